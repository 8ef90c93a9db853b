"""The group-commit writer: many callers, one log object per commit.

Callers hand records to :meth:`LogWriter.append` and block until the object holding
them is stored; whoever arrives while a commit is in flight rides the next one, so a
busy gateway turns thousands of appends per second into a few hundred object PUTs.
Records that need no acknowledgement (audit records of reads, artifact events) go
through :meth:`LogWriter.append_nowait` and are committed within ``flush_interval``.

A writer owns its key prefix outright (its id is unique per process start), so commits
need no condition and a retried PUT of the same bytes is harmless. Commits are serial,
and a commit that failed is never reused: its records (those not yet acknowledged) go
into the next commit under the next sequence number. So an acknowledged object is
always visible before the next one is written, which is what lets readers walk a
writer's objects by listing (see DESIGN.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..logs import log
from ..store.base import ObjectStore, StoreError, StoreTimeout, StoreUnavailable
from ..store.objects import write_object
from . import layout
from .records import Record, encodable, encode, encoded_size

#: A commit carries at most this many records; the rest ride the next one.
MAX_BATCH_RECORDS = 200_000
#: Buffered unacknowledged records kept while the store refuses writes; beyond, the oldest go.
MAX_BUFFERED = 500_000
#: Attempts per commit before its waiters are told the store is unavailable.
ATTEMPTS = 3
BACKOFF = 0.2

#: Called with (writer, seq, records) after each commit: the reader's cache learns them.
#: (writer, seq, records, uncompressed size) of each object committed
CommitHook = Callable[[str, int, list[Record], int], None]


class LogUnavailable(StoreUnavailable):
    """The log could not store the records; nothing was acknowledged. Retry later."""


@dataclass(frozen=True, slots=True)
class Position:
    """Where a record was committed: the writer and the sequence number of its object."""

    writer: str
    seq: int


@dataclass(slots=True)
class _Waiter:
    records: list[Record]
    done: threading.Event = field(default_factory=threading.Event)
    position: Position | None = None
    error: Exception | None = None


class LogWriter:
    def __init__(self, store: ObjectStore, writer_id: str | None = None, flush_interval: float = 1.0,
                 on_commit: CommitHook | None = None) -> None:
        self.store = store
        self.writer_id = writer_id or layout.new_writer_id()
        self.flush_interval = flush_interval
        self.on_commit = on_commit
        self._cond = threading.Condition()
        self._waiters: list[_Waiter] = []
        self._buffered: list[Record] = []
        self._buffered_since: float | None = None
        self._seq = 0
        self._closing = False
        self._thread: threading.Thread | None = None
        self.dropped = 0
        self.commits = 0
        self._straggler_lock = threading.Lock()

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> LogWriter:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="orgmem-log", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Commit what is buffered, then stop."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    # -- appending ----------------------------------------------------------

    def append(self, records: list[Record], timeout: float = 30.0) -> Position:
        """Block until ``records`` are durable in the store; raises :class:`LogUnavailable`."""
        waiter = _Waiter(records)
        with self._cond:
            if self._closing:
                raise LogUnavailable("the log is shutting down")
            self._waiters.append(waiter)
            self._cond.notify_all()
        position = self._wait(waiter, timeout)
        assert position is not None
        return position

    def append_nowait(self, records: list[Record]) -> None:
        """Buffer ``records``; they are committed within ``flush_interval`` seconds.

        After :meth:`close` (a request finishing during shutdown) there is no commit loop
        left to do it, so they are committed here and now."""
        with self._cond:
            closed = self._closing and self._thread is None
        if closed:
            with self._straggler_lock:
                self._commit([], list(records))
            return
        with self._cond:
            if not self._buffered:
                self._buffered_since = time.monotonic()
                self._cond.notify_all()  # the commit loop starts its flush_interval clock
            self._buffered.extend(records)
            overflow = len(self._buffered) - MAX_BUFFERED
            if overflow > 0:
                del self._buffered[:overflow]
                self.dropped += overflow
            if len(self._buffered) >= MAX_BATCH_RECORDS:
                self._cond.notify_all()

    def flush(self, timeout: float = 30.0) -> Position | None:
        """Commit everything buffered now, and wait for a commit already in flight (whose
        records left the buffer but are not stored yet); returns where the buffered records
        went (None if there were none). Raises :class:`LogUnavailable` like :meth:`append`."""
        waiter = _Waiter([])
        with self._cond:
            if self._closing or self._thread is None:
                if not self._buffered:
                    return None  # nothing buffered, and no commit loop that could be mid-commit
                if self._closing:
                    raise LogUnavailable("the log is shutting down")
            self._waiters.append(waiter)
            self._cond.notify_all()
        return self._wait(waiter, timeout)

    @staticmethod
    def _wait(waiter: _Waiter, timeout: float) -> Position | None:
        """The commit's answer to a queued waiter: where it went, or its error."""
        if not waiter.done.wait(timeout):
            raise LogUnavailable("the log did not commit in time")
        if waiter.error is not None:
            raise waiter.error
        return waiter.position

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._buffered) + sum(len(w.records) for w in self._waiters)

    # -- the commit loop ----------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due():
                    if self._closing:
                        break
                    self._cond.wait(self._wait_time())
                if self._closing and not self._waiters and not self._buffered:
                    return
                waiters, buffered = self._take()
            self._commit(waiters, buffered)

    def _due(self) -> bool:
        if self._waiters:
            return True
        if not self._buffered:
            return False
        full = len(self._buffered) >= MAX_BATCH_RECORDS
        return full or time.monotonic() - (self._buffered_since or 0) >= self.flush_interval

    def _wait_time(self) -> float | None:
        if not self._buffered:
            return None
        return max(0.0, self.flush_interval - (time.monotonic() - (self._buffered_since or 0)))

    def _take(self) -> tuple[list[_Waiter], list[Record]]:
        waiters, count = [], 0
        while self._waiters and (not waiters or count + len(self._waiters[0].records) <= MAX_BATCH_RECORDS):
            waiter = self._waiters.pop(0)
            waiters.append(waiter)
            count += len(waiter.records)
        buffered = self._buffered[: max(0, MAX_BATCH_RECORDS - count)]
        del self._buffered[: len(buffered)]
        self._buffered_since = time.monotonic() if self._buffered else None
        return waiters, buffered

    def _commit(self, waiters: list[_Waiter], buffered: list[Record]) -> None:
        # buffered records go first: they were handed over earlier
        records = buffered + [r for w in waiters for r in w.records]
        if not records:
            self._finish(waiters, None, None)
            return
        self._seq += 1
        seq = self._seq
        try:
            size = self._store(seq, records)
        except StoreError as exc:
            log.warning("log_commit_failed", writer=self.writer_id, seq=seq, records=len(records),
                        error=exc.__class__.__name__)
            with self._cond:  # keep the unacknowledged ones for the next commit
                self._buffered[:0] = buffered
                if self._buffered and self._buffered_since is None:
                    self._buffered_since = time.monotonic()
            self._finish(waiters, None, LogUnavailable(
                f"the log could not be written ({exc.message}); nothing was stored, retry"))
            return
        except Exception as exc:  # noqa: BLE001 - a record that can never be written must not stop the log
            unwritable = {id(r) for r in records if not encodable(r)}
            log.error("log_commit_refused", writer=self.writer_id, seq=seq, records=len(records),
                      unwritable=len(unwritable), error=exc.__class__.__name__)
            failed = [w for w in waiters if not unwritable or any(id(r) in unwritable for r in w.records)]
            with self._cond:  # everything else goes again with the next commit
                self._waiters[:0] = [w for w in waiters if all(w is not f for f in failed)]
                self._buffered[:0] = [r for r in buffered if id(r) not in unwritable]
                if self._buffered and self._buffered_since is None:
                    self._buffered_since = time.monotonic()
            self._finish(failed, None, LogUnavailable(
                "the log could not write this request's records; nothing was stored"))
            return
        self.commits += 1
        if self.on_commit is not None:
            try:
                self.on_commit(self.writer_id, seq, records, size)
            except Exception as exc:  # noqa: BLE001 - the commit stands; only the notice failed
                log.error("log_commit_notice_failed", writer=self.writer_id, seq=seq,
                          error=exc.__class__.__name__)
        self._finish(waiters, Position(self.writer_id, seq), None)

    def _store(self, seq: int, records: list[Record]) -> int:
        """Write one log object; its uncompressed size (what caching its records costs)."""
        data = encode(records, self.writer_id, seq)
        key = layout.log_key(self.writer_id, seq)
        for attempt in range(ATTEMPTS):
            try:
                write_object(self.store, layout.BUCKET, key, data, "application/zstd")
                return encoded_size(data)
            except StoreTimeout:
                # waited a whole timeout already: no second PUT (it would double every waiter's
                # wait), but the first often landed all the same: look once
                if self._landed(key, data):
                    return encoded_size(data)
                raise
            except StoreError:
                if attempt == ATTEMPTS - 1:
                    raise
                time.sleep(BACKOFF * (2 ** attempt))

    def _landed(self, key: str, data: bytes) -> bool:
        """Whether a PUT whose answer timed out stored this log object after all (its name is
        this writer's alone, so an object there of this size is it)."""
        try:
            return self.store.head_object(layout.BUCKET, key).size == len(data)
        except StoreError:  # NoSuchKey, or the store still silent: it did not, as far as we know
            return False

    @staticmethod
    def _finish(waiters: list[_Waiter], position: Position | None, error: Exception | None) -> None:
        for waiter in waiters:
            waiter.position, waiter.error = position, error
            waiter.done.set()
