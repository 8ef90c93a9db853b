"""Running an operation over a sync ``orgmem.Client`` or an ``orgmem.AsyncClient``.

The store and the saver write each operation once, as a generator that yields the SDK
calls it needs and is sent their results: a :class:`Call`, or a list of them to run
concurrently, or an :class:`Emit` carrying one result for the caller of an iterating
operation (``list``). :class:`Driver` performs the calls: directly (a small thread pool
for lists) for the sync API, awaited (``asyncio.gather`` for lists) for the async one.
So the sync and async APIs cannot drift apart, and the async API never blocks the event
loop: without an AsyncClient it runs the sync client's calls in worker threads.

A call that fails is thrown back into the generator at its ``yield``, so operations
handle the SDK's exceptions (``orgmem.errors``) where they happen.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import NotFound

#: At most this many calls of one list run at once (each is one HTTP request).
WORKERS = 8


@dataclass(frozen=True)
class Call:
    """One SDK method call; ``tolerate``: exceptions that answer None instead of raising."""

    method: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    tolerate: tuple[type[Exception], ...] = ()


def call(method: str, *args: Any, **kwargs: Any) -> Call:
    return Call(method, args, kwargs)


def maybe(method: str, *args: Any, **kwargs: Any) -> Call:
    """A call whose target may be absent (None then)."""
    return Call(method, args, kwargs, tolerate=(NotFound,))


@dataclass(frozen=True)
class Emit:
    """One item an iterating operation hands to its caller."""

    value: Any


Operation = Generator["Call | list[Call] | Emit", Any, Any]


class Driver:
    """Performs operations with ``client`` (sync) and/or ``async_client``."""

    def __init__(self, client: Any = None, async_client: Any = None) -> None:
        if client is None and async_client is None:
            raise TypeError("Pass an orgmem.Client (client=...) or an orgmem.AsyncClient "
                            "(async_client=...).")
        self.client = client
        self.async_client = async_client
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    # -- sync -----------------------------------------------------------------------------

    def run(self, op: Operation) -> Any:
        """Perform ``op`` and return its result."""
        steps = self.iterate(op)
        while True:
            try:
                next(steps)
            except StopIteration as stop:
                return stop.value

    def iterate(self, op: Operation) -> Iterator[Any]:
        """Perform ``op``, yielding what it emits; returns its result."""
        if self.client is None:
            raise TypeError("This was made with an orgmem.AsyncClient only: use the async methods "
                            "(aget, aput, ainvoke, ...), or pass client=orgmem.Client(...) too.")
        send: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = op.throw(error) if error is not None else op.send(send)
            except StopIteration as stop:
                return stop.value
            send, error = None, None
            if isinstance(step, Emit):
                yield step.value
                continue
            try:
                send = self._perform(step)
            except Exception as exc:  # noqa: BLE001 - handed to the operation
                error = exc

    def _perform(self, step: Call | list[Call]) -> Any:
        if isinstance(step, Call):
            return self._one(step)
        if len(step) <= 1:
            return [self._one(c) for c in step]
        return list(self._executor().map(self._one, step))

    def _one(self, c: Call) -> Any:
        try:
            return getattr(self.client, c.method)(*c.args, **c.kwargs)
        except c.tolerate:
            return None

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="orgmem-langgraph")
            return self._pool

    def close(self) -> None:
        """Stop the worker threads (the clients stay open: they are the caller's)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    # -- async ----------------------------------------------------------------------------

    async def arun(self, op: Operation) -> Any:
        send: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = op.throw(error) if error is not None else op.send(send)
            except StopIteration as stop:
                return stop.value
            if isinstance(step, Emit):
                raise TypeError("an iterating operation needs aiterate()")
            send, error = await self._aperform_catching(step)

    async def aiterate(self, op: Operation) -> AsyncIterator[Any]:
        send: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = op.throw(error) if error is not None else op.send(send)
            except StopIteration:
                return
            if isinstance(step, Emit):
                send, error = None, None
                yield step.value
                continue
            send, error = await self._aperform_catching(step)

    async def _aperform_catching(self, step: Call | list[Call]) -> tuple[Any, BaseException | None]:
        try:
            if isinstance(step, Call):
                return await self._aone(step), None
            gate = asyncio.Semaphore(WORKERS)

            async def one(c: Call) -> Any:
                async with gate:
                    return await self._aone(c)

            results = await asyncio.gather(*(one(c) for c in step), return_exceptions=True)
        except Exception as exc:  # noqa: BLE001 - handed to the operation
            return None, exc
        for r in results:
            if isinstance(r, BaseException):
                return None, r
        return list(results), None

    async def _aone(self, c: Call) -> Any:
        try:
            if self.async_client is not None:
                return await getattr(self.async_client, c.method)(*c.args, **c.kwargs)
            return await asyncio.to_thread(getattr(self.client, c.method), *c.args, **c.kwargs)
        except c.tolerate:
            return None
