"""The MCP tools: the organization's memory as a model sees it.

Each tool is one or two calls of the :mod:`orgmem` SDK made as the calling agent, so the
gateway authorizes and audits it exactly like the same REST or S3 call: a tool can do
nothing its caller could not do directly. Descriptions are written for a model to read:
what the tool is for, when to use it, and what each argument means.

Arguments are named as in the REST API. A refusal from the gateway (access denied, a
duplicate, bad input) comes back as a tool error carrying the gateway's code and message.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import Field

from orgmem import AsyncClient
from orgmem.errors import NotFound, OrgmemError

from .strict import StrictServer, strict_tool

#: The largest workspace file the tools read or write: text for a model's context.
MAX_FILE = 1024 * 1024
#: S3's limit on a key.
MAX_KEY = 1024
#: Search hits per call.
MAX_HITS = 50
#: Clients the HTTP endpoint keeps for reuse.
MAX_CLIENTS = 256

INSTRUCTIONS = """\
orgmem is your organization's durable, shared memory. It outlives this session and is shared
with the other agents and people of your organization.
- At the start of a task call recall (standing decisions, preferences and lessons that apply
  to you), or get_context with your session id to resume earlier work.
- Record what you do with log_event, under one session id per task.
- Save what others should keep knowing with remember; find anything with search_memory.
- Keep files in your workspace with write_workspace_file / read_workspace_file.
- Reusable procedures are skills: list_skills, then get_skill.
Everything you do here is done with your own permissions and is audited."""

EVENT_KINDS = Literal["prompt", "response", "tool_call", "tool_result", "artifact", "question", "answer",
                      "decision", "note", "error", "state", "handoff"]
MEMORY_KINDS = Literal["fact", "lesson", "preference", "decision"]
SEARCH_TYPES = Literal["memory", "event", "skill", "file"]
#: A media type with optional parameters (a header value: no line breaks, no quotes games).
CONTENT_TYPE = r"^[A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+(; ?[A-Za-z0-9_.-]+=[A-Za-z0-9_.+-]+)*$"


# --------------------------------------------------------------------------- who calls


class Caller:
    """One principal's way to the gateway: an SDK client and who it is (asked once)."""

    def __init__(self, client: AsyncClient, name: str | None = None, kind: str | None = None,
                 is_root: bool = False) -> None:
        self.client = client
        self.name, self.kind, self.is_root = name, kind, is_root

    @classmethod
    def from_env(cls) -> Caller:
        """ORGMEM_ENDPOINT, ORGMEM_ACCESS_KEY, ORGMEM_SECRET_KEY (and ORGMEM_CA_BUNDLE)."""
        return cls(AsyncClient())

    async def identity(self) -> str:
        if self.name is None:
            me = await self.client.whoami()
            self.name, self.kind, self.is_root = me["name"], me.get("kind"), bool(me.get("is_root"))
        return self.name

    async def own_bucket(self) -> str:
        return f"agent-{await self.identity()}"

    async def own_scope(self) -> str:
        """Where a memory goes by default: the agent's own scope; the org for root and humans."""
        name = await self.identity()
        return f"agent:{name}" if self.kind == "agent" and not self.is_root else "org"

    async def close(self) -> None:
        await self.client.close()


class ClientCache:
    """SDK clients by endpoint and key pair, for the HTTP endpoint's callers: making one loads
    the CA store (~0.1 s), too slow for every request. The least recently used is dropped."""

    def __init__(self, size: int = MAX_CLIENTS) -> None:
        self._size = size
        self._clients: OrderedDict[tuple[str, str, str, str], AsyncClient] = OrderedDict()
        self._closing: set[asyncio.Task] = set()

    def get(self, endpoint: str, access_key: str, secret_key: str, ca_bundle: str | None,
            transport: Callable[[], Any] | None = None, origin: str = "") -> AsyncClient:
        """The client for one key pair (and ``origin``: whom its calls stand for); ``transport``
        makes the network layer of a new one."""
        # the secret is part of the key (hashed): a wrong secret never reuses a right one's client
        key = (endpoint, access_key, hashlib.sha256(secret_key.encode()).hexdigest(), origin)
        client = self._clients.get(key)
        if client is None:
            client = AsyncClient(endpoint, access_key, secret_key, ca_bundle=ca_bundle,
                                 transport=transport() if transport else None)
            self._clients[key] = client
            while len(self._clients) > self._size:
                _, dropped = self._clients.popitem(last=False)
                self._closing.add(task := asyncio.get_running_loop().create_task(dropped.close()))
                task.add_done_callback(self._closing.discard)
        self._clients.move_to_end(key)
        return client

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            await client.close()


#: How a tool finds its caller: from the HTTP request's ASGI scope, or None on stdio.
CallerOf = Callable[[dict | None], Caller]


def _errors(fn):
    """The gateway's refusals as tool errors: its code and message, nothing else."""

    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except OrgmemError as exc:
            raise ToolError(f"{exc.code}: {exc.message}") from None
    return wrapper


# --------------------------------------------------------------------------- the tools


def build_server(caller_of: CallerOf) -> StrictServer:
    """The MCP server with every tool, each calling the gateway as ``caller_of(scope)``."""

    def caller(ctx: Context) -> Caller:
        request = ctx.request_context.request
        return caller_of(request.scope if request is not None else None)

    @_errors
    async def search_memory(
        ctx: Context,
        query: Annotated[str, Field(min_length=1, max_length=4096, description=(
            'Words to look for. Also: "exact phrase", +required, -excluded, and field:value '
            "filters such as kind:decision, tags:billing, agent:NAME, session:ID; * matches all."))],
        type: Annotated[SEARCH_TYPES | None, Field(description=(
            "Only this kind of item: memory (documents), event (biographies), skill or file "
            "(workspace text files). Default: all."))] = None,
        limit: Annotated[int, Field(ge=1, le=MAX_HITS, description="Most hits to return.")] = 10,
    ) -> dict[str, Any]:
        """Full-text search over everything you may read: open-memory documents, biography events,
        skills and workspace text files. Hits are ranked; each has its type, title, a snippet, its
        status (superseded memories rank lower and say so) and its source (memory:..., bio:...,
        skill:..., s3://...). New items become searchable within about a second."""
        found = await caller(ctx).client.search(query, type=type, limit=limit)
        keep = ("type", "title", "snippet", "source", "status", "time")
        return {"count": found.get("count", 0),
                "hits": [{k: h.get(k) for k in keep if h.get(k) is not None} for h in found["hits"]],
                **({"warnings": found["warnings"]} if found.get("warnings") else {})}

    @_errors
    async def remember(
        ctx: Context,
        title: Annotated[str, Field(min_length=1, description=(
            "One line saying what it is (at most 300 characters)."))],
        body: Annotated[str, Field(description="The content itself, in plain words.")],
        kind: Annotated[MEMORY_KINDS, Field(description=(
            "fact (how things are), lesson (learned from experience), preference (how something "
            "should be done) or decision (a standing choice, with who made it and why)."))] = "fact",
        id: Annotated[str | None, Field(description=(
            "Document id: lowercase letters, digits and hyphens, at most 128. Writing an id that "
            "exists adds a new version of it. Default: made from the title."))] = None,
        scope: Annotated[str | None, Field(description=(
            "Where it lives: agent:<you> (the default), team:<name> or org. Writing outside your "
            "own scope needs a grant."))] = None,
        tags: Annotated[list[str] | None, Field(description=(
            'Lowercase keywords for search and filtering, e.g. ["deploys", "billing"].'))] = None,
        rationale: Annotated[str | None, Field(description=(
            "Why: the reasoning or incident behind it."))] = None,
        evidence: Annotated[list[str] | None, Field(description=(
            "What backs it: bio:<agent>/<event_id>, s3://bucket/key, URLs."))] = None,
        supersedes: Annotated[str | None, Field(description=(
            "Id of an active document in the same scope that this one replaces: it is marked "
            "superseded (its history is kept) and this one becomes active."))] = None,
    ) -> dict[str, Any]:
        """Save something the organization should keep knowing, as a versioned open-memory document:
        a fact, a lesson, a preference or a decision. The gateway records who wrote it and when.
        Use supersedes to replace an earlier document rather than contradict it."""
        who = caller(ctx)
        scope = scope or await who.own_scope()
        doc_id = id or slug(title)
        if supersedes and not id:
            # a revision, often of the same title: an id of its own, whatever came before it
            doc_id = f"{doc_id}-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
        doc = {k: v for k, v in {"kind": kind, "title": title, "body": body, "tags": tags,
                                 "rationale": rationale, "evidence": evidence}.items() if v is not None}
        if supersedes:
            saved = await who.client.supersede_memory(scope, supersedes, {**doc, "id": doc_id})
        else:
            saved = await who.client.put_memory(scope, doc_id, doc)
        out = {k: saved.get(k) for k in ("scope", "id", "version", "status", "supersedes")}
        return {k: v for k, v in out.items() if v is not None}

    @_errors
    async def recall(
        ctx: Context,
        agent: Annotated[str | None, Field(description=(
            "Whose memory (default: yours). Another agent's needs a grant."))] = None,
    ) -> str:
        """What you should know before starting work: every decision, preference, lesson and fact in
        force that applies to you (your own, your teams' and the organization's), decisions first,
        as a Markdown digest naming each item's source and who decided it. Call it at the start of
        a session."""
        who = caller(ctx)
        return await who.client.digest(agent or await who.identity())

    @_errors
    async def log_event(
        ctx: Context,
        session: Annotated[str, Field(min_length=1, max_length=256, description=(
            "Your session id: one per task, reused for all its events (printable characters)."))],
        kind: Annotated[EVENT_KINDS, Field(description=(
            "What happened: prompt, response, tool_call, tool_result, artifact (a file you made), "
            "question (open until an answer names it as parent_id), answer, decision, note, error, "
            "state (where the work stands), handoff."))],
        content: Annotated[str, Field(description="What happened, as text (at most 1 MiB).")],
        parent_id: Annotated[str | None, Field(description=(
            "event_id this one follows up: the question it answers, the tool_call of a "
            "tool_result."))] = None,
        tool: Annotated[str | None, Field(description=(
            "For tool_call and tool_result: the tool's name."))] = None,
        data: Annotated[dict[str, Any] | None, Field(description=(
            "Structured details, as a JSON object."))] = None,
        artifact_uri: Annotated[str | None, Field(description=(
            "For artifact: where it is, e.g. s3://agent-<you>/report.md."))] = None,
        tags: Annotated[list[str] | None, Field(description="Labels for filtering and search.")] = None,
    ) -> dict[str, Any]:
        """Append an event to your biography, the durable record of what you did: prompts, responses,
        tool calls and results, artifacts, questions and answers, decisions, notes, errors and state.
        It is stored before this returns; get_context uses it to resume the session later."""
        event = {k: v for k, v in {"session": session, "kind": kind, "content": content,
                                   "parent_id": parent_id, "tool": tool, "data": data,
                                   "artifact_uri": artifact_uri, "tags": tags}.items() if v is not None}
        ids = await caller(ctx).client.put_events([event])
        return {"event_id": ids[0], "session": session, "kind": kind}

    @_errors
    async def get_context(
        ctx: Context,
        session: Annotated[str | None, Field(min_length=1, max_length=256, description=(
            "The session to resume: its open questions, last error, artifacts, state and "
            "recent events."))] = None,
        query: Annotated[str | None, Field(max_length=4096, description=(
            "What the work is about: picks the most relevant memories and skills."))] = None,
        budget_tokens: Annotated[int, Field(ge=100, le=200_000, description=(
            "Most tokens the answer may take (estimated)."))] = 2000,
    ) -> str:
        """Everything you need to continue your work, fitted to a token budget, as Markdown: the
        decisions and preferences that apply to you, the session's open questions, last error,
        artifacts and last state, the memories and skills most relevant to the query, and the
        session's recent events. Each item names its source."""
        who = caller(ctx)
        pack = await who.client.context(await who.identity(), session, query, budget_tokens)
        return pack["markdown"]

    @_errors
    async def list_skills(
        ctx: Context,
        scope: Annotated[str | None, Field(description=(
            "Only this scope: org, team:<name> or agent:<name>."))] = None,
        q: Annotated[str | None, Field(max_length=1024, description=(
            "Only skills with all these words in their name or description."))] = None,
    ) -> dict[str, Any]:
        """The reusable procedures (Agent Skills) you may use: name, description, scope, version and
        author of each. Read one with get_skill."""
        return {"skills": await caller(ctx).client.list_skills(scope, q)}

    @_errors
    async def get_skill(
        ctx: Context,
        name: Annotated[str, Field(min_length=1, max_length=64, description=(
            "The skill's name, as list_skills shows it."))],
        scope: Annotated[str | None, Field(description=(
            "org, team:<name> or agent:<name>. Default: yours, then your teams', then the org's."))] = None,
        path: Annotated[str, Field(min_length=1, max_length=1024, description=(
            "Which of its files to read: SKILL.md (the instructions) or one of the files "
            "listed."))] = "SKILL.md",
        version: Annotated[int | None, Field(ge=1, description=(
            "A version number. Default: the latest."))] = None,
    ) -> dict[str, Any]:
        """Read a skill: its SKILL.md instructions (or another of its text files) and the list of its
        files. Follow the instructions to use it."""
        client = caller(ctx).client
        manifest = await client.get_skill(scope, name, version)
        data = await client.get_skill_file(manifest["scope"], name, path, manifest["version"])
        return {"scope": manifest["scope"], "name": manifest["name"], "version": manifest["version"],
                "files": [f["path"] for f in manifest.get("files", [])], "path": path,
                "content": as_text(data, f"{path} of skill {name}")}

    @_errors
    async def read_workspace_file(
        ctx: Context,
        key: Annotated[str, Field(min_length=1, description=(
            "The file's key (its path), e.g. notes/plan.md."))],
        bucket: Annotated[str | None, Field(min_length=3, max_length=63, description=(
            "The workspace bucket. Default: your own, agent-<you>."))] = None,
    ) -> dict[str, Any]:
        """Read a text file from a workspace bucket (default: your own). Text only (UTF-8), at most
        1 MiB."""
        who = caller(ctx)
        bucket = bucket or await who.own_bucket()
        check_key(key)
        await check_size(who.client, bucket, key)
        data = await who.client.read_file(bucket, key)
        if len(data) > MAX_FILE:
            raise ToolError(too_big(key, len(data)))
        return {"bucket": bucket, "key": key, "size": len(data), "content": as_text(data, key)}

    @_errors
    async def write_workspace_file(
        ctx: Context,
        key: Annotated[str, Field(min_length=1, description=(
            "The file's key (its path), e.g. notes/plan.md."))],
        content: Annotated[str, Field(description="The whole text of the file (at most 1 MiB as UTF-8).")],
        bucket: Annotated[str | None, Field(min_length=3, max_length=63, description=(
            "The workspace bucket. Default: your own, agent-<you>, created on first use."))] = None,
        content_type: Annotated[str | None, Field(max_length=256, pattern=CONTENT_TYPE, description=(
            "Its media type. Default: from the key's extension (text/markdown for .md)."))] = None,
    ) -> dict[str, Any]:
        """Write a text file to a workspace bucket (default: your own), replacing any file at that key.
        Files there outlive the session, can be shared, and are searchable."""
        who = caller(ctx)
        check_key(key)
        data = utf8(content, "content")
        if len(data) > MAX_FILE:
            raise ToolError(too_big(key, len(data)) + " Nothing was written.")
        if "\x00" in content:
            raise ToolError("content: text only (it holds NUL characters). Nothing was written.")
        own = await who.own_bucket()
        bucket = bucket or own
        try:
            etag = await who.client.write_file(bucket, key, data, content_type)
        except NotFound as exc:
            if bucket != own or exc.code != "NoSuchBucket":
                raise
            await who.client.create_bucket(own)  # the agent's own workspace, on first use
            etag = await who.client.write_file(bucket, key, data, content_type)
        return {"bucket": bucket, "key": key, "size": len(data), "etag": etag}

    tools = [search_memory, remember, recall, log_event, get_context, list_skills, get_skill,
             read_workspace_file, write_workspace_file]
    return StrictServer("orgmem", instructions=INSTRUCTIONS, version=_version(),
                        tools=[strict_tool(fn, structured_output=not _returns_text(fn)) for fn in tools])


# --------------------------------------------------------------------------- helpers


def slug(title: str) -> str:
    """A document id from a title: "Deploys on Fridays?" -> "deploys-on-fridays"."""
    words = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    words = words[:100].rstrip("-")
    return words or "m-" + hashlib.sha256(title.encode()).hexdigest()[:16]


def check_key(key: str) -> None:
    if len(utf8(key, "key")) > MAX_KEY:
        raise ToolError(f"key: at most {MAX_KEY} bytes as UTF-8. Nothing was done.")


def utf8(text: str, what: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate (JSON allows "\\ud800") is not text."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError(f"{what}: not valid Unicode text (it holds a lone surrogate). "
                        "Nothing was done.") from None


async def check_size(client: AsyncClient, bucket: str, key: str) -> None:
    """Refuse a file too big for a model before fetching it (from its listing, when the caller
    may list the bucket; otherwise the size is checked once read)."""
    try:
        listed = await client.list_files(bucket, prefix=key, delimiter="/")
    except OrgmemError as exc:
        if exc.code in ("AccessDenied", "NoSuchBucket"):
            return  # the read itself says what is wrong, or the size is checked after it
        raise
    for entry in listed:
        if entry.get("key") == key and entry.get("size", 0) > MAX_FILE:
            raise ToolError(too_big(key, entry["size"]))


def too_big(key: str, size: int) -> str:
    return (f"{key} is {size:,} bytes; these tools read and write text files of at most "
            f"{MAX_FILE:,} bytes (use an S3 client for larger files).")


def as_text(data: bytes, what: str) -> str:
    """UTF-8 text, or a tool error saying the file is binary."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        raise ToolError(f"{what} is binary ({len(data):,} bytes), not UTF-8 text: these tools read "
                        "text only (use an S3 client for binary files).")
    return text


def _returns_text(fn) -> bool:
    return fn.__annotations__.get("return") in (str, "str")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("orgmem")
    except Exception:  # noqa: BLE001 - informational only
        return ""


# --------------------------------------------------------------------------- transports


def http_manager(caller_of: CallerOf, max_body: int) -> StreamableHTTPSessionManager:
    """The session manager the gateway's /mcp hands requests to: stateless, JSON answers (any
    replica can serve any request), no DNS-rebinding check (every request carries a bearer
    token, which a rebinding page cannot)."""
    server = build_server(caller_of)
    server.streamable_http_app(stateless_http=True, json_response=True, max_request_body_size=max_body,
                               transport_security=TransportSecuritySettings(
                                   enable_dns_rebinding_protection=False))
    return server.session_manager
