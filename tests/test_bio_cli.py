"""`orgmem bio` and its BioClient against a real gateway: events posted through the client, then
the command line run as a subprocess (tail, sessions, export, compact, retain, --follow)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
import uuid

import pyarrow.parquet as pq
import pytest
from clients import clean_env
from servers import BIN, Gateway

from gateway.admin_client import AdminClient
from gateway.bio_cli import _ts_us, event_from_api
from gateway.bio_client import BioClient, BioError
from gateway.biography.events import validate
from gateway.biography.schema import table_to_events

ORGMEM = BIN / "orgmem"


def uname(prefix: str = "b") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def cli_env(gw: Gateway, access_key: str | None = None, secret_key: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if not k.startswith("ORGMEM_")}
    env.update(ORGMEM_ENDPOINT=gw.endpoint, ORGMEM_ACCESS_KEY=access_key or gw.access_key,
               ORGMEM_SECRET_KEY=secret_key or gw.secret_key)
    return env


def bio(gw: Gateway, *args: str, expect: int | None = 0, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `orgmem bio ARGS`; check the exit code and that no secret key shows."""
    env = cli_env(gw) if env is None else env
    proc = subprocess.run([str(ORGMEM), "bio", *args], env=env, input="", capture_output=True, text=True,
                          timeout=timeout, check=False)
    if expect is not None:
        assert proc.returncode == expect, (f"orgmem bio {' '.join(args)} exited {proc.returncode}, expected "
                                           f"{expect}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    for secret in (gw.secret_key, env["ORGMEM_SECRET_KEY"]):
        assert secret not in proc.stdout + proc.stderr
    return proc


def ndjson_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    """A gateway of this module's own."""
    gw = Gateway(tmp_path_factory.mktemp("gw-bio") / "data").start()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def root(gw) -> AdminClient:
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


def new_agent(root: AdminClient) -> tuple[str, dict, BioClient]:
    name = uname()
    creds = root.create_agent(name)
    return name, creds, BioClient(root.endpoint, creds["access_key"], creds["secret_key"])


#: Two sessions: s1 asks a question and answers it; s2 asks one that stays open.
STORY = [
    {"session": "s1", "ts": "2026-11-30T10:00:00Z", "kind": "prompt", "role": "user",
     "content": "find the flight\nsecond line"},
    {"session": "s1", "ts": "2026-11-30T10:00:01Z", "kind": "tool_call", "tool": "web.search",
     "data": {"q": "flights", "n": 3}},
    {"session": "s1", "ts": "2026-11-30T10:00:02Z", "kind": "tool_result", "tool": "web.search",
     "content": "3 results"},
    {"event_id": "q-answered", "session": "s1", "ts": "2026-11-30T10:00:03Z", "kind": "question",
     "content": "which airline?"},
    {"session": "s1", "ts": "2026-11-30T10:00:04Z", "kind": "answer", "parent_id": "q-answered",
     "content": "the cheapest"},
    {"event_id": "q-open", "session": "s2", "ts": "2026-11-30T11:00:00Z", "kind": "question",
     "content": "should I book the hotel too?"},
    {"session": "s2", "ts": "2026-11-30T11:00:01Z", "kind": "note", "content": "waiting \x1b[31mfor a reply",
     "tags": ["t1"], "tokens_in": 5, "model": "m-1"},
]


@pytest.fixture(scope="module")
def story(root) -> dict:
    """An agent with STORY in its biography, posted with BioClient under the agent's own keys."""
    name, creds, client = new_agent(root)
    first = client.put_events(STORY[:4])
    assert first["count"] == 4
    rest = b"\n".join(json.dumps(e).encode() for e in STORY[4:]) + b"\n"  # NDJSON bytes
    second = client.put_events(rest)
    assert second["count"] == 3 and "q-open" in second["event_ids"]
    return {"name": name, "creds": creds, "client": client, "ids": first["event_ids"] + second["event_ids"]}


# ============================================================================ the client

def test_client_pages_and_filters(story):
    client: BioClient = story["client"]
    assert "secret" not in repr(client) and story["creds"]["secret_key"] not in repr(client)
    page = client.events(limit=2)
    assert len(page["events"]) == 2 and page["next_cursor"]
    everything = list(client.iter_events(page_size=2))
    assert [e["event_id"] for e in everything] == story["ids"]  # time order, every page followed
    assert all(e["agent"] == story["name"] for e in everything)
    questions = list(client.iter_events(kinds=["question"], page_size=1))
    assert [e["event_id"] for e in questions] == ["q-answered", "q-open"]
    s2 = list(client.iter_events(session="s2", page_size=1))
    assert [e["kind"] for e in s2] == ["question", "note"]
    since = list(client.iter_events(since="2026-11-30T11:00:00Z", until="2026-11-30T11:00:01Z"))
    assert [e["event_id"] for e in since] == ["q-open"]  # since inclusive, until exclusive
    # API dicts go back to the Event the server stored
    note = event_from_api(s2[1])
    expected = validate({**STORY[6], "event_id": s2[1]["event_id"]}, 1, caller=story["name"], now_us=0)
    assert note == expected


def test_client_errors(story, gw):
    client: BioClient = story["client"]
    with pytest.raises(BioError) as exc:
        client.put_events([{"session": "s", "kind": "note"}, {"session": "s", "kind": "nope"}])
    assert exc.value.status == 400 and exc.value.code == "InvalidEvent"
    assert 'line 2, field "kind"' in exc.value.message
    with pytest.raises(BioError) as exc:
        client.events(kinds="bogus")
    assert exc.value.code == "InvalidArgument" and "bogus" in exc.value.message
    bad = BioClient(gw.endpoint, story["creds"]["access_key"], "wrong-secret-0000000000000")
    with pytest.raises(BioError) as exc:
        bad.events()
    assert exc.value.status == 403 and "wrong-secret" not in str(exc.value)


# ============================================================================ tail

def test_tail_prints_one_line_per_event_oldest_first(gw, story):
    out = bio(gw, "tail", "--agent", story["name"]).stdout.splitlines()
    assert len(out) == len(STORY)
    assert out[0].startswith("2026-11-30T10:00:00.000Z") and "prompt" in out[0] and "s1" in out[0]
    assert "find the flight ..." in out[0] and "second line" not in out[0]  # first line only
    assert "web.search" in out[1] and '{"n":3,"q":"flights"}' in out[1]  # data when no content
    assert out[-1].startswith("2026-11-30T11:00:01.000Z") and "note" in out[-1]
    assert "\x1b" not in "\n".join(out)  # agent text cannot drive the terminal

    last2 = bio(gw, "tail", "--agent", story["name"], "--limit", "2").stdout.splitlines()
    assert last2 == out[-2:]


def test_tail_filters_and_json(gw, story):
    name = story["name"]
    rows = ndjson_lines(bio(gw, "tail", "--agent", name, "--json").stdout)
    assert [r["event_id"] for r in rows] == story["ids"]
    assert rows[1]["data"] == {"n": 3, "q": "flights"} and rows[1]["ts"] == "2026-11-30T10:00:01.000000Z"

    kinds = ndjson_lines(bio(gw, "tail", "--agent", name, "--json", "--kind", "question", "--kind",
                             "answer,note").stdout)
    assert [r["kind"] for r in kinds] == ["question", "answer", "question", "note"]
    session = ndjson_lines(bio(gw, "tail", "--agent", name, "--json", "--session", "s2").stdout)
    assert {r["session"] for r in session} == {"s2"} and len(session) == 2
    since = ndjson_lines(bio(gw, "tail", "--agent", name, "--json", "--since", "2026-11-30T10:30:00Z").stdout)
    assert [r["event_id"] for r in since] == story["ids"][5:]
    epoch = str(_ts_us("2026-11-30T11:00:01Z") // 1_000_000)
    assert len(ndjson_lines(bio(gw, "tail", "--agent", name, "--json", "--since", epoch).stdout)) == 1
    assert bio(gw, "tail", "--agent", name, "--since", "1s").stdout == ""  # nothing that recent


def test_tail_reads_back_only_as_far_as_its_last_events_need(gw, root):
    """A tail without --since widens its window (an hour, a day, a week...) until it holds
    --limit events: the last N are the same as from reading everything."""
    name, _, client = new_agent(root)
    now = time.time()
    ages = [400 * 86400, 40 * 86400, 3 * 86400, 3 * 86400 - 1, 7200, 60, 30]
    client.put_events([{"event_id": f"t{i}", "session": f"s{i % 2}", "kind": "note", "ts": now - age,
                        "content": f"n{i}"} for i, age in enumerate(ages)])

    def ids(*args: str) -> list[str]:
        return [r["event_id"] for r in ndjson_lines(bio(gw, "tail", "--agent", name, "--json", *args).stdout)]

    everything = [f"t{i}" for i in range(len(ages))]
    for n in range(1, len(ages) + 3):
        assert ids("-n", str(n)) == everything[-n:]
    assert ids("-n", "1", "--kind", "note") == ["t6"]
    assert ids("-n", "2", "--session", "s0") == ["t4", "t6"]  # a session: read whole, in its order
    assert bio(gw, "tail", "--agent", name, "-n", "2").stdout.count("\n") == 2


def test_tail_defaults_to_the_callers_own_biography(gw, story, root):
    creds = story["creds"]
    env = cli_env(gw, creds["access_key"], creds["secret_key"])
    mine = ndjson_lines(bio(gw, "tail", "--json", env=env).stdout)
    assert [r["event_id"] for r in mine] == story["ids"]
    other, _, _ = new_agent(root)
    denied = bio(gw, "tail", "--agent", other, env=env, expect=1)
    assert denied.stderr.startswith("error: AccessDenied:")


# ============================================================================ sessions

def test_sessions_table_and_open_questions(gw, story):
    out = bio(gw, "sessions", "--agent", story["name"]).stdout
    for word in ("SESSION", "EVENTS", "OPEN QUESTIONS", "s1", "s2", "2026-11-30 10:00:00Z"):
        assert word in out
    assert "Open questions:" in out
    assert "q-open" in out and "should I book the hotel too?" in out
    assert "q-answered" not in out and "which airline?" not in out

    found = json.loads(bio(gw, "sessions", "--agent", story["name"], "--json").stdout)
    by_name = {s["session"]: s for s in found["sessions"]}
    assert by_name["s1"]["events"] == 5 and by_name["s1"]["open_questions"] == []
    assert [q["event_id"] for q in by_name["s2"]["open_questions"]] == ["q-open"]

    empty = bio(gw, "sessions", "--agent", uname()).stdout
    assert "No events" in empty


# ============================================================================ export

def test_export_ndjson_and_parquet(gw, story, tmp_path):
    name = story["name"]
    nd = tmp_path / "bio.ndjson"
    proc = bio(gw, "export", "--agent", name, "--out", str(nd))
    assert f"Exported {len(STORY)} events" in proc.stdout and "exporting" in proc.stderr
    rows = ndjson_lines(nd.read_text())
    assert [r["event_id"] for r in rows] == story["ids"]

    pqf = tmp_path / "bio.parquet"
    bio(gw, "export", "--agent", name, "--out", str(pqf))
    table = pq.read_table(pqf)
    assert table.num_rows == len(rows)
    assert table.column_names[0] == "agent" and set(table.column("agent").to_pylist()) == {name}
    assert table.column("event_id").to_pylist() == story["ids"]
    assert json.loads(table.column("data")[1].as_py()) == {"n": 3, "q": "flights"}
    assert table.schema.metadata[b"orgmem.export"] == b"1"
    # the same events as the API's, field for field, through the segment reader
    assert table_to_events(table, name) == [event_from_api(r) for r in rows]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bio.ndjson", "bio.parquet"]  # no temp files left

    # filters, and an existing file is kept unless --force
    refused = bio(gw, "export", "--agent", name, "--session", "s2", "--out", str(pqf), expect=1)
    assert "exists" in refused.stderr and "--force" in refused.stderr
    bio(gw, "export", "--agent", name, "--session", "s2", "--out", str(pqf), "--force")
    assert pq.read_table(pqf).column("session").to_pylist() == ["s2", "s2"]
    bio(gw, "export", "--agent", name, "--since", "2026-11-30T10:00:02Z", "--until", "2026-11-30T11:00:00Z",
        "--out", str(nd), "--force")
    assert [r["event_id"] for r in ndjson_lines(nd.read_text())] == story["ids"][2:5]


# ============================================================================ compact and retention

def test_compact_keeps_every_event_readable(gw, story, tmp_path):
    result = json.loads(bio(gw, "compact", "--json").stdout)
    assert {"records", "segments_written", "conflict"} <= set(result)
    assert "Compacted" in bio(gw, "compact").stdout
    rows = ndjson_lines(bio(gw, "tail", "--agent", story["name"], "--json").stdout)
    assert [r["event_id"] for r in rows] == story["ids"]
    out = tmp_path / "after.parquet"
    bio(gw, "export", "--agent", story["name"], "--out", str(out))
    assert pq.read_table(out).num_rows == len(STORY)


def test_retain_show_and_set(gw):
    agent = uname()
    shown = json.loads(bio(gw, "retain", "--json").stdout)
    assert set(shown) == {"default_days", "agents", "audit_days"}
    try:
        assert "default: kept 400 days" in bio(gw, "retain", "--days", "400").stdout
        assert f"{agent}: kept 9 days." in bio(gw, "retain", "--agent", agent, "--days", "9").stdout
        assert f"{agent}: kept 9 days (its own setting)" in bio(gw, "retain", "--agent", agent).stdout
        table = bio(gw, "retain").stdout
        assert "default: kept 400 days" in table and agent in table
        assert f"{agent}: kept forever." in bio(gw, "retain", "--agent", agent, "--forever").stdout
        assert json.loads(bio(gw, "retain", "--json").stdout)["agents"][agent] is None
        assert "the default" in bio(gw, "retain", "--agent", agent, "--reset").stdout
        assert agent not in json.loads(bio(gw, "retain", "--json").stdout)["agents"]
        assert "default: kept forever" in bio(gw, "retain", "--forever").stdout
        assert json.loads(bio(gw, "retain", "--json").stdout)["default_days"] is None
        assert bio(gw, "retain", "--days", "5", "--forever", expect=2).returncode == 2
    finally:
        bio(gw, "retain", "--forever", expect=None)


# ============================================================================ follow

def _follow(gw: Gateway, agent: str, **popen) -> tuple[subprocess.Popen, queue.Queue]:
    proc = subprocess.Popen([str(ORGMEM), "bio", "tail", "--follow", "--json", "--agent", agent],
                            env=cli_env(gw), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **popen)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    return proc, lines


def _wait_for(lines: queue.Queue, event_id: str, timeout: float = 20) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if json.loads(lines.get(timeout=0.5))["event_id"] == event_id:
                return True
        except queue.Empty:
            continue
    return False


def _stop(proc: subprocess.Popen, sig: int) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def test_tail_follow_shows_new_events_and_stops_on_sigterm(gw, root):
    name, _, client = new_agent(root)
    client.put_events([{"event_id": "before", "session": "f", "kind": "note"}])
    term, term_lines = _follow(gw, name)
    # started the way a shell starts a background job: SIGINT ignored
    ignored, ignored_lines = _follow(gw, name, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert _wait_for(term_lines, "before") and _wait_for(ignored_lines, "before")
        time.sleep(0.5)  # both are polling now
        # a late event (older than the newest shown, within the look-back) and a new one
        now = time.time()
        client.put_events([{"event_id": "late", "session": "f", "kind": "note", "ts": now - 30},
                           {"event_id": "after", "session": "f", "kind": "question", "content": "new?"}])
        assert _wait_for(term_lines, "late") and _wait_for(term_lines, "after")
        assert _wait_for(ignored_lines, "late") and _wait_for(ignored_lines, "after")
        time.sleep(1.5)
        assert term_lines.empty(), "an event was shown twice"
    finally:
        term_code = _stop(term, signal.SIGTERM)
        ignored_code = _stop(ignored, signal.SIGINT)
    assert term_code == 0, term.stderr.read()
    assert ignored_code == 0, ignored.stderr.read()


# ============================================================================ bad input

@pytest.mark.parametrize("args,words", [
    (["tail", "--kind", "bogus"], ["InvalidArgument", "unknown kind 'bogus'"]),
    (["tail", "--since", "yesterday"], ["since", "not a time"]),
    (["export", "--out", "events.csv"], [".parquet", ".ndjson"]),
    (["sessions", "--agent", "Not_An_Agent"], ["agent name", "not valid"]),
    (["tail", "--agent", "Not_An_Agent"], ["agent name", "not valid"]),
    (["export", "--since", "soon", "--out", "x.ndjson"], ["since", "not a time"]),
])
def test_bad_input_is_a_clear_error(gw, story, tmp_path, args, words):
    args = [str(tmp_path / a) if a.endswith((".csv", ".ndjson")) else a for a in args]
    if "--agent" not in args:
        args += ["--agent", story["name"]]
    proc = bio(gw, *args, expect=1)
    assert proc.stderr.startswith("error: ") and proc.stdout == ""
    for word in words:
        assert word in proc.stderr
    assert list(tmp_path.iterdir()) == []  # a failed export leaves no file, not even a partial one


def test_audit_retention_from_the_admin_cli(gw):
    env = {**os.environ, "ORGMEM_ENDPOINT": gw.endpoint, "ORGMEM_ACCESS_KEY": gw.access_key,
           "ORGMEM_SECRET_KEY": gw.secret_key}
    run = lambda *a: subprocess.run([str(ORGMEM), "admin", "audit", "retain", *a], env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    assert run().stdout.strip() == "audit records: kept forever."
    assert run("--days", "90").stdout.strip() == "audit records: kept 90 days."
    assert run().stdout.strip() == "audit records: kept 90 days."
    assert run("--days", "0").returncode == 2
    assert run("--forever").stdout.strip() == "audit records: kept forever."
