"""The audit trail: records on the durable log of a real store, compacted into Parquet, queried
through segments and the log's tail; then against a real gateway."""

from __future__ import annotations

import base64
import dataclasses
import threading
import time
from datetime import UTC, datetime

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clients import wait_until
from servers import Gateway

from gateway.admin_client import AdminClient
from gateway.biography.stream import BioStream
from gateway.iam import audit as audit_mod
from gateway.iam.audit import (
    AuditLog,
    AuditRecord,
    Cursor,
    decode_cursor,
    encode_cursor,
    iso_ms,
    parse_since,
    query,
    scrub_user_agent,
)
from gateway.iam.audit_stream import AUDIT_SCHEMA, AuditStream, table_to_records, time_us
from gateway.log import AuditEntry, BioRecord, DurableLog
from gateway.segments.compactor import CONSUMER, Compactor
from gateway.segments.files import SegmentFiles
from gateway.store.base import INTERNAL_BUCKET, StoreUnavailable
from gateway.store.local import LocalStore

SPEC_FIELDS = [
    "time", "request_id", "principal", "access_key", "action", "resource", "operation", "decision",
    "reason", "status", "bytes_in", "bytes_out", "remote_addr", "user_agent", "error",
    "version",
]


def rec(request_id: str = "r", *, principal: str | None = "agent-a", decision: str = "allow",
        t: float | None = None, **kw) -> AuditRecord:
    extra = {} if t is None else {"time": t}
    return AuditRecord(request_id=request_id, principal=principal, access_key="AKIDEXAMPLE",
                       action="s3:GetObject", resource="arn:aws:s3:::agent-a/notes.md",
                       operation="GetObject", decision=decision,
                       reason="agent-default#Own" if decision == "allow" else "implicit-deny",
                       status=200 if decision == "allow" else 403, remote_addr="127.0.0.1",
                       **extra, **kw)


def ids(records) -> list[str]:
    return [r["request_id"] for r in records]


def wait_for(cond, timeout: float = 10.0) -> bool:
    return wait_until(cond, timeout, step=0.01)


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


class Node:
    """One gateway's audit plumbing on a shared store: its log writer, compactor and AuditLog."""

    def __init__(self, store, flush_interval: float = 60.0) -> None:
        self.log = DurableLog(store, consumers=(CONSUMER,), flush_interval=flush_interval).start()
        self.files = SegmentFiles(store)
        self.compactor = Compactor(self.log, self.files, [BioStream(), AuditStream()])
        self.audit = AuditLog(self.log, self.compactor)

    def query(self, **kw):
        return self.audit.query(**kw)

    def everything(self, **kw) -> list[dict]:
        """Every matching record, page by page."""
        out, cursor = [], None
        while True:
            page, cursor = self.audit.query(after=cursor, limit=7, **kw)
            out += page
            if len(page) < 7:
                return out

    def close(self) -> None:
        self.log.close()


@pytest.fixture
def store(tmp_path):
    s = LocalStore(tmp_path / "store")
    s.create_bucket(INTERNAL_BUCKET)
    yield s
    s.close()


@pytest.fixture
def node(store):
    n = Node(store)
    yield n
    n.close()


def other_gateway(store) -> Node:
    """A second gateway on the same store: nothing cached, nothing flushed on its behalf."""
    return Node(store)


# --- the record


def test_record_fields_and_json_follow_the_spec():
    assert [f.name for f in dataclasses.fields(AuditRecord)] == SPEC_FIELDS
    r = rec("req-1", t=1796031000.123456, bytes_in=5, bytes_out=7, user_agent="boto3", error=None)
    raw = r.to_json()
    assert isinstance(raw, bytes) and not raw.endswith(b"\n")
    d = orjson.loads(raw)
    assert list(d) == SPEC_FIELDS
    assert d["time"] == datetime.fromtimestamp(1796031000, UTC).strftime("%Y-%m-%dT%H:%M:%S") + ".123Z"
    assert d["request_id"] == "req-1" and d["status"] == 200 and d["bytes_in"] == 5 and d["bytes_out"] == 7
    assert d["decision"] == "allow" and d["error"] is None


def test_record_nulls_for_failed_authentication():
    r = AuditRecord(request_id="x", decision="deny", reason="authentication: SignatureDoesNotMatch",
                    status=403, remote_addr="10.0.0.1", error="SignatureDoesNotMatch")
    d = orjson.loads(r.to_json())
    assert d["principal"] is None and d["access_key"] is None and d["action"] is None
    assert d["bytes_in"] == 0 and d["bytes_out"] == 0
    assert abs(datetime.fromisoformat(d["time"]).timestamp() - time.time()) < 60


def test_iso_ms_format():
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert iso_ms(1.9999) == "1970-01-01T00:00:01.999Z"  # truncated, never "2.000" via rounding up
    assert iso_ms(1796031000.5) == iso_ms(1796031000.5001)


def test_scrub_user_agent():
    assert scrub_user_agent(None) is None
    assert scrub_user_agent("aws-cli/2") == "aws-cli/2"
    assert scrub_user_agent("x" * 2000) == "x" * 512
    assert scrub_user_agent("y" * 512) == "y" * 512


# --- writing


def test_record_is_buffered_until_the_flush_interval_or_a_flush(store, node):
    node.audit.record(rec("buffered"))
    elsewhere = other_gateway(store)
    try:
        assert elsewhere.query()[0] == []  # not committed yet (the interval is a minute here)
        assert node.audit.flush() is True
        assert ids(elsewhere.query()[0]) == ["buffered"]
    finally:
        elsewhere.close()


def test_record_is_committed_within_the_flush_interval(store):
    fast = Node(store, flush_interval=0.05)
    elsewhere = other_gateway(store)
    try:
        fast.audit.record(rec("a1"))
        fast.audit.record(rec("a2"))
        assert wait_for(lambda: ids(elsewhere.query()[0]) == ["a1", "a2"])
    finally:
        fast.close()
        elsewhere.close()


def test_record_durable_is_stored_when_it_returns_with_buffered_first(store, node):
    elsewhere = other_gateway(store)
    try:
        node.audit.record(rec("read-1", t=100.0))
        node.audit.record(rec("read-2", t=101.0))
        assert node.audit.record_durable(rec("delete-1", t=102.0)) is True
        # read at once by another gateway, no flush on anyone's part: the commit is in the store
        assert ids(elsewhere.query()[0]) == ["read-1", "read-2", "delete-1"]
        node.audit.record(rec("read-3", t=103.0))
        assert node.audit.record_durable(rec("admin-1", t=104.0)) is True
        assert ids(elsewhere.query()[0]) == ["read-1", "read-2", "delete-1", "read-3", "admin-1"]
    finally:
        elsewhere.close()


def test_close_commits_buffered_records_and_leaves_the_log_open(store, node):
    node.audit.start().record(rec("last"))
    node.audit.close()
    elsewhere = other_gateway(store)
    try:
        assert ids(elsewhere.query()[0]) == ["last"]
        node.audit.close()  # idempotent
        assert node.audit.record_durable(rec("after-close")) is True  # the shared log still runs
    finally:
        elsewhere.close()


def test_a_durable_record_the_store_refuses_does_not_raise_and_is_retried(tmp_path, monkeypatch):
    monkeypatch.setattr("gateway.log.writer.BACKOFF", 0.01)
    warnings = []
    monkeypatch.setattr(audit_mod.log, "warning", lambda event, **f: warnings.append((event, f)))
    inner = LocalStore(tmp_path / "store")
    inner.create_bucket(INTERNAL_BUCKET)
    failing = FailingStore(inner)
    n = Node(failing)
    try:
        failing.down = True
        assert n.audit.record_durable(rec("during")) is False  # no raise
        assert n.audit.flush() is False
        assert [e for e, _ in warnings if e.startswith("audit_")] == ["audit_not_durable", "audit_flush_failed"]
        assert dict(warnings)["audit_not_durable"]["request_id"] == "during"
        failing.down = False
        assert n.audit.flush() is True
        assert ids(n.query()[0]) == ["during"]  # kept buffered, committed once the store came back
    finally:
        n.close()
        inner.close()


def test_concurrent_writers_lose_nothing(store):
    n = Node(store, flush_interval=0.01)
    threads_n, per_thread = 8, 150
    barrier = threading.Barrier(threads_n)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            r = rec(f"{t}-{i}", principal=f"agent-{t}")
            if i % 25 == 0:
                assert n.audit.record_durable(r)
            else:
                n.audit.record(r)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    n.audit.flush()
    got = ids(n.audit.query(limit=5000)[0])
    assert sorted(got) == sorted(f"{t}-{i}" for t in range(threads_n) for i in range(per_thread))
    n.close()


# --- reading


def write(node: Node, records) -> None:
    for r in records:
        node.audit.record(r)
    node.audit.flush()


def test_query_returns_oldest_first_and_pages(node):
    base = time.time() - 100
    write(node, [rec(f"q-{i:02d}", t=base + i) for i in reversed(range(25))])  # written newest first
    got, cursor = node.query(limit=10)
    assert ids(got) == [f"q-{i:02d}" for i in range(10)]
    got, cursor = node.query(after=cursor, limit=10)
    assert ids(got) == [f"q-{i:02d}" for i in range(10, 20)]
    got, cursor = node.query(after=cursor, limit=10)
    assert ids(got) == [f"q-{i:02d}" for i in range(20, 25)]
    assert node.query(after=cursor)[0] == []


def test_same_time_orders_by_request_id(node):
    t = time.time() - 10
    write(node, [rec("b", t=t), rec("c", t=t), rec("a", t=t)])
    assert ids(node.query()[0]) == ["a", "b", "c"]
    first, cursor = node.query(limit=2)
    assert ids(first) == ["a", "b"] and ids(node.query(after=cursor)[0]) == ["c"]


def test_query_filters_principal_and_denied(node):
    t = time.time() - 10
    write(node, [
        rec("1", principal="agent-a", t=t),
        rec("2", principal="agent-b", decision="deny", t=t + 1),
        rec("3", principal="agent-a", decision="deny", t=t + 2),
        rec("4", principal=None, decision="deny", error="InvalidAccessKeyId", t=t + 3),
        rec("5", principal="agent-b", t=t + 4),
    ])
    for _ in range(2):  # from the log's tail, then from Parquet
        assert ids(node.query(principal="agent-a")[0]) == ["1", "3"]
        assert ids(node.query(denied=True)[0]) == ["2", "3", "4"]
        assert ids(node.query(denied=False)[0]) == ["1", "5"]
        assert ids(node.query(principal="agent-b", denied=True)[0]) == ["2"]
        assert ids(node.query(principal="nobody")[0]) == []
        node.compactor.run()


def test_query_since_filters_by_record_time(node):
    now = time.time()
    write(node, [rec("old", t=now - 7200), rec("mid", t=now - 600), rec("new", t=now - 5)])
    for _ in range(2):  # from the log's tail, then from Parquet
        assert ids(node.query(since=now - 3600)[0]) == ["mid", "new"]
        assert ids(node.query(since=parse_since("1m", now))[0]) == ["new"]
        assert ids(node.query(since=now + 10)[0]) == []
        assert ids(node.query(since=now - 600)[0]) == ["mid", "new"]  # inclusive
        node.compactor.run()


def test_cursor_polling_yields_only_newer_records(node):
    got, cursor = node.query()
    assert got == [] and cursor  # a cursor even for an empty log
    now = time.time()
    write(node, [rec(f"p-{i}", t=now + i / 100) for i in range(3)])
    got, cursor = node.query(after=cursor)
    assert ids(got) == ["p-0", "p-1", "p-2"]
    got, cursor = node.query(after=cursor)
    assert got == []
    write(node, [rec(f"p-{i}", t=now + i / 100) for i in range(3, 12)])
    node.compactor.run()  # some of what follows is in Parquet now, some not yet
    write(node, [rec(f"p-{i}", t=now + i / 100) for i in range(12, 15)])
    got, cursor = node.query(after=cursor)
    assert ids(got) == [f"p-{i}" for i in range(3, 15)]
    assert node.query(after=cursor)[0] == []
    # a cursor belongs to its filters, and advances past records they left out
    _, denials = node.query(denied=True)
    write(node, [rec("deny-1", decision="deny", t=now + 1), rec("allow-1", t=now + 1.01)])
    got, denials = node.query(after=denials, denied=True)
    assert ids(got) == ["deny-1"]
    assert decode_cursor(denials).request_id == "allow-1"
    assert node.query(after=denials, denied=True)[0] == []
    with pytest.raises(ValueError, match="other filters"):
        node.query(after=denials)


def test_a_record_that_arrives_behind_the_cursor_is_returned_once(node):
    now = time.time()
    node.audit.record_durable(rec("a", t=now - 1))
    got, cursor = node.query()
    assert ids(got) == ["a"]
    node.audit.record_durable(rec("b", t=now))
    got, cursor = node.query(after=cursor)
    assert ids(got) == ["b"]
    # a buffered record of another gateway, committed after "b" was returned but older than it
    node.audit.record_durable(rec("late", t=now - 0.5))
    got, cursor = node.query(after=cursor)
    assert ids(got) == ["late"]
    assert node.query(after=cursor)[0] == []
    # compacted between two polls: still returned once, and nothing returned again
    node.audit.record_durable(rec("late-compacted", t=now - 0.2))
    node.compactor.run()
    got, cursor = node.query(after=cursor)
    assert ids(got) == ["late-compacted"]
    assert node.query(after=cursor)[0] == []
    # beyond the late window: not returned by the cursor, only by a query that asks for it
    node.audit.record_durable(rec("too-late", t=now - audit_mod.LATE_WINDOW - 1))
    assert node.query(after=cursor)[0] == []
    assert "too-late" in ids(node.query(since=now - 60)[0])


def test_late_records_beyond_the_limit_come_on_the_next_pages(node):
    now = time.time()
    node.audit.record_durable(rec("newest", t=now))
    _, cursor = node.query()
    write(node, [rec(f"late-{i}", t=now - 1 + i / 10) for i in range(5)])
    seen = []
    for _ in range(4):
        got, cursor = node.query(after=cursor, limit=2)
        seen += ids(got)
    assert seen == ["late-0", "late-1", "late-2", "late-3", "late-4"]


def test_the_cursor_stays_small_when_many_records_share_its_window(node, monkeypatch):
    monkeypatch.setattr(audit_mod, "CURSOR_IDS", 5)
    now = time.time()
    write(node, [rec(f"w-{i:02d}", t=now - 2 + i / 100) for i in range(20)])
    seen, cursor = [], None
    while True:
        got, cursor = node.query(after=cursor, limit=3)
        seen += ids(got)
        assert len(decode_cursor(cursor).seen) <= 5
        if not got:
            break
    assert seen == [f"w-{i:02d}" for i in range(20)]
    window = decode_cursor(cursor).window
    assert window > time_us(iso_ms(now - 2))  # shrunk to the newest five
    # a late record inside the shrunk window is still returned, exactly once
    node.audit.record_durable(rec("late-in", t=now - 2 + 0.165))
    node.audit.record_durable(rec("late-out", t=now - 2 + 0.005))
    got, cursor = node.query(after=cursor)
    assert ids(got) == ["late-in"]
    assert node.query(after=cursor)[0] == []


def test_a_retried_record_is_returned_once(node):
    r = rec("twice", t=time.time())
    node.log.append([AuditEntry(r.to_dict())])
    node.log.append([AuditEntry(r.to_dict())])  # a commit retried after a lost acknowledgement
    assert ids(node.query()[0]) == ["twice"]
    node.compactor.run()
    assert ids(node.query()[0]) == ["twice"]
    node.log.append([AuditEntry(r.to_dict())])
    assert ids(node.query()[0]) == ["twice"]
    node.compactor.run()
    assert ids(node.query()[0]) == ["twice"]


def test_records_of_every_gateway_are_read(store, node):
    other = other_gateway(store)
    try:
        t = time.time()
        node.audit.record_durable(rec("from-one", t=t))
        other.audit.record_durable(rec("from-two", t=t + 0.001))
        assert ids(node.query()[0]) == ids(other.query()[0]) == ["from-one", "from-two"]
    finally:
        other.close()


def test_a_query_during_compaction_misses_nothing(node, monkeypatch):
    write(node, [rec(f"c-{i}", t=time.time() - 10 + i) for i in range(3)])
    stale = node.compactor.snapshot()
    node.compactor.run()  # compacts, then removes the log objects the stale snapshot points at
    assert query(stale, node.files, node.log.reader)[0] == []  # what a stale snapshot alone sees
    real = node.compactor.snapshot
    calls = iter([stale])
    monkeypatch.setattr(node.compactor, "snapshot", lambda: next(calls, None) or real())
    assert ids(node.query()[0]) == ["c-0", "c-1", "c-2"]


@pytest.mark.parametrize("bad", [
    "", "garbage!!", "not base64 at all", "x" * 10000,
    base64.urlsafe_b64encode(b"no-structure").decode(),
    encode_cursor(Cursor(1, "r", 0, [(0, 1)]))[:-3],  # truncated
    encode_cursor(Cursor(1, "r", 0, [(0, 1)])) + "AA",  # trailing bytes
    base64.urlsafe_b64encode(b"\x02" + encode_cursor.__name__.encode()).decode(),  # unknown version
])
def test_malformed_cursor_is_rejected(node, bad):
    with pytest.raises(ValueError, match="malformed audit cursor"):
        node.query(after=bad)


def test_cursor_round_trip():
    c = Cursor(1_796_031_000_123_000, "0123456789ABCDEF", 1_796_030_995_123_000,
               [(1_796_030_995_123_000, 7), (1_796_030_999_000_000, 2**32 - 1)])
    assert decode_cursor(encode_cursor(c)) == c
    empty = Cursor(-5_000_000, "", -5_000_000, [], 2**32 - 1)
    assert decode_cursor(encode_cursor(empty)) == empty


def test_query_limit_and_since_must_be_sane(node):
    with pytest.raises(ValueError):
        node.query(limit=0)
    for since in (1e20, -1e20, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="out of range"):
            node.query(since=since)


# --- Parquet


def test_records_land_as_parquet_in_date_partitions(node):
    day = 86400
    now = time.time()
    records = [rec("today-2", t=now - 2, user_agent="boto3", bytes_in=5, bytes_out=2**40),
               rec("today-1", t=now - 3, decision="deny", error="AccessDenied"),
               rec("days-ago", t=now - 3 * day, principal=None)]
    write(node, records)
    result = node.compactor.run()
    assert result.records >= 3 and result.written
    segments = node.compactor.snapshot().manifest.of("audit")
    dates = {datetime.fromtimestamp(now - 2, UTC).date().isoformat(),
             datetime.fromtimestamp(now - 3 * day, UTC).date().isoformat()}
    assert {s.partition for s in segments} == {f"date={d}" for d in dates}
    assert all(s.key.startswith("parquet/audit/date=") for s in segments)
    by_id = {r.request_id: r.to_dict() for r in records}
    for segment in segments:
        data = node.files.read(segment.key)
        parquet = pq.ParquetFile(pa.BufferReader(data))
        assert parquet.schema_arrow.equals(AUDIT_SCHEMA)
        assert parquet.schema_arrow.field("time").type == pa.timestamp("us", tz="UTC")
        assert parquet.schema_arrow.field("status").type == pa.int32()
        assert parquet.schema_arrow.field("bytes_out").type == pa.int64()
        column = parquet.metadata.row_group(0).column(0)
        assert column.compression == "ZSTD"
        assert [c.column_index for c in parquet.metadata.row_group(0).sorting_columns] == [0, 1]
        table = node.files.table(segment.key)
        got = table_to_records(table)
        keys = [(r["time"], r["request_id"]) for r in got]
        assert keys == sorted(keys)
        for r in got:
            assert r == by_id[r["request_id"]]  # every field survives the round trip
    assert sum(s.rows for s in segments) == 3


def test_query_is_the_same_before_and_after_compaction(node):
    now = time.time()
    write(node, [rec(f"x-{i:03d}", t=now - 50 + i / 10, principal=f"agent-{i % 3}",
                     decision="deny" if i % 4 == 0 else "allow") for i in range(120)])
    before = node.everything()
    before_filtered = node.everything(principal="agent-1", denied=True)
    _, cursor = node.query(limit=50)
    node.compactor.run()
    assert node.compactor.snapshot().manifest.of("audit")
    after = node.everything()
    assert after == before and len(ids(after)) == len(set(ids(after))) == 120
    assert node.everything(principal="agent-1", denied=True) == before_filtered
    # a cursor taken before compaction goes on where it was, exactly once
    rest = []
    while True:
        page, cursor = node.query(after=cursor, limit=50)
        if not page:
            break
        rest += ids(page)
    assert rest == [f"x-{i:03d}" for i in range(50, 120)]


def test_segments_older_than_since_are_not_read(node):
    now = time.time()
    write(node, [rec("old", t=now - 5 * 86400), rec("older", t=now - 9 * 86400), rec("new", t=now - 1)])
    node.compactor.run()
    read = []
    real = node.files.read
    node.files.read = lambda key: read.append(key) or real(key)
    assert ids(node.query(since=now - 3600)[0]) == ["new"]
    assert len(read) == 1 and "date=" + datetime.fromtimestamp(now, UTC).date().isoformat() in read[0]
    read.clear()
    assert ids(node.query(limit=1)[0]) == ["older"]
    assert len(read) == 1  # the first segment filled the page; newer ones cannot come before it


def test_audit_and_biography_records_share_the_log(node):
    from gateway.biography.events import Event, new_event_id

    now = int(time.time() * 1e6)
    node.log.append([BioRecord(Event(new_event_id(now), "a", "s", now, "note").to_record())])
    node.audit.record_durable(rec("beside-bio"))
    assert ids(node.query()[0]) == ["beside-bio"]
    node.compactor.run()
    snapshot = node.compactor.snapshot()
    assert snapshot.manifest.of("audit") and snapshot.manifest.of("bio")
    assert ids(node.query()[0]) == ["beside-bio"]


# --- parse_since


NOW = 1_800_000_000.0


@pytest.mark.parametrize("text, expected", [
    ("90s", NOW - 90),
    ("10m", NOW - 600),
    ("2h", NOW - 7200),
    ("7d", NOW - 7 * 86400),
    ("1.5h", NOW - 5400),
    (" 10m ", NOW - 600),
    ("1796031000", 1796031000.0),
    ("1796031000.25", 1796031000.25),
    ("2026-11-30T09:30:00Z", datetime(2026, 11, 30, 9, 30, tzinfo=UTC).timestamp()),
    ("2026-11-30T09:30:00.123Z", datetime(2026, 11, 30, 9, 30, tzinfo=UTC).timestamp() + 0.123),
    ("2026-11-30T10:30:00+01:00", datetime(2026, 11, 30, 9, 30, tzinfo=UTC).timestamp()),
    ("2026-11-30T09:30:00", datetime(2026, 11, 30, 9, 30, tzinfo=UTC).timestamp()),  # naive = UTC
    ("2026-11-30", datetime(2026, 11, 30, tzinfo=UTC).timestamp()),
])
def test_parse_since_accepts(text, expected):
    assert parse_since(text, NOW) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "  ", "yesterday", "10y", "-5m", "m10", "2026-13-40T00:00:00Z",
                                  "10 minutes", "1e9", "nan", "inf", "2026-11-30T09:30:00Zjunk"])
def test_parse_since_rejects(text):
    with pytest.raises(ValueError, match="invalid --since"):
        parse_since(text, NOW)


# --- against a real gateway


def test_gateway_audit_lands_as_parquet_and_reads_the_same_after_compaction(tmp_path):
    import boto3
    from botocore.config import Config as BotoConfig
    from botocore.exceptions import ClientError

    from gateway.config import Config
    from gateway.log import Checkpoints
    from gateway.sealing import seal
    from gateway.segments.manifest import Manifest

    gw = Gateway(tmp_path / "data", extra_args=[], env={"ORGMEM_COMPACT_INTERVAL": "0"}).start()
    admin = AdminClient(gw.endpoint, gw.access_key, gw.secret_key)
    try:
        agent = admin.create_agent("parquet-audited")
        s3 = boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=agent["access_key"],
                          aws_secret_access_key=agent["secret_key"], region_name="us-east-1",
                          config=BotoConfig(signature_version="s3v4", s3={"addressing_style": "path"},
                                            retries={"max_attempts": 1, "mode": "standard"}))
        s3.create_bucket(Bucket="agent-parquet-audited")
        s3.put_object(Bucket="agent-parquet-audited", Key="k", Body=b"12345")
        s3.delete_object(Bucket="agent-parquet-audited", Key="k")
        with pytest.raises(ClientError):
            s3.get_object(Bucket="library-elsewhere", Key="k")

        def mine():
            out, cursor = [], None
            while True:
                page = admin.audit(principal="parquet-audited", limit=1000, after=cursor)
                out += page["records"]
                cursor = page["cursor"]
                if len(page["records"]) < 1000:
                    return out

        before = mine()
        assert {"CreateBucket", "PutObject", "DeleteObject", "GetObject"} <= {r["operation"] for r in before}
        assert any(r["decision"] == "deny" for r in before)
        status, _, body = admin._request("POST", "/v1/bio/compact")
        assert status == 200 and orjson.loads(body)["segments_written"] >= 1
        after = mine()
        assert after == before  # the same records, each once, now read from Parquet
        assert admin.audit(principal="parquet-audited", denied=True)["records"] == \
            [r for r in before if r["decision"] == "deny"]
    finally:
        gw.stop()
    # The segments themselves, read from the (sealed) store with the gateway stopped.
    store = seal(LocalStore(gw.data / "store"), Config(data=str(gw.data)))
    try:
        checkpoint = Checkpoints(store).load(CONSUMER)
        segments = Manifest.from_state(checkpoint.state).of("audit")
        assert segments and all(s.partition.startswith("date=") for s in segments)
        files = SegmentFiles(store)
        rows = [r for s in segments for r in table_to_records(files.table(s.key))]
        by_id = {r["request_id"]: r for r in rows}
        for r in before:
            assert by_id[r["request_id"]] == r
        assert len(by_id) == len(rows)
        assert agent["secret_key"] not in orjson.dumps(rows).decode()
    finally:
        store.close()


def test_gateway_deletes_and_admin_changes_survive_a_kill_right_after_the_response(tmp_path):
    import boto3
    from botocore.config import Config as BotoConfig

    gw = Gateway(tmp_path / "data").start()
    try:
        admin = AdminClient(gw.endpoint, gw.access_key, gw.secret_key)
        admin.create_agent("killed-after")
        s3 = boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=gw.access_key,
                          aws_secret_access_key=gw.secret_key, region_name="us-east-1",
                          config=BotoConfig(signature_version="s3v4", s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket="killed")
        s3.put_object(Bucket="killed", Key="k", Body=b"x")
        deleted = s3.delete_object(Bucket="killed", Key="k")["ResponseMetadata"]["RequestId"]
        admin.disable_agent("killed-after")
        gw.kill()  # SIGKILL at once: no flush interval passes, no shutdown runs
        gw.start()
        records = AdminClient(gw.endpoint, gw.access_key, gw.secret_key).audit(limit=1000)["records"]
        ops = [(r["operation"], r["resource"]) for r in records]
        assert ("CreateAgent", "arn:orgmem:admin:::agent/killed-after") in ops
        assert ("DisableAgent", "arn:orgmem:admin:::agent/killed-after") in ops
        assert any(r["request_id"] == deleted and r["operation"] == "DeleteObject" for r in records)
    finally:
        gw.stop()
