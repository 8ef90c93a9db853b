"""The compactor on a real store: exactly once under retries, races and merges."""

from __future__ import annotations

import threading

import pytest

from gateway.biography import query
from gateway.biography.events import Event
from gateway.biography.stream import BioStream
from gateway.log import BioRecord, DurableLog
from gateway.segments.compactor import CONSUMER, Compactor
from gateway.segments.files import SegmentFiles
from gateway.store.base import INTERNAL_BUCKET, StoreUnavailable
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


def test_a_record_missing_a_required_field_is_skipped_not_a_stuck_compaction(store):
    """Written by a broken or future writer: the rest of the log must still reach Parquet
    (and be collected), or one record would hold every later event in the log forever."""
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        broken = {k: v for k, v in event(1).items() if k != "session"}
        log.append([BioRecord(event(0)), BioRecord(broken), BioRecord(event(2))])
        result = compactor(store, log).run()
        assert not result.conflict and sorted(stored_ids(store)) == ["e000000", "e000002"]
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


def test_only_segments_that_stay_as_written_get_the_strong_compression(store, monkeypatch):
    """A segment merged again soon is written cheaply; one large enough to stay is not."""
    from gateway.segments import compactor as module

    stream, levels = BioStream(), []
    encode = stream.encode

    def spy(table, settled=False):
        levels.append((table.num_rows, settled))
        return encode(table, settled)

    monkeypatch.setattr(stream, "encode", spy)
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        c = Compactor(log, SegmentFiles(store), [stream])
        log.append([BioRecord(event(i)) for i in range(200)])
        c.run()
        # the same 200 events' Arrow data counts as large once the threshold is below it
        monkeypatch.setattr(module, "SMALL_BYTES", 1024)
        log.append([BioRecord(event(i)) for i in range(200, 400)])
        c.run()
        assert levels == [(200, False), (200, True)]
        assert sorted(stored_ids(store)) == [f"e{i:06d}" for i in range(400)]
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


# -- a swap whose outcome is unknown ---------------------------------------------------------


class CheckpointTimeouts:
    """A store whose next write of the compactor's checkpoint times out: after it landed
    (``lands``), as an S3 upstream does when only its answer is lost, or before."""

    def __init__(self, inner, lands: bool):
        self.inner, self.lands, self.armed = inner, lands, False

    def put_object(self, bucket, key, *args, **kwargs):
        if self.armed and key == f"checkpoints/{CONSUMER}.json":
            self.armed = False
            if self.lands:
                self.inner.put_object(bucket, key, *args, **kwargs)
            raise StoreUnavailable("upstream timed out")
        return self.inner.put_object(bucket, key, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def read_ids(c: Compactor, agent: str = "a") -> list[str]:
    return [e.event_id for e in c.consistent(
        lambda snap: query.gather(snap, c.files, c.log.reader, query.Filter(agent)))]


def parquet_keys(store) -> set[str]:
    return {e.key for e in store.list_objects(INTERNAL_BUCKET, "parquet/").entries}


def test_a_swap_that_landed_before_its_timeout_keeps_its_segments(store):
    flaky = CheckpointTimeouts(store, lands=True)
    log = DurableLog(flaky, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        log.append([BioRecord(event(i)) for i in range(10)])
        c = compactor(flaky, log)
        flaky.armed = True
        with pytest.raises(StoreUnavailable):
            c.run_once()
        named = {s.key for s in c.snapshot().manifest.of("bio")}
        assert named and named == parquet_keys(store)  # the stored manifest's files are all there
        assert read_ids(c) == [f"e{i:06d}" for i in range(10)]
        assert c.run_once().records == 0  # nothing left to do
        log.append([BioRecord(event(i)) for i in range(8, 14)])  # the same partition again
        assert c.run().records == 6
        assert log.reader.pending({}) == []  # collected: the committed positions passed it all
        assert read_ids(c) == [f"e{i:06d}" for i in range(14)]
        assert sorted(stored_ids(store)) == [f"e{i:06d}" for i in range(14)]
    finally:
        log.close()


def test_a_swap_that_failed_leaves_orphans_for_the_sweep(store):
    flaky = CheckpointTimeouts(store, lands=False)
    log = DurableLog(flaky, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        log.append([BioRecord(event(i)) for i in range(5)])
        c = compactor(flaky, log)
        flaky.armed = True
        with pytest.raises(StoreUnavailable):
            c.run_once()
        assert c.snapshot().manifest.of("bio") == []
        orphans = parquet_keys(store)
        assert len(orphans) == 1
        assert read_ids(c) == [f"e{i:06d}" for i in range(5)]  # still in the log
        c.run()
        assert sorted(stored_ids(store)) == [f"e{i:06d}" for i in range(5)]
        c.grace = 0
        assert c.sweep() == 1
        assert parquet_keys(store) == {s.key for s in c.snapshot().manifest.of("bio")}
        assert orphans.isdisjoint(parquet_keys(store))
    finally:
        log.close()


def test_an_error_before_the_swap_deletes_what_the_run_wrote(store):
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        log.append([BioRecord(event(i, day=i % 2)) for i in range(6)])  # two partitions
        c = compactor(store, log)
        write, calls = c.files.write, []

        def second_write_fails(key, data):
            calls.append(key)
            if len(calls) == 2:
                raise StoreUnavailable("upstream unreachable")
            write(key, data)

        c.files.write = second_write_fails
        with pytest.raises(StoreUnavailable):
            c.run_once()
        assert parquet_keys(store) == set() and c._ids == {}
        c.files.write = write
        c.run()
        assert sorted(stored_ids(store)) == [f"e{i:06d}" for i in range(6)]
    finally:
        log.close()


# -- the id cache ----------------------------------------------------------------------------


def test_the_id_cache_holds_only_current_segments(store):
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        c = compactor(store, log)
        c.grace = 0  # replaced files go on the next run
        for round_ in range(9):
            log.append([BioRecord(event(round_ * 10 + i)) for i in range(10)])
            c.run()
        log.append([BioRecord(event(1000, agent="b"))])
        c.run()
        c.retention = lambda segment, now: segment.value("agent") == "b"
        assert c.run_once().retired_by_retention == 1
        c.run_once()  # each run starts by forgetting the segments its manifest no longer names
        current = {s.key for s in c.snapshot().manifest.of("bio")}
        assert len(current) == 3  # nine runs, two merges
        assert set(c._ids) == current
        assert sum(len(ids) for ids in c._ids.values()) == 90
    finally:
        log.close()


def test_the_id_cache_keeps_recent_days_and_reads_old_segments_again(store):
    """Segments of every day stay current, so the cache keeps the ids of the recent days'
    partitions only; an older one's are read again from its segment when a late record for
    it comes (which is still not written twice), and dropped after that run."""
    from gateway.segments.compactor import ID_DAYS

    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        c = compactor(store, log)
        days = ID_DAYS + 3
        for day in range(days):  # a partition a day, ten events each, the days before T0 (past)
            log.append([BioRecord(event(day * 10 + i, day=-day)) for i in range(10)])
            c.run()
        c.run_once()
        assert sum(len(ids) for ids in c._ids.values()) == 10 * (ID_DAYS + 1)
        oldest = days - 1
        log.append([BioRecord(event(oldest * 10, day=-oldest))])  # a repeat, late, for the oldest day
        c.run()
        assert sorted(stored_ids(store)) == sorted(f"e{i:06d}" for i in range(10 * days))
        c.run_once()
        assert sum(len(ids) for ids in c._ids.values()) == 10 * (ID_DAYS + 1)
    finally:
        log.close()


# -- retries stamped with a new time --------------------------------------------------------


def retried(i: int, us: int) -> dict:
    """Event i as a retry without ``ts`` makes it: the same id, the server's time of that try."""
    return Event(f"r{i}", "a", "s", us, "note", content=f"retried {i}").to_record()


MIDNIGHT = (T0 // DAY_US + 1) * DAY_US


@pytest.mark.parametrize("one_run", [False, True])
def test_a_retry_on_the_next_day_is_kept_once(store, one_run):
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        c = compactor(store, log)
        log.append([BioRecord(retried(i, MIDNIGHT - 1_000_000 + i)) for i in range(3)])  # 23:59:59
        if not one_run:
            c.run()
        log.append([BioRecord(retried(i, MIDNIGHT + 1_000_000 + i)) for i in range(3)])  # 00:00:01
        log.append([BioRecord(retried(i, MIDNIGHT - 2 * DAY_US + i)) for i in range(3)])  # and back
        c.run()
        assert sorted(stored_ids(store)) == ["r0", "r1", "r2"]
        assert {s.value("date") for s in c.snapshot().manifest.of("bio")} == {"2026-11-30"}
        log.append([BioRecord(retried(i, MIDNIGHT + 5_000_000 + i)) for i in range(3)])
        c.run()
        assert sorted(stored_ids(store)) == ["r0", "r1", "r2"]
        assert [e.ts for e in paged(c, 1)] == [MIDNIGHT - 1_000_000 + i for i in range(3)]
    finally:
        log.close()


def test_the_same_id_of_another_agent_is_another_event(store):
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        c = compactor(store, log)
        log.append([BioRecord(retried(0, MIDNIGHT - 1))])
        c.run()
        log.append([BioRecord({**retried(0, MIDNIGHT + 1), "agent": "b"})])
        c.run()
        assert stored_ids(store) == ["r0", "r0"]
        assert read_ids(c, "a") == read_ids(c, "b") == ["r0"]
    finally:
        log.close()


def paged(c: Compactor, limit: int, **filters) -> list[Event]:
    f = query.Filter("a", **filters)
    out, cursor = [], None
    while True:
        events, cursor = c.consistent(
            lambda snap: query.page(snap, c.files, c.log.reader, f, limit, cursor))  # noqa: B023
        out += events
        if not cursor:
            return out


@pytest.mark.parametrize("session", [None, "s"])
def test_pages_never_repeat_a_retried_id(store, session):
    """The copy stored first wins: the segments' over the tail's, the tail's first over later ones,
    whatever the filter or the cursor let through."""
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        c = compactor(store, log)
        log.append([BioRecord(retried(i, MIDNIGHT - 10_000_000 + i)) for i in range(3)])
        c.run()
        log.append([BioRecord(retried(i, MIDNIGHT + 1_000_000 + i)) for i in range(3)])  # after midnight
        log.append([BioRecord(retried(i, MIDNIGHT - 5_000_000 + i)) for i in range(3, 6)])  # tail only
        log.append([BioRecord(retried(i, MIDNIGHT + 2_000_000 + i)) for i in range(3, 6)])  # tail retry
        firsts = [MIDNIGHT - 10_000_000 + i for i in range(3)] + [MIDNIGHT - 5_000_000 + i for i in range(3, 6)]
        for limit in (1, 2, 100):
            got = paged(c, limit, session=session)
            assert [e.event_id for e in got] == [f"r{i}" for i in range(6)]
            assert [e.ts for e in got] == firsts
        # a later copy stays dropped where the first copy is filtered out
        assert paged(c, 1, session=session, since=MIDNIGHT) == []
        c.run()
        assert sorted(stored_ids(store)) == [f"r{i}" for i in range(6)]
        assert [e.ts for e in paged(c, 1, session=session)] == firsts
    finally:
        log.close()


def test_one_event_dated_far_ahead_does_not_push_the_recent_days_out_of_the_cache(store):
    """The days kept were counted back from the newest partition, so one event dated 9999
    made every run read the id columns of the partitions it touched again."""
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        c = compactor(store, log)
        log.append([BioRecord(event(i)) for i in range(10)])
        far = Event("far-ahead", "a", "s", 253402300799_000000, "note", content="dated 9999").to_record()
        log.append([BioRecord(far)])
        c.run()
        c.run_once()
        assert sum(len(ids) for ids in c._ids.values()) == 11  # T0's ten and 9999's one
    finally:
        log.close()


def test_retention_applies_to_what_the_same_run_wrote(store):
    """`orgmem bio compact` "applies retention now": a day past its retention written by that
    very run stayed until the next one."""
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        c = compactor(store, log)
        c.retention = lambda segment, now: segment.value("agent") == "b"
        log.append([BioRecord(event(i, agent=agent)) for i, agent in enumerate("abab")])
        result = c.run_once()
        assert result.retired_by_retention == 1 and [s.value("agent") for s in result.expired] == ["b"]
        assert [s.value("agent") for s in c.snapshot().manifest.of("bio")] == ["a"]
        assert sorted(stored_ids(store)) == ["e000000", "e000002"]
        assert parquet_keys(store) == {s.key for s in c.snapshot().manifest.of("bio")}  # no orphan
    finally:
        log.close()


def _rows(table) -> list[dict]:
    return table.to_pylist()


def test_the_table_path_groups_as_the_record_path_does():
    """A run's events by partition made by Arrow in one go: the same rows, in the same
    segment order, as the record-by-record path (kept for the odd run)."""
    from gateway.segments.compactor import _first_of_each, _group, _unheld

    stream = BioStream()
    payloads = [event(i, agent="a" if i % 3 else "b", day=i % 2, session=f"s{i % 4}") for i in range(90)]
    payloads[5]["tags"] = ["x", "y"]
    payloads[7]["seq"] = 3
    payloads[9]["data"] = '{"k":1}'
    payloads[11]["content"] = "nul \u0000, emoji \U0001f600, quote \" and \\ and \u2028 too"
    payloads[12].update(tokens_in=2**53, tokens_out=0, model="m", role="assistant", parent_id="p",
                        trace_id="0" * 32, span_id="1" * 16, artifact_uri="s3://b/k", redactions=2)
    tables = stream.partitions([BioRecord(p) for p in payloads])
    lined = stream.partitions([BioRecord.of_line(BioRecord(p).encoded()) for p in payloads])
    records = _group(stream, payloads)
    assert lined is not None and {k: _rows(v) for k, v in lined.items()} == {k: _rows(v) for k, v in tables.items()}
    assert tables is not None and sorted(tables) == sorted(records)
    held = [frozenset({"e000004", "e000011"})]
    kept = 0
    for partition, table in tables.items():
        one_by_one = stream.to_table(_first_of_each(stream, records[partition]))
        assert _rows(table) == _rows(one_by_one)
        assert _rows(_unheld(stream, table, held)) == _rows(_unheld(stream, one_by_one, held))
        kept += _unheld(stream, table, held).num_rows
    assert kept == 88  # the two held ids dropped, nothing else


@pytest.mark.parametrize("odd", ["missing session", "ts a string", "agent missing", "an id twice"])
def test_an_odd_run_is_grouped_record_by_record(odd):
    stream = BioStream()
    payloads = [event(i) for i in range(5)]
    if odd == "missing session":
        del payloads[2]["session"]
    elif odd == "ts a string":
        payloads[2]["ts"] = "yesterday"
    elif odd == "agent missing":
        del payloads[2]["agent"]
    else:
        payloads[3]["event_id"] = payloads[1]["event_id"]
    assert stream.partitions([BioRecord(p) for p in payloads]) is None
    assert stream.partitions([BioRecord.of_line(BioRecord(p).encoded()) for p in payloads]) is None


def test_a_run_with_a_retry_across_midnight_keeps_the_first_copy(store):
    """An id twice in one run (a retry restamped onto the next day) takes the record path,
    which keeps the first stored copy: the table path must not keep both."""
    log = DurableLog(store, consumers=(CONSUMER,), flush_interval=0.05).start()
    try:
        first = event(1, day=0)
        retry = dict(first, ts=first["ts"] + DAY_US)
        log.append([BioRecord(event(0)), BioRecord(first), BioRecord(retry), BioRecord(event(2))])
        assert not compactor(store, log).run().conflict
        assert sorted(stored_ids(store)) == ["e000000", "e000001", "e000002"]
    finally:
        log.close()
