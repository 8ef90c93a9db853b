"""The search pipeline's exactly-once rules, driven one step at a time in-process.

Events whose ids the gateway assigned are added to the index without the delete an
upsert does first (``BioRecord.fresh``). That is only safe while nothing of theirs can
be in the index already; these tests break an apply part way and check that the
retry leaves one copy of each event. (Rebuilds under a stream of events, restarts and
take-overs are covered against real gateways in ``test_search.py``.)
"""

from __future__ import annotations

import time

import orjson
import pytest

from gateway.app import build
from gateway.biography.events import validate_batch
from gateway.config import Config
from gateway.log import BioRecord
from gateway.log.writer import LogWriter
from gateway.search.tokens import ROOT_TOKEN
from gateway.store.base import StoreUnavailable
from indexer import ProcessIndexWriter

ROOT_ACCESS = "AKIAPIPELINETEST0001"


@pytest.fixture
def gw(tmp_path):
    g = build(Config(data=str(tmp_path / "data")), ROOT_ACCESS, "p" * 40)
    g.durable_log.start()
    index = g.search_index
    for _ in range(50):
        index.step()
        if index.role == "writer":
            break
        time.sleep(0.1)
    assert index.role == "writer"
    yield g
    index.close()
    g.durable_log.close()
    g.executor.shutdown(wait=True)
    g.store.close()


def ingest(gw, n: int, session: str) -> list[str]:
    body = b"\n".join(orjson.dumps({"session": session, "kind": "note", "content": f"line {i}"})
                      for i in range(n))
    events = validate_batch(body, caller="agent-1", now_us=int(time.time() * 1_000_000))
    assert all(e.id_assigned for e in events)
    return gw.biographies.ingest(events)


def hits(index, session: str) -> int:
    """Documents of ``session`` in the committed index, duplicates counted."""
    searcher = index._searcher
    searcher.reload()
    return searcher.search(None, {"session": session}, tokens=[ROOT_TOKEN], limit=0).count


def test_an_apply_that_fails_part_way_is_redone_without_a_second_copy(gw, monkeypatch):
    index = gw.search_index
    ingest(gw, 40, "first")
    real_add = ProcessIndexWriter.add_lines

    def add_half_then_fail(self, lines):
        real_add(self, lines[: len(lines) // 2])
        raise RuntimeError("the disk hiccupped")

    monkeypatch.setattr(ProcessIndexWriter, "add_lines", add_half_then_fail)
    with pytest.raises(RuntimeError):
        index.step()
    monkeypatch.setattr(ProcessIndexWriter, "add_lines", real_add)
    index.step()  # the same object again, its events upserted this time, then a commit
    assert hits(index, "first") == 40
    assert not index._careful  # the commit settled it: the next events are added again
    added = []

    def counting_add(self, lines):
        added.extend(lines)
        return real_add(self, lines)

    monkeypatch.setattr(ProcessIndexWriter, "add_lines", counting_add)
    ingest(gw, 10, "second")
    index.step()
    assert hits(index, "second") == 10 and hits(index, "first") == 40 and len(added) == 10


def test_adds_that_fail_with_a_value_error_are_redone_as_upserts_once_each(gw, monkeypatch):
    """A ValueError (Tantivy refusing an entry) sends the whole object through one-by-one
    upserts: the events the failed batch call had added already must not stay twice."""
    index = gw.search_index
    ingest(gw, 30, "refused")
    real_add = ProcessIndexWriter.add_lines

    def refuse_after_ten(self, lines):
        real_add(self, lines[:10])
        raise ValueError("a value Tantivy will not take")

    monkeypatch.setattr(ProcessIndexWriter, "add_lines", refuse_after_ten)
    index.step()
    assert hits(index, "refused") == 30


def fail_a_step_part_way(gw, monkeypatch) -> None:
    """Two log objects (sessions "applied" and "unreadable"); a step applies the first, advances
    its position, then fails reading the second: the first is applied but never committed."""
    index = gw.search_index
    ingest(gw, 20, "applied")
    ingest(gw, 20, "unreadable")
    real_add = ProcessIndexWriter.add_lines

    def store_fails_on_the_second(self, lines):
        if any(b'"session":"unreadable"' in line for line in lines):
            raise StoreUnavailable("the store did not answer")
        return real_add(self, lines)

    monkeypatch.setattr(ProcessIndexWriter, "add_lines", store_fails_on_the_second)
    with pytest.raises(StoreUnavailable):
        index.step()
    monkeypatch.setattr(ProcessIndexWriter, "add_lines", real_add)


def test_a_failed_rebuild_forgets_what_was_never_committed_and_reads_it_again(gw, monkeypatch):
    """A step that fails part way leaves log objects applied but not committed; a rebuild that
    then fails rolls them back, so the positions must go back too, or they would be skipped."""
    index = gw.search_index
    fail_a_step_part_way(gw, monkeypatch)

    def memory_fails():
        raise RuntimeError("the memory bucket could not be listed")
        yield  # a generator, as the real one is: it fails once the rebuild reaches it

    monkeypatch.setattr(index.sources, "all_memory", memory_fails)
    index.request_rebuild()
    with pytest.raises(RuntimeError):
        index.step()
    assert index.progress["state"] == "failed"
    monkeypatch.undo()
    index.step()
    assert hits(index, "applied") == 20 and hits(index, "unreadable") == 20


def test_a_rebuild_drops_what_a_failed_step_left_uncommitted(gw, monkeypatch):
    """Tantivy's delete-all spares documents added since the last commit: a rebuild that
    followed a step failing part way would index those events twice."""
    index = gw.search_index
    fail_a_step_part_way(gw, monkeypatch)
    index.request_rebuild()
    index.step()
    assert hits(index, "applied") == 20 and hits(index, "unreadable") == 20


def test_events_compacted_during_a_rebuild_are_not_added_again(gw, monkeypatch):
    """A rebuild reads the segments of the compaction it finds: their log objects, written
    after it listed its target, must count as read too."""
    index = gw.search_index
    bios = gw.biographies
    ingest(gw, 10, "before")
    index.step()
    real_snapshot = bios.snapshot
    between = []

    def compacted_meanwhile():
        if not between:
            between.extend(ingest(gw, 15, "between"))  # after the target was listed
            bios.compact()  # and in segments before the rebuild reads them
        return real_snapshot()

    monkeypatch.setattr(bios, "snapshot", compacted_meanwhile)
    index.request_rebuild()
    index.step()
    monkeypatch.undo()
    index.step()
    assert hits(index, "between") == 15 and hits(index, "before") == 10


def test_a_rebuild_that_reads_the_events_again_counts_each_once(gw, monkeypatch):
    """A compaction while the event phase reads makes it read every event again (upserts: the
    index holds each once); its progress counts each once too."""
    index = gw.search_index
    bios = gw.biographies
    ingest(gw, 10, "before")
    bios.compact()
    real_snapshot = bios.snapshot
    calls = []

    def compacted_after_reading():
        snapshot = real_snapshot()
        if not calls:
            ingest(gw, 15, "between")
            bios.compact()  # the snapshot just taken is stale: the phase reads again
        calls.append(1)
        return snapshot

    monkeypatch.setattr(bios, "snapshot", compacted_after_reading)
    index.request_rebuild()
    index.step()
    monkeypatch.undo()
    assert len(calls) >= 2
    assert index.progress["state"] == "done" and index.progress["counts"]["event"] == 25
    assert hits(index, "between") == 15 and hits(index, "before") == 10


def resent(ids: list[str], session: str) -> list[BioRecord]:
    """The records a gateway writes when a client sends ``ids`` back (a re-import)."""
    body = b"\n".join(orjson.dumps({"event_id": i, "session": session, "kind": "note", "content": "again"})
                      for i in ids)
    events = validate_batch(body, caller="agent-1", now_us=int(time.time() * 1_000_000))
    assert all(e.id_resent and not e.id_assigned for e in events)
    return [BioRecord(e.to_record(), e.id_assigned, e.id_resent) for e in events]


def other_writer(gw, writer_id: str, request) -> LogWriter:
    """Another gateway's log writer on the same store (its id sets where it is applied)."""
    writer = LogWriter(gw.store, writer_id, 0.05).start()
    request.addfinalizer(writer.close)
    return writer


def test_an_assigned_id_sent_back_through_another_gateway_stays_one_document(gw, request):
    """Sent back through a gateway whose log is applied first: its upserts come before the
    fresh adds, which the repeat fences."""
    index = gw.search_index
    ids = ingest(gw, 5, "resent")  # fresh, in this gateway's writer
    other_writer(gw, "000000000001-aaaaaaaaaa", request).append(resent(ids, "resent"))  # sorts first
    index.step()
    assert hits(index, "resent") == 5
    ingest(gw, 5, "later")  # nothing repeats these: added again
    index.step()
    assert hits(index, "later") == 5 and hits(index, "resent") == 5
    assert not index._fence or max(index._fence.values()) <= max(index.positions.values())


def test_an_assigned_id_sent_back_through_an_earlier_gateway_stays_one_document(gw, monkeypatch, request):
    """A gateway of an earlier version (mid rolling upgrade) logs the repeat without the
    resent mark; its objects lack ``ids_marked``, so their records count as resent all the
    same."""
    import zstandard

    from gateway.log import writer as writer_module

    index = gw.search_index
    ids = ingest(gw, 5, "legacy")
    real = writer_module.encode

    def unmarked(records, writer, seq):  # what an earlier gateway writes: no marks at all
        plain = [BioRecord(r.event) if isinstance(r, BioRecord) else r for r in records]
        text = zstandard.ZstdDecompressor().decompress(real(plain, writer, seq))
        return zstandard.ZstdCompressor().compress(text.replace(b',"ids_marked":true', b""))

    old = other_writer(gw, "000000000002-bbbbbbbbbb", request)  # applied before this gateway
    monkeypatch.setattr(writer_module, "encode", unmarked)
    old.append(resent(ids, "legacy"))
    monkeypatch.undo()
    index.step()
    assert hits(index, "legacy") == 5


def test_a_step_fences_once_however_many_repeats_it_applies(gw, monkeypatch, request):
    """Each fence lists every writer's log; a step's first fence already covers every repeat
    the step applies, so a stream of them (an earlier gateway's objects during an upgrade)
    costs one listing per step, not one per object."""
    index = gw.search_index
    ids = ingest(gw, 20, "many")
    other = other_writer(gw, "000000000003-cccccccccc", request)
    for i in ids:  # one repeat per log object
        other.append(resent([i], "many"))
    fences = []
    real = index._fence_waiting
    monkeypatch.setattr(index, "_fence_waiting", lambda: (fences.append(1), real())[1])
    index.step()
    assert len(fences) == 1
    assert hits(index, "many") == 20


def test_a_fresh_event_stored_between_two_writers_listings_stays_one_document(gw, monkeypatch, request):
    """The log's listing is one writer after another, not one look: the fresh record can be
    stored after its writer was listed and its repeat before the next writer is. The fence
    the repeat raises lists the log again, after the repeat was seen, so it finds the fresh."""
    index = gw.search_index
    me = gw.durable_log.writer_id
    later = other_writer(gw, "ffffffffffff-zzzzzzzzzz", request)  # listed after this gateway
    later.append(resent(["ev_NOTHINGTOREPEAT0000000000"], "warmup"))
    ingest(gw, 1, "warm")
    index.step()
    reader = index.log.reader
    real = reader.sequences
    raced = []

    def listing_with_a_race(writer, after=0):
        found = list(real(writer, after))
        if writer == me and not raced:
            raced.extend(ingest(gw, 5, "raced"))  # stored just after this writer was listed
            later.append(resent(raced, "raced"))  # and sent back before the next one is
        return iter(found)

    monkeypatch.setattr(reader, "sequences", listing_with_a_race)
    index.step()
    monkeypatch.undo()
    index.step()
    assert hits(index, "raced") == 5


def test_a_snapshot_carries_the_fence_to_the_next_writer(gw, request):
    """The fence is in the snapshot's checkpoint, so a gateway restoring it upserts what the
    writer before it had fenced."""
    from indexer.snapshot import latest

    index = gw.search_index
    ids = ingest(gw, 3, "fenced")
    other_writer(gw, "000000000001-bbbbbbbbbb", request).append(resent(ids[:1], "fenced"))
    index._consume(limit=1)  # applies the repeat only (its writer is first): ours is fenced
    mine = gw.durable_log.writer_id
    assert index._fence.get(mine) and index._fence[mine] > index.positions.get(mine, 0)
    index._commit()
    index._publish()
    assert latest(index.blobs, "index")["checkpoint"]["fence"] == {mine: index._fence[mine]}


def test_a_writer_over_a_damaged_newest_snapshot_publishes_over_it(gw):
    """The newest snapshot cannot be restored (a file damaged): the writer restores the one
    before, and then publishes over the damaged one rather than refusing its own base."""
    from indexer.snapshot import latest

    index = gw.search_index
    ingest(gw, 5, "first")
    index._consume()
    index._commit()
    index._publish()
    first = latest(index.blobs, "index")
    ingest(gw, 5, "second")
    index._consume()
    index._commit()
    index._publish()
    newest = latest(index.blobs, "index")
    assert newest["seq"] == first["seq"] + 1
    old_keys = {f["key"] for f in first["files"]}
    victim = next(f for f in newest["files"] if f["key"] not in old_keys)
    index.blobs.put(victim["key"], b"damaged")
    index._step_down()
    index._local = None  # as after a restart: nothing to link from, every file is fetched
    index.step()  # takes over: restores the snapshot before the damaged one
    assert index.role == "writer" and index._snapshot["seq"] == first["seq"]
    ingest(gw, 5, "third")
    for _ in range(3):
        index._consume()
        index._commit()
        index._publish()
        assert index.role == "writer"
    assert latest(index.blobs, "index")["seq"] > newest["seq"]
    assert hits(index, "first") == 5 and hits(index, "second") == 5 and hits(index, "third") == 5


def test_a_restore_the_store_cuts_short_leaves_no_working_copy(gw, monkeypatch):
    """A follower's or a new writer's restore that fails part way (the store gone) removes
    its half-made plaintext copy of the index at once: the owner is alive, so no sweep would."""
    from gateway.search import workdirs

    index = gw.search_index
    ingest(gw, 3, "restored")
    index._consume()
    index._commit()
    index._publish()
    made = []
    real_new = index._new_dir

    def new_dir():
        made.append(real_new())
        return made[-1]

    def cut_short(directory):
        (directory / "meta.json").write_text("{}")  # part of a copy, then the store fails
        raise StoreUnavailable("the store went away")

    monkeypatch.setattr(index, "_new_dir", new_dir)
    monkeypatch.setattr(index, "_restore", cut_short)
    index._snapshot = {}
    with pytest.raises(StoreUnavailable):
        index._follow()
    index._step_down()
    with pytest.raises(StoreUnavailable):
        index._take_over()
    assert len(made) == 2 and not any(d.exists() for d in made)
    assert all(d.name.startswith(workdirs.PREFIX) for d in made)


def test_a_step_that_left_a_backlog_makes_the_next_one_a_catch_up(gw, monkeypatch):
    """An index behind the log (ingest outpacing it) commits in larger steps until it is
    current: each commit has a fixed cost, and 0.5 s commits of a backlog spend on it what
    catching up needs. A step that read everything goes back to short ones."""
    import gateway.indexing as indexing

    index = gw.search_index
    monkeypatch.setattr(indexing, "STEP_RECORDS", 10)
    monkeypatch.setattr(indexing, "CATCHUP_STEP_RECORDS", 1000)
    commits = []
    real_commit = index._commit
    monkeypatch.setattr(index, "_commit", lambda: commits.append(1) or real_commit())
    for session in ("a", "b", "c"):
        ingest(gw, 20, session)  # one log object each
    assert index.step() is True  # one object (20 records >= 10), a backlog left
    assert not index._catching_up and hits(index, "a") == 20 and hits(index, "b") == 0
    assert index.step() is False  # catching up: both remaining objects, one commit
    assert index._catching_up and hits(index, "b") == 20 and hits(index, "c") == 20
    assert not index._far_behind  # snapshots keep their pace: 2 objects are not far behind
    assert len(commits) == 2
    ingest(gw, 5, "d")
    index.step()
    assert not index._catching_up and hits(index, "d") == 5


def test_status_lag_counts_what_search_does_not_show_yet(gw):
    """Objects a step read but has not committed are not searchable: the status counts them
    as lag until the commit (a client waiting for lag 0 then finds every event)."""
    index = gw.search_index
    index.step()
    assert index.status()["lag_objects"] == 0
    ingest(gw, 5, "pending")
    assert index._consume()  # read and applied, not committed
    assert index.status()["lag_objects"] == 1 and hits(index, "pending") == 0
    index._commit()
    assert index.status()["lag_objects"] == 0 and hits(index, "pending") == 5


def test_status_lag_reaches_zero_when_the_log_holds_nothing_to_index(gw):
    """Every request logs an audit record, which search does not index: a step that reads only
    such objects commits nothing, and the status must still count them as read (a client
    polling the status, itself a request, waited forever for lag 0)."""
    from gateway.log import AuditEntry

    index = gw.search_index
    ingest(gw, 5, "indexed")
    index.step()
    assert index.status()["lag_objects"] == 0
    gw.durable_log.append([AuditEntry({"action": "s3:GetObject", "time": "2026-12-02T06:00:00Z"})])
    assert index.status()["lag_objects"] == 1
    index.step()
    assert index.status()["lag_objects"] == 0 and hits(index, "indexed") == 5
