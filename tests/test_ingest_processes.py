"""Ingest processes: large event batches prepared outside the gateway's interpreter.

Real spawned processes throughout; the last tests run a real gateway over HTTP."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import uuid
from pathlib import Path

import orjson
import pytest
from clients import wait_until
from servers import Gateway

from gateway.admin_client import AdminClient
from gateway.bio_client import BioClient, BioError
from gateway.biography.events import EventError
from gateway.biography.prepare import Preparer
from gateway.biography.redact import Redactor
from gateway.biography.workers import MIN_BODY, IngestWorkers
from gateway.config import Config

KEY = bytes(range(32))
NOW = 1_796_000_000_000_000


def batch(n: int, session: str = "s1", **extra) -> bytes:
    """``n`` events with their own ids and times (so two preparations can be compared), with a
    planted AWS key, a password in a URL and ordinary prose, large enough for the processes."""
    lines = []
    for i in range(n):
        lines.append({"event_id": f"e-{session}-{i}", "session": session, "ts": f"2026-11-30T10:00:00.{i:06d}Z",
                      "kind": "tool_result" if i % 2 else "note", "seq": i, "tags": ["t"],
                      "content": f"step {i}: AKIAIOSFODNN7EXAMPLE then postgres://app:hunter2pass@db/x "
                                 f"and the build log said {'ok ' * 40}",
                      "data": {"exit": i % 3, "path": f"/src/m{i}.py"}, **extra})
    body = b"\n".join(orjson.dumps(line) for line in lines)
    assert len(body) >= MIN_BODY
    return body


def ingest_children() -> list[multiprocessing.Process]:
    return [p for p in multiprocessing.active_children() if p.name == "orgmem-ingest"]


@pytest.fixture
def pool():
    workers = IngestWorkers(KEY, 2)
    yield workers
    workers.close()


def ready(pool: IngestWorkers, body: bytes) -> None:
    """Start the processes (the first large batch does) and wait until both answer."""
    assert pool.prepare(body, "agent-1", NOW) is None  # none ready yet: the caller prepares it
    wait_until(lambda: pool.ready == 2, timeout=60)


def test_a_batch_becomes_the_same_records_as_in_process(pool):
    body = batch(120)
    ready(pool, body)
    there = pool.prepare(body, "agent-1", NOW)
    here = Preparer(Redactor(KEY)).prepare(body, "agent-1", NOW)
    assert there is not None
    assert [r.event for r in there.records] == [r.event for r in here.records]
    assert [r.encoded() for r in there.records] == [r.encoded() for r in here.records]  # byte for byte
    assert there.ids == here.ids and there.first == here.first and there.others == here.others
    assert all("AKIAIOSFODNN7EXAMPLE" not in r.event["content"] and "hunter2pass" not in r.event["content"]
               for r in there.records)
    assert all(r.event["redactions"] == 2 for r in there.records)


def test_assigned_ids_are_fresh_and_unique_across_processes(pool):
    body = b"\n".join(orjson.dumps({"session": "s", "kind": "note", "content": "x" * 200}) for _ in range(200))
    ready(pool, body)
    ids: list[str] = []
    for _ in range(6):
        prepared = pool.prepare(body, "agent-1", NOW)
        assert prepared is not None and all(r.fresh for r in prepared.records)
        ids += prepared.ids
    assert len(ids) == len(set(ids)) == 1200


@pytest.mark.parametrize("bad, field", [({"kind": "note"}, "session"),
                                        ({"session": "s", "kind": "nap"}, "kind"),
                                        ({"session": "s", "kind": "note", "tokens_in": "12"}, "tokens_in")])
def test_an_invalid_event_is_refused_with_the_in_process_message(pool, bad, field):
    body = batch(100) + b"\n" + orjson.dumps(bad)
    ready(pool, batch(100))
    with pytest.raises(EventError) as there:
        pool.prepare(body, "agent-1", NOW)
    with pytest.raises(EventError) as here:
        Preparer(Redactor(KEY)).prepare(body, "agent-1", NOW)
    assert (there.value.line, there.value.field) == (101, field)
    assert str(there.value) == str(here.value)


def test_vault_values_reach_every_process_before_its_next_batch(pool):
    body = batch(100)
    ready(pool, body)
    secret = "vault-value-" + uuid.uuid4().hex
    pool.replace_values([secret])
    with_secret = batch(100, session="v", artifact_uri=f"s3://b/k?token={secret}")
    for _ in range(4):  # both processes, whichever takes each batch
        prepared = pool.prepare(with_secret, "agent-1", NOW)
        assert prepared is not None
        assert all(secret not in r.encoded().decode() for r in prepared.records)
        assert all("[REDACTED:vault:" in r.event["artifact_uri"] for r in prepared.records)


def test_a_killed_process_is_replaced_and_no_batch_is_lost(pool):
    body = batch(100)
    ready(pool, body)
    for child in ingest_children():
        os.kill(child.pid, signal.SIGKILL)
    answers = [pool.prepare(body, "agent-1", NOW) for _ in range(2)]
    assert answers == [None, None]  # each caller learns it, and prepares the batch itself
    wait_until(lambda: pool.ready == 2, timeout=60)  # two new processes
    again = pool.prepare(body, "agent-1", NOW)
    assert again is not None and len(again.records) == 100


def test_closing_the_pool_ends_its_processes(pool):
    ready(pool, batch(100))
    assert len(ingest_children()) == 2
    pool.close()
    assert pool.prepare(batch(100), "agent-1", NOW) is None
    wait_until(lambda: not ingest_children(), timeout=30)


@pytest.mark.parametrize("value", ["-1", "65", "many"])
def test_a_bad_ingest_process_count_is_refused(value):
    with pytest.raises(ValueError, match="ingest_processes"):
        Config.load(env={"ORGMEM_INGEST_PROCESSES": value})


def test_the_default_is_one_process_per_cpu_and_none_on_one():
    assert Config.load(env={"ORGMEM_INGEST_PROCESSES": "0"}).ingest_process_count == 0
    cpus = len(os.sched_getaffinity(0))
    assert Config.load(env={}).ingest_process_count == (cpus if cpus > 1 else 0)


# -- a real gateway ----------------------------------------------------------------------------


def gateway_children(gw: Gateway) -> list[int]:
    pids = []
    for task in Path(f"/proc/{gw.proc.pid}/task").iterdir():
        pids += [int(p) for p in (task / "children").read_text().split()]
    return [p for p in pids if b"multiprocessing" in Path(f"/proc/{p}/cmdline").read_bytes()
            and b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("ingest") / "data", extra_args=["--ingest-processes", "2"]).start()
    yield gateway
    gateway.stop()


def test_large_batches_through_the_gateway_read_back_redacted_and_in_order(gw):
    admin = AdminClient(gw.endpoint, gw.access_key, gw.secret_key)
    name = f"ag-{uuid.uuid4().hex[:8]}"
    created = admin.create_agent(name)
    bio = BioClient(gw.endpoint, created["access_key"], created["secret_key"])
    before = len(gateway_children(gw))
    sessions = [f"big-{i}" for i in range(8)]
    assert bio.put_events(batch(150, session=sessions[0]))["count"] == 150  # starts the processes
    assert wait_until(lambda: len(gateway_children(gw)) >= before + 2, timeout=60)
    for session in sessions[1:]:  # these go through them
        assert bio.put_events(batch(150, session=session))["count"] == 150
    for session in sessions:
        events = list(bio.iter_events(session=session))
        assert [e["event_id"] for e in events] == [f"e-{session}-{i}" for i in range(150)]
        assert all(e["agent"] == name and e["redactions"] == 2 for e in events)
        assert all("AKIAIOSFODNN7EXAMPLE" not in e["content"] for e in events)


def test_a_large_invalid_batch_is_refused_naming_the_line_and_nothing_is_stored(gw):
    admin = AdminClient(gw.endpoint, gw.access_key, gw.secret_key)
    created = admin.create_agent(f"ag-{uuid.uuid4().hex[:8]}")
    bio = BioClient(gw.endpoint, created["access_key"], created["secret_key"])
    bio.put_events(batch(100, session="warm"))
    time.sleep(1)  # the processes are up by now, or the batch is prepared in-process: same answer
    body = batch(100, session="bad") + b"\n" + orjson.dumps({"session": "bad", "kind": "note", "seq": -1})
    with pytest.raises(BioError) as refused:
        bio.put_events(body)
    assert refused.value.status == 400 and "line 101" in str(refused.value) and "seq" in str(refused.value)
    assert list(bio.iter_events(session="bad")) == []


def test_writing_for_another_agent_still_needs_a_grant(gw):
    admin = AdminClient(gw.endpoint, gw.access_key, gw.secret_key)
    created = admin.create_agent(f"ag-{uuid.uuid4().hex[:8]}")
    bio = BioClient(gw.endpoint, created["access_key"], created["secret_key"])
    with pytest.raises(BioError) as refused:
        bio.put_events(batch(100, session="theirs", agent="someone-else"))
    assert refused.value.status == 403
    root = BioClient(gw.endpoint, gw.access_key, gw.secret_key)
    assert list(root.iter_events(agent="someone-else", session="theirs")) == []


def test_the_gateway_ends_its_ingest_processes_when_it_stops(tmp_path):
    gateway = Gateway(tmp_path / "data", extra_args=["--ingest-processes", "2"]).start()
    try:
        bio = BioClient(gateway.endpoint, gateway.access_key, gateway.secret_key)
        bio.put_events(batch(100))
        wait_until(lambda: len(gateway_children(gateway)) >= 3, timeout=60)  # two + the index writer
        children = gateway_children(gateway)
    finally:
        gateway.stop()
    wait_until(lambda: not [p for p in children if Path(f"/proc/{p}").exists()
                            and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2]], timeout=30)


def test_an_uploaded_object_gets_the_same_derived_ids_there_as_here(pool):
    """An NDJSON object put into the biographies bucket: its limits and its id namespace travel
    with it, so a retried upload derives the same ids wherever it is prepared."""
    body = b"\n".join(orjson.dumps({"session": "up", "kind": "note", "content": "y" * 300}) for _ in range(80))
    ready(pool, body)
    limits = {"id_namespace": "s3:biographies/run-1.ndjson", "max_body": 256 << 20, "max_events": 1_000_000}
    there = pool.prepare(body, "agent-1", NOW, **limits)
    here = Preparer(Redactor(KEY)).prepare(body, "agent-1", NOW, **limits)
    assert there is not None and there.ids == here.ids and len(set(there.ids)) == 80
    assert not any(r.fresh for r in there.records)  # derived, not fresh: a retry repeats them
