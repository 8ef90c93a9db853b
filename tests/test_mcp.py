"""The MCP tools against a real gateway, with the ``mcp`` package's own client: over stdio
(``orgmem mcp`` as a subprocess) and over streamable HTTP (the gateway's /mcp with a bearer
token). Memory, biography, context, skills and workspace files; bad input (a tool error,
nothing written); authentication and audit of /mcp."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from servers import BIN, ROOT, Gateway

import orgmem
from gateway.admin_client import AdminClient
from orgmem.errors import NotFound

TOOLS = {"search_memory", "remember", "recall", "log_event", "get_context", "list_skills", "get_skill",
         "read_workspace_file", "write_workspace_file"}
#: The gateway and ``orgmem mcp`` import the SDK package (orgmem/) from the checkout: needed only
#: while the venv's editable install predates orgmem* in pyproject's packages (make reinstalls).
SDK_PATH = {"PYTHONPATH": str(ROOT)}
#: How long search may take to see a write (it is eventually consistent within about a second).
SEARCH_DEADLINE = 15.0
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("mcp") / "data", env=SDK_PATH).start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin(gw):
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


@dataclass
class Agent:
    name: str
    access_key: str
    secret_key: str = field(repr=False)  # never in a failure's output
    sdk: orgmem.Client

    @property
    def scope(self) -> str:
        return f"agent:{self.name}"

    @property
    def bucket(self) -> str:
        return f"agent-{self.name}"


@pytest.fixture
def agent(gw, admin):
    yield from _agent(gw, admin)


@pytest.fixture
def other(gw, admin):
    yield from _agent(gw, admin)


def _agent(gw, admin):
    name = f"ag-{uuid.uuid4().hex[:8]}"
    created = admin.create_agent(name)
    sdk = orgmem.Client(gw.endpoint, created["access_key"], created["secret_key"])
    yield Agent(name, created["access_key"], created["secret_key"], sdk)
    sdk.close()


# --------------------------------------------------------------------------- the two transports


@asynccontextmanager
async def http_session(gw: Gateway, authorization: str, ca: str | None = None, **headers: str):
    verify = ssl.create_default_context(cafile=ca) if ca else True
    async with httpx2.AsyncClient(headers={"Authorization": authorization, **headers}, timeout=60,
                                  verify=verify) as http:
        async with streamable_http_client(gw.endpoint + "/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=60) as session:
                await session.initialize()
                yield session


@asynccontextmanager
async def stdio_session(gw: Gateway, access_key: str, secret_key: str, errlog):
    params = StdioServerParameters(command=str(BIN / "orgmem"), args=["mcp"], cwd=str(ROOT), env={
        "ORGMEM_ENDPOINT": gw.endpoint, "ORGMEM_ACCESS_KEY": access_key, "ORGMEM_SECRET_KEY": secret_key,
        **SDK_PATH})
    async with stdio_client(params, errlog=errlog) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=60) as session:
            await session.initialize()
            yield session


@pytest.fixture(params=["stdio", "http"])
def connect(request, gw, tmp_path):
    """``connect(agent)``: an initialized ClientSession as that agent, over either transport."""
    errlog = open(tmp_path / "mcp-stderr.log", "w")  # noqa: SIM115 - closed below
    if request.param == "http":
        def connect(a: Agent):
            return http_session(gw, f"Bearer {a.access_key}:{a.secret_key}")
    else:
        def connect(a: Agent):
            return stdio_session(gw, a.access_key, a.secret_key, errlog)
    yield connect
    errlog.close()


def run(scenario, *args) -> None:
    """Run an async scenario; a failure inside the clients' task groups is raised as itself."""
    async def bounded():
        with anyio.fail_after(120):
            await scenario(*args)
    try:
        anyio.run(bounded)
    except BaseExceptionGroup as group:
        raise _first(group) from None


def _first(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


async def ok(session: ClientSession, tool: str, args: dict):
    """The tool's answer: its structured content, or its text."""
    result = await session.call_tool(tool, args)
    text = result.content[0].text if result.content else ""
    assert not result.is_error, f"{tool} failed: {text}"
    return result.structured_content if result.structured_content is not None else text


async def fails(session: ClientSession, tool: str, args: dict) -> str:
    """The tool error's text (the call must fail as a tool error, not a protocol error)."""
    result = await session.call_tool(tool, args)
    text = result.content[0].text if result.content else ""
    assert result.is_error, f"{tool} should have failed: {text}"
    return text


async def searched(session: ClientSession, query: str, title: str) -> dict:
    deadline = time.monotonic() + SEARCH_DEADLINE
    while True:
        found = await ok(session, "search_memory", {"query": query, "type": "memory"})
        hits = [h for h in found["hits"] if h["title"] == title]
        if hits:
            return hits[0]
        assert time.monotonic() < deadline, f"search never found {title!r}: {found}"
        await anyio.sleep(0.2)


# --------------------------------------------------------------------------- tools


def test_tools_are_described_for_a_model(connect, agent):
    async def scenario():
        async with connect(agent) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == TOOLS
            for tool in tools.values():
                assert tool.description and len(tool.description) > 40, tool.name
                schema = tool.input_schema
                assert schema["type"] == "object" and schema["additionalProperties"] is False
                for arg, prop in schema["properties"].items():
                    assert prop.get("description"), f"{tool.name}.{arg} has no description"
            assert tools["search_memory"].input_schema["required"] == ["query"]
            assert set(tools["log_event"].input_schema["required"]) == {"session", "kind", "content"}
            assert "ctx" not in tools["recall"].input_schema["properties"]
    run(scenario)


def test_remember_recall_search_and_supersede(connect, agent):
    tag = uuid.uuid4().hex[:8]
    title = f"Deploys happen on weekdays {tag}"

    async def scenario():
        async with connect(agent) as s:
            saved = await ok(s, "remember", {"title": title, "body": "Never deploy on a Friday.",
                                             "kind": "decision", "tags": ["deploys"],
                                             "rationale": "Friday deploys broke billing twice."})
            assert saved == {"scope": agent.scope, "id": f"deploys-happen-on-weekdays-{tag}",
                             "version": 1, "status": "active"}
            digest = await ok(s, "recall", {})
            assert title in digest and "Never deploy on a Friday." in digest
            hit = await searched(s, f"weekdays {tag}", title)
            assert hit["source"] == f"memory:agents/{agent.name}/{saved['id']}" and hit["status"] == "active"

            new_title = f"Deploys happen Monday to Thursday {tag}"
            newer = await ok(s, "remember", {"title": new_title, "body": "Not on Fridays, not on weekends.",
                                             "kind": "decision", "id": f"deploy-days-{tag}",
                                             "supersedes": saved["id"]})
            assert newer["id"] == f"deploy-days-{tag}" and newer["status"] == "active"
            digest = await ok(s, "recall", {})
            assert new_title in digest and title not in digest
            # revised again and again under one title, with no id given: each gets its own
            latest = newer["id"]
            for n in range(2):
                revised = await ok(s, "remember", {"title": new_title, "body": f"Revision {n}.",
                                                   "kind": "decision", "supersedes": latest})
                assert revised["status"] == "active" and revised["id"] != latest
                latest = revised["id"]
        # the gateway holds what the tools said, with the agent as the author
        old = agent.sdk.get_memory(agent.scope, saved["id"])
        assert old["status"] == "superseded" and old["superseded_by"] == f"deploy-days-{tag}"
        assert old["created_by"] == agent.name and old["rationale"] == "Friday deploys broke billing twice."
    run(scenario)


def test_log_event_then_get_context(connect, agent):
    session_id = f"inv-{uuid.uuid4().hex[:6]}"

    async def scenario():
        async with connect(agent) as s:
            asked = await ok(s, "log_event", {"session": session_id, "kind": "question",
                                              "content": "Why do nightly uploads fail?"})
            assert asked["event_id"].startswith("ev_") and asked["session"] == session_id
            await ok(s, "log_event", {"session": session_id, "kind": "tool_call", "tool": "s3.put",
                                      "content": "put the nightly batch", "data": {"attempt": 3},
                                      "tags": ["uploads"]})
            pack = await ok(s, "get_context", {"session": session_id, "query": "nightly uploads",
                                               "budget_tokens": 1000})
            assert "Why do nightly uploads fail?" in pack
            assert f"bio:{agent.name}/{asked['event_id']}" in pack
        events = agent.sdk.events(session=session_id)
        assert [e["kind"] for e in events] == ["question", "tool_call"]
        assert events[1]["data"] == {"attempt": 3} and events[1]["tool"] == "s3.put"
    run(scenario)


def test_workspace_files(connect, agent):
    text = "# Plan\n\nShip the café menu — 100 % tested.\n"

    async def scenario():
        async with connect(agent) as s:
            # the agent's own bucket does not exist yet: the first write creates it
            written = await ok(s, "write_workspace_file", {"key": "notes/plan.md", "content": text})
            assert written["bucket"] == agent.bucket and written["size"] == len(text.encode())
            read = await ok(s, "read_workspace_file", {"key": "notes/plan.md"})
            assert read["content"] == text and read["bucket"] == agent.bucket
            # explicit bucket, and a key with spaces
            await ok(s, "write_workspace_file", {"bucket": agent.bucket, "key": "a b/c.txt", "content": "x"})
            assert (await ok(s, "read_workspace_file", {"bucket": agent.bucket, "key": "a b/c.txt"}))["content"] == "x"
            # what other tools put there: binary, and too big for a model
            agent.sdk.write_file(agent.bucket, "logo.png", b"\x89PNG\r\n\x1a\n\x00\x00binary")
            assert "binary" in await fails(s, "read_workspace_file", {"key": "logo.png"})
            agent.sdk.write_file(agent.bucket, "big.txt", b"a" * (MIB + 1))
            assert "1,048,577 bytes" in await fails(s, "read_workspace_file", {"key": "big.txt"})
            missing = await fails(s, "read_workspace_file", {"key": "nope.md"})
            assert "NoSuchKey" in missing
        assert bytes(agent.sdk.read_file(agent.bucket, "notes/plan.md")) == text.encode()
    run(scenario)


def test_skills(connect, agent, gw):
    name = f"reconcile-{uuid.uuid4().hex[:6]}"
    skill_md = (f"---\nname: {name}\ndescription: Match vendor invoices to purchase orders.\n---\n\n"
                "1. Export the invoices.\n2. Run scripts/match.py.\n")
    with orgmem.Client(gw.endpoint, gw.access_key, gw.secret_key) as root:
        root.put_skill("org", name, {"SKILL.md": skill_md, "scripts/match.py": "print('match')\n",
                                     "assets/logo.bin": b"\x00\x01\x02"})

    async def scenario():
        async with connect(agent) as s:
            listed = await ok(s, "list_skills", {"q": "vendor invoices"})
            assert [k["name"] for k in listed["skills"] if k["name"] == name] == [name]
            skill = await ok(s, "get_skill", {"name": name})
            assert skill["scope"] == "org" and skill["version"] == 1 and skill["content"] == skill_md
            assert sorted(skill["files"]) == ["SKILL.md", "assets/logo.bin", "scripts/match.py"]
            script = await ok(s, "get_skill", {"name": name, "scope": "org", "path": "scripts/match.py"})
            assert script["content"] == "print('match')\n"
            assert "binary" in await fails(s, "get_skill", {"name": name, "path": "assets/logo.bin"})
            assert "NoSuchSkill" in await fails(s, "get_skill", {"name": f"absent-{name}"})
    run(scenario)


# --------------------------------------------------------------------------- bad input


def test_bad_arguments_are_tool_errors_and_write_nothing(connect, agent):
    async def scenario():
        async with connect(agent) as s:
            # an unknown argument: refused, not ignored
            msg = await fails(s, "remember", {"title": "Unknown arg", "body": "b", "id": "unknown-arg",
                                              "colour": "red"})
            assert "unknown argument 'colour'" in msg and "Nothing was done" in msg
            # wrong types: no coercion ("5" is not a number, a string is not a list)
            msg = await fails(s, "remember", {"title": 5, "body": "b", "id": "wrong-type"})
            assert "'title'" in msg and "string" in msg
            assert "'tags'" in await fails(s, "remember", {"title": "t", "body": "b", "id": "wrong-tags",
                                                          "tags": "deploys"})
            assert "'limit'" in await fails(s, "search_memory", {"query": "x", "limit": "5"})
            assert "'limit'" in await fails(s, "search_memory", {"query": "x", "limit": 500})
            assert "'kind'" in await fails(s, "remember", {"title": "t", "body": "b", "id": "bad-kind",
                                                          "kind": "rumour"})
            assert "missing required argument 'content'" in await fails(
                s, "log_event", {"session": "s", "kind": "note"})
            assert "'budget_tokens'" in await fails(s, "get_context", {"budget_tokens": 10})
            assert "'budget_tokens'" in await fails(s, "get_context", {"budget_tokens": True})
            assert "'content_type'" in await fails(s, "write_workspace_file", {
                "key": "a.md", "content": "x", "content_type": "text/plain\r\nX-Injected: 1"})
            # the gateway's own checks come back as tool errors too
            assert "InvalidArgument" in await fails(s, "remember", {"title": "t", "body": "b",
                                                                   "scope": "everyone"})
            assert "not a document id" in await fails(s, "remember", {"title": "t", "body": "b",
                                                                     "id": "Not An Id"})
            assert "Unknown tool" in await fails(s, "forget_everything", {})
        for doc_id in ("unknown-arg", "wrong-type", "wrong-tags", "bad-kind"):
            with pytest.raises(NotFound):
                agent.sdk.get_memory(agent.scope, doc_id)
    run(scenario)


def test_oversized_payloads_write_nothing(connect, agent):
    async def scenario():
        async with connect(agent) as s:
            msg = await fails(s, "write_workspace_file", {"key": "huge.md", "content": "a" * (MIB + 1)})
            assert "1,048,577 bytes" in msg and "Nothing was written" in msg
            # 1 MiB of text is fine, as long as it is text
            await ok(s, "write_workspace_file", {"key": "max.md", "content": "é" * (MIB // 2)})
            assert "NUL" in await fails(s, "write_workspace_file", {"key": "nul.md", "content": "a\x00b"})
            assert "1024 bytes" in await fails(s, "write_workspace_file", {"key": "k" * 1025, "content": "x"})
            session_id = f"big-{uuid.uuid4().hex[:6]}"
            msg = await fails(s, "log_event", {"session": session_id, "kind": "note", "content": "a" * (MIB + 1)})
            assert "InvalidEvent" in msg and "content" in msg
            assert "EntityTooLarge" in await fails(s, "remember", {"title": "big", "body": "a" * (300 * 1024),
                                                                   "id": "too-big"})
            assert "'query'" in await fails(s, "search_memory", {"query": "q" * 5000})
        with pytest.raises(NotFound):
            agent.sdk.read_file(agent.bucket, "huge.md")
        with pytest.raises(NotFound):
            agent.sdk.read_file(agent.bucket, "nul.md")
        with pytest.raises(NotFound):
            agent.sdk.get_memory(agent.scope, "too-big")
        assert agent.sdk.events(session=session_id) == []
    run(scenario)


def test_another_agents_data_is_access_denied(connect, agent, other):
    other.sdk.create_bucket(other.bucket)
    other.sdk.write_file(other.bucket, "private.md", "other's notes")

    async def scenario():
        async with connect(agent) as s:
            for tool, args in [
                ("read_workspace_file", {"bucket": other.bucket, "key": "private.md"}),
                ("write_workspace_file", {"bucket": other.bucket, "key": "planted.md", "content": "x"}),
                ("remember", {"title": "t", "body": "b", "id": "planted", "scope": other.scope}),
                ("recall", {"agent": other.name}),
                ("get_skill", {"name": "anything", "scope": other.scope}),
            ]:
                assert "AccessDenied" in await fails(s, tool, args), tool
    run(scenario)
    assert bytes(other.sdk.read_file(other.bucket, "private.md")) == b"other's notes"
    with pytest.raises(NotFound):
        other.sdk.read_file(other.bucket, "planted.md")
    with pytest.raises(NotFound):
        other.sdk.get_memory(other.scope, "planted")


# --------------------------------------------------------------------------- /mcp over HTTP


def _post_mcp(gw: Gateway, authorization: str | None) -> tuple[int, dict, dict]:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}}}).encode()
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if authorization is not None:
        headers["authorization"] = authorization
    req = urllib.request.Request(gw.endpoint + "/mcp", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def test_http_needs_a_valid_bearer_token(gw, admin, agent):
    secret = agent.secret_key
    for authorization, code in [(None, "AccessDenied"), (f"Bearer {agent.access_key}:wrong-secret-123",
                                                         "SignatureDoesNotMatch"),
                                ("Bearer AKNOSUCHKEY000000000:whatever", "InvalidAccessKeyId"),
                                ("Bearer no-colon", "InvalidRequest"),
                                ("AWS4-HMAC-SHA256 Credential=x/y", "AccessDenied")]:
        status, headers, body = _post_mcp(gw, authorization)
        assert status == 401, (authorization, body)
        assert body["error"]["code"] == code and body["error"]["message"]
        assert headers.get("www-authenticate", "").startswith("Bearer")
    status, _, body = _post_mcp(gw, f"Bearer {agent.access_key}:{secret}")
    assert status == 200 and body["result"]["serverInfo"]["name"] == "orgmem"

    admin.disable_agent(agent.name)
    status, _, body = _post_mcp(gw, f"Bearer {agent.access_key}:{secret}")
    assert status == 401 and "disabled" in body["error"]["message"]
    admin.enable_agent(agent.name)

    async def with_wrong_token():
        async with http_session(gw, f"Bearer {agent.access_key}:wrong-secret-123"):
            pass
    with pytest.raises(MCPError):  # the SDK client's word for an HTTP error answer
        run(with_wrong_token)
    # the refusals are audited, naming the access key claimed; no secret is ever logged
    deadline = time.monotonic() + 10
    while True:
        records = admin.audit(principal=agent.name, denied=True)["records"]
        if any(r.get("operation") == "McpRequest" for r in records):
            break
        assert time.monotonic() < deadline, records
        time.sleep(0.3)
    assert secret not in gw.log()


def test_http_request_body_limit(gw, agent):
    """A request beyond /mcp's 8 MiB body limit is refused by the transport (413, which the SDK
    client reports as an error response); nothing is written."""
    async def scenario():
        async with http_session(gw, f"Bearer {agent.access_key}:{agent.secret_key}") as s:
            with pytest.raises(MCPError):
                await s.call_tool("write_workspace_file", {"key": "huge.md", "content": "a" * (9 * MIB)})
            await ok(s, "recall", {})  # the session goes on
    run(scenario)
    with pytest.raises(NotFound):
        agent.sdk.read_file(agent.bucket, "huge.md")


def test_tool_calls_are_the_callers_audited_rest_calls(gw, admin, agent):
    async def scenario():
        async with http_session(gw, f"Bearer {agent.access_key}:{agent.secret_key}") as s:
            await ok(s, "remember", {"title": "Audited", "body": "b", "id": "audited"})
    run(scenario)
    records = admin.audit(principal=agent.name)["records"]
    puts = [r for r in records if r.get("operation") == "PutDocument"]
    assert puts and puts[-1]["resource"] == f"arn:orgmem:memory:::agent/{agent.name}/audited"
    assert puts[-1]["decision"] == "allow"


def test_tool_calls_come_from_the_callers_address(tmp_path):
    """Tool calls run in process with the MCP request's own client address, so audit records
    name it and aws:SourceIp conditions apply to it (behind a trusted proxy: X-Forwarded-For)."""
    gw = Gateway(tmp_path / "data", env=SDK_PATH, extra_args=["--trusted-proxies", "127.0.0.1"]).start()
    try:
        admin = AdminClient(gw.endpoint, gw.access_key, gw.secret_key)
        created = admin.create_agent("ip-agent")
        admin.put_policy("no-lab-net", {"Version": "2012-10-17", "Statement": [{
            "Effect": "Deny", "Action": "memory:PutDocument", "Resource": "*",
            "Condition": {"IpAddress": {"aws:SourceIp": "198.51.100.0/24"}}}]})
        admin.attach_policy("no-lab-net", agent="ip-agent")
        bearer = f"Bearer {created['access_key']}:{created['secret_key']}"

        async def scenario():
            async with http_session(gw, bearer, **{"X-Forwarded-For": "203.0.113.7"}) as s:
                await ok(s, "remember", {"title": "From afar", "body": "b", "id": "afar"})
            async with http_session(gw, bearer, **{"X-Forwarded-For": "198.51.100.9"}) as s:
                assert "AccessDenied" in await fails(s, "remember", {"title": "Lab", "body": "b", "id": "lab"})
        run(scenario)
        records = admin.audit(principal="ip-agent")["records"]
        puts = {r["remote_addr"]: r["decision"] for r in records if r.get("operation") == "PutDocument"}
        assert puts == {"203.0.113.7": "allow", "198.51.100.9": "deny"}
    finally:
        gw.stop()


def test_https_gateway(tmp_path, tls_files):
    """Over TLS: the MCP client checks the gateway's certificate; the tools call the gateway in
    process, so they need no CA of their own."""
    gw = Gateway(tmp_path / "data", tls=(tls_files["cert"], tls_files["key"]),
                 env=SDK_PATH).start()
    try:
        admin = AdminClient(gw.endpoint, gw.access_key, gw.secret_key, ca_file=tls_files["ca"])
        created = admin.create_agent("tls-agent")

        async def scenario():
            async with http_session(gw, f"Bearer {created['access_key']}:{created['secret_key']}",
                                    ca=tls_files["ca"]) as s:
                await ok(s, "remember", {"title": "Over TLS", "body": "works", "id": "over-tls"})
                assert "Over TLS" in await ok(s, "recall", {})
        run(scenario)
    finally:
        gw.stop()


def test_mcp_is_a_reserved_path_not_a_bucket(gw, agent):
    """No bucket can be named mcp (like v1 and admin), so /mcp is always the MCP endpoint:
    without a bearer token it answers 401 with a JSON error, and a request that is not MCP is a
    4xx from the MCP transport."""
    req = urllib.request.Request(gw.endpoint + "/mcp", method="GET")
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(req, timeout=30)
    assert anonymous.value.code == 401
    assert json.loads(anonymous.value.read())["error"]["code"] == "AccessDenied"
    req = urllib.request.Request(gw.endpoint + "/mcp", data=b"{}", method="POST", headers={
        "authorization": f"Bearer {agent.access_key}:{agent.secret_key}", "content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as not_mcp:
        urllib.request.urlopen(req, timeout=30)
    assert 400 <= not_mcp.value.code < 500


def test_stdio_without_credentials_says_what_is_missing(tmp_path):
    from clients import clean_env
    from clients import run as run_cmd

    env = {k: v for k, v in clean_env(**SDK_PATH).items() if not k.startswith("ORGMEM_")}
    proc = run_cmd([BIN / "orgmem", "mcp"], env, check=False, timeout=60, input="")
    assert proc.returncode != 0
    assert "ORGMEM_" in proc.stderr and proc.stdout == ""


def test_stdio_logs_no_secret(gw, agent, tmp_path):
    errlog_path = tmp_path / "stderr.log"

    async def scenario():
        with open(errlog_path, "w") as errlog:
            async with stdio_session(gw, agent.access_key, agent.secret_key, errlog) as s:
                await fails(s, "read_workspace_file", {"bucket": "agent-nobody-here", "key": "x"})
                await ok(s, "recall", {})
    run(scenario)
    assert agent.secret_key not in Path(errlog_path).read_text()
