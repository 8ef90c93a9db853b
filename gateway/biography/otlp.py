"""OpenTelemetry traces as biography events: OTLP decoding and the GenAI span mapping.

A framework that already exports OpenTelemetry traces (the GenAI semantic conventions)
fills its agent's biography by pointing its OTLP/HTTP exporter at the gateway; no code
change. This module knows nothing of HTTP: it decodes an ``ExportTraceServiceRequest``
(protobuf, or the OTLP/JSON encoding) and turns its GenAI spans into validated
:class:`~gateway.biography.events.Event` objects.

- A request that cannot be decoded (corrupt protobuf, invalid JSON, an id of the wrong
  length) raises :class:`OtlpError`: the whole request is refused and nothing is stored.
- A GenAI span that decodes but cannot become valid events (a conversation id with line
  breaks, a tool name of 300 characters) is *rejected*: counted and named in the OTLP
  ``partial_success``, while the other spans are kept.
- Spans that are not GenAI spans (HTTP calls, database queries, embeddings) are skipped.

Event ids are ``otel:<trace_id>:<span_id>:<part>``, so a re-exported span adds nothing
twice: the biography keeps one event per id, agent and day. The agent is always the
caller; a span's ``gen_ai.agent.name`` is kept in ``data``, never used as the agent.
The README's "OpenTelemetry capture" section is the user-facing version of this mapping.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from . import events as ev

#: Operations that call a model: a ``prompt`` and then a ``response``.
MODEL_CALLS = frozenset({"chat", "text_completion", "generate_content"})
#: Operations that become events; any other ``gen_ai.operation.name`` is skipped.
MAPPED = MODEL_CALLS | {"execute_tool", "invoke_agent", "create_agent"}
#: The session of spans without ``gen_ai.conversation.id`` (nor an ancestor with one in
#: the same request): one session per trace.
TRACE_SESSION = "otel-trace:"
#: Tags every captured event carries, so they can be told from events an agent wrote.
TAGS = ["otel"]
#: Reasons named in ``partial_success.error_message`` (the count covers the rest).
MAX_REASONS = 5
#: Nesting of an attribute value (kvlists in arrays ...) we follow before refusing it.
MAX_DEPTH = 64
#: Hops up the parent chain when looking for an inherited attribute.
MAX_ANCESTORS = 64
#: Attributes a span without them takes from its nearest ancestor in the same request.
INHERITED = frozenset({"gen_ai.conversation.id", "gen_ai.agent.name", "gen_ai.agent.id"})
_ERROR = Status.STATUS_CODE_ERROR
#: What old-style span events (semconv 1.36 and before) say about who spoke.
_MESSAGE_EVENTS = {"gen_ai.system.message": "system", "gen_ai.user.message": "user",
                   "gen_ai.assistant.message": "assistant", "gen_ai.tool.message": "tool"}
#: Keys of ``data`` that may be large, dropped in this order when ``data`` is over 1 MiB.
_BULKY = ("messages", "result", "arguments", "instructions", "input_messages",
          "output_messages", "request")


class OtlpError(ValueError):
    """A request that is not a well-formed ExportTraceServiceRequest; ``message`` says where."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Unconvertible(Exception):
    """One span that cannot become events; the request goes on without it."""


@dataclass
class Conversion:
    """What a request became: the events to store and what happened to every span."""

    events: list[ev.Event] = field(default_factory=list)
    spans: int = 0
    #: GenAI spans turned into events
    converted: int = 0
    #: spans that are not GenAI spans (or GenAI operations with no mapping)
    skipped: int = 0
    #: GenAI spans that could not be turned into valid events
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)

    def error_message(self) -> str:
        if not self.rejected:
            return ""
        more = self.rejected - len(self.reasons)
        tail = f"; and {more} more" if more > 0 else ""
        return (f"{self.rejected} of {self.spans} spans could not be stored: "
                + "; ".join(self.reasons) + tail)


# --------------------------------------------------------------------------- decoding


def decode_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """An ``application/x-protobuf`` body, ids checked."""
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except (DecodeError, RecursionError) as exc:
        raise OtlpError(f"the body is not a protobuf ExportTraceServiceRequest ({exc})") from None
    _check_ids(request)
    return request


def decode_json(body: bytes) -> ExportTraceServiceRequest:
    """An ``application/json`` body in the OTLP/JSON encoding: hex trace and span ids,
    camelCase (or the proto's snake_case) keys, int64 as strings or numbers, enums as
    integers. Unknown fields are ignored, as OTLP asks of receivers."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OtlpError(f"the body is not valid JSON: {exc}") from None
    if type(doc) is not dict:
        raise OtlpError("the body must be a JSON object, an ExportTraceServiceRequest "
                        'such as {"resourceSpans": [...]}')
    _hex_ids_to_base64(doc)
    try:
        request = json_format.ParseDict(doc, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError, ValueError, TypeError) as exc:
        raise OtlpError(f"the body is not an OTLP/JSON ExportTraceServiceRequest: {exc}") from None
    _check_ids(request)
    return request


def encode_response(result: Conversion, as_json: bool) -> bytes:
    """The ExportTraceServiceResponse: empty when every span was taken, else
    ``partial_success`` with the rejected count and why."""
    response = ExportTraceServiceResponse()
    if result.rejected:
        response.partial_success.rejected_spans = result.rejected
        response.partial_success.error_message = result.error_message()
    if as_json:
        return orjson.dumps(json_format.MessageToDict(response))
    return response.SerializeToString()


def _items(obj: Any, *names: str) -> list:
    """A repeated field of a JSON object under its camelCase or snake_case name; anything
    else is left for the protobuf parser to complain about."""
    if type(obj) is not dict:
        return []
    for name in names:
        if name in obj:
            value = obj[name]
            return value if type(value) is list else []
    return []


def _hex_ids_to_base64(doc: dict) -> None:
    """OTLP/JSON writes ids as hex where proto3 JSON expects base64: rewrite them in place."""
    for i, rs in enumerate(_items(doc, "resourceSpans", "resource_spans")):
        for j, ss in enumerate(_items(rs, "scopeSpans", "scope_spans")):
            for k, span in enumerate(_items(ss, "spans")):
                path = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                if type(span) is not dict:
                    continue
                _rewrite_id(span, path, "traceId", "trace_id", 32)
                _rewrite_id(span, path, "spanId", "span_id", 16)
                _rewrite_id(span, path, "parentSpanId", "parent_span_id", 16)
                for n, link in enumerate(_items(span, "links")):
                    if type(link) is dict:
                        _rewrite_id(link, f"{path}.links[{n}]", "traceId", "trace_id", 32)
                        _rewrite_id(link, f"{path}.links[{n}]", "spanId", "span_id", 16)


def _rewrite_id(obj: dict, path: str, json_name: str, proto_name: str, digits: int) -> None:
    for key in (json_name, proto_name):
        value = obj.get(key)
        if value is None or value == "":
            continue
        if type(value) is not str or len(value) != digits:
            raise OtlpError(f"{path}.{json_name}: must be {digits} hexadecimal digits "
                            f"({_shown(value)})")
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raise OtlpError(f"{path}.{json_name}: must be {digits} hexadecimal digits "
                            f"({_shown(value)})") from None
        obj[key] = base64.b64encode(raw).decode()


def _shown(value: Any) -> str:
    """``got <value>`` for a message: short JSON, never the whole of a long value."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = orjson.dumps(str(value)).decode()
    return "got " + (text if len(text) <= 70 else text[:66] + '..."')


def _check_ids(request: ExportTraceServiceRequest) -> None:
    """Every span needs a valid 16-byte trace id and 8-byte span id (W3C: not all zeros);
    a parent span id is empty or 8 bytes. A request that breaks this is malformed."""
    for path, _, span in _spans(request):
        _check_id(span.trace_id, f"{path}.traceId", 16)
        _check_id(span.span_id, f"{path}.spanId", 8)
        if span.parent_span_id:
            _check_id(span.parent_span_id, f"{path}.parentSpanId", 8)


def _check_id(value: bytes, path: str, size: int) -> None:
    if len(value) != size:
        raise OtlpError(f"{path}: must be {size} bytes ({size * 2} hexadecimal digits in JSON); "
                        f"got {len(value)} bytes")
    if not any(value):
        raise OtlpError(f"{path}: must not be all zeros (an invalid id in W3C Trace Context)")


def _spans(request: ExportTraceServiceRequest) -> Iterator[tuple[str, str | None, Span]]:
    """(path, service.name, span) for every span of the request, in order."""
    for i, rs in enumerate(request.resource_spans):
        service = None
        for kv in rs.resource.attributes:
            if kv.key == "service.name" and kv.value.WhichOneof("value") == "string_value":
                service = kv.value.string_value or None
        for j, ss in enumerate(rs.scope_spans):
            for k, span in enumerate(ss.spans):
                yield f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]", service, span


# --------------------------------------------------------------------------- conversion


def convert(request: ExportTraceServiceRequest, *, caller: str) -> Conversion:
    """Map every GenAI span of ``request`` to events of ``caller``'s biography."""
    result = Conversion()
    spans = list(_spans(request))
    result.spans = len(spans)
    lineage = _lineage(spans)
    seen: set[str] = set()
    for n, (_, service, span) in enumerate(spans, 1):
        view = _SpanView(span, service)
        if view.operation not in MAPPED:
            result.skipped += 1
            continue
        view.session = (_inherited(span, lineage, "gen_ai.conversation.id")
                        or TRACE_SESSION + view.trace_id)
        view.agent = {"agent_name": _inherited(span, lineage, "gen_ai.agent.name"),
                      "agent_id": _inherited(span, lineage, "gen_ai.agent.id")}
        try:
            events = [_validated(raw, ts, n, caller) for ts, raw in _map(view)]
        except Exception as exc:  # noqa: BLE001 - a span the mapping cannot take: rejected alone
            # (model output and tool arguments are anything: one odd span must not lose its batch)
            reason = str(exc) if isinstance(exc, _Unconvertible) else \
                f"its attributes could not be read ({exc.__class__.__name__})"
            result.rejected += 1
            if len(result.reasons) < MAX_REASONS:
                result.reasons.append(f"span {span.span_id.hex()} ({_shown(span.name)[4:]}): {reason}")
            continue
        result.converted += 1
        for e in events:
            if e.event_id not in seen:  # the same span twice in one request
                seen.add(e.event_id)
                result.events.append(e)
    return result


def _validated(raw: dict, ts: int, line: int, caller: str) -> ev.Event:
    """The events module's own checks, so a captured event obeys every rule a posted one does."""
    if not ev.TS_MIN_US <= ts <= ev.TS_MAX_US:
        raise _Unconvertible("its start or end time is after year 9999")
    try:
        return ev.validate(_fit(raw), line, caller=caller, now_us=ts)
    except ev.EventError as exc:
        where = f'field "{exc.field}": ' if exc.field else ""
        raise _Unconvertible(f"{where}{exc.message}") from None


def _lineage(spans: list[tuple[str, str | None, Span]]) -> dict[bytes, tuple[dict, bytes]]:
    """For every span of the request, by trace+span id: its own values of the attributes
    children inherit, and its parent's key."""
    out = {}
    for _, _, span in spans:
        own = {}
        for kv in span.attributes:
            if kv.key in INHERITED:
                own[kv.key] = _scalar_text(kv.value)
        parent = span.trace_id + span.parent_span_id if span.parent_span_id else b""
        out[span.trace_id + span.span_id] = (own, parent)
    return out


def _inherited(span: Span, lineage: dict[bytes, tuple[dict, bytes]], key: str) -> str | None:
    """The span's own ``key`` attribute, else the nearest ancestor's in this request:
    frameworks often set the conversation and the agent on the agent span only."""
    node = span.trace_id + span.span_id
    for _ in range(MAX_ANCESTORS):
        found = lineage.get(node)
        if found is None:
            return None
        if found[0].get(key):
            return found[0][key]
        if not found[1]:
            return None
        node = found[1]
    return None


# --------------------------------------------------------------------------- one span


class _SpanView:
    """A span's attributes, read on demand: most of a big request is never looked at."""

    def __init__(self, span: Span, service: str | None) -> None:
        self.span = span
        self.service = service
        self.attrs = {kv.key: kv.value for kv in span.attributes}
        self.trace_id = span.trace_id.hex()
        self.span_id = span.span_id.hex()
        self.start = span.start_time_unix_nano // 1000
        # a closing event never sorts before its opening one, even for a zero-length span
        self.end = max(span.end_time_unix_nano // 1000, self.start + 1)
        self.session = ""
        self.agent: dict[str, str | None] = {}
        self.operation = self.text("gen_ai.operation.name")
        if self.operation is None and any(k in self.attrs for k in (
                "gen_ai.request.model", "gen_ai.response.model", "gen_ai.system")):
            self.operation = "chat"  # spans from before gen_ai.operation.name existed

    def value(self, key: str) -> Any:
        av = self.attrs.get(key)
        return None if av is None else _any(av)

    def text(self, key: str) -> str | None:
        av = self.attrs.get(key)
        return None if av is None else _scalar_text(av)

    def integer(self, *keys: str) -> int | None:
        for key in keys:
            v = self.value(key)
            if type(v) is float and v.is_integer():
                v = int(v)
            if type(v) is int:
                return v
        return None

    def event_id(self, part: str) -> str:
        return f"otel:{self.trace_id}:{self.span_id}:{part}"

    def raw(self, kind: str, part: str, data: dict, **fields: Any) -> dict:
        raw = {"event_id": self.event_id(part), "session": self.session, "kind": kind,
               "trace_id": self.trace_id, "span_id": self.span_id, "tags": TAGS,
               "data": {**self.common(), **{k: v for k, v in data.items() if v not in (None, [], {})}}}
        raw.update((k, v) for k, v in fields.items() if v is not None)
        return raw

    def common(self) -> dict:
        """What every event of the span keeps in ``data``: where it came from."""
        d = {"operation": self.operation, "span_name": self.span.name or None,
             "parent_span_id": self.span.parent_span_id.hex() or None, "service": self.service,
             "provider": self.text("gen_ai.provider.name") or self.text("gen_ai.system"),
             **self.agent}
        return {k: v for k, v in d.items() if v is not None}

    def model(self) -> str | None:
        return self.text("gen_ai.response.model") or self.text("gen_ai.request.model")

    def failure(self) -> tuple[str, dict] | None:
        """Why the span failed (``error.type`` or an ERROR status), or None."""
        error_type = self.text("error.type")
        if error_type is None and self.span.status.code != _ERROR:
            return None
        exception = next((e for e in self.span.events if e.name == "exception"), None)
        exc = {kv.key: _scalar_text(kv.value) for kv in exception.attributes} if exception else {}
        message = (self.span.status.message or exc.get("exception.message")
                   or error_type or exc.get("exception.type") or "the operation failed")
        return message, {"error_type": error_type, "exception_type": exc.get("exception.type")}


def _map(s: _SpanView) -> list[tuple[int, dict]]:
    if not s.span.start_time_unix_nano:
        raise _Unconvertible("it has no start time")
    if s.operation in MODEL_CALLS:
        return _model_call(s)
    if s.operation == "execute_tool":
        return _tool(s)
    if s.operation == "invoke_agent":
        return _invoke_agent(s)
    return _create_agent(s)


def _closing_error(s: _SpanView, failure: tuple[str, dict], **fields: Any) -> tuple[int, dict]:
    message, data = failure
    return s.end, s.raw("error", "error", data, content=message, **fields)


def _model_call(s: _SpanView) -> list[tuple[int, dict]]:
    """``prompt`` at the start (the newest input message as text, every message in data),
    ``response`` at the end (the output text); a system prompt first when there is one."""
    inputs = _messages(s.value("gen_ai.input.messages"), "user")
    outputs = _messages(s.value("gen_ai.output.messages"), "assistant")
    instructions = _parts(s.value("gen_ai.system_instructions"))
    if not inputs and not outputs:
        inputs, outputs, old_instructions = _event_messages(s.span)
        instructions = instructions or old_instructions
    model = s.model()
    out = []
    if instructions:
        out.append((s.start, s.raw("prompt", "instructions", {"instructions": instructions},
                                   role="system", content=_text(instructions), model=model)))
    last = inputs[-1] if inputs else {}
    request = {k[len("gen_ai.request."):]: s.value(k) for k in s.attrs
               if k.startswith("gen_ai.request.") and k != "gen_ai.request.model"}
    out.append((s.start, s.raw("prompt", "prompt", {"messages": inputs, "request": request},
                               role=_role(last), content=_text(last.get("parts")),
                               model=model,
                               tokens_in=s.integer("gen_ai.usage.input_tokens",
                                                   "gen_ai.usage.prompt_tokens"))))
    failure = s.failure()
    if failure:
        out.append(_closing_error(s, failure, model=model))
        return out
    texts = [t for t in (_text(m.get("parts")) for m in outputs) if t]
    data = {"messages": outputs, "response_id": s.text("gen_ai.response.id"),
            "finish_reasons": s.value("gen_ai.response.finish_reasons")}
    out.append((s.end, s.raw("response", "response", data,
                             role=_role(outputs[0]) if outputs else "assistant",
                             content="\n\n".join(texts) or None, model=model,
                             tokens_out=s.integer("gen_ai.usage.output_tokens",
                                                  "gen_ai.usage.completion_tokens"))))
    return out


def _tool(s: _SpanView) -> list[tuple[int, dict]]:
    """``tool_call`` at the start (arguments in data), ``tool_result`` at the end pointing
    at it (a text result in content, a structured one in data)."""
    name = s.text("gen_ai.tool.name") or _after(s.span.name, "execute_tool ") or None
    call_id = s.text("gen_ai.tool.call.id")
    call = s.raw("tool_call", "tool_call", {
        "arguments": _jsonish(s.value("gen_ai.tool.call.arguments")), "tool_call_id": call_id,
        "tool_type": s.text("gen_ai.tool.type"),
        "tool_description": s.text("gen_ai.tool.description")}, role="assistant", tool=name)
    out = [(s.start, call)]
    failure = s.failure()
    if failure:
        out.append(_closing_error(s, failure, tool=name, parent_id=call["event_id"]))
        return out
    result = _jsonish(s.value("gen_ai.tool.call.result"))
    text = result if type(result) is str else None
    out.append((s.end, s.raw("tool_result", "tool_result", {
        "result": None if text is not None else result, "tool_call_id": call_id},
        role="tool", tool=name, parent_id=call["event_id"], content=text)))
    return out


def _invoke_agent(s: _SpanView) -> list[tuple[int, dict]]:
    """A ``note`` at the start: the agent run began. Not ``handoff``: a span cannot say
    who handed the work over. Its usage totals stay in data (the model calls inside the
    run carry the tokens), and a failed run adds an ``error`` at its end."""
    name = s.text("gen_ai.agent.name") or _after(s.span.name, "invoke_agent ") or None
    data = {"agent_description": s.text("gen_ai.agent.description"),
            "input_messages": _messages(s.value("gen_ai.input.messages"), "user"),
            "output_messages": _messages(s.value("gen_ai.output.messages"), "assistant"),
            "usage_input_tokens": s.integer("gen_ai.usage.input_tokens"),
            "usage_output_tokens": s.integer("gen_ai.usage.output_tokens")}
    out = [(s.start, s.raw("note", "note", data, content=f"invoke_agent {name or ''}".strip(),
                           model=s.model()))]
    failure = s.failure()
    if failure:
        out.append(_closing_error(s, failure))
    return out


def _create_agent(s: _SpanView) -> list[tuple[int, dict]]:
    """A ``state`` event at the end: the agent exists from then on (an ``error`` instead
    when the creation failed)."""
    failure = s.failure()
    if failure:
        return [_closing_error(s, failure, model=s.model())]
    name = s.text("gen_ai.agent.name") or _after(s.span.name, "create_agent ") or None
    data = {"agent_description": s.text("gen_ai.agent.description"),
            "instructions": _parts(s.value("gen_ai.system_instructions"))}
    return [(s.end, s.raw("state", "state", data, content=f"create_agent {name or ''}".strip(),
                          model=s.model()))]


def _role(message: dict) -> str | None:
    role = message.get("role")
    return role if type(role) is str and role else None


def _after(text: str, prefix: str) -> str:
    return text[len(prefix):].strip() if text.startswith(prefix) else ""


# --------------------------------------------------------------------------- values


def _any(av: Any, depth: int = 0) -> Any:
    """An OTLP AnyValue as plain JSON-ready Python (bytes as base64 text)."""
    which = av.WhichOneof("value")
    if which is None:
        return None
    if which in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(av, which)
    if which == "bytes_value":
        return base64.b64encode(av.bytes_value).decode()
    if depth >= MAX_DEPTH:
        raise _Unconvertible(f"an attribute value is nested more than {MAX_DEPTH} levels deep")
    if which == "array_value":
        return [_any(v, depth + 1) for v in av.array_value.values]
    return {kv.key: _any(kv.value, depth + 1) for kv in av.kvlist_value.values}


def _scalar_text(av: Any) -> str | None:
    """A string attribute (numbers and booleans as text); structured values and "" are None."""
    which = av.WhichOneof("value")
    if which == "string_value":
        return av.string_value or None
    if which in ("int_value", "double_value"):
        return str(getattr(av, which))
    if which == "bool_value":
        return "true" if av.bool_value else "false"
    return None


def _jsonish(value: Any) -> Any:
    """A value that may be JSON text (Python SDKs can only set strings): objects and arrays
    are parsed, any other text stays text."""
    if type(value) is str and value[:1] in ("{", "["):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _messages(value: Any, role: str) -> list[dict]:
    """``gen_ai.input.messages`` / ``output.messages`` (structured or JSON text; also the
    older OpenAI-style ``{"role", "content", "tool_calls"}`` shape) as a list of
    ``{"role", "parts": [...]}``. Plain text becomes one message of ``role``."""
    value = _jsonish(value)
    if value is None:
        return []
    if type(value) is dict:
        value = [value]
    if type(value) is not list:
        value = [value]
    out = []
    for m in value:
        if type(m) is dict:
            out.append(_message(m, role))
        elif m is not None:
            out.append({"role": role, "parts": _parts(m)})
    return out


def _message(m: dict, role: str) -> dict:
    if type(m.get("parts")) is list:
        return m if m.get("role") else {**m, "role": role}
    role = m.get("role") if type(m.get("role")) is str and m.get("role") else role
    call_id = m.get("tool_call_id") or m.get("id")
    if role == "tool" and call_id:
        parts = [{"type": "tool_call_response", "id": call_id, "response": m.get("content")}]
    else:
        parts = _parts(m.get("content"))
    for call in _jsonish(m.get("tool_calls")) or []:
        if type(call) is dict:
            fn = call.get("function") if type(call.get("function")) is dict else {}
            parts.append({"type": "tool_call", "id": call.get("id"),
                          "name": fn.get("name", call.get("name")),
                          "arguments": _jsonish(fn.get("arguments", call.get("arguments")))})
    out = {"role": role, "parts": parts}
    if m.get("finish_reason") is not None:
        out["finish_reason"] = m["finish_reason"]
    return out


def _parts(content: Any) -> list:
    """Message content as parts: text → a text part; OpenAI content parts
    (``{"type": "text", "text": ...}``) → text parts; other parts are kept as they are."""
    content = _jsonish(content)
    if content is None:
        return []
    if type(content) is str:
        return [{"type": "text", "content": content}]
    if type(content) is dict:
        content = [content]
    if type(content) is not list:
        return [{"type": "text", "content": orjson.dumps(content).decode()}]
    parts = []
    for p in content:
        if type(p) is str:
            parts.append({"type": "text", "content": p})
        elif type(p) is dict and p.get("type", "text") == "text" and "content" not in p \
                and type(p.get("text")) is str:
            parts.append({"type": "text", "content": p["text"]})
        elif p is not None:
            parts.append(p)
    return parts


def _text(parts: Any) -> str | None:
    """The text parts of a message, joined by line breaks."""
    if type(parts) is not list:
        return None
    texts = [p["content"] for p in parts
             if type(p) is dict and p.get("type") == "text" and type(p.get("content")) is str]
    return "\n".join(texts) or None


def _event_messages(span: Span) -> tuple[list[dict], list[dict], list]:
    """Input and output messages from span events, as instrumentations wrote them before
    the ``gen_ai.input.messages`` attributes: ``gen_ai.{system,user,assistant,tool}.message``
    and ``gen_ai.choice``, ``gen_ai.content.prompt`` / ``completion``, and the
    ``gen_ai.client.inference.operation.details`` event recorded on the span."""
    inputs: list[dict] = []
    outputs: list[dict] = []
    instructions: list = []
    for event in span.events:
        attrs = {kv.key: kv.value for kv in event.attributes}
        if event.name in _MESSAGE_EVENTS:
            inputs.append(_message(_event_body(attrs), _MESSAGE_EVENTS[event.name]))
        elif event.name == "gen_ai.choice":
            body = _event_body(attrs)
            message = _jsonish(body.get("message"))
            message = dict(message) if type(message) is dict else {"content": body.get("content")}
            if body.get("finish_reason") is not None:
                message.setdefault("finish_reason", body["finish_reason"])
            outputs.append(_message(message, "assistant"))
        elif event.name == "gen_ai.content.prompt":
            inputs += _messages(_attr(attrs, "gen_ai.prompt"), "user")
        elif event.name == "gen_ai.content.completion":
            outputs += _messages(_attr(attrs, "gen_ai.completion"), "assistant")
        elif event.name == "gen_ai.client.inference.operation.details":
            inputs += _messages(_attr(attrs, "gen_ai.input.messages"), "user")
            outputs += _messages(_attr(attrs, "gen_ai.output.messages"), "assistant")
            instructions += _parts(_attr(attrs, "gen_ai.system_instructions"))
    return inputs, outputs, instructions


def _attr(attrs: dict, key: str) -> Any:
    av = attrs.get(key)
    return None if av is None else _any(av)


def _event_body(attrs: dict) -> dict:
    """An old-style event's body: its attributes, or the JSON in ``gen_ai.event.content``."""
    body = {k: _any(v) for k, v in attrs.items()
            if k not in ("gen_ai.system", "gen_ai.provider.name", "event.name")}
    inner = _jsonish(body.pop("gen_ai.event.content", None))
    return inner if type(inner) is dict else body


# --------------------------------------------------------------------------- limits


def _fit(raw: dict) -> dict:
    """Keep a captured event within the event limits instead of losing the span: content
    over 1 MiB is cut (its full size kept in data), and the bulkiest parts of data are
    replaced by their size until data fits in 1 MiB."""
    content = raw.get("content")
    if content is not None:
        encoded = content.encode("utf-8", "surrogatepass")
        if len(encoded) > ev.MAX_CONTENT:
            raw["content"] = encoded[:ev.MAX_CONTENT - 64].decode("utf-8", "ignore") + " [truncated]"
            raw["data"]["content_bytes"] = len(encoded)
    data = raw["data"]
    if len(orjson.dumps(data)) > ev.MAX_DATA:
        for key in _BULKY:
            if key in data:
                data[key] = {"omitted_bytes": len(orjson.dumps(data[key]))}
                if len(orjson.dumps(data)) <= ev.MAX_DATA:
                    break
    return raw
