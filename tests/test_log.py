"""The durable log on a real store: group commit, reading past positions, checkpoints, collection."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import zstandard

from gateway.log import (
    AuditEntry,
    BioRecord,
    CheckpointConflict,
    DocChanged,
    DurableLog,
    LogFormatError,
    LogUnavailable,
    advance,
    layout,
)
from gateway.log.records import decode, encode
from gateway.store.base import INTERNAL_BUCKET, StoreUnavailable
from gateway.store.local import LocalStore
from gateway.store.s3 import S3Store

UPSTREAM_BUCKET = "orgmem-log-tests"


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, monkeypatch):
    if request.param == "local":
        s = LocalStore(tmp_path / "store")
    else:
        sw = request.getfixturevalue("seaweed")
        for name, value in sw.env.items():
            monkeypatch.setenv(name, value)
        s = S3Store(UPSTREAM_BUCKET, f"log-{uuid.uuid4().hex[:8]}", sw.endpoint, threads=8,
                    spool_dir=tmp_path / "spool")
    s.create_bucket(INTERNAL_BUCKET)
    yield s
    s.close()


def bio(i: int) -> BioRecord:
    return BioRecord({"event_id": f"e{i}", "agent": "a", "session": "s", "kind": "note", "ts": i})


def test_records_round_trip_through_one_object():
    records = [bio(1), AuditEntry({"request_id": "R1", "status": 200}),
               DocChanged("memory", "org/x", "put", 1.5, version=2, etag="e", by="alice")]
    assert decode(encode(records, "w1", 7), "w1", 7) == records


def test_fresh_and_resent_marks_travel_with_their_records_and_are_absent_by_default():
    fresh, resent = BioRecord(bio(2).event, fresh=True), BioRecord(bio(3).event, resent=True)
    back = decode(encode([bio(1), fresh, resent], "w1", 8), "w1", 8)
    assert [(r.fresh, r.resent) for r in back] == [(False, False), (True, False), (False, True)]
    assert back[1].event == fresh.event
    text = zstandard.ZstdDecompressor().decompress(encode([bio(1), fresh, resent], "w1", 8)).split(b"\n")
    assert b"fresh" not in text[1] and b"resent" not in text[1]
    assert b'"fresh":true' in text[2] and b'"resent":true' in text[3]


def test_bio_records_of_a_writer_that_marks_no_ids_count_as_resent():
    """An object without ``ids_marked`` (an earlier gateway, mid rolling upgrade) may hold a
    client's repeat of an assigned id, unmarked: its bio lines read as resent, never fresh."""
    records = [bio(1), BioRecord(bio(2).event, fresh=True), AuditEntry({"request_id": "R1"})]
    text = zstandard.ZstdDecompressor().decompress(encode(records, "w1", 4))
    assert b'"ids_marked":true' in text.split(b"\n")[0]
    legacy = zstandard.ZstdCompressor().compress(text.replace(b',"ids_marked":true', b""))
    back = decode(legacy, "w1", 4)
    assert [(r.fresh, r.resent) for r in back[:2]] == [(False, True), (False, True)]
    assert [r.event for r in back[:2]] == [records[0].event, records[1].event]
    assert back[2] == records[2]


@pytest.mark.parametrize("damage", ["not zstd", "wrong name", "truncated", "bad json", "future format"])
def test_damaged_log_objects_are_refused(damage):
    data = encode([bio(1), bio(2)], "w1", 3)
    text = zstandard.ZstdDecompressor().decompress(data)
    if damage == "not zstd":
        data = b"plain text"
    elif damage == "wrong name":
        data = encode([bio(1)], "w2", 3)
    elif damage == "truncated":
        data = zstandard.ZstdCompressor().compress(text.rsplit(b"\n", 2)[0])
    elif damage == "bad json":
        data = zstandard.ZstdCompressor().compress(text.replace(b'"e2"', b'"e2'))
    else:
        data = zstandard.ZstdCompressor().compress(text.replace(b'"format":1', b'"format":9'))
    with pytest.raises(LogFormatError):
        decode(data, "w1", 3)


def test_acknowledged_records_are_readable_in_order(store):
    log = DurableLog(store, flush_interval=0.05).start()
    try:
        first = log.append([bio(1), bio(2)])
        second = log.append([bio(3)])
        assert (first.writer, second.seq) == (log.writer_id, first.seq + 1)
        fresh = DurableLog(store)  # another gateway: nothing cached
        objects = list(fresh.reader.read_pending({}))
        got = [r.event["event_id"] for o in objects for r in o.records]
        assert got == ["e1", "e2", "e3"]
        assert [o.seq for o in objects] == [first.seq, second.seq]
        assert list(fresh.reader.read_pending({log.writer_id: first.seq}))[0].seq == second.seq
    finally:
        log.close()


def test_concurrent_appends_are_group_committed(store):
    log = DurableLog(store, flush_interval=0.05).start()
    positions = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for i in range(20):
            pos = log.append([bio(n * 1000 + i)])
            with lock:
                positions.append(pos.seq)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    assert len(positions) == 320
    assert log.writer.commits < 320  # several appends shared a commit
    ids = [r.event["event_id"] for o in DurableLog(store).reader.read_pending({}) for r in o.records]
    assert sorted(ids) == sorted(f"e{n * 1000 + i}" for n in range(16) for i in range(20))


def test_buffered_records_are_committed_within_the_interval_and_on_close(store):
    log = DurableLog(store, flush_interval=0.2).start()
    log.append_nowait([AuditEntry({"request_id": "A"})])
    deadline = time.time() + 5
    while log.writer.commits == 0 and time.time() < deadline:
        time.sleep(0.02)
    assert log.writer.commits == 1
    log.append_nowait([AuditEntry({"request_id": "B"})])
    log.close()  # close commits what is still buffered
    ids = [r.record["request_id"] for o in DurableLog(store).reader.read_pending({}) for r in o.records]
    assert ids == ["A", "B"]


def test_a_durable_append_carries_buffered_records_first(store):
    log = DurableLog(store, flush_interval=60).start()
    try:
        log.append_nowait([AuditEntry({"request_id": "early"})])
        log.append([AuditEntry({"request_id": "late"})])
        objects = list(DurableLog(store).reader.read_pending({}))
        assert [r.record["request_id"] for r in objects[0].records] == ["early", "late"]
    finally:
        log.close()


class FailingStore:
    """A store whose writes fail while ``down`` is set."""

    def __init__(self, inner):
        self.inner, self.down = inner, False

    def put_object(self, *args, **kwargs):
        if self.down:
            raise StoreUnavailable("upstream unreachable")
        return self.inner.put_object(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_failed_commit_is_not_acknowledged_and_the_log_recovers(tmp_path, monkeypatch):
    monkeypatch.setattr("gateway.log.writer.BACKOFF", 0.01)
    inner = LocalStore(tmp_path / "store")
    inner.create_bucket(INTERNAL_BUCKET)
    store = FailingStore(inner)
    log = DurableLog(store, flush_interval=60).start()
    try:
        log.append([bio(1)])
        log.append_nowait([AuditEntry({"request_id": "buffered"})])
        store.down = True
        with pytest.raises(LogUnavailable, match="nothing was stored"):
            log.append([bio(2)])
        store.down = False
        log.append([bio(3)])
        records = [r for o in DurableLog(inner).reader.read_pending({}) for r in o.records]
        kinds = [r.event["event_id"] if isinstance(r, BioRecord) else r.record["request_id"]
                 for r in records]
        # the refused event is absent; the buffered audit record survived the failure
        assert kinds == ["e1", "buffered", "e3"]
    finally:
        log.close()


def test_text_that_is_not_unicode_is_written_spelled_out():
    """A header byte that is not UTF-8 (a surrogate escape) once made the log writer's
    thread die: every durable write after it failed until a restart."""
    record = AuditEntry({"request_id": "R1", "user_agent": "probe-\udcff-agent", "x": ["\ud800"]})
    (back,) = decode(encode([record], "w1", 1), "w1", 1)
    assert back.record == {"request_id": "R1", "user_agent": "probe-\\xff-agent", "x": ["\\ud800"]}


def test_an_unexpected_failure_fails_its_writes_and_the_log_goes_on(tmp_path):
    inner = LocalStore(tmp_path / "store")
    inner.create_bucket(INTERNAL_BUCKET)

    class Broken(FailingStore):
        def put_object(self, *args, **kwargs):
            if self.down:
                raise ValueError("not a store error")
            return self.inner.put_object(*args, **kwargs)

    store = Broken(inner)
    log = DurableLog(store, flush_interval=60).start()
    try:
        store.down = True
        with pytest.raises(LogUnavailable, match="nothing was stored"):
            log.append([bio(1)])
        store.down = False
        log.append([bio(2)])
        records = [r for o in DurableLog(inner).reader.read_pending({}) for r in o.records]
        assert [r.event["event_id"] for r in records] == ["e2"]
    finally:
        log.close()


def test_a_record_that_cannot_be_written_fails_only_its_own_request(tmp_path):
    inner = LocalStore(tmp_path / "store")
    inner.create_bucket(INTERNAL_BUCKET)
    log = DurableLog(inner, flush_interval=60).start()
    try:
        log.append_nowait([AuditEntry({"request_id": "innocent"})])
        with pytest.raises(LogUnavailable, match="nothing was stored"):
            log.append([AuditEntry({"request_id": "poison", "x": {1, 2}})])  # a set: no JSON
        log.append([bio(1)])
        records = [r for o in DurableLog(inner).reader.read_pending({}) for r in o.records]
        assert [getattr(r, "record", {}).get("request_id") or r.event["event_id"] for r in records] == [
            "innocent", "e1"]
    finally:
        log.close()


def test_a_commit_the_store_timed_out_on_is_not_tried_again(tmp_path, monkeypatch):
    """A timeout already took the whole backend timeout: trying twice more tripled every
    waiter's wait (a vault read waited minutes behind a frozen upstream)."""
    from gateway.store.base import StoreTimeout

    monkeypatch.setattr("gateway.log.writer.BACKOFF", 0.01)
    inner = LocalStore(tmp_path / "store")
    inner.create_bucket(INTERNAL_BUCKET)
    attempts = []

    class Frozen(FailingStore):
        def put_object(self, *args, **kwargs):
            if self.down:
                attempts.append(1)
                raise StoreTimeout("no answer in time")
            return self.inner.put_object(*args, **kwargs)

    store = Frozen(inner)
    log = DurableLog(store, flush_interval=60).start()
    try:
        store.down = True
        with pytest.raises(LogUnavailable):
            log.append([bio(1)])
        assert len(attempts) == 1
        store.down = False
        log.append([bio(2)])
    finally:
        log.close()


def test_a_commit_whose_answer_timed_out_but_that_landed_is_acknowledged(tmp_path):
    """A timeout on a PUT often means the upstream stored it: the writer looks once, and
    acknowledges rather than telling the client nothing was stored."""
    from gateway.store.base import StoreTimeout

    inner = LocalStore(tmp_path / "store")
    inner.create_bucket(INTERNAL_BUCKET)

    class SlowAnswer(FailingStore):
        def put_object(self, *args, **kwargs):
            self.inner.put_object(*args, **kwargs)
            if self.down:
                raise StoreTimeout("stored, but the answer never came")

    store = SlowAnswer(inner)
    store.down = True
    log = DurableLog(store, flush_interval=60).start()
    try:
        log.append([bio(1)])
        records = [r for o in DurableLog(inner).reader.read_pending({}) for r in o.records]
        assert [r.event["event_id"] for r in records] == ["e1"]
    finally:
        log.close()


def test_checkpoints_are_compare_and_swap(store):
    log = DurableLog(store)
    one = log.checkpoints.load("biography")
    two = log.checkpoints.load("biography")
    saved = log.checkpoints.save(one, {"w": 3}, {"segments": ["x"]})
    with pytest.raises(CheckpointConflict):
        log.checkpoints.save(two, {"w": 2}, {})
    again = log.checkpoints.load("biography")
    assert (again.positions, again.state, again.etag) == ({"w": 3}, {"segments": ["x"]}, saved.etag)
    positions = dict(again.positions)
    advance(positions, "w", 2)
    advance(positions, "v", 1)
    assert positions == {"w": 3, "v": 1}


def test_collection_waits_for_every_consumer(store):
    log = DurableLog(store, consumers=("one", "two"), flush_interval=0.05).start()
    try:
        seqs = [log.append([bio(i)]).seq for i in range(4)]
        w = log.writer_id
        cps = log.checkpoints
        cps.save(cps.load("one"), {w: seqs[3]}, {})
        assert log.collect() == 0  # "two" has read nothing
        cps.save(cps.load("two"), {w: seqs[1]}, {})
        assert log.collect() == 2
        left = [o.seq for o in DurableLog(store).reader.read_pending({})]
        assert left == seqs[2:]
        assert log.collect() == 0
    finally:
        log.close()


def test_log_keys_sort_in_commit_order():
    keys = [layout.log_key("w", n) for n in (1, 2, 10, 100, 99999)]
    assert keys == sorted(keys)
    assert layout.parse_log_key(keys[2]) == ("w", 10)
    assert layout.parse_log_key("log/w/12") is None
    assert layout.new_writer_id() < (time.sleep(0.002) or layout.new_writer_id())


def test_records_buffered_after_close_are_still_committed(store):
    log = DurableLog(store, flush_interval=60).start()
    log.close()
    log.append_nowait([AuditEntry({"request_id": "straggler"})])
    ids = [r.record["request_id"] for o in DurableLog(store).reader.read_pending({}) for r in o.records]
    assert ids == ["straggler"]
