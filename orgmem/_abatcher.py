"""The background event logger of the async client: the sync Batcher's rules on an event loop.

One flusher task, started on the loop of the first ``log_event``; the same triggers (500
events, one second, a flush) and the same bookkeeping (sequence numbers, ``done``, errors
raised by ``flush``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

from . import _events
from ._events import Pending
from .errors import OrgmemError, Unavailable


class AsyncBatcher:
    def __init__(self, send: Callable[[list[Pending]], Awaitable[list[OrgmemError]]], *,
                 interval: float = _events.FLUSH_INTERVAL, batch_events: int = _events.BATCH_EVENTS,
                 max_queue: int = _events.MAX_QUEUE) -> None:
        self._send = send
        self._interval = interval
        self._batch_events = batch_events
        self._max_queue = max_queue
        self._cond: asyncio.Condition | None = None
        self._queue: deque[tuple[int, Pending]] = deque()
        self._queued_at = 0.0
        self._enqueued = 0
        self._done = 0
        self._flush_upto = 0
        self._errors: list[OrgmemError] = []
        self._closed = False
        self._task: asyncio.Task | None = None

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def add(self, event: Pending) -> None:
        cond = self._condition()
        async with cond:
            if self._closed:
                raise OrgmemError(0, "ClientClosed", "the client is closed; nothing more can be logged")
            while len(self._queue) >= self._max_queue and not self._closed:
                await cond.wait()
            if not self._queue:
                self._queued_at = time.monotonic()
            self._enqueued += 1
            self._queue.append((self._enqueued, event))
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._run(), name="orgmem-event-flusher")
            if len(self._queue) >= self._batch_events:
                cond.notify_all()

    async def flush(self, timeout: float | None = None) -> None:
        cond = self._condition()
        async with cond:
            target = self._enqueued
            self._flush_upto = max(self._flush_upto, target)
            cond.notify_all()
            try:
                await asyncio.wait_for(cond.wait_for(lambda: self._done >= target), timeout)
            except TimeoutError:
                raise Unavailable(0, "Timeout", f"{target - self._done} logged events were not "
                                  f"acknowledged within {timeout:g} seconds; they are still queued") from None
            errors, self._errors = self._errors, []
        if errors:
            raise _events.refused(errors)

    async def close(self, timeout: float | None = None) -> None:
        try:
            await self.flush(timeout)
        finally:
            cond = self._condition()
            async with cond:
                self._closed = True
                cond.notify_all()
            if self._task is not None:
                try:
                    await asyncio.wait_for(self._task, timeout)
                except TimeoutError:
                    self._task.cancel()

    async def _next_batch(self, cond: asyncio.Condition) -> list[tuple[int, Pending]] | None:
        while True:
            if self._queue:
                due = (len(self._queue) >= self._batch_events or self._closed
                       or self._queue[0][0] <= self._flush_upto)
                wait = self._queued_at + self._interval - time.monotonic()
                if due or wait <= 0:
                    batch = _events.take(self._queue, self._batch_events)
                    self._queued_at = time.monotonic()
                    cond.notify_all()
                    return batch
                try:
                    await asyncio.wait_for(cond.wait(), wait)
                except TimeoutError:
                    pass
            elif self._closed:
                return None
            else:
                await cond.wait()

    async def _run(self) -> None:
        cond = self._condition()
        while True:
            async with cond:
                batch = await self._next_batch(cond)
            if batch is None:
                return
            try:
                errors = await self._send([p for _, p in batch])
            except Exception as exc:  # noqa: BLE001 - the flusher must outlive any failure
                errors = [OrgmemError(0, type(exc).__name__, f"{len(batch)} events not stored: {exc}")]
            async with cond:
                self._done = batch[-1][0]
                self._errors.extend(errors)
                cond.notify_all()
