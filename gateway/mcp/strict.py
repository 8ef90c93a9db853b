"""Strict tool arguments: the published input schema is also the contract that is enforced.

The MCP SDK derives each tool's argument model from its function signature and validates
leniently: unknown arguments are dropped and ``"5"`` passes for an integer. A model that
writes memory should learn at once that it misspelt an argument or sent the wrong type,
rather than have half its intent silently ignored, so every tool here gets a strict model
(no extra keys, no coercion), its schema says ``additionalProperties: false``, and a call
that does not fit is answered with one short tool error naming the argument, before the
tool body runs: nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from pydantic import BaseModel, ConfigDict, ValidationError

#: At most this many problems are listed in one error.
MAX_PROBLEMS = 5
_JSON_TYPES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number",
               list: "an array", dict: "an object", type(None): "null"}


def strict_tool(fn: Callable[..., Any], structured_output: bool) -> Tool:
    """A Tool whose argument model forbids unknown keys and coercion; its description is the
    function's docstring as one paragraph (no source indentation in the model's context)."""
    description = " ".join((fn.__doc__ or "").split())
    tool = Tool.from_function(fn, description=description, structured_output=structured_output)
    base = tool.fn_metadata.arg_model
    model = type(base.__name__, (base,), {
        "__module__": __name__,
        "model_config": ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)})
    tool.fn_metadata.arg_model = model
    tool.parameters = _without_titles(model.model_json_schema(by_alias=True))
    return tool


class StrictServer(MCPServer):
    """An MCPServer that checks a call's arguments against the tool's strict model first."""

    def __init__(self, name: str, *, tools: list[Tool], **kwargs: Any) -> None:
        super().__init__(name, tools=tools, **kwargs)
        self._strict = {tool.name: tool for tool in tools}

    async def call_tool(self, name: str, arguments: dict[str, Any], context=None):
        tool = self._strict.get(name)
        if tool is not None:
            check_arguments(tool, arguments)
        return await super().call_tool(name, arguments, context)


def check_arguments(tool: Tool, arguments: dict[str, Any]) -> None:
    """ToolError naming what is wrong, or nothing. JSON text for an array or object argument
    is accepted, as the SDK does (some clients send lists as strings)."""
    model: type[BaseModel] = tool.fn_metadata.arg_model
    try:
        model.model_validate(tool.fn_metadata.pre_parse_json(arguments))
    except ValidationError as exc:
        raise ToolError(describe(tool.name, model, exc)) from None


def describe(tool: str, model: type[BaseModel], exc: ValidationError) -> str:
    """One sentence per problem, naming the argument, never echoing its value."""
    problems = []
    for error in exc.errors()[:MAX_PROBLEMS]:
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        kind = error["type"]
        if kind == "extra_forbidden":
            problems.append(f"unknown argument {where!r}")
        elif kind == "missing":
            problems.append(f"missing required argument {where!r}")
        else:
            got = _JSON_TYPES.get(type(error.get("input")), "a value")
            problems.append(f"argument {where!r}: {error['msg'].rstrip('.')} (got {got})")
    names = ", ".join(model.model_fields)
    return (f"Invalid arguments for {tool}: {'; '.join(problems)}. {tool} takes: {names}. "
            "Nothing was done.")


def _without_titles(schema: dict[str, Any]) -> dict[str, Any]:
    """Property titles repeat the names ("Query" for query): noise in a model's context."""
    schema = dict(schema)
    schema.pop("title", None)
    schema["properties"] = {name: {k: v for k, v in prop.items() if k != "title"}
                            for name, prop in schema.get("properties", {}).items()}
    return schema
