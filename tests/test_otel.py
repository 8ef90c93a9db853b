"""OpenTelemetry capture against a real gateway: the OTel SDK's own OTLP/HTTP exporter fills
an agent's biography from GenAI spans; OTLP/JSON by hand; re-exports store nothing twice;
and every malformed request is a clear 4xx with nothing stored."""

from __future__ import annotations

import gzip
import http.client
import json
import uuid
import zlib

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from servers import Gateway

from gateway.admin_client import AdminClient
from gateway.bio_client import BioClient
from gateway.biography.events import format_ts

TRACE = "5b8efff798038103d269b633813fc60c"
SPAN_A = "eee19b7ec3c1b174"
SPAN_B = "eee19b7ec3c1b175"


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("otel") / "data").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin(gw):
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


@pytest.fixture
def agent(admin, gw):
    """A fresh agent: (name, BioClient, bearer header value)."""
    name = f"ot-{uuid.uuid4().hex[:8]}"
    created = admin.create_agent(name)
    client = BioClient(gw.endpoint, created["access_key"], created["secret_key"])
    return name, client, f"Bearer {created['access_key']}:{created['secret_key']}"


@pytest.fixture
def providers():
    """TracerProviders made by a test, shut down (their export threads stopped) after it."""
    made: list[TracerProvider] = []
    yield made
    for provider in made:
        provider.shutdown()


def exporter(gw, bearer: str, **kw) -> OTLPSpanExporter:
    return OTLPSpanExporter(endpoint=f"{gw.endpoint}/v1/traces", headers={"Authorization": bearer},
                            timeout=10, **kw)


def tracing(providers, export: OTLPSpanExporter) -> tuple[TracerProvider, InMemorySpanExporter]:
    """A provider that batches to the gateway and also keeps every finished span in memory."""
    provider = TracerProvider()
    kept = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(kept))
    provider.add_span_processor(BatchSpanProcessor(export))
    providers.append(provider)
    return provider, kept


def all_events(client: BioClient, **query) -> list[dict]:
    return list(client.iter_events(**query))


def post(gw, bearer: str | None, body: bytes, content_type: str | None = "application/json",
         encoding: str | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection(gw.endpoint.removeprefix("http://"), timeout=30)
    headers = {"Content-Length": str(len(body))}
    if bearer:
        headers["Authorization"] = bearer
    if content_type:
        headers["Content-Type"] = content_type
    if encoding:
        headers["Content-Encoding"] = encoding
    try:
        conn.request("POST", "/v1/traces", body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def json_span(span_id: str = SPAN_A, trace_id: str = TRACE, **attrs) -> dict:
    """One span in the OTLP/JSON encoding: hex ids, int64 as strings, camelCase."""
    attributes = [{"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}}
                  for k, v in attrs.items()]
    return {"traceId": trace_id, "spanId": span_id, "name": f"chat {attrs.get('gen_ai.request.model', '')}",
            "kind": 3, "startTimeUnixNano": "1796040000000000000",
            "endTimeUnixNano": "1796040001500000000", "attributes": attributes}


def json_body(*spans: dict) -> bytes:
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "billing-agent"}}]},
        "scopeSpans": [{"scope": {"name": "hand-made"}, "spans": list(spans)}]}]}).encode()


def messages(role: str, text: str, **extra) -> str:
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}], **extra}])


# -- the SDK exporter ----------------------------------------------------------------------


def emit_run(tracer, conversation: str, claimed_agent: str) -> None:
    """An agent run as a framework traces it: an agent span around a model call and a tool."""
    with tracer.start_as_current_span("invoke_agent billing", kind=SpanKind.INTERNAL, attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": claimed_agent,
            "gen_ai.agent.id": "asst_42", "gen_ai.conversation.id": conversation}):
        with tracer.start_as_current_span("chat gpt-4o", kind=SpanKind.CLIENT, attributes={
                "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                "gen_ai.request.model": "gpt-4o", "gen_ai.response.model": "gpt-4o-2024-08-06",
                "gen_ai.usage.input_tokens": 42, "gen_ai.usage.output_tokens": 9,
                "gen_ai.response.finish_reasons": ["tool_calls"],
                "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Be careful."}]),
                "gen_ai.input.messages": messages("user", "Pay invoice 2291"),
                "gen_ai.output.messages": messages("assistant", "Checking the ERP first.",
                                                   finish_reason="tool_calls")}):
            pass
        with tracer.start_as_current_span("execute_tool erp.lookup", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "erp.lookup",
                "gen_ai.tool.call.id": "call_VSPygqKTWdrhaFErNvMV18Yl",
                "gen_ai.tool.call.arguments": json.dumps({"invoice": 2291}),
                "gen_ai.tool.call.result": "already paid on 2026-11-02"}):
            pass
        with tracer.start_as_current_span("GET /erp/invoices/2291", kind=SpanKind.CLIENT,
                                          attributes={"http.request.method": "GET"}):
            pass  # not a GenAI span: skipped


def test_the_sdk_exporter_fills_the_callers_biography(gw, admin, agent, providers):
    name, bio, bearer = agent
    other = f"ot-{uuid.uuid4().hex[:8]}"
    other_keys = admin.create_agent(other)
    provider, kept = tracing(providers, exporter(gw, bearer))
    emit_run(provider.get_tracer("billing"), "inv-2291", claimed_agent=other)
    assert provider.force_flush(10_000)

    spans = {s.name: s for s in kept.get_finished_spans()}
    events = all_events(bio, session="inv-2291")
    assert [(e["kind"], e["role"]) for e in events] == [
        ("note", None), ("prompt", "system"), ("prompt", "user"), ("response", "assistant"),
        ("tool_call", "assistant"), ("tool_result", "tool")]
    assert {e["agent"] for e in events} == {name}
    assert all(e["tags"] == ["otel"] and e["data"]["agent_name"] == other for e in events)
    note, system, prompt, response, call, result = events

    agent_span, chat, tool = spans["invoke_agent billing"], spans["chat gpt-4o"], spans["execute_tool erp.lookup"]
    trace_id = format(chat.context.trace_id, "032x")
    assert note["content"] == f"invoke_agent {other}" and note["data"]["agent_id"] == "asst_42"
    assert note["span_id"] == format(agent_span.context.span_id, "016x")
    assert system["content"] == "Be careful."
    assert prompt["content"] == "Pay invoice 2291" and prompt["tokens_in"] == 42 and prompt["tokens_out"] is None
    assert response["content"] == "Checking the ERP first." and response["tokens_out"] == 9
    assert {prompt["model"], response["model"]} == {"gpt-4o-2024-08-06"}
    assert response["data"]["finish_reasons"] == ["tool_calls"] and response["data"]["provider"] == "openai"
    assert prompt["ts"] == format_ts(chat.start_time // 1000)
    assert response["ts"] == format_ts(chat.end_time // 1000)
    assert prompt["trace_id"] == trace_id and prompt["span_id"] == format(chat.context.span_id, "016x")
    assert prompt["data"]["parent_span_id"] == note["span_id"]
    assert call["tool"] == result["tool"] == "erp.lookup"
    assert call["data"]["arguments"] == {"invoice": 2291}
    assert call["data"]["tool_call_id"] == "call_VSPygqKTWdrhaFErNvMV18Yl"
    assert result["parent_id"] == call["event_id"] == f"otel:{trace_id}:{format(tool.context.span_id, '016x')}:tool_call"
    assert result["content"] == "already paid on 2026-11-02"
    assert all_events(bio) == events  # the HTTP span added nothing

    # the span named another agent, whose biography stays empty
    assert all_events(BioClient(gw.endpoint, other_keys["access_key"], other_keys["secret_key"])) == []

    # exporting the same spans again, plain and gzip, stores nothing twice
    finished = kept.get_finished_spans()
    for compression in (None, Compression.Gzip):
        again = exporter(gw, bearer, compression=compression)
        assert again.export(finished) == SpanExportResult.SUCCESS
        again.shutdown()
    BioClient(gw.endpoint, gw.access_key, gw.secret_key).compact()  # compacted Parquet too
    assert all_events(bio) == events


def test_failures_and_spans_without_a_conversation(gw, agent, providers):
    _, bio, bearer = agent
    provider, kept = tracing(providers, exporter(gw, bearer, compression=Compression.Gzip))
    tracer = provider.get_tracer("failing")
    with tracer.start_as_current_span("chat claude", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "claude-x",
            "gen_ai.usage.input_tokens": 5}) as span:
        span.set_attribute("error.type", "RateLimitError")
        span.set_status(Status(StatusCode.ERROR, "429 Too Many Requests"))
    with tracer.start_as_current_span("execute_tool shell", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "shell"}) as span:
        span.record_exception(RuntimeError("exit status 2"))
        span.set_status(Status(StatusCode.ERROR))
    with tracer.start_as_current_span("embeddings text-embedding-3", attributes={
            "gen_ai.operation.name": "embeddings", "gen_ai.request.model": "text-embedding-3"}):
        pass  # a GenAI operation with no biography meaning: skipped
    assert provider.force_flush(10_000)

    chat, tool = (s for s in kept.get_finished_spans() if s.name != "embeddings text-embedding-3")
    chat_session = f"otel-trace:{chat.context.trace_id:032x}"
    prompt, error = all_events(bio, session=chat_session)
    assert (prompt["kind"], prompt["model"], prompt["tokens_in"]) == ("prompt", "claude-x", 5)
    assert (error["kind"], error["content"]) == ("error", "429 Too Many Requests")
    assert error["data"]["error_type"] == "RateLimitError"
    call, failed = all_events(bio, session=f"otel-trace:{tool.context.trace_id:032x}")
    assert (call["kind"], failed["kind"], failed["content"]) == ("tool_call", "error", "exit status 2")
    assert failed["parent_id"] == call["event_id"] and failed["tool"] == "shell"
    assert len(all_events(bio)) == 4


def test_the_exporter_configured_by_environment_variables(gw, agent, providers, monkeypatch):
    """The README's no-code-change setup: only OTEL_* variables name the gateway and the key."""
    _, bio, bearer = agent
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{gw.endpoint}/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                       "Authorization=" + bearer.replace(" ", "%20"))
    provider, _ = tracing(providers, OTLPSpanExporter())
    with provider.get_tracer("env").start_as_current_span("create_agent helper", attributes={
            "gen_ai.operation.name": "create_agent", "gen_ai.agent.name": "helper",
            "gen_ai.request.model": "gpt-4o", "gen_ai.conversation.id": "setup"}):
        pass
    assert provider.force_flush(10_000)
    [state] = all_events(bio, session="setup")
    assert (state["kind"], state["content"], state["model"]) == ("state", "create_agent helper", "gpt-4o")


# -- OTLP/JSON by hand -----------------------------------------------------------------------


def test_json_encoding_with_a_partial_success(gw, agent):
    _, bio, bearer = agent
    good = json_span(SPAN_A, **{"gen_ai.operation.name": "text_completion",
                                "gen_ai.request.model": "llama-3", "gen_ai.usage.input_tokens": 3,
                                "gen_ai.usage.output_tokens": 4,
                                "gen_ai.input.messages": messages("user", "2+2?"),
                                "gen_ai.output.messages": messages("assistant", "4")})
    bad = json_span(SPAN_B, **{"gen_ai.operation.name": "chat", "gen_ai.request.model": "llama-3",
                               "gen_ai.conversation.id": "two\nlines"})
    status, headers, body = post(gw, bearer, json_body(good, bad))
    assert status == 200 and headers["content-type"] == "application/json"
    answer = json.loads(body)["partialSuccess"]
    assert answer["rejectedSpans"] == "1"
    assert SPAN_B in answer["errorMessage"] and '"session"' in answer["errorMessage"]
    assert headers["x-orgmem-events"] == "2" and headers["x-orgmem-spans-rejected"] == "1"

    prompt, response = all_events(bio)
    assert prompt["session"] == f"otel-trace:{TRACE}" and prompt["ts"] == "2026-11-30T12:00:00.000000Z"
    assert (prompt["content"], prompt["tokens_in"], response["content"], response["tokens_out"]) == \
        ("2+2?", 3, "4", 4)
    assert response["ts"] == "2026-11-30T12:00:01.500000Z" and prompt["data"]["service"] == "billing-agent"

    # the same request again, compressed: the same answer, nothing stored twice
    for encoded, encoding in ((gzip.compress(json_body(good, bad)), "gzip"),
                              (zlib.compress(json_body(good, bad)), "deflate")):
        status, _, body = post(gw, bearer, encoded, encoding=encoding)
        assert status == 200 and json.loads(body)["partialSuccess"]["rejectedSpans"] == "1"
    assert len(all_events(bio)) == 2


def test_a_span_the_mapping_cannot_take_is_rejected_alone(gw, agent):
    """Model output is anything: a tool_calls that is not a list, or JSON nested deeper than
    the encoder takes, once gave a 500 and lost every span of the batch."""
    _, bio, bearer = agent
    good = json_span(SPAN_A, **{"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                                "gen_ai.conversation.id": "odd", "gen_ai.input.messages": messages("user", "hi")})
    odd = json_span(SPAN_B, **{"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                               "gen_ai.conversation.id": "odd",
                               "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": "x",
                                                                      "tool_calls": 1}])})
    deep = json_span("cccccccccccccccc", **{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t",
                                            "gen_ai.conversation.id": "odd",
                                            "gen_ai.tool.call.arguments": "[" * 300 + "]" * 300})
    status, headers, body = post(gw, bearer, json_body(good, odd, deep))
    assert status == 200, body
    assert json.loads(body)["partialSuccess"]["rejectedSpans"] == "2"
    kept = all_events(bio, session="odd")  # the good span's prompt and (empty) response
    assert kept[0]["content"] == "hi" and all(e["content"] in ("hi", None) for e in kept)


def test_a_fully_accepted_protobuf_request_answers_an_empty_response(gw, agent, providers):
    _, bio, bearer = agent
    provider, kept = tracing(providers, InMemorySpanExporter())
    with provider.get_tracer("t").start_as_current_span("chat m", attributes={
            "gen_ai.operation.name": "generate_content", "gen_ai.request.model": "gemini"}):
        pass
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    body = encode_spans(kept.get_finished_spans()).SerializeToString()
    status, headers, answer = post(gw, bearer, body, "application/x-protobuf")
    assert status == 200 and headers["content-type"] == "application/x-protobuf"
    assert ExportTraceServiceResponse.FromString(answer) == ExportTraceServiceResponse()
    assert [e["kind"] for e in all_events(bio)] == ["prompt", "response"]


# -- bad input -------------------------------------------------------------------------------


BAD = [
    pytest.param(b"\xff\xff\xff\xff", "application/x-protobuf", None, 400, "InvalidTraces",
                 "not a protobuf ExportTraceServiceRequest", id="malformed-protobuf"),
    pytest.param(json_body(json_span()), "text/plain", None, 415, "UnsupportedMediaType",
                 "application/x-protobuf or application/json", id="wrong-content-type"),
    pytest.param(json_body(json_span()), None, None, 415, "UnsupportedMediaType", "none was sent",
                 id="no-content-type"),
    pytest.param(json_body(json_span(trace_id="not-hex-at-all-not-hex-at-all-xx")), "application/json",
                 None, 400, "InvalidTraces", "spans[0].traceId: must be 32 hexadecimal digits",
                 id="json-non-hex-trace-id"),
    pytest.param(json_body(json_span(span_id="abc")), "application/json", None, 400, "InvalidTraces",
                 "spans[0].spanId: must be 16 hexadecimal digits", id="json-short-span-id"),
    pytest.param(json_body(json_span(trace_id="0" * 32)), "application/json", None, 400, "InvalidTraces",
                 "must not be all zeros", id="json-zero-trace-id"),
    pytest.param(json_body(json_span(span_id="")), "application/json", None, 400, "InvalidTraces",
                 "spans[0].spanId: must be 8 bytes", id="json-missing-span-id"),
    pytest.param(b'{"resourceSpans": [', "application/json", None, 400, "InvalidTraces",
                 "not valid JSON", id="invalid-json"),
    pytest.param(b'[{"resourceSpans": []}]', "application/json", None, 400, "InvalidTraces",
                 "must be a JSON object", id="json-array"),
    pytest.param(json_body(dict(json_span(), startTimeUnixNano="yesterday")), "application/json", None,
                 400, "InvalidTraces", "startTimeUnixNano", id="json-bad-int64"),
    pytest.param(json_body(json_span()), "application/json", "br", 415, "UnsupportedMediaType",
                 "Content-Encoding 'br'", id="unsupported-encoding"),
    pytest.param(gzip.compress(json_body(json_span()))[:-12], "application/json", "gzip", 400,
                 "InvalidTraces", "truncated", id="truncated-gzip"),
    pytest.param(b"not gzip at all", "application/json", "gzip", 400, "InvalidTraces",
                 "not valid gzip", id="not-gzip"),
    pytest.param(gzip.compress(bytes(17 * 1024 * 1024)), "application/x-protobuf", "gzip", 413,
                 "EntityTooLarge", "decompresses to more than", id="gzip-bomb"),
    pytest.param(gzip.compress(b"") * 100_000, "application/json", "gzip", 400, "InvalidTraces",
                 "members", id="gzip-members"),
]


@pytest.mark.parametrize("body, content_type, encoding, status, code, needle", BAD)
def test_bad_requests_are_refused_whole(gw, agent, body, content_type, encoding, status, code, needle):
    _, bio, bearer = agent
    got, _, answer = post(gw, bearer, body, content_type, encoding)
    error = json.loads(answer)["error"]
    assert (got, error["code"]) == (status, code), error
    assert needle in error["message"]
    assert all_events(bio) == []


def test_an_oversized_body_is_refused(gw, agent):
    _, bio, bearer = agent
    body = json_body(json_span(**{"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}))
    body = body[:-1] + b", " + b'"padding": "' + b"x" * (16 * 1024 * 1024) + b'"}'
    status, _, answer = post(gw, bearer, body)
    assert status == 413 and json.loads(answer)["error"]["code"] == "EntityTooLarge"
    assert all_events(bio) == []


def test_only_callers_allowed_to_write_their_biography_may_export(gw, admin):
    body = json_body(json_span(**{"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}))
    status, _, answer = post(gw, None, body)
    assert status == 403 and json.loads(answer)["error"]["code"] == "AccessDenied"
    reader = admin.create_agent(f"ot-{uuid.uuid4().hex[:8]}", policies=["readonly"])
    status, _, answer = post(gw, f"Bearer {reader['access_key']}:{reader['secret_key']}", body)
    assert status == 403 and "bio:PutEvents" in json.loads(answer)["error"]["message"]
    assert all_events(BioClient(gw.endpoint, reader["access_key"], reader["secret_key"])) == []


# -- older conventions and big values --------------------------------------------------------


def test_older_span_events_and_values_over_the_event_limits(gw, agent, providers):
    """Instrumentations on semconv 1.36 or before record messages as span events; a tool
    result over 1 MiB is cut rather than losing the span."""
    _, bio, bearer = agent
    provider, _ = tracing(providers, exporter(gw, bearer))
    tracer = provider.get_tracer("legacy")
    with tracer.start_as_current_span("chat gpt-3.5-turbo", attributes={
            "gen_ai.system": "openai", "gen_ai.request.model": "gpt-3.5-turbo",
            "gen_ai.usage.prompt_tokens": 11, "gen_ai.usage.completion_tokens": 2,
            "gen_ai.conversation.id": "legacy"}) as span:
        span.add_event("gen_ai.system.message", {"content": "You are terse."})
        span.add_event("gen_ai.user.message", {"gen_ai.event.content": json.dumps({"content": "Hi?"})})
        span.add_event("gen_ai.choice", {"index": 0, "finish_reason": "stop", "message": json.dumps(
            {"role": "assistant", "content": "Hello.", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "wave", "arguments": "{}"}}]})})
    with tracer.start_as_current_span("text_completion davinci", attributes={
            "gen_ai.operation.name": "text_completion", "gen_ai.request.model": "davinci",
            "gen_ai.conversation.id": "legacy"}) as span:
        span.add_event("gen_ai.content.prompt", {"gen_ai.prompt": json.dumps(
            [{"role": "user", "content": [{"type": "text", "text": "Once upon"}]}])})
        span.add_event("gen_ai.content.completion", {"gen_ai.completion": "a time"})
    with tracer.start_as_current_span("execute_tool cat", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "cat",
            "gen_ai.conversation.id": "legacy",
            "gen_ai.tool.call.result": "é" * (700 * 1024)}):  # 1.4 MB of UTF-8
        pass
    assert provider.force_flush(10_000)

    events = all_events(bio, session="legacy")
    by_content = {e["content"][:20]: e for e in events if e["content"]}
    prompt, response = by_content["Hi?"], by_content["Hello."]
    assert (prompt["kind"], prompt["role"], prompt["tokens_in"], prompt["data"]["provider"]) == \
        ("prompt", "user", 11, "openai")
    assert [m["role"] for m in prompt["data"]["messages"]] == ["system", "user"]
    assert (response["kind"], response["tokens_out"]) == ("response", 2)
    [message] = response["data"]["messages"]
    assert message["finish_reason"] == "stop"
    assert message["parts"][1] == {"type": "tool_call", "id": "c1", "name": "wave", "arguments": {}}
    assert by_content["Once upon"]["kind"] == "prompt" and by_content["a time"]["kind"] == "response"
    result = next(e for e in events if e["kind"] == "tool_result")
    assert result["content"].endswith(" [truncated]") and len(result["content"].encode()) <= 1024 * 1024
    assert result["data"]["content_bytes"] == 1400 * 1024
