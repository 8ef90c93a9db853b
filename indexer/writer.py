"""Writing the index: upserts and deletes by source reference, committed in batches.

Tantivy allows one writer per index directory (a lock file enforces it); an
:class:`IndexWriter` owns it until :meth:`IndexWriter.close`. Nothing written is
visible before :meth:`IndexWriter.commit`, which also reloads the index so a
searcher created afterwards sees the commit.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

import tantivy

from .documents import Entry
from .schema import open_index

T = TypeVar("T")

DEFAULT_HEAP = 128 * 1024 * 1024
#: CPU priority (nice) of Tantivy's indexing and merge threads: below the threads that answer
#: requests, so indexing takes the CPU that is left rather than delaying searches and writes.
BACKGROUND_NICE = 10


def _niced(fn: Callable[[], T]) -> T:
    """``fn()`` in a short-lived thread at :data:`BACKGROUND_NICE`.

    Tantivy starts its indexing threads when a writer is made and again at every commit
    and rollback, and its merge threads with the writer; on Linux a new thread inherits
    the nice value of the thread that starts it, so those threads run niced while the
    caller keeps its own priority. (Raising nice never needs privileges; lowering it
    back would, hence the helper thread.)
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)  # 0: this thread, on Linux
        except (AttributeError, OSError):
            pass  # no per-thread priorities here: the threads run at the caller's
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name="orgmem-index-niced")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class IndexWriter:
    """The one writer of the index in ``path`` (created when absent)."""

    def __init__(self, path: str | os.PathLike, heap_size: int = DEFAULT_HEAP, num_threads: int = 0) -> None:
        self.path = os.fspath(path)
        self.index = open_index(self.path, create=True)
        self._writer = _niced(lambda: self.index.writer(heap_size=heap_size, num_threads=num_threads))
        self._lock = threading.Lock()
        self._pending = 0

    def upsert(self, entries: Entry | Iterable[Entry]) -> int:
        """Replace (or add) each entry by its source reference; visible after :meth:`commit`.

        The delete and the add share one commit, and Tantivy applies a delete only to
        documents added before it, so the entry ends up exactly once however often
        it is upserted.
        """
        if isinstance(entries, Entry):
            entries = [entries]
        n = 0
        with self._lock:
            for entry in entries:
                self._writer.delete_documents_by_term("uid", entry.source)
                self._writer.add_document(entry.to_document())
                n += 1
            self._pending += n
        return n

    def add(self, entries: Iterable[Entry]) -> int:
        """Add entries the caller knows are not in the index (nor pending) under their source
        reference: :meth:`upsert` without the delete, whose term lookup in every segment costs
        about a quarter of the indexing CPU. Adding one twice leaves two documents."""
        n = 0
        with self._lock:
            for entry in entries:
                self._writer.add_document(entry.to_document())
                n += 1
            self._pending += n
        return n

    def delete(self, sources: str | Iterable[str]) -> int:
        """Remove the entries with these source references; visible after :meth:`commit`."""
        if isinstance(sources, str):
            sources = [sources]
        n = 0
        with self._lock:
            for source in sources:
                self._writer.delete_documents_by_term("uid", source)
                n += 1
            self._pending += n
        return n

    def delete_events(self, agent: str, start: datetime, end: datetime) -> None:
        """Remove ``agent``'s events timed in [start, end): a day retention removed."""
        schema = self.index.schema
        query = tantivy.Query.boolean_query([
            (tantivy.Occur.Must, tantivy.Query.term_query(schema, "type", "event", index_option="basic")),
            (tantivy.Occur.Must, tantivy.Query.term_query(schema, "agent", agent, index_option="basic")),
            (tantivy.Occur.Must, tantivy.Query.range_query(schema, "time", tantivy.FieldType.Date, start, end,
                                                           include_lower=True, include_upper=False))])
        with self._lock:
            self._writer.delete_documents_by_query(query)
            self._pending += 1

    def delete_all(self) -> None:
        """Drop every entry (a rebuild starts with this); visible after :meth:`commit`."""
        with self._lock:
            self._writer.delete_all_documents()
            self._pending += 1

    @property
    def pending(self) -> int:
        """Upserts and deletes not yet committed."""
        return self._pending

    def commit(self) -> int:
        """Make every change so far durable and searchable; returns Tantivy's opstamp."""
        with self._lock:
            opstamp = _niced(self._writer.commit)
            self._pending = 0
        self.index.reload()
        return opstamp

    def rollback(self) -> None:
        """Forget the changes since the last commit."""
        with self._lock:
            _niced(self._writer.rollback)
            self._pending = 0

    def close(self) -> None:
        """Let background merges finish and release the directory's writer lock."""
        with self._lock:
            if self._writer is not None:
                self._writer.wait_merging_threads()
                self._writer = None

    def __enter__(self) -> IndexWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
