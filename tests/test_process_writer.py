"""The index writer in its own process: the same meaning as the in-process writer, errors
brought back as their kind, and a child that dies never taken for a working writer.

Real child processes (spawned as the gateway spawns them) over real index directories; the
gateway-level test kills the writer's process under a running pipeline and checks that every
event is found once after the pipeline takes the index over again.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from gateway.app import build
from gateway.biography.events import validate_batch
from gateway.config import Config
from gateway.search.entries import event_of
from gateway.search.tokens import ROOT_TOKEN
from indexer import IndexSearcher, IndexWriterGone, ProcessIndexWriter, event_entry, memory_entry

WHEN = datetime(2026, 11, 30, 12, 0, 0, 123457, tzinfo=UTC)


def entry(n: int, word: str = "quokka"):
    return event_entry("agent-a", f"ev_{n}", kind="note", content=f"{word} number {n}", time=WHEN,
                       session="s1", access=["agent:agent-a"])


def count(writer: ProcessIndexWriter, query: str, tokens=("agent:agent-a",)) -> int:
    return IndexSearcher(writer.index).search(query, tokens=list(tokens), limit=0).count


@pytest.fixture
def writer(tmp_path):
    w = ProcessIndexWriter(tmp_path / "index", heap_size=15_000_000, num_threads=1, entry_of=event_of)
    yield w
    w.close()


def test_upserts_adds_deletes_are_seen_after_commit_and_rollback_forgets(writer):
    writer.add([entry(1), entry(2)])
    assert writer.pending == 2 and count(writer, "quokka") == 0  # nothing before the commit
    writer.commit()
    assert count(writer, "quokka") == 2
    writer.upsert(entry(1, "wombat"))  # replaces, by source
    writer.upsert([entry(1, "wombat")])
    writer.commit()
    assert count(writer, "quokka") == 1 and count(writer, "wombat") == 1
    writer.delete("bio:agent-a/ev_2")
    writer.rollback()
    writer.commit()
    assert count(writer, "quokka") == 1 and writer.pending == 0
    writer.delete(["bio:agent-a/ev_2"])
    writer.commit()
    assert count(writer, "quokka") == 0


def test_an_entry_comes_back_exactly_as_sent(writer):
    """Every field survives the pipe, the time to the microsecond."""
    doc = memory_entry("team:core", "m-1", kind="decision", title="Ship on Fridays", body="never ö",
                       time=WHEN, status="superseded", tags=["ops", "release"], agent="agent-b",
                       access=["team:core"], resource="arn:orgmem:memory:::team/core/m-1")
    writer.upsert(doc)
    writer.commit()
    (hit,) = IndexSearcher(writer.index).search("ship", tokens=["team:core"]).hits
    assert (hit.type, hit.id, hit.title, hit.scope, hit.kind, hit.status, hit.agent) == (
        "memory", "m-1", "Ship on Fridays", "team:core", "decision", "superseded", "agent-b")
    assert sorted(hit.tags) == ["ops", "release"]
    assert datetime.fromisoformat(hit.time) == WHEN


def test_records_become_entries_in_the_child_and_odd_ones_are_skipped(writer):
    body = b"\n".join(orjson.dumps({"session": "s", "kind": "note", "content": f"platypus {i}"})
                      for i in range(5))
    records = [e.to_record() for e in validate_batch(body, caller="agent-c", now_us=1_796_000_000_000_000)]
    assert writer.add_records(records[:3]) == (3, 0)
    assert writer.upsert_records(records[2:] + [{"no": "agent"}]) == (3, 1)  # the odd one skipped
    writer.commit()
    assert count(writer, "platypus", tokens=[ROOT_TOKEN]) == 5


def test_errors_come_back_as_their_kind_and_the_writer_goes_on(writer):
    with pytest.raises(ValueError, match="unknown request"):
        writer._call(("bogus",))
    writer.add([entry(3)])
    writer.commit()
    assert count(writer, "quokka") == 1


def test_a_second_writer_on_the_directory_is_refused_and_leaves_no_process(writer, tmp_path):
    before = {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(ValueError):
        ProcessIndexWriter(tmp_path / "index", heap_size=15_000_000, num_threads=1)
    assert {p.pid for p in multiprocessing.active_children()} == before  # its child was ended
    writer.add([entry(6)])  # the first writer holds on
    writer.commit()
    assert count(writer, "quokka") == 1


def test_a_killed_child_is_never_taken_for_a_writer_and_frees_the_directory(tmp_path):
    writer = ProcessIndexWriter(tmp_path / "index", heap_size=15_000_000, num_threads=1)
    writer.add([entry(4)])
    writer.commit()
    os.kill(writer._process.pid, signal.SIGKILL)
    with pytest.raises(IndexWriterGone, match="signal 9"):
        writer.add([entry(5)])
    with pytest.raises(IndexWriterGone):
        writer.commit()
    writer.close()  # harmless
    again = ProcessIndexWriter(tmp_path / "index", heap_size=15_000_000, num_threads=1)
    try:
        assert count(again, "quokka") == 1  # what was committed stayed; nothing else
    finally:
        again.close()


def test_the_pipeline_takes_the_index_over_again_when_its_writer_dies(tmp_path):
    """SIGKILL the writer's process between steps: the step that finds it gone fails, the
    next takes the index over (its snapshot, then the log), and every event is found once."""
    gw = build(Config(data=str(tmp_path / "data")), "AKIAPROCWRITERTEST01", "p" * 40)
    gw.durable_log.start()
    index = gw.search_index
    try:
        _until_writer(index)
        _ingest(gw, 30, "before")
        index.step()
        os.kill(index._writer._process.pid, signal.SIGKILL)
        _ingest(gw, 20, "after")
        with pytest.raises(IndexWriterGone):
            index.step()
        assert index.role != "writer"
        _until_writer(index)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _hits(index, "after") < 20:
            index.step()
        assert _hits(index, "before") == 30 and _hits(index, "after") == 20
    finally:
        index.close()
        gw.durable_log.close()
        gw.executor.shutdown(wait=True)
        gw.store.close()


def _until_writer(index) -> None:
    for _ in range(100):
        index.step()
        if index.role == "writer":
            return
        time.sleep(0.1)
    raise AssertionError(f"the index never became the writer ({index.role})")


def _ingest(gw, n: int, session: str) -> None:
    body = b"\n".join(orjson.dumps({"session": session, "kind": "note", "content": f"line {i}"})
                      for i in range(n))
    gw.biographies.ingest(validate_batch(body, caller="agent-1", now_us=int(time.time() * 1_000_000)))


def _hits(index, session: str) -> int:
    searcher = index._searcher
    searcher.reload()
    return searcher.search(None, {"session": session}, tokens=[ROOT_TOKEN], limit=0).count


def test_times_at_the_edges_of_the_index_survive(writer):
    for n, when in enumerate((datetime(1970, 1, 1, tzinfo=UTC), WHEN + timedelta(days=3650)), 10):
        writer.upsert(event_entry("agent-a", f"ev_{n}", kind="note", content="edge", time=when,
                                  access=["agent:agent-a"]))
    writer.commit()
    times = sorted(datetime.fromisoformat(h.time) for h in IndexSearcher(writer.index).search("edge", tokens=["agent:agent-a"]).hits)
    assert times == [datetime(1970, 1, 1, tzinfo=UTC), WHEN + timedelta(days=3650)]


def test_log_lines_become_entries_in_the_child_and_odd_ones_are_skipped(writer):
    """The pipeline sends a biography record as its log line (the bytes the log holds)."""
    from gateway.log import BioRecord

    body = b"\n".join(orjson.dumps({"session": "s", "kind": "note", "content": f"wombat {i}"}) for i in range(4))
    events = validate_batch(body, caller="agent-c", now_us=1_796_000_000_000_000)
    lines = [BioRecord(e.to_record(), fresh=True).encoded() for e in events]
    assert writer.add_lines(lines[:2]) == (2, 0)
    assert writer.upsert_lines(lines[2:] + [b'{"k":"bio"}', b'{"k":"bio","v":{"no":"agent"}}']) == (2, 2)
    writer.commit()
    assert count(writer, "wombat", tokens=[ROOT_TOKEN]) == 4
