"""Search against real gateways: the log -> index pipeline, access control in the query,
snapshots, restarts, a follower gateway on a shared SeaweedFS bucket, hostile queries,
and the ``orgmem search`` / ``orgmem index`` commands."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
import time
import uuid

import boto3
import pytest
from botocore.config import Config
from servers import BIN, Gateway

from gateway.admin_client import AdminClient, AdminError
from gateway.bio_client import BioClient
from gateway.memory_client import MemoryClient
from gateway.search_cli import SearchClient
from gateway.skills_client import SkillsClient

#: How long a wait-until loop waits before the test fails (never a timed assert).
DEADLINE = 30.0


def word() -> str:
    """A word no other test uses (letters only, so the stemmer leaves it alone)."""
    return "zq" + "".join(chr(ord("a") + int(c, 16) % 26) for c in uuid.uuid4().hex[:10])


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def searcher(gw: Gateway, access_key: str | None = None, secret_key: str | None = None) -> SearchClient:
    return SearchClient(AdminClient(gw.endpoint, access_key or gw.access_key, secret_key or gw.secret_key))


def wait_for(probe, what: str, deadline: float = DEADLINE):
    """Call ``probe`` until it returns something truthy; its last value otherwise fails the test."""
    end = time.time() + deadline
    last = None
    while time.time() < end:
        try:
            last = probe()
        except AdminError as exc:
            if exc.code != "IndexNotReady":
                raise
            last = None
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {deadline} s (last: {last!r})")


def wait_for_first_snapshot(gw: Gateway) -> None:
    wait_for(lambda: (searcher(gw).status().get("snapshot") or {}).get("seq"), "a first snapshot")


def found(client: SearchClient, q: str, **filters):
    result = client.search(q, **filters)
    return result if result["hits"] else None


def s3_client(gw: Gateway, access_key: str | None = None, secret_key: str | None = None):
    return boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=access_key or gw.access_key,
                        aws_secret_access_key=secret_key or gw.secret_key, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def skill_files(name: str, description: str, body: str) -> list[dict]:
    md = f"---\nname: {name}\ndescription: {description}\n---\n{body}\n"
    return [{"path": "SKILL.md", "content": base64.b64encode(md.encode()).decode()}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    g = Gateway(tmp_path_factory.mktemp("search") / "data").start()
    wait_for(lambda: searcher(g).status()["role"] == "writer", "the index open")  # any test may go first
    yield g
    g.stop()


@pytest.fixture(scope="module")
def root(gw):
    return searcher(gw)


@pytest.fixture(scope="module")
def admin(gw):
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


# -- each kind of item is found by a word of its body ------------------------------------------


def test_an_event_a_memory_a_skill_and_a_file_are_each_found(gw, root):
    words = {t: word() for t in ("event", "memory", "skill", "file")}
    BioClient(gw.endpoint, gw.access_key, gw.secret_key).put_events(
        [{"agent": "scout", "session": "s-find", "kind": "note", "content": f"saw the {words['event']} today"}])
    MemoryClient(gw.endpoint, gw.access_key, gw.secret_key).put(
        "org", uid("doc"), {"kind": "decision", "title": "Release cadence",
                            "body": f"We ship on {words['memory']} mornings."})
    name = uid("sk")
    SkillsClient(gw.endpoint, gw.access_key, gw.secret_key).publish(
        name, skill_files(name, "How to deploy.", f"Run the {words['skill']} script first."), scope="org")
    s3 = s3_client(gw)
    bucket = uid("ws")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="notes/README.md", Body=f"# Notes\n\nThe {words['file']} plan.\n".encode(),
                  ContentType="text/markdown")
    for kind, w in words.items():
        result = wait_for(lambda w=w: found(root, w), f"the {kind} by {w}")
        hit = result["hits"][0]
        assert result["count"] == 1 and hit["type"] == kind
        assert w in hit["snippet"] and f"<b>{w}</b>" in hit["snippet_html"]
        assert hit["source"] and hit["href"] and hit["status"] == "active"
        # and the type filter keeps it, another type's filter does not
        assert root.search(w, type=kind)["count"] == 1
        other = next(t for t in words if t != kind)
        assert root.search(w, type=other)["count"] == 0
    file_hit = root.search(words["file"])["hits"][0]
    assert file_hit["source"] == f"s3://{bucket}/notes/README.md"


def test_a_superseded_memory_ranks_below_its_replacement_and_is_marked(gw, root):
    w = word()
    memory = MemoryClient(gw.endpoint, gw.access_key, gw.secret_key)
    old_id, new_id = uid("old"), uid("new")
    memory.put("org", old_id, {"kind": "decision", "title": f"{w} on Fridays", "body": f"Deploy {w} on Fridays."})
    memory.supersede("org", old_id, {"id": new_id, "kind": "decision", "title": f"{w} on Tuesdays",
                                     "body": f"Deploy {w} on Tuesdays, never Fridays."})

    def both():
        result = root.search(w, type="memory")
        hits = {h["id"]: h for h in result["hits"]}
        return result if old_id in hits and new_id in hits and hits[old_id]["superseded"] else None

    result = wait_for(both, "the supersession")
    ids = [h["id"] for h in result["hits"]]
    assert ids == [new_id, old_id]
    old = result["hits"][1]
    assert old["status"] == "superseded" and old["superseded"] is True
    assert result["hits"][0]["status"] == "active" and result["hits"][0]["superseded"] is False


def test_a_deleted_file_disappears(gw, root):
    w = word()
    s3 = s3_client(gw)
    bucket = uid("del")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="a.md", Body=f"first {w}\n".encode())
    s3.put_object(Bucket=bucket, Key="b.txt", Body=f"second {w}\n".encode())
    wait_for(lambda: root.search(w)["count"] == 2, "both files")
    s3.delete_object(Bucket=bucket, Key="a.md")
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "b.txt"}]})
    wait_for(lambda: root.search(w)["count"] == 0, "both files gone")
    # a quiet bulk delete names no key in its answer; the index still hears of each
    for key in ("q1.md", "q2.md"):
        s3.put_object(Bucket=bucket, Key=key, Body=f"quiet {w}\n".encode())
    wait_for(lambda: root.search(w)["count"] == 2, "the quiet pair")
    answer = s3.delete_objects(Bucket=bucket, Delete={"Quiet": True, "Objects": [{"Key": "q1.md"}, {"Key": "q2.md"}]})
    assert not answer.get("Deleted") and not answer.get("Errors")
    wait_for(lambda: root.search(w)["count"] == 0, "the quiet pair gone")
    # binary content is never indexed
    s3.put_object(Bucket=bucket, Key="c.bin", Body=b"\x00\x01" + w.encode())
    s3.put_object(Bucket=bucket, Key="d.md", Body=f"third {w}\n".encode())
    result = wait_for(lambda: found(root, w), "the text file")
    assert [h["id"] for h in result["hits"]] == ["d.md"]


# -- access control ---------------------------------------------------------------------------------


def test_agent_b_never_sees_agent_a_private_events_or_documents(gw, admin):
    w = word()
    a, b = uid("aa"), uid("bb")
    keys = {n: admin.create_agent(n) for n in (a, b)}
    a_search = searcher(gw, keys[a]["access_key"], keys[a]["secret_key"])
    b_search = searcher(gw, keys[b]["access_key"], keys[b]["secret_key"])
    BioClient(gw.endpoint, keys[a]["access_key"], keys[a]["secret_key"]).put_events(
        [{"session": "private", "kind": "note", "content": f"my secret {w} plan"}])
    MemoryClient(gw.endpoint, keys[a]["access_key"], keys[a]["secret_key"]).put(
        f"agent:{a}", uid("mine"), {"kind": "lesson", "title": f"The {w} lesson", "body": f"{w} matters."})
    s3 = s3_client(gw, keys[a]["access_key"], keys[a]["secret_key"])
    s3.create_bucket(Bucket=f"agent-{a}")
    s3.put_object(Bucket=f"agent-{a}", Key="diary.md", Body=f"dear {w}\n".encode())
    result = wait_for(lambda: a_search.search(w)["count"] == 3 and a_search.search(w), "A's own items")
    assert {h["type"] for h in result["hits"]} == {"event", "memory", "file"}
    # B also has a word of its own, so it can search at all
    BioClient(gw.endpoint, keys[b]["access_key"], keys[b]["secret_key"]).put_events(
        [{"session": "mine", "kind": "note", "content": f"b writes {w} too"}])
    result = wait_for(lambda: found(b_search, w), "B's own event")
    assert result["count"] == 1 and result["hits"][0]["agent"] == b
    for q, filters in [(w, {}), ("*", {"agent": a}), ("secret", {}), (f"agent:{a}", {}),
                       (f"{w} OR secret OR lesson OR dear", {}), ("*", {"type": "memory"}),
                       ("*", {"type": "file"}), (f"scope:agent:{a}", {})]:
        result = b_search.search(q, **filters)
        assert all(h["agent"] != a and a not in h["source"] for h in result["hits"]), (q, result)
        if filters.get("agent") == a or q.startswith("scope:") or filters.get("type") == "file":
            assert result["count"] == 0, (q, result)
    assert b_search.search(w)["count"] == 1


def test_a_deny_inside_a_granted_scope_leaves_no_trace_in_hits_or_counts(gw, admin, root):
    """Tokens grant whole scopes; a Deny within one (by name, or by a condition of this request)
    becomes part of the query, so neither a page nor a count shows what it denies."""
    w = word()
    name = uid("denied")
    keys = admin.create_agent(name)
    admin.put_policy(f"{name}-deny", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Deny", "Action": "memory:GetDocument", "Resource": "arn:orgmem:memory:::org/board-*"},
        {"Effect": "Deny", "Action": "memory:*", "Resource": "arn:orgmem:memory:::org/fin-*",
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        {"Effect": "Deny", "Action": "bio:GetEvents", "Resource": f"arn:orgmem:bio:::{name}/hidden"}]})
    admin.attach_policy(f"{name}-deny", agent=name)
    memory = MemoryClient(gw.endpoint, gw.access_key, gw.secret_key)
    for slug in (f"board-{w}", f"fin-{w}", f"public-{w}"):
        memory.put("org", slug, {"kind": "fact", "title": f"About {slug}", "body": f"The {w} plan."})
    BioClient(gw.endpoint, keys["access_key"], keys["secret_key"]).put_events(
        [{"session": session, "kind": "note", "content": f"{session} {w}"} for session in ("hidden", "open")])
    wait_for(lambda: root.search(w)["count"] == 5, "every item, for the root")
    bob = searcher(gw, keys["access_key"], keys["secret_key"])
    for limit in (0, 1, 10):
        result = bob.search(w, limit=limit)
        assert result["count"] == 2, (limit, result)
        assert len(result["hits"]) == min(limit, 2)
    ids = {h["id"] for h in bob.search(w, limit=10)["hits"]}
    assert f"public-{w}" in ids and not ids & {f"board-{w}", f"fin-{w}"}
    assert bob.search(f"{w} hidden", session="hidden")["count"] == 0


@pytest.mark.parametrize("grant", [
    {"Effect": "Allow", "Action": "memory:GetDocument", "NotResource": "arn:orgmem:memory:::org/secret-*"},
    {"Effect": "Allow", "Action": "memory:GetDocument", "Resource": "arn:orgmem:memory:::org/?"},
], ids=["not-resource", "one-character"])
def test_an_allow_that_covers_part_of_a_scope_never_counts_the_rest(gw, admin, root, grant):
    """Asking the policy about the literal resource ``org/*`` granted the whole scope to
    an Allow that covers only part of it, and counts showed documents the caller could not
    read (a yes/no oracle on their words)."""
    w = word()
    name = uid("partial")
    keys = admin.create_agent(name, policies=[])
    admin.put_policy(f"{name}-grant", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "search:Query", "Resource": "*"}, grant]})
    admin.attach_policy(f"{name}-grant", agent=name)
    memory = MemoryClient(gw.endpoint, gw.access_key, gw.secret_key)
    for slug in (f"secret-{w}-1", f"secret-{w}-2", f"public-{w}"):
        memory.put("org", slug, {"kind": "fact", "title": f"About {slug}", "body": f"The {w} merger."})
    wait_for(lambda: root.search(w)["count"] == 3, "every item, for the root")
    carol = searcher(gw, keys["access_key"], keys["secret_key"])
    readable = 1 if "NotResource" in grant else 0
    for limit in (0, 1, 10):
        result = carol.search(w, limit=limit)
        assert result["count"] == readable, (limit, result)
        assert not any("secret" in h["id"] for h in result["hits"])


def test_what_a_not_resource_allow_leaves_out_another_allow_may_grant_back(gw, admin, root):
    w = word()
    name = uid("finance")
    keys = admin.create_agent(name, policies=[])
    admin.put_policy(f"{name}-grant", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "search:Query", "Resource": "*"},
        {"Effect": "Allow", "Action": "memory:GetDocument", "NotResource": "arn:orgmem:memory:::org/fin-*"},
        {"Effect": "Allow", "Action": "memory:GetDocument", "Resource": "arn:orgmem:memory:::org/fin-ok-*"}]})
    admin.attach_policy(f"{name}-grant", agent=name)
    memory = MemoryClient(gw.endpoint, gw.access_key, gw.secret_key)
    for slug in (f"fin-secret-{w}", f"fin-ok-{w}", f"public-{w}"):
        memory.put("org", slug, {"kind": "fact", "title": f"About {slug}", "body": f"The {w} budget."})
    wait_for(lambda: root.search(w)["count"] == 3, "every item, for the root")
    found = searcher(gw, keys["access_key"], keys["secret_key"]).search(w, limit=10)
    assert found["count"] == 2 and {h["id"] for h in found["hits"]} == {f"fin-ok-{w}", f"public-{w}"}
    # sandbox credentials narrowed to part of the scope by their session policy count no more
    sandbox = admin.sandbox_credentials(name, 600, policy_document={"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["search:Query", "memory:GetDocument"],
         "NotResource": "arn:orgmem:memory:::org/public-*"}]})
    narrowed = searcher(gw, sandbox["access_key"], sandbox["secret_key"]).search(w, limit=0)
    assert narrowed["count"] == 1


def test_a_not_resource_deny_of_several_patterns_hides_only_what_none_of_them_names(gw, admin, root):
    """"Read only org, my teams and my own": a Deny with NotResource of several patterns
    became one inverted exclusion per pattern, which together left only what every pattern
    matched: nothing. GET allowed the documents; search found none of them."""
    w = word()
    name, team_a, team_b, other = uid("nr"), uid("ta"), uid("tb"), uid("tc")
    for team in (team_a, team_b, other):
        admin.create_team(team)
    keys = admin.create_agent(name, teams=[team_a, team_b])
    admin.put_policy(f"{name}-only", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Deny", "Action": "memory:GetDocument",
         "NotResource": ["arn:orgmem:memory:::org/*", "arn:orgmem:memory:::team/${orgmem:teams}/*",
                         "arn:orgmem:memory:::agent/${aws:username}/*"]}]})
    admin.attach_policy(f"{name}-only", agent=name)
    memory = MemoryClient(gw.endpoint, gw.access_key, gw.secret_key)
    for scope in ("org", f"team:{team_a}", f"team:{team_b}", f"team:{other}"):
        memory.put(scope, f"rule-{w}", {"kind": "fact", "title": f"Rule {w}", "body": f"The {w} rule."})
    wait_for(lambda: root.search(w)["count"] == 4, "every item, for the root")
    found = searcher(gw, keys["access_key"], keys["secret_key"]).search(w, limit=10)
    assert found["count"] == 3, found
    assert {h["scope"] for h in found["hits"]} == {"org", f"team:{team_a}", f"team:{team_b}"}


def test_a_deny_of_many_patterns_with_stars_inside_still_searches(gw, admin, root):
    """Joined into one regex, four ``*/word-*`` patterns passed the 1,000 states Tantivy
    compiles a regex into, and every search of that agent answered 400."""
    w = word()
    name = uid("many")
    keys = admin.create_agent(name)
    words = ("board", "hr", "payroll", "legal", "merger")
    admin.put_policy(f"{name}-deny", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Deny", "Action": "memory:GetDocument",
         "Resource": [f"arn:orgmem:memory:::*/{k}-*" for k in words]},
        {"Effect": "Deny", "Action": "memory:GetDocument",  # all but org and these: all of org
         "NotResource": ["arn:orgmem:memory:::org/*"] + [f"arn:orgmem:memory:::*/x{k}-*" for k in words]}]})
    admin.attach_policy(f"{name}-deny", agent=name)
    memory = MemoryClient(gw.endpoint, gw.access_key, gw.secret_key)
    for slug in (*(f"{k}-{w}" for k in words), f"public-{w}"):
        memory.put("org", slug, {"kind": "fact", "title": f"About {slug}", "body": f"The {w} note."})
    wait_for(lambda: root.search(w)["count"] == 6, "every item, for the root")
    found = searcher(gw, keys["access_key"], keys["secret_key"]).search(w, limit=10)
    assert found["count"] == 1 and [h["id"] for h in found["hits"]] == [f"public-{w}"]


# -- hostile input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("q,extra", [
    ('"unbalanced', {}), ("x" * 10_000, {}), ("nosuchfield:value", {}), ("*", {}), ("NOT", {}),
    ("NOT deploy", {}), ("time:[2024-01-01 TO", {}), ("time:[garbage TO 2024]", {}), ("(((", {}),
    ("a:b:c:d", {}), ("access:root", {}), ("/etc/passwd", {}), ("", {"type": "nosuchtype"}),
    ("x", {"limit": "many"}), ("x", {"limit": "100000"}), ("x", {"offset": "-1"}),
    ("x", {"since": "yesterday-ish"}), ("x", {"since": "2030-01-01", "until": "2020-01-01"}),
    ("\x00 nul \x7f", {}), ("🦩 +-~^", {}), ("(" * 3500, {}), ("(a " * 65, {}),
    ("x", {"since": "2300-01-01T00:00:00Z"}), ("x", {"since": "1600-01-01"}), ("x", {"until": "9999-12-31"}),
])
def test_hostile_queries_answer_200_or_a_clear_400(gw, q, extra):
    client = AdminClient(gw.endpoint, gw.access_key, gw.secret_key)
    try:
        status, _, data = client._request("GET", "/v1/search", query={"q": q, **extra})
    except AdminError as exc:
        assert exc.status == 400, exc
        assert exc.code in ("InvalidQuery", "InvalidArgument") and len(exc.message) > 10
        return
    assert status == 200, data


def test_a_query_nested_thousands_deep_is_refused_and_the_gateway_lives_on(gw, root):
    """Tantivy's parser recurses once per parenthesis: a few thousand used to kill the search
    worker, and then the gateway itself when it retried the search in-process."""
    with pytest.raises(AdminError) as refused:
        root.search("(" * 3500 + "x")
    assert refused.value.status == 400 and "nest 3500 levels" in refused.value.message
    w = word()
    BioClient(gw.endpoint, gw.access_key, gw.secret_key).put_events(
        [{"agent": "nesting", "session": "s", "kind": "note", "content": f"still {w}"}])
    wait_for(lambda: found(root, w), "a search after the refused one")
    assert found(root, f"(((({w}))))")["count"] == 1


def test_an_event_dated_past_the_index_span_does_not_stop_indexing(gw, root):
    """Events may be dated up to 9999, Tantivy's dates end in 2262: such an entry is indexed at
    the end of the span, and everything after it in the log is indexed as usual."""
    w1, w2 = word(), word()
    bio = BioClient(gw.endpoint, gw.access_key, gw.secret_key)
    bio.put_events([{"agent": "far", "session": "s", "kind": "note", "content": f"future {w1}",
                     "ts": "9999-06-01T00:00:00Z"}])
    bio.put_events([{"agent": "far", "session": "s", "kind": "note", "content": f"now {w1} {w2}"}])
    result = wait_for(lambda: root.search(w1)["count"] == 2 and root.search(w1), "both events")
    assert sorted(h["time"][:4] for h in result["hits"])[-1] == "2262"
    assert root.search(w1, since="2250-01-01")["count"] == 1
    assert root.search(w2, until="9999-12-31")["count"] == 1


# -- restarts, snapshots, followers ----------------------------------------------------------------


def write_until(stop: threading.Event, bio: BioClient, session: str, acked: list, lock: threading.Lock) -> None:
    n = 0
    while not stop.is_set():
        batch = [{"agent": "streamer", "session": session, "kind": "note", "event_id": f"ev-{session}-{n + i}",
                  "content": f"tick {n + i}"} for i in range(5)]
        try:
            ids = bio.put_events(batch)["event_ids"]
        except (AdminError, OSError):
            time.sleep(0.05)  # the gateway is down: retry the same ids (retries collapse)
            continue
        with lock:
            acked.extend(ids)
        n += 5


def session_ids(client: SearchClient, session: str) -> list[str]:
    out: list[str] = []
    while True:
        page = client.search("*", session=session, limit=1000, offset=len(out))
        out += [h["id"] for h in page["hits"]]
        if not page["hits"] or len(out) >= page["count"]:
            return out


def test_a_restart_mid_stream_loses_and_duplicates_nothing(tmp_path):
    gw = Gateway(tmp_path / "data").start()
    # the first snapshot (of the empty store) is what the restart restores; a kill before it
    # is published leaves nothing to restore, and the restart rightly rebuilds
    wait_for_first_snapshot(gw)
    session = uid("stream")
    acked, lock, stop = [], threading.Lock(), threading.Event()
    bio = BioClient(gw.endpoint, gw.access_key, gw.secret_key, timeout=5)
    writer = threading.Thread(target=write_until, args=(stop, bio, session, acked, lock))
    writer.start()
    try:
        wait_for(lambda: len(acked) > 50, "some events acknowledged")
        gw.kill()  # mid-stream, no final snapshot
        gw.start()
        wait_for(lambda: len(acked) > 150, "events after the restart")
        stop.set()
        writer.join(30)
        client = searcher(gw)
        wait_for(lambda: len(session_ids(client, session)) >= len(set(acked)), "every acknowledged event")
        ids = session_ids(client, session)
        assert len(ids) == len(set(ids)) and set(ids) == set(acked)
        assert client.search("*", session=session)["count"] == len(set(acked))
        status = client.status()
        assert status["stats"]["started_from"] == "snapshot" and status["stats"]["rebuilds"] == 0
    finally:
        stop.set()
        gw.stop()


def test_rebuilds_while_events_stream_in_index_each_event_once(tmp_path):
    """Events without ids get theirs from the gateway and are added to the index without a
    delete first. A rebuild reads the log tail past the positions it listed at its start: its
    positions must cover what it read, or those events would be added a second time."""
    gw = Gateway(tmp_path / "data").start()
    client = searcher(gw)
    session = uid("rebuilt")
    acked, lock, stop = [], threading.Lock(), threading.Event()
    bio = BioClient(gw.endpoint, gw.access_key, gw.secret_key, timeout=10)

    def stream() -> None:
        n = 0
        while not stop.is_set() and n < 8000:  # session_ids pages up to 10,000
            batch = [{"agent": "streamer", "session": session, "kind": "note", "content": f"tick {n + i}"}
                     for i in range(20)]
            time.sleep(0.005)
            ids = bio.put_events(batch)["event_ids"]
            with lock:
                acked.extend(ids)
            n += 20

    writer = threading.Thread(target=stream)
    try:
        wait_for(lambda: client.status()["role"] == "writer", "the index open")
        # compacted history makes each rebuild read segments for a while before it lists the
        # log tail, so the stream commits log objects in between
        for k in range(20):
            bio.put_events([{"agent": "history", "session": f"h{k}", "kind": "note", "content": f"old {i}"}
                            for i in range(1000)])
        status, _, _ = AdminClient(gw.endpoint, gw.access_key, gw.secret_key)._request("POST", "/v1/bio/compact")
        assert status == 200
        writer.start()
        for rebuilds in (2, 3):  # the first was the empty store's
            wait_for(lambda: len(acked) > 1000, "events streaming")
            client.rebuild()
            wait_for(lambda r=rebuilds: client.status()["stats"]["rebuilds"] >= r, "the rebuild")
        writer.join(60)  # the stream goes on past the last rebuild
        assert not writer.is_alive()
        wait_for(lambda: len(session_ids(client, session)) >= len(acked), "every acknowledged event")
        ids = session_ids(client, session)
        assert len(ids) == len(set(ids)) == len(acked) and set(ids) == set(acked)
        assert client.search("*", session=session)["count"] == len(acked)
    finally:
        stop.set()
        if writer.is_alive():
            writer.join(30)
        gw.stop()


def test_a_fresh_gateway_restores_the_snapshot_and_catches_up(tmp_path):
    gw = Gateway(tmp_path / "data").start()
    w1, w2 = word(), word()
    try:
        bio = BioClient(gw.endpoint, gw.access_key, gw.secret_key)
        bio.put_events([{"agent": "keeper", "session": "s", "kind": "note", "content": f"before {w1}"}])
        wait_for(lambda: found(searcher(gw), w1), "the first event")
        assert searcher(gw).status()["stats"]["rebuilds"] == 1  # an empty store: built from nothing once
    finally:
        gw.stop()  # a clean stop publishes a final snapshot
    # an event acknowledged while no gateway indexes: only the log has it
    gw.start()
    try:
        client = searcher(gw)
        wait_for(lambda: found(client, w1), "the first event after the restart")
        BioClient(gw.endpoint, gw.access_key, gw.secret_key).put_events(
            [{"agent": "keeper", "session": "s", "kind": "note", "content": f"after {w2}"}])
        wait_for(lambda: found(client, w2), "the event written after the restart")
        status = client.status()
        assert status["stats"]["started_from"] == "snapshot"
        assert status["stats"]["restores"] >= 1 and status["stats"]["rebuilds"] == 0
        assert status["role"] == "writer" and status["snapshot"]["seq"] >= 2
        assert client.search("*", agent="keeper")["count"] == 2
    finally:
        gw.stop()


def test_an_older_snapshot_behind_the_collected_log_is_rebuilt_not_restored(tmp_path):
    """When the newest snapshot cannot be restored, the one before may not cover log objects
    that were collected since: catching up from it would silently miss them, so the gateway
    rebuilds from the sources instead."""
    from gateway.config import Config as GatewayConfig
    from gateway.sealing import seal
    from gateway.search.blobs import StoreBlobs
    from gateway.store.local import LocalStore
    from indexer.snapshot import _manifest_keys

    data = tmp_path / "data"
    gw = Gateway(data)
    w1, w2 = word(), word()
    for w in (w1, w2):  # each stop publishes a snapshot: S1 covers w1, S2 covers w2
        gw.start()
        try:
            BioClient(gw.endpoint, gw.access_key, gw.secret_key).put_events(
                [{"agent": "behind", "session": "s", "kind": "note", "content": f"word {w}"}])
            wait_for(lambda w=w: found(searcher(gw), w), "the event")
        finally:
            gw.stop()
    # a replica that never writes the index compacts: the log is collected up to S2
    reader = Gateway(data, env={"ORGMEM_INDEX_WRITER": "false"}).start()
    try:
        status, _, _ = AdminClient(reader.endpoint, reader.access_key, reader.secret_key)._request(
            "POST", "/v1/bio/compact")
        assert status == 200
    finally:
        reader.stop()
    store = seal(LocalStore(data / "store"), GatewayConfig(data=str(data)))
    try:  # S2 loses a file only it names: it cannot be restored, S1 can
        blobs = StoreBlobs(store)
        (_, older), (_, newest) = _manifest_keys(blobs, "index")[-2:]
        named = {f["key"] for f in json.loads(blobs.get(older))["files"]}
        only_newest = [f["key"] for f in json.loads(blobs.get(newest))["files"] if f["key"] not in named]
        blobs.delete(only_newest[0])
    finally:
        store.close()
    gw.start()
    try:
        client = searcher(gw)
        wait_for(lambda: found(client, w2), "the event only the broken snapshot covered")
        assert found(client, w1)["count"] == 1
        assert client.status()["stats"]["rebuilds"] == 1
    finally:
        gw.stop()


def test_a_gateway_without_index_writing_leaves_the_log_to_the_next_writer(tmp_path):
    """``--no-index-writer`` (ORGMEM_INDEX_WRITER=false) never takes the lease: it ingests and
    serves the last snapshot, and a writer started later catches up from the log."""
    data = tmp_path / "data"
    gw = Gateway(data).start()
    try:  # a writer publishes the first snapshot of the empty store
        wait_for_first_snapshot(gw)
    finally:
        gw.stop()
    w = word()
    reader = Gateway(data, env={"ORGMEM_INDEX_WRITER": "false"}).start()
    try:
        BioClient(reader.endpoint, reader.access_key, reader.secret_key).put_events(
            [{"agent": "quiet", "session": "s", "kind": "note", "content": f"unindexed {w}"}])
        client = searcher(reader)
        time.sleep(1.5)  # several pipeline steps: a writer would have indexed it by now
        status = client.status()
        assert status["role"] == "follower" and status["may_write"] is False
        assert status["holder"] is None and status["stats"]["commits"] == 0
        assert client.search(w)["count"] == 0
        with pytest.raises(AdminError) as refused:
            client.rebuild()
        assert refused.value.status == 409
    finally:
        reader.stop()
    gw.start()
    try:
        client = searcher(gw)
        wait_for(lambda: found(client, w), "the event, indexed by the next writer")
        status = client.status()
        assert status["role"] == "writer" and status["may_write"] is True
        assert status["stats"]["started_from"] == "snapshot" and status["stats"]["rebuilds"] == 0
    finally:
        gw.stop()


def _search_workers(pid: int) -> list[int]:
    """The gateway's search worker processes (spawned children running multiprocessing)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"multiprocessing" in cmdline:
            out.append(int(entry))
    return out


def test_searches_survive_a_killed_search_worker(gw):
    """Searches run in worker processes; one killed mid-life is replaced, nothing is lost,
    and the gateway stops its workers when it stops."""
    w = word()
    BioClient(gw.endpoint, gw.access_key, gw.secret_key).put_events(
        [{"agent": "worker-test", "session": "s", "kind": "note", "content": f"kept {w}"}])
    client = searcher(gw)
    wait_for(lambda: found(client, w), "the event")
    workers = _search_workers(gw.proc.pid)
    assert workers, "a search ran, so a worker process exists"
    for pid in workers:
        os.kill(pid, 9)
    for _ in range(3):  # the first may meet the dead pipe; every answer is still right
        assert client.search(w)["count"] == 1
    assert _search_workers(gw.proc.pid), "a new worker took over"


def test_a_stopped_gateway_leaves_no_search_worker(tmp_path):
    g = Gateway(tmp_path / "data").start()
    try:
        wait_for(lambda: searcher(g).search("anything") is not None, "a first search")
        workers = _search_workers(g.proc.pid)
        assert workers
    finally:
        g.stop()
    wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in workers), "the workers gone", 10)


def test_index_writer_setting_refuses_a_non_boolean(tmp_path):
    bad = subprocess.run([str(BIN / "orgmem"), "serve", "--data", str(tmp_path / "d")],
                         env={**os.environ, "ORGMEM_INDEX_WRITER": "maybe"}, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2
    assert "index_writer must be true or false, not 'maybe'" in bad.stderr


def test_a_second_gateway_on_one_seaweedfs_bucket_answers_from_the_snapshot(tmp_path, seaweed):
    prefix = f"search-{uuid.uuid4().hex[:6]}"
    args = ["--backend", f"s3://orgmem-upstream/{prefix}", "--backend-endpoint", seaweed.endpoint]
    one = Gateway(tmp_path / "one", extra_args=args, env=seaweed.env).start()
    kek = ["--kek", f"file:{tmp_path / 'one.keyring.json'}"]
    two = None
    try:
        first = searcher(one)
        wait_for(lambda: first.status()["role"] == "writer", "the first gateway writes the index")
        two = Gateway(tmp_path / "two", extra_args=args + kek, env=seaweed.env).start()
        w = word()
        BioClient(two.endpoint, two.access_key, two.secret_key).put_events(
            [{"agent": "pair", "session": "s", "kind": "note", "content": f"shared {w}"}])
        wait_for(lambda: found(first, w), "the writer finds the event")
        second = searcher(two)
        result = wait_for(lambda: found(second, w), "the follower finds it in a snapshot")
        assert result["index"]["role"] == "follower" and result["index"]["snapshot_age_seconds"] >= 0
        assert result["hits"][0]["agent"] == "pair"
        status = second.status()
        assert status["role"] == "follower" and status["holder"] == first.status()["holder"]
        with pytest.raises(AdminError) as refused:
            second.rebuild()
        assert refused.value.status == 409
        # the next snapshot: the follower fetches what changed and links the segments it has
        w2 = word()
        BioClient(two.endpoint, two.access_key, two.secret_key).put_events(
            [{"agent": "pair", "session": "s", "kind": "note", "content": f"later {w2}"}])
        wait_for(lambda: found(second, w2), "the follower finds the second event")
        stats = second.status()["stats"]
        assert stats["restores"] >= 2 and stats["restore_linked_bytes"] > 0
        assert found(second, w)["hits"][0]["agent"] == "pair"
    finally:
        one.stop()
        if two is not None:
            two.stop()


# -- the commands -------------------------------------------------------------------------------------


def test_search_and_index_commands(gw, root):
    w = word()
    MemoryClient(gw.endpoint, gw.access_key, gw.secret_key).put(
        "org", uid("cli"), {"kind": "fact", "title": f"The {w} fact", "body": f"All about {w}."})
    wait_for(lambda: found(root, w), "the document")
    env = {**os.environ, "ORGMEM_ENDPOINT": gw.endpoint, "ORGMEM_ACCESS_KEY": gw.access_key,
           "ORGMEM_SECRET_KEY": gw.secret_key, "COLUMNS": "200"}

    def orgmem(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "orgmem"), *args], env=env, capture_output=True, text=True,
                              timeout=120)

    out = orgmem("search", w, "--type", "memory")
    assert out.returncode == 0, out.stderr
    assert w in out.stdout and "memory" in out.stdout and "1 of 1" in out.stdout
    bad = orgmem("search", "x", "--type", "nosuchtype")
    assert bad.returncode == 1 and "InvalidQuery" in bad.stderr
    status = orgmem("index", "status")
    assert status.returncode == 0 and "writer" in status.stdout, status.stderr
    rebuilt = orgmem("index", "rebuild")
    assert rebuilt.returncode == 0 and "rebuilt in" in rebuilt.stdout, rebuilt.stderr
    assert root.status()["stats"]["rebuilds"] >= 2
    assert wait_for(lambda: found(root, w), "the document after the rebuild")["count"] == 1
