"""The compactor on a real store: exactly once under retries, races and merges."""

from __future__ import annotations

import threading

import pytest

from gateway.biography.events import Event
from gateway.biography.stream import BioStream
from gateway.log import BioRecord, DurableLog
from gateway.segments.compactor import CONSUMER, Compactor
from gateway.segments.files import SegmentFiles
from gateway.store.base import INTERNAL_BUCKET
from gateway.store.local import LocalStore

DAY_US = 86_400_000_000
T0 = 1_796_000_000_000_000  # 2026-11-30


@pytest.fixture
def store(tmp_path):
    s = LocalStore(tmp_path / "store")
    s.create_bucket(INTERNAL_BUCKET)
    return s


def event(i: int, agent: str = "a", day: int = 0, session: str = "s") -> dict:
    return Event(f"e{i:06d}", agent, session, T0 + day * DAY_US + i, "note", content=f"event {i}").to_record()


def compactor(store, log=None) -> Compactor:
    log = log or DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05)
    return Compactor(log, SegmentFiles(store), [BioStream()])


def stored_ids(store) -> list[str]:
    """Every event id in the current segments (duplicates kept, to catch doubling)."""
    c = compactor(store)
    ids = []
    for segment in c.snapshot().manifest.of("bio"):
        ids += c.files.table(segment.key, ["event_id"])["event_id"].to_pylist()
    return ids


def test_compaction_partitions_by_agent_and_date_and_consumes_the_log(store):
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        log.append([BioRecord(event(i, agent="a" if i % 2 else "b", day=i % 3)) for i in range(60)])
        c = compactor(store, log)
        result = c.run()
        assert result.records == 60 and not result.conflict
        partitions = sorted(s.partition for s in c.snapshot().manifest.of("bio"))
        assert len(partitions) == 6 and partitions[0].startswith("agent=a/date=2026-")
        assert sorted(stored_ids(store)) == [f"e{i:06d}" for i in range(60)]
        assert log.reader.pending(c.snapshot().positions) == []
        assert result.log_removed == 1  # the only consumer passed it
    finally:
        log.close()


def test_retried_events_are_kept_once(store):
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        log.append([BioRecord(event(i)) for i in range(10)])
        compactor(store, log).run()
        log.append([BioRecord(event(i)) for i in range(5, 15)])  # 5..9 are retries
        log.append([BioRecord(event(14))])
        compactor(store, log).run()
        assert sorted(stored_ids(store)) == [f"e{i:06d}" for i in range(15)]
    finally:
        log.close()


def test_small_segments_merge_and_replaced_ones_wait_out_their_grace(store):
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        c = compactor(store, log)
        for round_ in range(4):
            log.append([BioRecord(event(round_ * 10 + i)) for i in range(10)])
            c.run()
        manifest = c.snapshot().manifest
        assert len(manifest.of("bio")) == 1  # the fourth run merged the three small ones
        assert len(manifest.retired) == 3
        table = c.files.table(manifest.of("bio")[0].key)
        assert table.num_rows == 40
        assert table["event_id"].to_pylist() == sorted(table["event_id"].to_pylist())
        for retired in manifest.retired:  # still readable by queries that listed them
            assert c.files.read(retired.key)
    finally:
        log.close()


def test_two_compactors_racing_never_lose_or_double_an_event(store):
    """Two gateways compacting the same log at once: one swap wins each round."""
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.01).start()
    writers_done = threading.Event()
    errors = []

    def write():
        for n in range(40):
            log.append([BioRecord(event(n * 25 + i, day=i % 2)) for i in range(25)])
        writers_done.set()

    def compact(c: Compactor):
        try:
            while not writers_done.is_set():
                c.run_once()
            c.run()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    racers = [compactor(store), compactor(store)]  # separate caches, like two processes
    threads = [threading.Thread(target=write)] + [threading.Thread(target=compact, args=(c,)) for c in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    log.close()
    assert not errors
    racers[0].run()
    ids = stored_ids(store)
    assert len(ids) == len(set(ids)) == 1000


def test_a_lost_swap_leaves_no_files_behind(store):
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        log.append([BioRecord(event(i)) for i in range(5)])
        # fast: another process (which leaves the log in place, so slow has work to lose)
        slow, fast = compactor(store, log), compactor(store, DurableLog(store))
        checkpoints = slow.log.checkpoints
        original = checkpoints.load

        def stale_load(consumer):  # slow read its checkpoint before fast committed
            cp = original(consumer)
            fast.run()
            return cp

        checkpoints.load = stale_load
        result = slow.run_once()
        checkpoints.load = original
        assert result.conflict
        keys = [e.key for e in store.list_objects(INTERNAL_BUCKET, "parquet/").entries]
        assert keys == [s.key for s in fast.snapshot().manifest.of("bio")]
    finally:
        log.close()


def test_retention_retires_old_partitions(store):
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        log.append([BioRecord(event(1, day=-30)), BioRecord(event(2, day=0))])
        c = compactor(store, log)
        c.run()
        assert len(c.snapshot().manifest.of("bio")) == 2
        c.retention = lambda segment, now: segment.value("date") < "2026-11-01"
        assert c.run().retired_by_retention == 1
        assert [s.value("date") for s in c.snapshot().manifest.of("bio")] == ["2026-11-30"]
    finally:
        log.close()



def test_audit_retention_retires_old_audit_partitions(store):
    from gateway.biography.service import RetentionPolicy
    from gateway.segments.manifest import Segment

    policy = RetentionPolicy(audit_days=30)
    now = T0 / 1_000_000
    old = Segment("audit", "date=2026-09-01", "a.parquet", 1, 1, 0, 0, now)
    recent = Segment("audit", "date=2026-11-29", "b.parquet", 1, 1, 0, 0, now)
    bio = Segment("bio", "agent=a/date=2026-09-01", "c.parquet", 1, 1, 0, 0, now)
    assert [policy.expired(s, now) for s in (old, recent, bio)] == [True, False, False]
    assert RetentionPolicy.from_dict(policy.to_dict()) == policy
