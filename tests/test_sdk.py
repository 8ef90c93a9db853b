"""The Python SDK (``orgmem``) against a real gateway: every method family as an agent made with
AdminClient, the batched logger under threads, the async client, how errors map to exceptions
(and never carry a secret), its SigV4 signer against the gateway's own verifier, and that the
package imports without any of the server's dependencies."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from clients import clean_env
from servers import ROOT, Gateway, free_port

import orgmem
from gateway.admin_client import AdminClient
from gateway.s3 import sigv4 as gateway_sigv4
from orgmem import (
    AccessDenied,
    AsyncClient,
    Client,
    InvalidRequest,
    Memory,
    NotFound,
    OrgmemError,
    PreconditionFailed,
    Unavailable,
    _sigv4,
)

#: Generous: only how long a poll for an asynchronous effect (the search index) may go on.
PATIENCE = 30.0


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_for(probe, what: str):
    end = time.monotonic() + PATIENCE
    last = None
    while time.monotonic() < end:
        last = probe()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {PATIENCE} s (last: {last!r})")


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("sdk") / "data").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin(gw):
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


@pytest.fixture(scope="module")
def agent(admin):
    name = uid("sdk")
    return admin.create_agent(name)


@pytest.fixture(scope="module")
def om(gw, agent):
    client = Client(gw.endpoint, agent["access_key"], agent["secret_key"])
    yield client
    client.close()


@pytest.fixture(scope="module")
def root(gw):
    client = Client(gw.endpoint, gw.access_key, gw.secret_key)
    yield client
    client.close()


# -- configuration ---------------------------------------------------------------------------


def test_configuration_comes_from_arguments_or_environment(gw, agent, monkeypatch):
    monkeypatch.setenv("ORGMEM_ENDPOINT", gw.endpoint)
    monkeypatch.setenv("ORGMEM_ACCESS_KEY", agent["access_key"])
    monkeypatch.setenv("ORGMEM_SECRET_KEY", agent["secret_key"])
    with Client() as client:
        assert client.whoami()["name"] == agent["name"]
        assert agent["secret_key"] not in repr(client)
        assert repr(client) == f"Client(endpoint={gw.endpoint!r}, access_key={agent['access_key']!r})"

    monkeypatch.delenv("ORGMEM_SECRET_KEY")
    with pytest.raises(OrgmemError) as missing:
        Client()
    assert missing.value.code == "NoCredentials" and "ORGMEM_SECRET_KEY" in missing.value.message
    with pytest.raises(OrgmemError) as half:
        Client(gw.endpoint, agent["access_key"])
    assert half.value.code == "NoCredentials"
    monkeypatch.delenv("ORGMEM_ENDPOINT")
    with pytest.raises(OrgmemError) as no_endpoint:
        Client(access_key="a", secret_key="b")
    assert no_endpoint.value.code == "NoEndpoint" and "ORGMEM_ENDPOINT" in no_endpoint.value.message
    for bad in ("ftp://127.0.0.1", "127.0.0.1:9000", "http://user:pw@127.0.0.1", "http://h:99999"):
        with pytest.raises(OrgmemError) as invalid:
            Client(bad, "a", "b")
        assert invalid.value.code == "InvalidEndpoint" and "pw" not in str(invalid.value)


def test_whoami(om, agent):
    me = om.whoami()
    assert me["name"] == agent["name"] and me["kind"] == "agent" and not me["is_root"]


# -- biographies -----------------------------------------------------------------------------


def test_put_events_then_read_them_back(om, agent):
    session = uid("s")
    ids = om.put_events([{"session": session, "kind": "prompt", "role": "user", "content": "hello"},
                         {"session": session, "kind": "question", "event_id": "q1", "content": "why?"},
                         {"session": session, "kind": "note", "data": {"n": 1}, "tags": ["a"]}])
    assert len(ids) == 3 and ids[1] == "q1"
    assert om.put_events([]) == []
    events = om.events(session=session)
    assert [e["event_id"] for e in events] == ids
    assert events[2]["data"] == {"n": 1} and events[0]["agent"] == agent["name"]
    assert [e["kind"] for e in om.events(session=session, kinds=["question", "note"])] == ["question", "note"]
    assert len(om.events(session=session, limit=2)) == 2
    assert len(om.events(agent=agent["name"], session=session, since="1h")) == 3
    assert om.events(session=session, until="2000-01-01T00:00:00Z") == []
    sessions = {s["session"]: s for s in om.sessions()}
    assert sessions[session]["open_questions"][0]["event_id"] == "q1"
    with pytest.raises(InvalidRequest):
        om.events(limit=0)
    with pytest.raises(InvalidRequest):
        om.events(kinds=["nonsense"])


def test_logger_from_four_threads_stores_every_event_exactly_once(om):
    session = uid("threads")
    returned: list[str] = []
    lock = threading.Lock()

    def work(n: int) -> None:
        mine = [om.log_event(session, "note", f"thread {n} event {i}", seq=n * 1000 + i) for i in range(250)]
        with lock:
            returned.extend(mine)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    om.flush()
    stored = om.events(session=session)
    assert len(stored) == 1000
    assert sorted(e["event_id"] for e in stored) == sorted(returned)
    assert len({e["content"] for e in stored}) == 1000
    assert [e["seq"] for e in stored] == sorted(e["seq"] for e in stored)


def test_a_refused_event_costs_only_itself_and_flush_raises_it(om):
    session = uid("refused")
    good = [om.log_event(session, "note", f"fine {i}") for i in range(3)]
    bad = om.log_event(session, "note", "x" * (1024 * 1024 + 1))  # content over 1 MiB
    good.append(om.log_event(session, "note", "fine after"))
    with pytest.raises(InvalidRequest) as refused:
        om.flush()
    assert refused.value.status == 400 and refused.value.code == "InvalidEvent"
    assert bad in refused.value.message and "content" in refused.value.message
    assert "xxxxxxxx" not in refused.value.message
    assert sorted(e["event_id"] for e in om.events(session=session)) == sorted(good)
    om.flush()  # the refusal was reported once


def test_log_event_refuses_what_cannot_be_sent_at_once(om):
    session = uid("local")
    for args, kwargs in ((("", "note"), {}), ((session, ""), {}), ((session, "note"), {"data": object()})):
        with pytest.raises(InvalidRequest) as bad:
            om.log_event(*args, **kwargs)
        assert bad.value.status == 0
    om.flush()
    assert om.events(session=session) == []


def test_close_sends_what_is_queued_and_then_refuses_more(gw, agent, om):
    session = uid("close")
    with Client(gw.endpoint, agent["access_key"], agent["secret_key"]) as client:
        ids = [client.log_event(session, "note", f"n{i}") for i in range(20)]
    assert sorted(e["event_id"] for e in om.events(session=session)) == sorted(ids)
    with pytest.raises(OrgmemError) as closed:
        client.log_event(session, "note", "late")
    assert closed.value.code == "ClientClosed"
    with pytest.raises(OrgmemError):
        client.whoami()


def test_events_logged_are_sent_at_interpreter_exit(gw, agent, om):
    session = uid("exit")
    script = ("import orgmem\nc = orgmem.Client()\n"
              f"for i in range(5): c.log_event({session!r}, 'note', f'at exit {{i}}')\n")
    env = clean_env(ORGMEM_ENDPOINT=gw.endpoint, ORGMEM_ACCESS_KEY=agent["access_key"],
                    ORGMEM_SECRET_KEY=agent["secret_key"], PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(om.events(session=session)) == 5


# -- open memory -----------------------------------------------------------------------------


def test_memory_documents(om, agent):
    scope = f"agent:{agent['name']}"
    doc_id = uid("fact").lower()
    doc = {"kind": "decision", "title": f"Ship on Tuesdays {doc_id}", "body": "Never on Fridays.",
           "tags": ["release"]}
    created = om.put_memory(scope, doc_id, doc, create_only=True)
    assert isinstance(created, Memory) and created.etag and created["version"] == 1
    read = om.get_memory(scope, doc_id)
    assert read.etag == created.etag and read["title"] == doc["title"] and read["created_by"] == agent["name"]
    with pytest.raises(PreconditionFailed):
        om.put_memory(scope, doc_id, doc, create_only=True)
    updated = om.put_memory(scope, doc_id, {**doc, "body": "Never on Fridays, nor before holidays."},
                            if_match=read.etag)
    assert updated["version"] == 2 and updated.etag != read.etag
    with pytest.raises(PreconditionFailed) as stale:
        om.put_memory(scope, doc_id, {**doc, "body": "lost update"}, if_match=read.etag)
    assert stale.value.status == 412
    assert [v["version"] for v in om.memory_history(scope, doc_id)] == [1, 2]
    assert doc_id in {d["id"] for d in om.list_memory(scope=scope, kind="decision")}
    assert doc_id in {d["id"] for d in om.list_memory(tag="release")}
    assert doc_id in {d["id"] for d in om.memory_for(agent["name"])}
    assert doc["title"] in om.digest() and om.digest(agent["name"]) == om.digest()

    new_id = doc_id + "-v2"
    new = om.supersede_memory(scope, doc_id, {"id": new_id, "kind": "decision",
                                              "title": f"Ship on Wednesdays {doc_id}", "body": "Moved."})
    assert new["id"] == new_id and new["supersedes"] == doc_id and new.etag
    assert om.get_memory(scope, doc_id)["status"] == "superseded"
    retracted = om.retract_memory(scope, new_id)
    assert retracted["status"] == "retracted"
    assert new_id in {d["id"] for d in om.list_memory(scope=scope, status="retracted")}
    with pytest.raises(NotFound):
        om.get_memory(scope, "no-such-document")


# -- search and context ----------------------------------------------------------------------


def test_search_and_context(om, agent):
    word = "zq" + uuid.uuid4().hex[:10]
    scope = f"agent:{agent['name']}"
    om.put_memory(scope, uid("lesson").lower(), {"kind": "lesson", "title": f"About {word}",
                                                 "body": f"The {word} pipeline retries twice."})
    result = wait_for(lambda: om.search(word, type="memory")["count"] and om.search(word, type="memory"),
                      "the memory is searchable")
    assert result["hits"][0]["type"] == "memory" and word in result["hits"][0]["title"]
    assert om.search(word, type=["event", "skill"])["count"] == 0
    assert om.search(word, scope=scope, limit=1, offset=0)["count"] >= 1
    with pytest.raises(InvalidRequest):
        om.search(word, type="no-such-type")

    session = uid("ctx")
    om.put_events([{"session": session, "kind": "question", "event_id": "open-1",
                    "content": f"Is {word} safe to retry?"}])
    pack = om.context(session=session, query=word, budget_tokens=800)
    assert pack["used_tokens"] <= 800 and word in pack["markdown"]
    with pytest.raises(InvalidRequest):
        om.context(budget_tokens=5)


# -- vault -----------------------------------------------------------------------------------


def test_secrets(om, root, agent):
    base = f"agents/{agent['name']}"
    value = "sk-" + uuid.uuid4().hex
    assert root.put_secret(f"{base}/api", value) == 1
    assert root.put_secret(f"{base}/api", value + "-2", cas=1) == 2
    assert root.put_secret(f"{base}/blob", b"\x00\xffbinary") == 1
    assert om.get_secret(f"{base}/api") == value + "-2"
    assert om.get_secret(f"{base}/api", version=1) == value
    assert om.get_secret(f"{base}/blob") == b"\x00\xffbinary"
    assert {s["path"] for s in root.list_secrets(base)} == {f"{base}/api", f"{base}/blob"}
    assert {s["path"] for s in root.list_secrets(base + "/")} == {f"{base}/api", f"{base}/blob"}
    with pytest.raises(PreconditionFailed) as cas:
        root.put_secret(f"{base}/api", value + "-3", cas=1)
    assert value not in str(cas.value) and value not in repr(cas.value)
    with pytest.raises(AccessDenied) as denied:  # agent-default reads its own secrets, never writes
        om.put_secret(f"{base}/api", value)
    assert value not in str(denied.value)
    with pytest.raises(NotFound):
        om.get_secret(f"{base}/missing")
    with pytest.raises(InvalidRequest):
        om.get_secret(f"{base}//api")
    root.delete_secret(f"{base}/blob")
    with pytest.raises(NotFound):
        om.get_secret(f"{base}/blob")


# -- skills ----------------------------------------------------------------------------------


def skill_md(name: str, description: str) -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n# {name}\n"


def test_skills(om, agent, tmp_path):
    name = uid("skill")
    manifest = om.put_skill(None, name, {"SKILL.md": skill_md(name, "Greets politely"),
                                         "scripts/hi.sh": b"#!/bin/sh\necho hi\n"},
                            executable=["scripts/hi.sh"])
    assert manifest["version"] == 1 and manifest["scope"] == f"agent:{agent['name']}"
    folder = tmp_path / name
    (folder / "scripts").mkdir(parents=True)
    (folder / "SKILL.md").write_text(skill_md(name, "Greets very politely"))
    (folder / "scripts" / "hi.sh").write_bytes(b"#!/bin/sh\necho hello\n")
    os.chmod(folder / "scripts" / "hi.sh", 0o755)
    assert om.put_skill(f"agent:{agent['name']}", name, folder)["version"] == 2

    assert name in {s["name"] for s in om.list_skills()}
    assert name in {s["name"] for s in om.list_skills(scope=f"agent:{agent['name']}", q="politely")}
    latest = om.get_skill(None, name)
    assert latest["version"] == 2
    files = {f["path"]: f for f in latest["files"]}
    assert files["scripts/hi.sh"]["executable"]
    assert om.get_skill_file(None, name, "scripts/hi.sh") == b"#!/bin/sh\necho hello\n"
    assert om.get_skill_file(None, name, "scripts/hi.sh", version=1) == b"#!/bin/sh\necho hi\n"
    with pytest.raises(InvalidRequest) as bad:
        om.put_skill(None, uid("broken"), {"README.md": "no SKILL.md"})
    assert bad.value.code == "InvalidSkill"
    with pytest.raises(NotFound):
        om.get_skill(None, uid("missing"))


# -- workspace files -------------------------------------------------------------------------


def test_workspace_files(om, root, agent, admin, gw):
    bucket = f"agent-{agent['name']}"
    assert om.create_bucket(bucket) in (True, False)
    assert om.create_bucket(bucket) is False and om.bucket_exists(bucket)
    keys = ["notes/plain.md", "notes/with space+plus~tilde%.txt", "notes/ünïcødé/日本.md", "top.json"]
    etags = {key: om.write_file(bucket, key, f"content of {key}") for key in keys}
    for key in keys:
        data = om.read_file(bucket, key)
        assert data == f"content of {key}".encode() and data.etag == etags[key]
    assert om.read_file(bucket, "notes/plain.md").content_type.startswith("text/markdown")
    assert om.read_file(bucket, "top.json").content_type == "application/json"
    listed = om.list_files(bucket, prefix="notes/")
    assert sorted(o["key"] for o in listed) == sorted(keys[:3])
    assert {o["key"]: o["size"] for o in listed}["notes/plain.md"] == len("content of notes/plain.md")
    shallow = om.list_files(bucket, prefix="notes/", delimiter="/")
    assert {"prefix": "notes/ünïcødé/"} in shallow and len(shallow) == 3

    with pytest.raises(PreconditionFailed):
        om.write_file(bucket, "top.json", b"{}", create_only=True)
    with pytest.raises(PreconditionFailed):
        om.write_file(bucket, "top.json", b"{}", if_match="0" * 32)
    new_etag = om.write_file(bucket, "top.json", b'{"v": 2}', "application/json", if_match=etags["top.json"])
    assert om.read_file(bucket, "top.json").etag == new_etag
    assert om.copy_file(bucket, keys[1], bucket, "copies/one.txt") == etags[keys[1]]
    with pytest.raises(PreconditionFailed):  # (the same bytes again would count as a retry)
        om.copy_file(bucket, keys[0], bucket, "copies/one.txt", create_only=True)
    om.delete_file(bucket, "copies/one.txt")
    with pytest.raises(NotFound):
        om.read_file(bucket, "copies/one.txt")
    with pytest.raises(NotFound):
        root.list_files(uid("no-such-bucket"))

    other = admin.create_agent(uid("other"))
    with Client(gw.endpoint, other["access_key"], other["secret_key"]) as stranger:
        with pytest.raises(AccessDenied) as denied:
            stranger.read_file(bucket, "top.json")
        assert denied.value.status == 403 and denied.value.code == "AccessDenied"
        with pytest.raises(AccessDenied):
            stranger.write_file(bucket, "intruder.txt", b"x")
    assert "intruder.txt" not in {o["key"] for o in om.list_files(bucket)}


# -- errors ----------------------------------------------------------------------------------


def test_errors_map_to_exceptions_without_secrets(gw, om, agent):
    with pytest.raises(AccessDenied) as denied:  # 403: another agent's memory
        om.put_memory("agent:someone-else", "x", {"kind": "fact", "title": "t", "body": "b"})
    assert denied.value.status == 403 and denied.value.code == "AccessDenied"
    with pytest.raises(NotFound) as missing:  # 404
        om.get_memory("org", "there-is-no-such-document")
    assert missing.value.status == 404 and missing.value.request_id
    with pytest.raises(InvalidRequest) as oversized:  # 400: an event over the content limit
        om.put_events([{"session": "s", "kind": "note", "content": "y" * (1024 * 1024 + 10)}])
    assert oversized.value.status == 400 and oversized.value.code == "InvalidEvent"
    assert "line 1" in oversized.value.message and "yyyy" not in oversized.value.message
    with pytest.raises(InvalidRequest) as bad_scope:
        om.get_memory("galaxy", "x")
    assert bad_scope.value.status == 400
    assert isinstance(denied.value, OrgmemError) and isinstance(missing.value, OrgmemError)

    wrong = Client(gw.endpoint, agent["access_key"], "not-the-secret-" + "s" * 24)
    with pytest.raises(AccessDenied) as bad_key:
        wrong.whoami()
    assert bad_key.value.code == "SignatureDoesNotMatch"
    for text in (str(bad_key.value), repr(bad_key.value), repr(wrong)):
        assert "not-the-secret" not in text and agent["secret_key"] not in text
    wrong.close()

    down = Client(f"http://127.0.0.1:{free_port()}", "a", "b", timeout=2)
    with pytest.raises(Unavailable) as unreachable:
        down.whoami()
    assert unreachable.value.status == 0 and unreachable.value.code == "ConnectionError"
    down.close()


def test_bad_input_is_refused_and_stores_nothing(om, agent):
    scope = f"agent:{agent['name']}"
    doc_id = uid("bad").lower()
    for doc in ({"kind": "fact", "title": "t", "body": "b", "colour": "red"},  # unknown field
                {"kind": "opinion", "title": "t", "body": "b"},
                {"kind": "fact", "title": "t", "body": "b" * (300 * 1024)}):  # over 256 KiB
        with pytest.raises(InvalidRequest) as bad:
            om.put_memory(scope, doc_id, doc)
        assert bad.value.status in (400, 413) and "nothing was stored" in bad.value.message
    with pytest.raises(InvalidRequest):
        om.put_memory(scope, doc_id, ["not", "a", "dict"])
    with pytest.raises(InvalidRequest):
        om.put_memory(scope, doc_id, {"kind": "fact", "title": "t", "body": "b"}, if_match="x", create_only=True)
    with pytest.raises(NotFound):
        om.get_memory(scope, doc_id)

    session = uid("bad-events")
    with pytest.raises(InvalidRequest) as batch:  # all or nothing: the good first event is not kept
        om.put_events([{"session": session, "kind": "note", "content": "fine"},
                       {"session": session, "kind": "promt", "content": "typo"}])
    assert "line 2" in batch.value.message and 'did you mean "prompt"' in batch.value.message
    with pytest.raises(InvalidRequest):
        om.put_events(["not an event"])
    assert om.events(session=session) == []

    bucket = f"agent-{agent['name']}"
    om.create_bucket(bucket)
    for call in (lambda: om.write_file(bucket, "x.txt", 12345), lambda: om.write_file("", "x.txt", b"x"),
                 lambda: om.write_file(bucket, "", b"x"), lambda: om.read_file("a/b", "x")):
        with pytest.raises(InvalidRequest) as refused:
            call()
        assert refused.value.status == 0
    with pytest.raises(InvalidRequest):
        om.put_secret("agents/x", 42)
    with pytest.raises(InvalidRequest):
        om.search(None)
    assert "x.txt" not in {o["key"] for o in om.list_files(bucket)}


def test_the_logger_reports_a_gateway_it_cannot_reach(tmp_path):
    down = Client(f"http://127.0.0.1:{free_port()}", "AKDOWN", "secret-down", timeout=1)
    ids = [down.log_event("s", "note", f"n{i}") for i in range(3)]
    with pytest.raises(Unavailable) as waiting:
        down.flush(timeout=0.05)
    assert waiting.value.code == "Timeout" and "still queued" in waiting.value.message
    with pytest.raises(Unavailable) as lost:
        down.flush()
    assert lost.value.code == "ConnectionError" and "3 events not stored" in lost.value.message
    assert not any(i in lost.value.message for i in ids)
    down.close()  # nothing left to send, nothing more to report


# -- the async client ------------------------------------------------------------------------


def test_the_async_client_has_every_method_of_the_sync_one():
    def public(cls):
        return {n: m for n, m in vars(cls).items() if callable(m) and not n.startswith("_")}

    sync, asyn = public(Client), public(AsyncClient)
    assert set(sync) == set(asyn)
    for name, method in sync.items():
        assert inspect.signature(method) == inspect.signature(asyn[name]), name
        assert inspect.iscoroutinefunction(asyn[name]), name


def test_async_client(gw, agent, om):
    session = uid("async")
    bucket = f"agent-{agent['name']}"

    async def main():
        async with AsyncClient(gw.endpoint, agent["access_key"], agent["secret_key"]) as client:
            me = await client.whoami()
            ids = await asyncio.gather(*(client.log_event(session, "note", f"a{i}") for i in range(300)))
            await client.flush()
            stored = await client.events(session=session)
            scope = f"agent:{me['name']}"
            doc_id = uid("async-doc").lower()
            doc = await client.put_memory(scope, doc_id, {"kind": "fact", "title": f"Async {doc_id}",
                                                          "body": "works"})
            again = await client.get_memory(scope, doc_id)
            await client.create_bucket(bucket)
            etag = await client.write_file(bucket, "async/a.txt", b"async bytes")
            data = await client.read_file(bucket, "async/a.txt")
            with pytest.raises(NotFound):
                await client.get_memory(scope, "missing-doc")
            late = [await client.log_event(session, "note", f"late {i}") for i in range(3)]
            return ids + late, stored, doc, again, etag, data

        # close() sent the three late events
    ids, stored, doc, again, etag, data = asyncio.run(main())
    assert len(stored) == 300
    assert again.etag == doc.etag and data == b"async bytes" and data.etag == etag
    assert sorted(e["event_id"] for e in om.events(session=session)) == sorted(ids)


# -- the signer and the package boundary -----------------------------------------------------


@pytest.mark.parametrize("path,query", [
    ("/v1/memory/team%3Afinance/doc", "as_of=2026-01-01T00%3A00%3A00Z"),
    ("/bucket/with%20space%2Bplus~tilde%25/%E6%97%A5%E6%9C%AC.md", "list-type=2&prefix=a%2Fb%20c"),
    ("/bucket/%2E%2E/x", "b=2&a=1&a=0"),
    ("/", ""),
])
def test_sdk_signatures_verify_with_the_gateways_own_verifier(path, query):
    signer = _sigv4.Signer("AKTEST", "secret/with+odd=chars", "us-east-1")
    body = b'{"x": 1}'
    now = time.time()
    headers = signer.sign("PUT", "127.0.0.1:9000", path, query, {"content-type": "application/json"},
                          _sigv4.payload_hash(body), now=now)
    req = gateway_sigv4.parse_authorization(headers)
    gateway_sigv4.verify(req, "secret/with+odd=chars", "PUT", path, query, headers, now)
    with pytest.raises(gateway_sigv4.AuthError):
        gateway_sigv4.verify(req, "another-secret", "PUT", path, query, headers, now)
    assert "secret/with" not in repr(signer)


BLOCKER = """
import sys
BLOCKED = {"gateway", "vault", "indexer", "pyarrow", "tantivy", "boto3", "botocore", "cryptography",
           "anthropic"}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked: {name}")
        return None
sys.meta_path.insert(0, Block())
import orgmem
client = orgmem.Client()
print(client.whoami()["name"])
client.log_event("blocked-imports", "note", "no server packages here")
client.close()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
"""


def test_import_needs_none_of_the_servers_packages(gw, agent):
    env = clean_env(ORGMEM_ENDPOINT=gw.endpoint, ORGMEM_ACCESS_KEY=agent["access_key"],
                    ORGMEM_SECRET_KEY=agent["secret_key"], PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", BLOCKER], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == agent["name"]


def test_values_survive_a_round_trip_through_pickle_and_json():
    import pickle

    doc = Memory({"id": "x", "title": "t"}, etag="abc")
    again = pickle.loads(pickle.dumps(doc))
    assert again == doc and again.etag == "abc" and json.loads(json.dumps(doc)) == dict(doc)
    error = PreconditionFailed(412, "PreconditionFailed", "changed", request_id="R1")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is PreconditionFailed and copy.request_id == "R1" and str(copy) == str(error)
    assert orgmem.__version__ and Path(orgmem.__file__).parent.name == "orgmem"
