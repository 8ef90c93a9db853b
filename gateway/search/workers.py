"""Searches run in worker processes, so a search never queues behind the gateway's GIL.

Under ingest, the gateway's interpreter is busy with HTTP, validation, the log, the
compactor and the index pipeline. Tantivy releases the GIL in every search call and in
every stored-document fetch, and each time the search thread must win the GIL back from
those threads (a 5 ms switch interval each): about fifteen such waits made a search
that takes 2 ms alone take 100-250 ms while indexing. In a worker process the same
search runs uncontended, and the gateway thread waits on one pipe read instead.

A worker opens the index directory read-only (Tantivy allows readers beside the one
writer) and reloads it when the gateway says it committed since (``generation``). Access
tokens are computed by the gateway and are part of the request; the gateway re-checks
every returned hit as before. A worker that dies is replaced on the next search. The
caller searches in-process only when no worker could be started or the worker reported
an ordinary error; a search that killed its worker or ran out of time is not tried again
in the gateway (:class:`SearchCrashed`), where it could take the whole process down.
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from indexer import Exclusion, IndexSearcher, QueryError

#: Worker processes (at most this many searches run at once; more wait for a free one).
PROCESSES = 2
#: Seconds a search may take in a worker before it is abandoned (the caller then
#: searches in-process).
TIMEOUT = 30.0


class WorkerFailed(Exception):
    """The worker could not answer (it could not start, or raised); search in-process."""


class SearchCrashed(WorkerFailed):
    """The worker died or timed out on this search: do not run it in the gateway."""


class _WorkerGone(WorkerFailed):
    """The worker had died before this search was sent (killed): another one takes it."""


class SearchWorkers:
    """A small pool of search processes, started on first use."""

    def __init__(self, processes: int = PROCESSES) -> None:
        self._slots: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(processes):
            self._slots.put(None)
        self._closed = False

    def search(self, directory: str, generation: int, query: str, filters: Mapping[str, Any],
               tokens: list[str], limit: int, offset: int, exclusions: Sequence[Exclusion] = ()) -> dict:
        """``{hits: [dict], count, warnings, timing}`` from a worker; :class:`QueryError` for input the
        searcher refuses, :class:`WorkerFailed` when the worker could not answer."""
        request = (directory, generation, query, dict(filters), tokens, limit, offset, tuple(exclusions))
        worker = self._slots.get()
        try:
            for attempt in (1, 2):
                if worker is None:
                    if self._closed:
                        raise WorkerFailed("the search workers are stopped")
                    worker = _Worker()
                try:
                    kind, value = worker.call(request)
                    break
                except _WorkerGone:
                    worker.stop()
                    worker = None
                    if attempt == 2:
                        raise
        except WorkerFailed:
            if worker is not None:
                worker.stop()
            worker = None
            raise
        finally:
            self._slots.put(worker)
        if kind == "ok":
            return value
        if kind == "query":
            raise QueryError(value)
        raise WorkerFailed(value)

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                worker = self._slots.get_nowait()
            except queue.Empty:
                return
            if worker is not None:
                worker.stop()


class _Worker:
    """One process and the pipe to it; used by one caller at a time."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork a threaded gateway
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child,), name="orgmem-search", daemon=True)
        self._process.start()
        child.close()
        self._lock = threading.Lock()

    def call(self, request: tuple) -> tuple[str, Any]:
        with self._lock:
            try:
                self._conn.send(request)
            except (EOFError, OSError) as exc:  # nobody reads the pipe: it died before
                raise _WorkerGone(f"the search worker was gone ({exc.__class__.__name__})") from None
            try:
                if not self._conn.poll(TIMEOUT):
                    raise SearchCrashed(f"no answer within {TIMEOUT:.0f} s")
                return self._conn.recv()
            except (EOFError, OSError):
                raise self._why_stopped() from None

    def _why_stopped(self) -> WorkerFailed:
        """Killed from outside (SIGKILL, SIGTERM: the OOM killer, an operator), perhaps just
        as the request went out: another worker may take it. Crashed (a native fault): the
        search itself is the likely cause."""
        self._process.join(1.0)
        code = self._process.exitcode
        if code in (-signal.SIGKILL, -signal.SIGTERM):
            return _WorkerGone(f"the search worker was killed (signal {-code})")
        return SearchCrashed(f"the search worker stopped (exit code {code})")

    def stop(self) -> None:
        try:
            self._conn.close()
        except OSError:
            pass
        if self._process.is_alive():
            self._process.kill()
        self._process.join(5)


# -- the worker process -------------------------------------------------------------------


def _serve(conn: Any) -> None:
    """Answer search requests until the gateway closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the gateway decides when we stop
    opened: dict[str, Any] = {}  # directory, searcher, generation of the one open index
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer = ("ok", _search(opened, *request))
        except QueryError as exc:
            answer = ("query", str(exc))
        except Exception as exc:  # noqa: BLE001 - reported to the gateway, which searches itself
            answer = ("error", f"{exc.__class__.__name__}: {str(exc)[:300]}")
        try:
            conn.send(answer)
        except (EOFError, OSError):
            return


def _search(opened: dict[str, Any], directory: str, generation: int, query: str, filters: dict,
            tokens: list[str], limit: int, offset: int, exclusions: tuple[Exclusion, ...]) -> dict:
    received = time.monotonic()
    t0 = time.perf_counter()
    searcher = _searcher(opened, directory, generation)
    t1 = time.perf_counter()
    result = searcher.search(query, filters, tokens, limit, offset, exclusions)
    t2 = time.perf_counter()
    return {"hits": [hit.to_dict() for hit in result.hits], "count": result.count,
            "warnings": result.warnings,
            "timing": {"reload_ms": round((t1 - t0) * 1000, 3), "search_ms": round((t2 - t1) * 1000, 3),
                       "received": received, "answered": time.monotonic()}}


def _searcher(opened: dict[str, Any], directory: str, generation: int) -> IndexSearcher:
    """The searcher of ``directory``, reloaded when the gateway committed since we last looked.

    The writer may delete segment files a reload is about to open (a merge finished in
    between); opening the index again then reads the newer list of segments.
    """
    if opened.get("directory") != directory:
        opened.clear()
        opened.update(directory=directory, searcher=IndexSearcher(directory), generation=generation)
    elif opened["generation"] < generation:
        try:
            opened["searcher"].reload()
        except Exception:  # noqa: BLE001 - see the docstring
            opened["searcher"] = IndexSearcher(directory)
        opened["generation"] = generation
    return opened["searcher"]
