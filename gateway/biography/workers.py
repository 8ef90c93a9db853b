"""Ingest processes: large event batches parsed, validated and redacted outside the gateway's
interpreter.

One interpreter runs one thread of Python at a time. Preparing a batch (parsing its JSON,
checking every field, scanning content for secrets, building the log records) is ~25 µs of
Python per event, so a gateway that did it in its request threads could not acknowledge
much over 20,000 events/s however many cores it had, and its event loop, log writer and
compactor queued behind the batches for the interpreter. Here a request thread hands the
body to an ingest process down a pipe and waits (without the GIL) for the records, each
as its log line, encoded there. The gateway writes the lines as they are and keeps them as
lines (see ``BioRecord.raw``): on the ingest path it never turns an event into Python
objects.

The processes run :class:`~.prepare.Preparer`, the code the request threads run, with the
same redaction key and the vault's values, so a body becomes the same records either way.
They start on the first batch large enough to need them (:data:`MIN_BODY`); until they are
ready, and if they stop, batches are prepared in the request's own thread, as before.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from collections.abc import Iterable
from typing import Any

from ..log import BioRecord
from ..logs import log
from .events import EventError
from .prepare import Prepared, Preparer
from .redact import Redactor

#: Bodies smaller than this are prepared in the request's thread: a round trip to a process
#: costs ~100 µs, more than a few events take to prepare.
MIN_BODY = 16 * 1024
#: Seconds a process may take to prepare one batch: a 256 MiB object put into the
#: biographies bucket, of text dense with credential keywords, redacts at a few MB/s.
TIMEOUT = 600.0
#: Processes that stopped before the gateway gives up on them and prepares everything itself.
MAX_RESTARTS = 3


class IngestWorkerGone(RuntimeError):
    """An ingest process stopped or did not answer; its batch is prepared in-process."""


class _Worker:
    """One ingest process and the gateway's end of its pipe (used by one thread at a time)."""

    def __init__(self, key: bytes) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork a threaded gateway
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, key), name="orgmem-ingest", daemon=True)
        self._process.start()
        child.close()
        self.values_version = -1

    def call(self, request: tuple) -> tuple:
        try:
            self._conn.send(request)
            if not self._conn.poll(TIMEOUT):
                raise IngestWorkerGone(f"an ingest process did not answer within {TIMEOUT:.0f} s")
            return self._conn.recv()
        except (EOFError, OSError) as exc:
            raise IngestWorkerGone(f"an ingest process stopped ({exc.__class__.__name__})") from None

    def wait_ready(self) -> None:
        """Block until the process has imported everything and answers."""
        if self.call(("ping",)) != ("pong",):
            raise IngestWorkerGone("an ingest process answered a ping with something else")

    def stop(self) -> None:
        try:
            self._conn.close()
        except OSError:
            pass
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)


class IngestWorkers:
    """A pool of ``count`` ingest processes, started when a large batch first needs them.

    :meth:`prepare` hands a batch to an idle process and answers what
    :meth:`Preparer.prepare` would, or ``None`` when no process is ready (the caller prepares
    it itself). :meth:`replace_values` reaches every process before its next batch.
    """

    def __init__(self, key: bytes, count: int) -> None:
        self._key = key
        self._count = count
        self._idle: list[_Worker] = []
        self._cond = threading.Condition()
        self._ready = 0
        self._started = False
        self._closed = False
        self._restarts = 0
        self._values: list[str] = []
        self._values_version = 0

    @property
    def ready(self) -> int:
        """Processes started and not lost (idle or preparing a batch)."""
        return self._ready

    def replace_values(self, values: Iterable[str]) -> None:
        """The vault's values, redacted by every process from its next batch on."""
        with self._cond:
            self._values = list(values)
            self._values_version += 1

    def prepare(self, body: bytes, caller: str, now_us: int, **limits: Any) -> Prepared | None:
        """The batch's records, prepared by an ingest process (``limits`` as for
        :meth:`Preparer.prepare`); raises :class:`EventError` for an invalid batch, as
        in-process preparation does; ``None``: no process is ready, or the one that had the
        batch stopped."""
        with self._cond:
            while not self._idle and self._ready and not self._closed:
                self._cond.wait()
            if not self._idle or self._closed:
                worker = None
            else:
                worker = self._idle.pop()
                version = self._values_version
                values = self._values if worker.values_version != version else None
        if worker is None:
            self._start()
            return None
        try:
            answer = worker.call(("prepare", body, caller, now_us, limits, values))
        except IngestWorkerGone as exc:
            self._lost(worker, exc)
            return None
        worker.values_version = version
        self._give_back(worker)
        return _prepared(answer)

    def close(self) -> None:
        """Stop the idle processes now; one preparing a batch stops when it is given back."""
        with self._cond:
            self._closed = True
            workers, self._idle = self._idle, []
            self._ready -= len(workers)
            self._cond.notify_all()
        for worker in workers:
            worker.stop()

    # -- starting and losing processes ----------------------------------------------------

    def _start(self) -> None:
        with self._cond:
            if self._started or self._closed:
                return
            self._started = True
        self._spawn_in_background(self._count)

    def _spawn_in_background(self, count: int) -> None:
        threading.Thread(target=self._spawn, args=(count,), name="orgmem-ingest-start", daemon=True).start()

    def _spawn(self, count: int) -> None:
        for _ in range(count):
            try:
                worker = _Worker(self._key)
                worker.wait_ready()
            except Exception as exc:  # noqa: BLE001 - requests go on in-process
                log.warning("ingest_process_failed", error=exc.__class__.__name__)
                return
            with self._cond:
                self._ready += 1
            self._give_back(worker)

    def _give_back(self, worker: _Worker) -> None:
        with self._cond:
            if not self._closed:
                self._idle.append(worker)
                self._cond.notify()
                return
            self._ready -= 1
        worker.stop()

    def _lost(self, worker: _Worker, exc: Exception) -> None:
        worker.stop()
        with self._cond:
            self._ready -= 1
            self._restarts += 1
            again = self._restarts <= MAX_RESTARTS and not self._closed
            self._cond.notify_all()  # a waiter may now find no process left, and go on in-process
        log.warning("ingest_process_lost", detail=str(exc)[:200], restarting=again)
        if again:
            self._spawn_in_background(1)


def _prepared(answer: tuple) -> Prepared:
    status = answer[0]
    if status == "invalid":
        raise EventError(*answer[1:])
    if status != "ok":
        raise IngestWorkerGone(f"an ingest process failed: {answer[1]}")
    _, lines, ids, first, others = answer
    return Prepared([BioRecord.of_line(line) for line in lines], ids, tuple(first), others)


# -- the process ------------------------------------------------------------------------------


def _serve(conn: Any, key: bytes) -> None:
    """Prepare the gateway's batches, one at a time, until it closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the gateway decides when we stop
    preparer = Preparer(Redactor(key))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(_answer(preparer, request))
        except (EOFError, OSError):
            return


def _answer(preparer: Preparer, request: tuple) -> tuple:
    if request[0] == "ping":
        return ("pong",)
    _, body, caller, now_us, limits, values = request
    if values is not None:
        preparer.redactor.replace_values(values)
    try:
        p = preparer.prepare(body, caller, now_us, **limits)
    except EventError as exc:
        return ("invalid", exc.line, exc.field, exc.message)
    except Exception as exc:  # noqa: BLE001 - its type only: a message may quote event text
        return ("error", exc.__class__.__name__)
    return ("ok", [r.encoded() for r in p.records], p.ids, p.first, p.others)

