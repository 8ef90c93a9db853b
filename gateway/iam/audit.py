"""The audit trail: one record per gateway request, allowed or denied.

Until the durable log exists, records go to rotating JSONL files in a directory of the
gateway's reserved area (``DATA/.orgmem/audit/``): one JSON object per line, keys in the
order of the contract (/tmp/spec/audit.md, mirrored by :class:`AuditRecord`).

Durability bound
----------------
- :meth:`AuditLog.record` (plain reads) only appends the serialized record to an in-memory
  buffer and returns. A background thread writes and fsyncs the buffered group every
  ``flush_interval`` seconds (1 s by default), so a crash of the process or the machine
  loses at most the records of the last ``flush_interval`` seconds plus the duration of
  one write+fsync -- about one second. While the disk refuses writes (full, read-only)
  records stay buffered and are retried on every tick; the buffer is bounded
  (``max_pending``, 100k records by default), beyond which the oldest records are dropped,
  counted in :attr:`AuditLog.dropped` and reported in the warning.
- :meth:`AuditLog.record_durable` (admin and IAM changes, deletes, vault access) writes
  everything still buffered plus its record, in order, and fsyncs before it returns.
  Concurrent durable callers share one fsync (group commit).

Files
-----
The directory is created 0700 and files 0600. Names sort by creation time:
``audit-20261130T093000.123456Z-000001.jsonl``. A file is closed and a new one started
when the next record would grow it past ``max_file_bytes``; beyond ``max_files`` files the
oldest are deleted. Every process start begins a new file, so a line torn by a crash is
always the unterminated tail of a file; :func:`query` skips it (and any other line that
does not parse).

Reading
-------
:func:`query` streams records oldest first with filters and returns an opaque cursor
(file name + byte offset) with which ``--follow`` polls for only newer records.
:func:`parse_since` turns ``--since`` arguments ("10m", "2h", "7d", "90s", unix seconds or
ISO-8601) into unix seconds.

Records never carry secrets by construction (only the access key ID, never a signature,
a secret or a query string); this module does not rewrite fields.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import logging
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import orjson

logger = logging.getLogger("orgmem.audit")

MiB = 1024 * 1024
USER_AGENT_MAX = 512
WARN_EVERY = 10.0  # seconds between repeated write-failure warnings (unless drops grew)

_NAME_RE = re.compile(r"audit-(\d{8}T\d{6})\.(\d{6})Z-(\d+)\.jsonl")
_CURSOR_MAX = 256


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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


class AuditLog:
    """Appends audit records to rotating JSONL files; see the module docstring for the bounds.

    Thread-safe: :meth:`record` is called on the event loop, :meth:`record_durable` from
    worker threads. :meth:`record` never touches the disk (unless called after
    :meth:`close`), and never waits for a write in progress.
    """

    def __init__(
        self,
        directory: Path,
        *,
        flush_interval: float = 1.0,
        max_file_bytes: int = 64 * MiB,
        max_files: int = 100,
        max_pending: int = 100_000,
    ) -> None:
        if not flush_interval > 0:
            raise ValueError("flush_interval must be > 0 seconds")
        if max_file_bytes < 1 or max_files < 1 or max_pending < 1:
            raise ValueError("max_file_bytes, max_files and max_pending must be >= 1")
        self.directory = Path(directory)
        self.flush_interval = flush_interval
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files
        self.max_pending = max_pending
        _make_dir(self.directory)

        # Buffer state, under _lock. Every record gets a sequence number; the buffer always
        # holds the contiguous range [_head_seq, _next_seq). Numbers below _head_seq were
        # either written (<= _durable_seq) or dropped (<= _drop_high).
        self._lock = threading.Lock()
        self._pending: deque[bytes] = deque()
        self._head_seq = 0
        self._next_seq = 0
        self._durable_seq = -1
        self._drop_high = -1
        self._dropped = 0

        # File state, under _write_lock (held for a whole write + fsync).
        self._write_lock = threading.Lock()
        self._fd: int | None = None
        self._name = ""
        self._size = 0
        self._synced_size = 0
        self._file_seq = 0
        existing = _list_files(self.directory)
        self._last_name = existing[-1] if existing else ""
        self._failing = False
        self._warned_at = 0.0
        self._warned_drops = 0

        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- lifecycle

    def start(self) -> AuditLog:
        """Start the background flusher (idempotent)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("audit log is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="orgmem-audit", daemon=True)
                self._thread.start()
        return self

    def close(self) -> None:
        """Stop the flusher, write and fsync what is buffered, close the file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        self._stop.set()
        if thread is not None:
            thread.join()
        with self._write_lock:
            self._drain()
            self._close_file()

    def __enter__(self) -> AuditLog:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def dropped(self) -> int:
        """Records dropped because the buffer overflowed while writes were failing."""
        return self._dropped

    @property
    def pending(self) -> int:
        """Records buffered, not yet written."""
        return len(self._pending)

    # -- writing

    def record(self, rec: AuditRecord) -> None:
        """Buffer a record; the flusher writes it within ``flush_interval``. Returns at once."""
        line = orjson.dumps(rec.to_dict(), option=orjson.OPT_APPEND_NEWLINE)
        with self._lock:
            self._append(line)
            closed = self._closed
        if closed:  # a straggler after shutdown: nobody else will write it
            self.flush()

    def record_durable(self, rec: AuditRecord) -> bool:
        """Write everything buffered plus ``rec`` and fsync, before returning.

        Returns True once ``rec`` is on disk. On a write failure it logs a warning, keeps
        the records buffered for the next attempt and returns False (it does not raise).
        """
        line = orjson.dumps(rec.to_dict(), option=orjson.OPT_APPEND_NEWLINE)
        with self._lock:
            self._append(line)
            mine = self._next_seq - 1
        with self._write_lock:
            with self._lock:
                taken = mine < self._head_seq  # written (or being retried) by another caller
            if not taken:
                self._drain()
            if self._closed:
                self._close_file()
            with self._lock:
                return self._drop_high < mine <= self._durable_seq

    def flush(self) -> bool:
        """Write and fsync everything buffered now; False (and a warning) if that failed."""
        with self._write_lock:
            ok = self._drain()
            if self._closed:  # a straggler after close(): do not keep a file open
                self._close_file()
            return ok

    def _append(self, line: bytes) -> None:
        # caller holds _lock
        self._pending.append(line)
        self._next_seq += 1
        if len(self._pending) > self.max_pending:
            self._pending.popleft()
            self._drop_high = self._head_seq
            self._head_seq += 1
            self._dropped += 1

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval):
            try:
                self.flush()
            except Exception:  # never let the flusher die
                logger.exception("audit flusher failed")

    def _drain(self) -> bool:
        """Write and fsync the buffer. Caller holds _write_lock."""
        with self._lock:
            if not self._pending:
                return True
            batch, first = self._pending, self._head_seq
            self._pending = deque()
            self._head_seq = self._next_seq
        lines = list(batch)
        n = len(lines)
        done = 0  # lines[:done] are durable
        try:
            i = 0
            while i < n:
                if self._fd is None:
                    self._open_file()
                elif self._size > 0 and self._size + len(lines[i]) > self.max_file_bytes:
                    self._sync()
                    done = i
                    self._close_file()
                    self._open_file()
                j, total = i, 0
                while j < n and (self._size + total == 0
                                 or self._size + total + len(lines[j]) <= self.max_file_bytes):
                    total += len(lines[j])
                    j += 1
                self._write_all(b"".join(lines[i:j]))
                i = j
            self._sync()
            done = n
        except OSError as exc:
            self._recover_file()
            with self._lock:
                rest = deque(lines[done:])
                rest.extend(self._pending)
                self._pending = rest
                self._head_seq = first + done
                while len(self._pending) > self.max_pending:
                    self._pending.popleft()
                    self._drop_high = self._head_seq
                    self._head_seq += 1
                    self._dropped += 1
                if done:
                    self._durable_seq = first + done - 1
            self._warn(exc)
            return False
        with self._lock:
            self._durable_seq = first + n - 1
        if self._failing:
            self._failing = False
            logger.warning("audit log writes recovered; %d records dropped in total", self._dropped)
        return True

    def _write_all(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            self._size += written
            view = view[written:]

    def _sync(self) -> None:
        if self._fd is not None and self._size != self._synced_size:
            os.fsync(self._fd)
            self._synced_size = self._size

    def _recover_file(self) -> None:
        """After a failed write, cut the file back to what is known durable, or give it up."""
        if self._fd is None:
            return
        try:
            if self._size != self._synced_size:
                os.ftruncate(self._fd, self._synced_size)
                self._size = self._synced_size
        except OSError:
            # A torn tail stays as the last line of this file; readers skip it.
            self._close_file()

    def _close_file(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass

    def _next_name(self) -> str:
        ns = time.time_ns()
        sec, us = divmod(ns // 1000, 1_000_000)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(sec)) + f".{us:06d}"
        self._file_seq += 1
        name = f"audit-{stamp}Z-{self._file_seq:06d}.jsonl"
        if name <= self._last_name:  # the clock went back: keep names sorted by creation
            m = _NAME_RE.fullmatch(self._last_name)
            assert m is not None
            self._file_seq = max(self._file_seq, int(m.group(3)) + 1)
            name = f"audit-{m.group(1)}.{m.group(2)}Z-{self._file_seq:06d}.jsonl"
        return name

    def _open_file(self) -> None:
        _make_dir(self.directory)  # recreate if someone removed it
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        while True:
            name = self._next_name()
            try:
                fd = os.open(self.directory / name, flags, 0o600)
                break
            except FileExistsError:
                self._last_name = name
        try:
            os.fchmod(fd, 0o600)
            _fsync_dir(self.directory)
        except OSError:
            os.close(fd)
            raise
        self._fd, self._name, self._last_name = fd, name, name
        self._size = self._synced_size = 0
        self._retain()

    def _retain(self) -> None:
        names = _list_files(self.directory)
        excess = len(names) - self.max_files
        for name in names:
            if excess <= 0:
                break
            if name == self._name:
                continue
            try:
                os.unlink(self.directory / name)
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning("could not delete old audit file %s: %s", name, exc)
            excess -= 1

    def _warn(self, exc: OSError) -> None:
        now = time.monotonic()
        if self._failing and self._dropped == self._warned_drops and now - self._warned_at < WARN_EVERY:
            return
        self._failing = True
        self._warned_at, self._warned_drops = now, self._dropped
        logger.warning(
            "audit log write failed (%s: %s); %d records kept buffered for retry, "
            "%d dropped so far (buffer limit %d records)",
            type(exc).__name__, exc, len(self._pending), self._dropped, self.max_pending,
        )


# --- reading ----------------------------------------------------------------------------------------


def _list_files(directory: Path) -> list[str]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if _NAME_RE.fullmatch(n))


def _name_time(name: str) -> float:
    m = _NAME_RE.fullmatch(name)
    assert m is not None
    return calendar.timegm(time.strptime(m.group(1), "%Y%m%dT%H%M%S")) + int(m.group(2)) / 1e6


def encode_cursor(name: str, offset: int) -> str:
    raw = f"{name}:{offset}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, int]:
    """The (file name, byte offset) of a cursor from :func:`query`; ValueError if malformed."""
    bad = ValueError("malformed audit cursor: pass back the cursor returned by the previous query")
    if not isinstance(cursor, str) or not 0 < len(cursor) <= _CURSOR_MAX:
        raise bad
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
        name, sep, offset = raw.decode("ascii").rpartition(":")
    except (binascii.Error, ValueError):
        raise bad from None
    if not sep or not offset.isdigit() or len(offset) > 19 or (name and not _NAME_RE.fullmatch(name)):
        raise bad
    return name, int(offset)


def query(
    directory: Path,
    *,
    since: float | None = None,
    principal: str | None = None,
    denied: bool | None = None,
    after: str | None = None,
    limit: int = 100,
) -> tuple[list[dict], str | None]:
    """Audit records oldest first, filtered, at most ``limit``; and a cursor for the next call.

    ``since`` (unix seconds, millisecond granularity) keeps records at or after that time;
    ``principal`` matches exactly; ``denied`` True keeps denials, False allowed requests.
    ``after`` is the cursor of a previous call: only records written after it are read.
    The returned cursor points after the last record returned, or at the current end when
    the scan reached it, so polling with it yields only newer records. Files are streamed,
    never loaded whole; files wholly older than ``since`` (by their successor's name) are
    not opened. Unparsable lines (a line torn by a crash) are skipped; an unterminated
    last line of the newest file is left for the next poll (it may be mid-write).
    """
    if limit < 1:
        raise ValueError("limit must be >= 1")
    start_name, start_offset = decode_cursor(after) if after is not None else ("", 0)
    directory = Path(directory)
    names = [n for n in _list_files(directory) if n >= start_name]
    since_text = iso_ms(since) if since is not None else None
    want_decision = None if denied is None else ("deny" if denied else "allow")

    results: list[dict] = []
    cur_name, cur_offset = start_name, start_offset
    for idx, name in enumerate(names):
        last = idx == len(names) - 1
        offset = start_offset if name == start_name else 0
        if since is not None and not last and _name_time(names[idx + 1]) < since:
            cur_name, cur_offset = names[idx + 1], 0  # everything in this file is older
            continue
        try:
            f = open(directory / name, "rb")
        except FileNotFoundError:  # deleted by retention meanwhile
            continue
        with f:
            size = os.fstat(f.fileno()).st_size
            if offset > size:  # cannot resume inside this file; move on
                offset = size
            f.seek(offset)
            cur_name, cur_offset = name, offset
            for line in f:
                if not line.endswith(b"\n"):
                    if last:
                        break  # maybe still being written: leave it for the next poll
                    logger.warning("skipping torn last line of audit file %s", name)
                    cur_offset += len(line)
                    break
                cur_offset += len(line)
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    logger.warning("skipping unparsable line in audit file %s at byte %d",
                                   name, cur_offset - len(line))
                    continue
                if not isinstance(rec, dict):
                    continue
                if since_text is not None and not str(rec.get("time", "")) >= since_text:
                    continue
                if principal is not None and rec.get("principal") != principal:
                    continue
                if want_decision is not None and rec.get("decision") != want_decision:
                    continue
                results.append(rec)
                if len(results) >= limit:
                    return results, encode_cursor(cur_name, cur_offset)
    return results, encode_cursor(cur_name, cur_offset)


_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")


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
