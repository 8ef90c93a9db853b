"""The audit trail store: real files in tmp_path, a real flusher thread."""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import shutil
import stat
import threading
import time
from datetime import UTC, datetime

import orjson
import pytest

from gateway.iam.audit import (
    AuditLog,
    AuditRecord,
    decode_cursor,
    encode_cursor,
    iso_ms,
    parse_since,
    query,
    scrub_user_agent,
)

SPEC_FIELDS = [
    "time", "request_id", "principal", "access_key", "action", "resource", "operation", "decision",
    "reason", "status", "bytes_in", "bytes_out", "remote_addr", "user_agent", "error",
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


def files(d) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.startswith("audit-") and n.endswith(".jsonl"))


def on_disk(d) -> list[dict]:
    """Every complete record in the directory, read straight from the files (no query());
    a line still being written (no newline yet) is not complete."""
    out = []
    for name in files(d):
        for line in (d / name).read_bytes().split(b"\n")[:-1]:
            out.append(orjson.loads(line))
    return out


def ids(records) -> list[str]:
    return [r["request_id"] for r in records]


def wait_for(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture
def audit_dir(tmp_path):
    return tmp_path / "data" / ".orgmem" / "audit"


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


def test_directory_0700_and_files_0600(audit_dir):
    old = os.umask(0o002)  # permissive: the modes must come from the code, not the umask
    try:
        with AuditLog(audit_dir) as log:
            log.record_durable(rec())
        assert stat.S_IMODE(audit_dir.stat().st_mode) == 0o700
        names = files(audit_dir)
        assert names
        for name in names:
            assert stat.S_IMODE((audit_dir / name).stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_existing_directory_is_tightened(tmp_path):
    d = tmp_path / "audit"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    AuditLog(d).close()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_file_names_sort_by_time(audit_dir):
    log = AuditLog(audit_dir, max_file_bytes=1)
    for i in range(3):
        log.record_durable(rec(str(i)))
    log.close()
    names = files(audit_dir)
    assert len(names) == 3
    for name in names:
        assert name.startswith("audit-20") and "T" in name and "Z-" in name
    assert ids(on_disk(audit_dir)) == ["0", "1", "2"]  # file order == write order


def test_async_record_reaches_disk_within_flush_interval(audit_dir):
    with AuditLog(audit_dir, flush_interval=0.05) as log:
        log.record(rec("a1"))
        log.record(rec("a2"))
        assert wait_for(lambda: ids(on_disk(audit_dir)) == ["a1", "a2"])


def test_record_does_not_write_before_the_flusher(audit_dir):
    log = AuditLog(audit_dir, flush_interval=60)  # not started: nothing writes
    log.record(rec("buffered"))
    assert on_disk(audit_dir) == [] and log.pending == 1
    assert log.flush() is True
    assert ids(on_disk(audit_dir)) == ["buffered"] and log.pending == 0
    log.close()


def test_record_durable_is_on_disk_when_it_returns_with_buffered_first(audit_dir):
    log = AuditLog(audit_dir, flush_interval=3600).start()  # the flusher will not tick during the test
    log.record(rec("read-1"))
    log.record(rec("read-2"))
    assert log.record_durable(rec("delete-1", decision="allow")) is True
    assert ids(on_disk(audit_dir)) == ["read-1", "read-2", "delete-1"]
    log.record(rec("read-3"))
    assert log.record_durable(rec("admin-1")) is True
    assert ids(on_disk(audit_dir)) == ["read-1", "read-2", "delete-1", "read-3", "admin-1"]
    log.close()


def test_close_flushes_and_is_idempotent(audit_dir):
    log = AuditLog(audit_dir, flush_interval=3600).start()
    log.record(rec("last"))
    log.close()
    assert ids(on_disk(audit_dir)) == ["last"]
    log.close()
    assert ids(on_disk(audit_dir)) == ["last"]
    with pytest.raises(RuntimeError):
        log.start()


def test_record_after_close_is_still_written(audit_dir):
    log = AuditLog(audit_dir)
    log.close()
    log.record(rec("straggler"))
    assert ids(on_disk(audit_dir)) == ["straggler"]
    log.close()


def test_close_without_records_creates_no_file(audit_dir):
    AuditLog(audit_dir).start().close()
    assert files(audit_dir) == []


def test_concurrent_writers_lose_nothing_and_keep_per_thread_order(audit_dir):
    threads_n, per_thread = 8, 500
    log = AuditLog(audit_dir, flush_interval=0.01, max_file_bytes=64 * 1024).start()
    barrier = threading.Barrier(threads_n)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            r = rec(f"{t}-{i}", principal=f"agent-{t}")
            if i % 50 == 0:
                assert log.record_durable(r)
            else:
                log.record(r)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    log.close()
    got = ids(on_disk(audit_dir))
    assert len(got) == threads_n * per_thread and len(set(got)) == len(got)
    for t in range(threads_n):
        mine = [int(x.split("-")[1]) for x in got if x.startswith(f"{t}-")]
        assert mine == list(range(per_thread))
    assert log.dropped == 0
    assert len(files(audit_dir)) > 1  # rotated along the way


def test_concurrent_durable_writers_each_return_on_disk(audit_dir):
    log = AuditLog(audit_dir, flush_interval=3600)
    seen_missing = []

    def work(t: int) -> None:
        for i in range(30):
            name = f"{t}-{i}"
            assert log.record_durable(rec(name)) is True
            if name not in ids(on_disk(audit_dir)):
                seen_missing.append(name)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    log.close()
    assert seen_missing == []
    assert len(on_disk(audit_dir)) == 240


def test_rotation_and_retention(audit_dir):
    line_len = len(rec("x-000").to_json()) + 1
    log = AuditLog(audit_dir, max_file_bytes=line_len * 3, max_files=4)
    for i in range(30):
        log.record(rec(f"x-{i:03d}"))
    log.flush()
    names = files(audit_dir)
    assert len(names) == 4  # 10 files were written, the oldest 6 deleted
    for name in names:
        assert (audit_dir / name).stat().st_size <= line_len * 3
    assert ids(on_disk(audit_dir)) == [f"x-{i:03d}" for i in range(18, 30)]
    # a new file starts once the current one is full, also across flushes
    log.record(rec("x-030"))
    log.flush()
    assert files(audit_dir)[-1] not in names and len(files(audit_dir)) == 4
    log.close()


def test_a_record_larger_than_max_file_bytes_gets_its_own_file(audit_dir):
    log = AuditLog(audit_dir, max_file_bytes=10)
    log.record(rec("big-1"))
    log.record(rec("big-2"))
    log.close()
    assert len(files(audit_dir)) == 2 and ids(on_disk(audit_dir)) == ["big-1", "big-2"]


def test_each_start_begins_a_new_file(audit_dir):
    for i in range(3):
        log = AuditLog(audit_dir)
        log.record_durable(rec(f"run-{i}"))
        log.close()
    assert len(files(audit_dir)) == 3
    assert ids(on_disk(audit_dir)) == ["run-0", "run-1", "run-2"]


def test_write_failure_keeps_records_buffered_and_warns(tmp_path, caplog):
    d = tmp_path / "audit"
    log = AuditLog(d, max_file_bytes=1)  # every flush opens a new file
    log.record_durable(rec("before"))
    shutil.rmtree(d)
    d.write_bytes(b"")  # a file where the directory was: every create now fails
    caplog.set_level(logging.WARNING, logger="orgmem.audit")
    log.record(rec("during-1"))
    assert log.flush() is False
    assert log.record_durable(rec("during-2")) is False  # does not raise
    assert log.pending == 2
    assert any("kept buffered" in r.getMessage() for r in caplog.records)
    d.unlink()
    log.record(rec("after"))
    assert log.flush() is True
    assert ids(on_disk(d)) == ["during-1", "during-2", "after"]  # order kept, nothing lost
    assert log.dropped == 0
    assert any("recovered" in r.getMessage() for r in caplog.records)
    log.close()


def test_buffer_is_bounded_while_writes_fail_and_drops_are_reported(tmp_path, caplog):
    d = tmp_path / "audit"
    log = AuditLog(d, max_file_bytes=1, max_pending=5)
    log.record_durable(rec("ok"))
    shutil.rmtree(d)
    d.write_bytes(b"")
    caplog.set_level(logging.WARNING, logger="orgmem.audit")
    for i in range(8):
        log.record(rec(f"lost-{i}"))
    assert log.pending == 5 and log.dropped == 3
    assert log.flush() is False
    msg = [r.getMessage() for r in caplog.records if "write failed" in r.getMessage()][-1]
    assert "3 dropped" in msg and "5 records kept buffered" in msg
    d.unlink()
    assert log.flush() is True
    assert ids(on_disk(d)) == [f"lost-{i}" for i in range(3, 8)]
    log.close()


def test_flusher_survives_write_failures(tmp_path):
    d = tmp_path / "audit"
    log = AuditLog(d, flush_interval=0.02, max_file_bytes=1).start()
    log.record_durable(rec("first"))
    shutil.rmtree(d)
    d.write_bytes(b"")
    log.record(rec("second"))
    time.sleep(0.1)  # a few failing ticks
    d.unlink()
    assert wait_for(lambda: d.is_dir() and ids(on_disk(d)) == ["second"])
    log.close()


def test_invalid_arguments(tmp_path):
    with pytest.raises(ValueError):
        AuditLog(tmp_path / "a", flush_interval=0)
    with pytest.raises(ValueError):
        AuditLog(tmp_path / "a", max_files=0)


# --- reading


def write_records(d, records, **kw) -> None:
    log = AuditLog(d, **kw)
    for r in records:
        log.record(r)
    log.close()


def test_query_returns_oldest_first_and_pages(audit_dir):
    write_records(audit_dir, [rec(f"q-{i}") for i in range(25)], max_file_bytes=2000)
    assert len(files(audit_dir)) > 2
    got, cursor = query(audit_dir, limit=10)
    assert ids(got) == [f"q-{i}" for i in range(10)]
    got, cursor = query(audit_dir, after=cursor, limit=10)
    assert ids(got) == [f"q-{i}" for i in range(10, 20)]
    got, cursor = query(audit_dir, after=cursor, limit=10)
    assert ids(got) == [f"q-{i}" for i in range(20, 25)]
    got, cursor2 = query(audit_dir, after=cursor)
    assert got == [] and cursor2 == cursor


def test_query_filters_principal_and_denied(audit_dir):
    write_records(audit_dir, [
        rec("1", principal="agent-a"),
        rec("2", principal="agent-b", decision="deny"),
        rec("3", principal="agent-a", decision="deny"),
        rec("4", principal=None, decision="deny", error="InvalidAccessKeyId"),
        rec("5", principal="agent-b"),
    ])
    assert ids(query(audit_dir, principal="agent-a")[0]) == ["1", "3"]
    assert ids(query(audit_dir, denied=True)[0]) == ["2", "3", "4"]
    assert ids(query(audit_dir, denied=False)[0]) == ["1", "5"]
    assert ids(query(audit_dir, principal="agent-b", denied=True)[0]) == ["2"]
    assert ids(query(audit_dir, principal="nobody")[0]) == []


def test_query_since_filters_by_record_time(audit_dir):
    now = time.time()
    write_records(audit_dir, [rec("old", t=now - 7200), rec("mid", t=now - 600), rec("new", t=now - 5)])
    assert ids(query(audit_dir, since=now - 3600)[0]) == ["mid", "new"]
    assert ids(query(audit_dir, since=parse_since("1m", now))[0]) == ["new"]
    assert ids(query(audit_dir, since=now + 10)[0]) == []
    assert ids(query(audit_dir, since=now - 600)[0]) == ["mid", "new"]  # inclusive


def test_query_since_skips_older_files_by_name(audit_dir):
    # A record with a future time planted in a file whose successor was created before
    # `since`: returned only if that file were read, which its name makes unnecessary.
    write_records(audit_dir, [rec("planted", t=time.time() + 3600)])
    time.sleep(0.01)
    write_records(audit_dir, [rec("in-new-file")])
    boundary = time.time()
    time.sleep(0.01)
    write_records(audit_dir, [rec("newest")])
    names = files(audit_dir)
    got, cursor = query(audit_dir, since=boundary)
    assert ids(got) == ["newest"]
    assert decode_cursor(cursor)[0] == names[-1]
    assert ids(query(audit_dir)[0]) == ["planted", "in-new-file", "newest"]  # without since: all


def test_cursor_polling_yields_only_newer_records(audit_dir):
    log = AuditLog(audit_dir, flush_interval=3600, max_file_bytes=1500)
    got, cursor = query(audit_dir)
    assert got == [] and cursor  # a cursor even for an empty (or missing) directory
    for i in range(3):
        log.record(rec(f"p-{i}"))
    log.flush()
    got, cursor = query(audit_dir, after=cursor)
    assert ids(got) == ["p-0", "p-1", "p-2"]
    got, cursor = query(audit_dir, after=cursor)
    assert got == []
    for i in range(3, 12):  # crosses into new files
        log.record(rec(f"p-{i}"))
    log.flush()
    assert len(files(audit_dir)) > 1
    got, cursor = query(audit_dir, after=cursor)
    assert ids(got) == [f"p-{i}" for i in range(3, 12)]
    log.close()
    # the cursor also advances past records a filter left out
    write_records(audit_dir, [rec("deny-1", decision="deny"), rec("allow-1")])
    got, cursor = query(audit_dir, after=cursor, denied=True)
    assert ids(got) == ["deny-1"]
    assert query(audit_dir, after=cursor)[0] == []


def test_cursor_survives_retention_of_its_file(audit_dir):
    write_records(audit_dir, [rec("a")])
    _, cursor = query(audit_dir)
    write_records(audit_dir, [rec("b")])
    os.unlink(audit_dir / files(audit_dir)[0])
    assert ids(query(audit_dir, after=cursor)[0]) == ["b"]


@pytest.mark.parametrize("bad", [
    "", "garbage!!", "not base64 at all", "x" * 1000,
    base64.urlsafe_b64encode(b"no-separator").decode(),
    base64.urlsafe_b64encode(b"../../etc/passwd:0").decode(),
    base64.urlsafe_b64encode(b"audit-20261130T093000.123456Z-000001.jsonl:-5").decode(),
    base64.urlsafe_b64encode(b"audit-20261130T093000.123456Z-000001.jsonl:abc").decode(),
])
def test_malformed_cursor_is_rejected(audit_dir, bad):
    write_records(audit_dir, [rec("a")])
    with pytest.raises(ValueError, match="malformed audit cursor"):
        query(audit_dir, after=bad)


def test_cursor_round_trip():
    name = "audit-20261130T093000.123456Z-000001.jsonl"
    assert decode_cursor(encode_cursor(name, 1234)) == (name, 1234)
    assert decode_cursor(encode_cursor("", 0)) == ("", 0)


def test_torn_trailing_line_is_skipped(audit_dir, caplog):
    write_records(audit_dir, [rec("t-1"), rec("t-2")])
    (name,) = files(audit_dir)
    with open(audit_dir / name, "ab") as f:  # a crash mid-write
        f.write(rec("t-torn").to_json()[:40])
    got, cursor = query(audit_dir)
    assert ids(got) == ["t-1", "t-2"]
    # The next process starts a new file; the torn line stays behind and is never returned.
    write_records(audit_dir, [rec("t-3")])
    caplog.set_level(logging.WARNING, logger="orgmem.audit")
    assert ids(query(audit_dir)[0]) == ["t-1", "t-2", "t-3"]
    assert any("torn" in r.getMessage() for r in caplog.records)
    assert ids(query(audit_dir, after=cursor)[0]) == ["t-3"]


def test_unparsable_complete_line_is_skipped(audit_dir):
    write_records(audit_dir, [rec("u-1")])
    (name,) = files(audit_dir)
    with open(audit_dir / name, "ab") as f:
        f.write(b"\x00\x00{not json\n")
    write_records(audit_dir, [rec("u-2")])
    assert ids(query(audit_dir)[0]) == ["u-1", "u-2"]


def test_query_limit_must_be_positive(audit_dir):
    with pytest.raises(ValueError):
        query(audit_dir, limit=0)


def test_query_missing_directory(tmp_path):
    got, cursor = query(tmp_path / "nope")
    assert got == [] and decode_cursor(cursor) == ("", 0)


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
