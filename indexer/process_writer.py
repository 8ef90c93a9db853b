"""The index writer in a process of its own, so indexing never fights requests for the GIL.

Tantivy's ``add_document`` and ``delete_documents_by_term`` let go of the GIL for every
document. In a gateway under ingest, each time the indexing thread lets go, a request thread
takes the interpreter and the indexer waits up to a switch interval (5 ms) to get it back:
a document that takes 6 µs alone took ~190 µs, so search fell further behind the faster
events came, and every hand-over cost the request threads a context switch too. Here the
gateway's thread builds the entries and sends a batch down a pipe (one wait per batch); a
child process, niced (:data:`~indexer.writer.BACKGROUND_NICE`) so requests win the CPU, turns
them into documents and owns Tantivy's writer, with its own interpreter.

:class:`ProcessIndexWriter` has :class:`~indexer.writer.IndexWriter`'s methods and meaning:
nothing is visible before :meth:`commit`, which also reloads :attr:`index` (this process's
read-only view of the directory) so a searcher made on it sees the commit. A ``ValueError``
or ``TypeError`` the child raises (an entry Tantivy refuses) is raised here as the same
type; a child that died raises :class:`IndexWriterGone`, and the writer is then unusable
(the gateway steps down and takes the index over again from its snapshot and the log).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from .documents import Entry
from .schema import open_index
from .writer import BACKGROUND_NICE, DEFAULT_HEAP, IndexWriter

#: Seconds a call may wait for the child (a commit of a large batch, a merge-heavy close).
TIMEOUT = 600.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
#: Entry's fields in order; ``time`` travels as microseconds since the epoch.
_FIELDS = tuple(f.name for f in fields(Entry))
_TIME = _FIELDS.index("time")


class IndexWriterGone(RuntimeError):
    """The writer's process stopped (killed, or crashed); nothing since the last commit is in
    the index."""


#: Makes a record (a JSON object) the caller sends into its entry, in the child: a module-level
#: function, which the child imports by name.
EntryOf = Callable[[dict], Entry]


class ProcessIndexWriter:
    """The one writer of the index in ``path``, run in a child process (see the module doc).

    ``entry_of``: what :meth:`add_records` and :meth:`upsert_records` make of a record. Making
    an entry costs more than sending the record it comes from (a biography event: 13 against
    2 µs), so the gateway sends its log records and the child makes their entries."""

    def __init__(self, path: str | os.PathLike, heap_size: int = DEFAULT_HEAP, num_threads: int = 0,
                 entry_of: EntryOf | None = None) -> None:
        self.path = os.fspath(path)
        ctx = multiprocessing.get_context("spawn")  # never fork a threaded gateway
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, self.path, heap_size, num_threads, entry_of),
                                    name="orgmem-index-writer", daemon=True)
        self._process.start()
        child.close()
        self._lock = threading.Lock()
        self._pending = 0
        self._closed = False
        try:
            self._call(("open",))  # what opening raised (another writer holds the directory...)
        except BaseException:
            self._stop()
            raise
        self.index = open_index(self.path, create=False)

    # -- IndexWriter's interface ----------------------------------------------------------

    def upsert(self, entries: Entry | Iterable[Entry]) -> int:
        if isinstance(entries, Entry):
            entries = [entries]
        return self._batch("upsert", "entries", _array([_row(entry) for entry in entries]))[0]

    def add(self, entries: Iterable[Entry]) -> int:
        return self._batch("add", "entries", _array([_row(entry) for entry in entries]))[0]

    def upsert_records(self, records: list[dict]) -> tuple[int, int]:
        """Upsert the entries ``entry_of`` makes of ``records``: (upserted, records skipped
        because no entry could be made of them)."""
        return self._batch("upsert", "records", _array(records))

    def add_records(self, records: list[dict]) -> tuple[int, int]:
        """:meth:`add` of the entries ``entry_of`` makes of ``records`` (see :meth:`upsert_records`)."""
        return self._batch("add", "records", _array(records))

    def upsert_lines(self, lines: list[bytes]) -> tuple[int, int]:
        """:meth:`upsert_records` of log lines (``{"v": record, ...}`` as the log writes them),
        sent as they are: the gateway never decodes them (see ``BioRecord.raw``)."""
        return self._batch("upsert", "lines", _joined(lines))

    def add_lines(self, lines: list[bytes]) -> tuple[int, int]:
        """:meth:`add_records` of log lines (see :meth:`upsert_lines`)."""
        return self._batch("add", "lines", _joined(lines))

    def delete(self, sources: str | Iterable[str]) -> int:
        sources = [sources] if isinstance(sources, str) else list(sources)
        with self._lock:
            n = self._call(("delete", sources))
            self._pending += n
        return n

    def delete_events(self, agent: str, start: datetime, end: datetime) -> None:
        with self._lock:
            self._call(("delete_events", agent, _micros(start), _micros(end)))
            self._pending += 1

    def delete_all(self) -> None:
        with self._lock:
            self._call(("delete_all",))
            self._pending += 1

    @property
    def pending(self) -> int:
        return self._pending

    def commit(self) -> int:
        with self._lock:
            opstamp = self._call(("commit",))
            self._pending = 0
        self.index.reload()
        return opstamp

    def rollback(self) -> None:
        with self._lock:
            self._call(("rollback",))
            self._pending = 0

    def close(self) -> None:
        """Let background merges finish, release the writer lock and end the child."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._call(("close",))
            finally:
                self._stop()

    def __enter__(self) -> ProcessIndexWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pipe -------------------------------------------------------------------------

    def _batch(self, op: str, form: str, items: bytes | None) -> tuple[int, int]:
        """Have the child ``op`` (upsert, add) the entries of ``items``, a JSON array of entry
        rows, records or log lines (``form``): (applied, records skipped)."""
        if items is None:
            return 0, 0
        with self._lock:
            n, skipped = self._call((op, form, items))
            self._pending += n
        return n, skipped

    def _call(self, request: tuple) -> Any:
        """Send one request and wait for its answer (the caller holds ``_lock``, or owns the
        writer alone, as in ``__init__``)."""
        if self._closed and request[0] != "close":
            raise IndexWriterGone("the index writer is closed")
        try:
            self._conn.send(request)
            if not self._conn.poll(TIMEOUT):
                self._stop()
                raise IndexWriterGone(f"the index writer did not answer within {TIMEOUT:.0f} s")
            status, value = self._conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            self._stop()
            raise IndexWriterGone(self._why_stopped()) from None
        if status == "ok":
            return value
        kind, message = value
        raise {"ValueError": ValueError, "TypeError": TypeError}.get(kind, RuntimeError)(message)

    def _why_stopped(self) -> str:
        self._process.join(1.0)
        code = self._process.exitcode
        if code is not None and code < 0:
            return f"the index writer process was stopped by signal {-code}"
        return f"the index writer process stopped (exit code {code})"

    def _stop(self) -> None:
        self._closed = True
        try:
            self._conn.close()
        except OSError:
            pass
        self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)


def _array(items: list) -> bytes | None:
    return orjson.dumps(items) if items else None


def _joined(lines: list[bytes]) -> bytes | None:
    return b"[" + b",".join(lines) + b"]" if lines else None


def _micros(value: datetime) -> int:
    return (value - _EPOCH) // _US


def _row(entry: Entry) -> list:
    row = [getattr(entry, name) for name in _FIELDS]
    row[_TIME] = _micros(entry.time)
    return row


def _entry(row: list) -> Entry:
    row[_TIME] = _EPOCH + row[_TIME] * _US
    return Entry(*row)


def _entries_of(form: str, items: list, entry_of: EntryOf | None) -> tuple[list[Entry], int]:
    """The entries ``items`` stand for (rows of entries, or records ``entry_of`` makes entries
    of), and how many records were skipped because no entry could be made of them."""
    if form == "entries":
        return [_entry(row) for row in items], 0
    if form == "lines":  # a line without its record is skipped below, as an odd record is
        items = [line.get("v") if isinstance(line, dict) else None for line in items]
    if entry_of is None:
        raise ValueError("this writer was started without entry_of: it takes entries only")
    entries, skipped = [], 0
    for record in items:
        try:
            entries.append(entry_of(record))
        except Exception:  # noqa: BLE001 - one odd record must not stop the index
            skipped += 1
    return entries, skipped


# -- the child process ----------------------------------------------------------------------


def _serve(conn: Any, path: str, heap_size: int, num_threads: int, entry_of: EntryOf | None) -> None:
    """Apply the gateway's requests to the one writer, in order, until it closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the gateway decides when we stop
    try:
        os.nice(BACKGROUND_NICE)  # all of indexing, Tantivy's threads with it, below requests
    except OSError:
        pass
    writer: IndexWriter | None = None
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            break
        try:
            if request[0] == "open":
                writer = IndexWriter(path, heap_size=heap_size, num_threads=num_threads)
                answer: tuple = ("ok", None)
            else:
                assert writer is not None
                answer = ("ok", _apply(writer, request, entry_of))
        except Exception as exc:  # noqa: BLE001 - reported to the gateway, which decides
            answer = ("error", (exc.__class__.__name__, f"{exc.__class__.__name__}: {str(exc)[:500]}"))
        try:
            conn.send(answer)
        except (EOFError, OSError):
            break
        if request[0] == "close":
            return
    if writer is not None:  # the gateway went away without closing: leave the directory tidy
        writer.close()


def _apply(writer: IndexWriter, request: tuple, entry_of: EntryOf | None) -> Any:
    op = request[0]
    if op in ("upsert", "add"):
        entries, skipped = _entries_of(request[1], orjson.loads(request[2]), entry_of)
        return (writer.upsert(entries) if op == "upsert" else writer.add(entries)), skipped
    if op == "delete":
        return writer.delete(request[1])
    if op == "delete_events":
        writer.delete_events(request[1], _EPOCH + request[2] * _US, _EPOCH + request[3] * _US)
        return None
    if op == "delete_all":
        writer.delete_all()
        return None
    if op == "commit":
        return writer.commit()
    if op == "rollback":
        writer.rollback()
        return None
    if op == "close":
        writer.close()
        return None
    raise ValueError(f"unknown request {op!r}")
