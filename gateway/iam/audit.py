"""The audit trail: one record per gateway request, allowed or denied.

Records travel on the durable log (:mod:`gateway.log`) as :class:`~gateway.log.AuditEntry`
and the compactor turns them into zstd Parquet in their own partition,
``parquet/audit/date=<yyyy-mm-dd>/`` of the internal bucket (:mod:`.audit_stream`), sealed
like everything else. The fields and their order are the contract, :class:`AuditRecord`.

Durability bound
----------------
- :meth:`AuditLog.record` (reads, writes, and anything else that changes nothing an admin
  must be able to account for) hands the record to the log's buffer and returns at once;
  the log commits its buffer within its flush interval (1 s). A crash of the process or
  the machine therefore loses at most the records of the last second plus one commit.
  While the store refuses writes the log keeps its buffer (500,000 records, beyond which
  it drops the oldest and counts them) and retries on every tick.
- :meth:`AuditLog.record_durable` (deletes, admin and IAM changes, vault key management)
  returns once the log object holding the record is stored; concurrent callers share one
  commit. If the log cannot store it, the request is *not* failed: the change it audits
  has already happened, so failing the response would only hide that it did. The
  record goes back to the buffer to be retried with the next commit, and a warning
  ``audit_not_durable`` names the request.

Reading
-------
:func:`query` merges the compacted segments with the log's uncompacted tail (so a
record is readable the moment its commit is acknowledged), filters, returns records
oldest first (by ``time``, then ``request_id``), each request once, and an opaque cursor.
:func:`parse_since` turns ``--since`` arguments ("10m", "2h", "7d", "90s", unix seconds
or ISO-8601) into unix seconds.

The cursor holds the ``(time, request_id)`` of the last record returned, so the next
call returns what sorts after it. Records can also become visible *behind* it: buffered
records are committed up to about a second after their ``time``, and other gateways
commit on their own clocks. So the cursor also holds a window, :data:`LATE_WINDOW`
(5 s) before its time, and a 4-byte hash of the ``request_id`` of every record it
returned in that window (at most :data:`CURSOR_IDS`; beyond that the window shrinks to
the newest ones): a later call returns, besides the newer records, any matching record in
the window that it did not return yet. A record that becomes visible more than the
window behind the newest one already returned (a gateway whose clock lags by more, or
that could not reach the store for longer) is not returned by a cursor, only by a query
whose ``since`` covers it. When a call was not cut short by ``limit``, the cursor moves
to the newest record examined, matching or not, so polls with filters do not re-read
what they passed; a cursor is therefore only valid with the filters (``principal``,
``denied``) of the query that returned it.

Records never carry secrets by construction (only the access key ID, never a signature,
a secret or a query string); this module does not rewrite fields.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import re
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any, Literal

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..log import AuditEntry, DurableLog, LogReader, LogUnavailable
from ..logs import log
from ..segments.compactor import Compactor, Snapshot
from ..segments.files import SegmentFiles
from .audit_stream import AUDIT_SCHEMA, AuditStream, date_of, table_rows, time_us

USER_AGENT_MAX = 512
STREAM = AuditStream.name
TIME_TYPE = AUDIT_SCHEMA.field("time").type
#: How far behind the newest record a cursor returned it still looks for late arrivals.
LATE_WINDOW = 5.0
#: Request ids a cursor remembers from its window, at most (about 6 bytes each).
CURSOR_IDS = 500
#: Times outside year 1..9999 cannot be asked for.
_MAX_US = 253_402_300_799_999_999
_MIN_US = -62_135_596_800_000_000
_CURSOR_VERSION = 1
_CURSOR_MAX = 8192
_WINDOW_US = int(LATE_WINDOW * 1_000_000)
#: How often a query retries when compaction moved the log under it.


# --- the record -------------------------------------------------------------------------------------


_iso_cache: tuple[int, str] = (-1, "")


def iso_ms(t: float) -> str:
    """Unix seconds -> "2026-11-30T09:30:00.123Z" (UTC, milliseconds truncated)."""
    global _iso_cache
    ms = int(t * 1000)
    sec, milli = divmod(ms, 1000)
    cached_sec, prefix = _iso_cache
    if cached_sec != sec:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
        _iso_cache = (sec, prefix)  # one tuple assignment: safe to race
    return f"{prefix}.{milli:03d}Z"


@dataclass(slots=True, kw_only=True)
class AuditRecord:
    """One request's audit record; the fields and their order are the contract.

    ``time`` is unix seconds (cheap to take on the event loop); it is rendered as ISO-8601
    UTC with milliseconds only when serialized. Pass ``user_agent`` through
    :func:`scrub_user_agent`.
    """

    time: float = field(default_factory=time.time)
    request_id: str
    principal: str | None = None
    access_key: str | None = None
    action: str | None = None
    resource: str | None = None
    operation: str | None = None
    decision: Literal["allow", "deny"]
    reason: str
    status: int
    bytes_in: int = 0
    bytes_out: int = 0
    remote_addr: str
    user_agent: str | None = None
    error: str | None = None
    #: the version a vault operation read or wrote (secrets); None elsewhere
    version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as written: a JSON-ready dict, keys in contract order."""
        return {
            "time": iso_ms(self.time),
            "request_id": self.request_id,
            "principal": self.principal,
            "access_key": self.access_key,
            "action": self.action,
            "resource": self.resource,
            "operation": self.operation,
            "decision": self.decision,
            "reason": self.reason,
            "status": self.status,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "remote_addr": self.remote_addr,
            "user_agent": self.user_agent,
            "error": self.error,
            "version": self.version,
        }

    def to_json(self) -> bytes:
        """One JSON object (no trailing newline)."""
        return orjson.dumps(self.to_dict())


def scrub_user_agent(ua: str | None) -> str | None:
    """A client-supplied User-Agent, truncated to 512 characters."""
    if ua is None or len(ua) <= USER_AGENT_MAX:
        return ua
    return ua[:USER_AGENT_MAX]


# --- the writer -------------------------------------------------------------------------------------


class AuditLog:
    """Audit records onto the shared durable log, and queries of them; see the module docstring.

    Thread-safe. The log's lifecycle belongs to whoever built it (the gateway starts and
    closes it); :meth:`close` only commits what is buffered.
    """

    def __init__(self, durable_log: DurableLog, compactor: Compactor) -> None:
        self.log = durable_log
        self.compactor = compactor

    def start(self) -> AuditLog:
        """Nothing to start: the records ride the durable log, started by the gateway."""
        return self

    def close(self) -> None:
        """Commit the buffered records (best effort: a warning if the store refuses)."""
        self.flush()

    def record(self, rec: AuditRecord) -> None:
        """Buffer a record; the log commits it within its flush interval. Returns at once."""
        self.log.append_nowait([AuditEntry(rec.to_dict())])

    def record_durable(self, rec: AuditRecord) -> bool:
        """Commit ``rec`` (with whatever is buffered) before returning; True once it is stored.

        When the log cannot store it, logs a warning, leaves the record buffered for the
        next commit and returns False: it never raises, and never fails the request.
        """
        entry = AuditEntry(rec.to_dict())
        try:
            self.log.append([entry])
        except LogUnavailable as exc:
            self.log.append_nowait([entry])
            log.warning("audit_not_durable", request_id=rec.request_id, operation=rec.operation,
                        error=str(exc)[:200], hint="the record stays buffered and is retried")
            return False
        return True

    def flush(self) -> bool:
        """Commit what is buffered now; False (and a warning) if the store refused."""
        try:
            self.log.flush()
        except LogUnavailable as exc:
            log.warning("audit_flush_failed", error=str(exc)[:200])
            return False
        return True

    def query(self, **kwargs: Any) -> tuple[list[dict], str]:
        """:func:`query` over one consistent snapshot of the compactor; the same keywords."""
        return self.compactor.consistent(
            lambda snapshot: query(snapshot, self.compactor.files, self.log.reader, **kwargs))


# --- reading ----------------------------------------------------------------------------------------


@dataclass
class Cursor:
    """Where a query stopped: see the module docstring."""

    time: int  # microseconds: (time, request_id) of the last record returned or examined
    request_id: str
    #: start of the late window (microseconds, whole milliseconds)
    window: int
    #: (time in whole milliseconds as microseconds, id hash) of records returned in the window
    seen: list[tuple[int, int]] = field(default_factory=list)
    #: a hash of the filters it was made with (principal, denied): it is only valid with them
    filters: int = 0

    @property
    def key(self) -> tuple[int, str]:
        return self.time, self.request_id


def _id_hash(request_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=4).digest(), "big")


def _filters_hash(principal: str | None, denied: bool | None) -> int:
    return _id_hash(orjson.dumps([principal, denied]).decode())


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_cursor(cursor: Cursor) -> str:
    rid = cursor.request_id.encode()
    parts = [struct.pack(">BIqqH", _CURSOR_VERSION, cursor.filters, cursor.time, cursor.window, len(rid)),
             rid, struct.pack(">H", len(cursor.seen))]
    prev = cursor.window
    for t, h in cursor.seen:
        parts.append(_varint((t - prev) // 1000))
        parts.append(struct.pack(">I", h))
        prev = t
    return base64.urlsafe_b64encode(b"".join(parts)).decode().rstrip("=")


def decode_cursor(text: str) -> Cursor:
    """The :class:`Cursor` of a string from :func:`query`; ValueError if malformed."""
    bad = ValueError("malformed audit cursor: pass back the cursor returned by the previous query")
    if not isinstance(text, str) or not 0 < len(text) <= _CURSOR_MAX:
        raise bad
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
        version, filters, t, window, n = struct.unpack_from(">BIqqH", raw)
        pos = struct.calcsize(">BIqqH")
        rid_bytes = raw[pos:pos + n]
        pos += n
        if version != _CURSOR_VERSION or len(rid_bytes) != n:
            raise bad
        rid = rid_bytes.decode()
        (count,) = struct.unpack_from(">H", raw, pos)
        pos += 2
        seen, prev = [], window
        for _ in range(count):
            delta = shift = 0
            while True:
                byte = raw[pos]
                pos += 1
                delta |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
                if shift > 63:
                    raise bad
            prev += delta * 1000
            (h,) = struct.unpack_from(">I", raw, pos)
            pos += 4
            seen.append((prev, h))
    except (binascii.Error, struct.error, IndexError, UnicodeDecodeError, ValueError):
        raise bad from None
    if pos != len(raw) or count > CURSOR_IDS or not _MIN_US <= window <= _MAX_US \
            or not _MIN_US <= t <= _MAX_US or (seen and seen[-1][0] > _MAX_US):
        raise bad
    return Cursor(t, rid, window, seen, filters)


def _since_us(since: float) -> int:
    """``since`` (unix seconds) in microseconds, whole milliseconds as records have them."""
    if not since == since or not _MIN_US <= since * 1_000_000 <= _MAX_US:  # NaN or beyond year 9999
        raise ValueError("since is out of range.")
    return int(since * 1000) * 1000


def _ms(us: int) -> int:
    return us // 1000 * 1000


def query(
    snapshot: Snapshot,
    files: SegmentFiles,
    reader: LogReader,
    *,
    since: float | None = None,
    principal: str | None = None,
    denied: bool | None = None,
    after: str | None = None,
    limit: int = 100,
    now: float | None = None,
) -> tuple[list[dict], str]:
    """Audit records oldest first, filtered, at most ``limit``; and a cursor for the next call.

    ``snapshot`` names the compacted segments and where the log's tail starts (one loaded
    compactor checkpoint); the tail is read from ``reader``. ``since`` (unix seconds,
    millisecond granularity) keeps records at or after that time; ``principal`` matches
    exactly; ``denied`` True keeps denials, False allowed requests. ``after`` is the cursor
    of a previous call: only records it did not return are returned (see the module
    docstring for records that arrive late). Segments wholly older than what is asked
    for are not read, nor, once ``limit`` records are in hand, those wholly newer.
    """
    if limit < 1:
        raise ValueError("limit must be >= 1")
    cur = decode_cursor(after) if after is not None else None
    filters = _filters_hash(principal, denied)
    if cur is not None and cur.filters != filters:
        raise ValueError("this audit cursor belongs to a query with other filters: pass the same "
                         "principal and denied as the query that returned it")
    since_us = _since_us(since) if since is not None else None
    now_us = int((time.time() if now is None else now) * 1_000_000)
    want = None if denied is None else ("deny" if denied else "allow")
    seen = {h for _, h in cur.seen} if cur else set()

    # the lowest time that can matter
    lo = min(cur.window, cur.time) if cur else since_us
    if since_us is not None and lo is not None:
        lo = max(lo, since_us)

    def wanted(t: int, rid: str) -> bool:
        if cur is None or (t, rid) > cur.key:
            return True
        return t >= cur.window and _id_hash(rid) not in seen  # a late arrival not yet returned

    found: dict[str, tuple[int, dict]] = {}
    horizon: tuple[int, str] | None = None  # the newest record examined

    for t, rec in _tail(snapshot, reader):
        if lo is not None and t < lo:
            continue
        rid = rec["request_id"]
        if horizon is None or (t, rid) > horizon:
            horizon = (t, rid)
        if ((principal is None or rec.get("principal") == principal)
                and (want is None or rec.get("decision") == want)
                and rid not in found and wanted(t, rid)):
            found[rid] = (t, rec)

    truncated = False
    for segment in _segments(snapshot, lo):
        if len(found) >= limit:
            kth = heapq.nsmallest(limit, ((t, rid) for rid, (t, _) in found.items()))[-1]
            if segment.min_ts > kth[0]:  # this and every later segment sort after the page
                truncated = True
                break
        table = _read_segment(files, segment.key, lo)
        if table.num_rows:  # rows are sorted: the last is the newest
            last = (table["time"].cast(pa.int64())[-1].as_py(), table["request_id"][-1].as_py())
            horizon = last if horizon is None else max(horizon, last)
        if principal is not None:
            table = table.filter(pc.equal(table["principal"], principal))
        if want is not None:
            table = table.filter(pc.equal(table["decision"], want))
        for t, rec in table_rows(table):
            rid = rec["request_id"]
            if rid not in found and wanted(t, rid):
                found[rid] = (t, rec)

    ordered = sorted(found.values(), key=lambda item: (item[0], item[1]["request_id"]))
    truncated = truncated or len(ordered) > limit
    page = ordered[:limit]
    cursor = _next_cursor(cur, page, horizon, truncated, since_us, now_us)
    cursor.filters = filters
    return [rec for _, rec in page], encode_cursor(cursor)


def _tail(snapshot: Snapshot, reader: LogReader) -> Iterable[tuple[int, dict]]:
    """Audit records acknowledged but not yet compacted, with their time in microseconds."""
    for obj in reader.read_pending(snapshot.positions):
        for record in obj.records:
            if isinstance(record, AuditEntry):
                yield time_us(record.record["time"]), record.record


def _read_segment(files: SegmentFiles, key: str, lo: int | None) -> pa.Table:
    """A segment's rows at or after ``lo``: row groups wholly before it are skipped by their
    statistics (rows are sorted by time, so a poll of the newest records reads little)."""
    data = pa.BufferReader(files.read(key))
    if lo is None:
        return pq.read_table(data)
    return pq.read_table(data, filters=pc.field("time") >= pa.scalar(lo, TIME_TYPE))


def _segments(snapshot: Snapshot, lo: int | None) -> list:
    """The audit segments that can hold records at or after ``lo``, oldest first."""
    low_date = date_of(lo) if lo is not None and lo > 0 else ""
    chosen = [s for s in snapshot.manifest.of(STREAM)
              if lo is None or (s.max_ts >= lo and (s.value("date") or "") >= low_date)]
    return sorted(chosen, key=lambda s: (s.min_ts, s.name))


def _next_cursor(cur: Cursor | None, page: list[tuple[int, dict]], horizon: tuple[int, str] | None,
                 truncated: bool, since_us: int | None, now_us: int) -> Cursor:
    keys = [cur.key] if cur else []
    if page:
        keys.append((page[-1][0], page[-1][1]["request_id"]))
    if horizon is not None and not truncated:
        keys.append(horizon)  # everything up to it that matched was returned
    t, rid = max(keys) if keys else (since_us if since_us is not None else _MIN_US, "")
    floor = cur.window if cur else (since_us if since_us is not None else _MIN_US)
    # the window trails the newest record returned, or now when that lies in the future
    window = _ms(max(floor, min(t, now_us) - _WINDOW_US))
    entries = {(t0, h) for t0, h in cur.seen if t0 >= window} if cur else set()
    entries |= {(_ms(t0), _id_hash(rec["request_id"])) for t0, rec in page if t0 >= window}
    ordered = sorted(entries)
    if len(ordered) > CURSOR_IDS:  # keep the newest; the window starts after the rest
        window = ordered[len(ordered) - CURSOR_IDS - 1][0] + 1000
        ordered = [e for e in ordered if e[0] >= window]
    return Cursor(t, rid, window, ordered)


_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")


def parse_since_us(text: str, now: float) -> int:
    """:func:`parse_since` in whole microseconds, exactly: through a float, times after about
    2255 lost their microseconds (a ``since`` at an event's own time could miss it)."""
    s = text.strip()
    if _DURATION_RE.fullmatch(s):
        return int(parse_since(s, now) * 1_000_000)
    if _NUMBER_RE.fullmatch(s):
        try:
            return int((Decimal(s) * 1_000_000).to_integral_value(ROUND_FLOOR))
        except (InvalidOperation, OverflowError):
            raise ValueError(f"invalid --since value {text!r}") from None
    parse_since(s, now)  # what is left is an ISO-8601 timestamp, or this raises
    return time_us(s)


def parse_since(text: str, now: float) -> float:
    """``--since`` to unix seconds: "90s", "10m", "2h", "7d" before ``now``, unix seconds, or
    an ISO-8601 timestamp (UTC when it carries no offset). ValueError otherwise."""
    s = text.strip()
    if m := _DURATION_RE.fullmatch(s):
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    if _NUMBER_RE.fullmatch(s):
        return float(s)
    if len(s) >= 8 and s[:4].isdigit():
        try:
            dt = datetime.fromisoformat(s)
        except ValueError:
            pass
        else:
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=UTC)
            return dt.timestamp()
    raise ValueError(
        f"invalid --since value {text!r}: expected a duration such as 90s, 10m, 2h or 7d, "
        "unix seconds, or an ISO-8601 timestamp such as 2026-11-30T09:30:00Z"
    )
