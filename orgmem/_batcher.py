"""The background event logger of the sync client: a bounded queue and one flusher thread.

``add`` queues and returns at once (it waits only while the queue is full, which bounds the
memory a stalled gateway can cost).  The flusher sends a batch when 500 events are waiting,
when the oldest has waited a second, or when someone flushes.  Every event gets a sequence
number; ``done`` is the highest number whose batch is finished (stored or refused), so
``flush`` waits for exactly what was logged before it was called, and then raises what the
gateway refused of it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from . import _events
from ._events import Pending
from .errors import OrgmemError, Unavailable


class Batcher:
    def __init__(self, send: Callable[[list[Pending]], list[OrgmemError]], *,
                 interval: float = _events.FLUSH_INTERVAL, batch_events: int = _events.BATCH_EVENTS,
                 max_queue: int = _events.MAX_QUEUE) -> None:
        self._send = send
        self._interval = interval
        self._batch_events = batch_events
        self._max_queue = max_queue
        self._cond = threading.Condition()
        self._queue: deque[tuple[int, Pending]] = deque()
        self._queued_at = 0.0      # when the queue last went from empty to not empty
        self._enqueued = 0         # the last sequence number handed out
        self._done = 0             # every event up to this number is finished
        self._flush_upto = 0       # send without waiting for the interval up to here
        self._errors: list[OrgmemError] = []
        self._closed = False
        self._thread: threading.Thread | None = None

    # -- producers -----------------------------------------------------------------

    def add(self, event: Pending) -> None:
        with self._cond:
            if self._closed:
                raise OrgmemError(0, "ClientClosed", "the client is closed; nothing more can be logged")
            while len(self._queue) >= self._max_queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                self._queued_at = time.monotonic()
            self._enqueued += 1
            self._queue.append((self._enqueued, event))
            self._start()
            if len(self._queue) >= self._batch_events:
                self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every event added before this call is stored or refused; raise for refusals."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._enqueued
            self._flush_upto = max(self._flush_upto, target)
            if self._done < target:
                self._start()
            self._cond.notify_all()
            while self._done < target:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise Unavailable(0, "Timeout", f"{target - self._done} logged events were not "
                                      f"acknowledged within {timeout:g} seconds; they are still queued")
                self._cond.wait(remaining)
            errors, self._errors = self._errors, []
        if errors:
            raise _events.refused(errors)

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the flusher; later ``add`` calls are refused."""
        try:
            self.flush(timeout)
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            if self._thread is not None:
                self._thread.join(timeout)

    @property
    def pending(self) -> int:
        with self._cond:
            return self._enqueued - self._done

    # -- the flusher -----------------------------------------------------------------

    def _start(self) -> None:
        """Start the flusher if it is not running (first use, or in a child after fork)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="orgmem-event-flusher", daemon=True)
            self._thread.start()

    def _next_batch(self) -> list[tuple[int, Pending]] | None:
        """Wait (holding the lock) until a batch is due; None once closed and drained."""
        while True:
            if self._queue:
                due = (len(self._queue) >= self._batch_events or self._closed
                       or self._queue[0][0] <= self._flush_upto)
                wait = self._queued_at + self._interval - time.monotonic()
                if due or wait <= 0:
                    batch = _events.take(self._queue, self._batch_events)
                    self._queued_at = time.monotonic()
                    self._cond.notify_all()  # room for waiting producers
                    return batch
                self._cond.wait(wait)
            elif self._closed:
                return None
            else:
                self._cond.wait()

    def _run(self) -> None:
        while True:
            with self._cond:
                batch = self._next_batch()
            if batch is None:
                return
            try:
                errors = self._send([p for _, p in batch])
            except Exception as exc:  # noqa: BLE001 - the flusher must outlive any failure
                errors = [OrgmemError(0, type(exc).__name__, f"{len(batch)} events not stored: {exc}")]
            with self._cond:
                self._done = batch[-1][0]
                self._errors.extend(errors)
                self._cond.notify_all()
