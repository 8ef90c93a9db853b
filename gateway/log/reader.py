"""Reading the log: which objects lie past a consumer's positions, and what they hold.

Log objects never change once written, so decoded objects are cached (bounded by
record count); this gateway's own commits enter the cache as they are made, so the
read-your-writes path of a query rarely touches the store.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..store.base import NoSuchKey, ObjectStore
from ..store.objects import read_object
from . import layout
from .layout import Positions
from .records import Record, decode, encoded_size

#: Decoded records kept in memory across all cached objects, and their size as stored
#: (uncompressed NDJSON; as dicts in memory about 1.8 times that: 1,973 bytes for a 1,103-byte
#: event). Enough for the tail the compactor and the index pipeline (a snapshot every 5 s) have
#: not passed yet at 20,000 events/s of ~1 KB: the compactor starts a run every 5 s and a run
#: of 5 s of such ingest takes 2.5-3 s, so it reads objects up to ~8 s old; neither then reads
#: back what this gateway just wrote. The log collector drops an object from the cache once
#: both have passed it, so the cache is this full only under heavy ingest (at most ~350 MB).
#: At 128 MiB (~120,000 such events), a 14,500 events/s ingest had the compactor fetch,
#: unseal, decompress and parse again one object in six, 8% of the interpreter's time; at
#: 48 MiB, 90% of the objects of a 9,000 events/s ingest.
CACHE_RECORDS = 200_000
CACHE_BYTES = 192 * 1024 * 1024
_PAGE = 1000
#: Log objects fetched at once when catching up (an upstream S3 answers each in milliseconds).
FETCH_PARALLEL = 16
#: Objects fetched ahead of the consumer at a time.
FETCH_WINDOW = 2 * FETCH_PARALLEL


@dataclass(frozen=True, slots=True)
class LogObject:
    writer: str
    seq: int
    records: list[Record]


class LogReader:
    def __init__(self, store: ObjectStore, cache_records: int = CACHE_RECORDS,
                 cache_bytes: int = CACHE_BYTES) -> None:
        self.store = store
        self._cache: OrderedDict[tuple[str, int], tuple[list[Record], int]] = OrderedDict()
        self._cached = 0
        self._cached_bytes = 0
        self._limit = cache_records
        self._limit_bytes = cache_bytes
        self._lock = threading.Lock()

    def writers(self) -> list[str]:
        """Every writer that has log objects, oldest first."""
        out, after = [], ""
        while True:
            page = self.store.list_objects(layout.BUCKET, layout.LOG_PREFIX, "/", after, _PAGE)
            out.extend(p[len(layout.LOG_PREFIX):-1] for p in page.common_prefixes)
            if not page.is_truncated or not page.next_marker:
                return out
            after = page.next_marker

    def pending(self, positions: Positions, limit: int | None = None) -> list[tuple[str, int]]:
        """(writer, seq) of every log object past ``positions`` (the first ``limit`` of them),
        each writer in commit order."""
        found: list[tuple[str, int]] = []
        for writer in self.writers():
            for seq in self.sequences(writer, positions.get(writer, 0)):
                if limit is not None and len(found) >= limit:
                    return found
                found.append((writer, seq))
        return found

    def sequences(self, writer: str, after: int = 0) -> Iterator[int]:
        prefix = layout.writer_prefix(writer)
        marker = layout.log_key(writer, after) if after else ""
        while True:
            page = self.store.list_objects(layout.BUCKET, prefix, "", marker, _PAGE)
            for entry in page.entries:
                parsed = layout.parse_log_key(entry.key)
                if parsed is not None:
                    yield parsed[1]
            if not page.is_truncated or not page.next_marker:
                return
            marker = page.next_marker

    def read(self, writer: str, seq: int) -> list[Record] | None:
        """The records of one object; None if it is gone (collected since it was listed)."""
        with self._lock:
            cached = self._cache.get((writer, seq))
            if cached is not None:
                self._cache.move_to_end((writer, seq))
                return cached[0]
        try:
            found = read_object(self.store, layout.BUCKET, layout.log_key(writer, seq))
        except NoSuchKey:
            found = None
        if found is None:
            return None
        records = decode(found[0], writer, seq)
        self.remember(writer, seq, records, encoded_size(found[0]))
        return records

    def read_pending(self, positions: Positions, limit: int | None = None) -> Iterator[LogObject]:
        """Every object past ``positions`` (at most ``limit``) with its records, each writer
        in commit order. Objects not in the cache are fetched in parallel, a window at a time,
        so a consumer that stops early has fetched little it did not use."""
        return self.read_listed(self.pending(positions, limit))

    def read_listed(self, pending: list[tuple[str, int]]) -> Iterator[LogObject]:
        """:meth:`read_pending` of a list :meth:`pending` gave (gone objects are skipped)."""
        for start in range(0, len(pending), FETCH_WINDOW):
            window = pending[start:start + FETCH_WINDOW]
            self._prefetch(window)
            for writer, seq in window:
                records = self.read(writer, seq)
                if records is not None:
                    yield LogObject(writer, seq, records)

    def _prefetch(self, window: list[tuple[str, int]]) -> None:
        with self._lock:
            missing = [p for p in window if p not in self._cache]
        if len(missing) > 1:
            with ThreadPoolExecutor(min(FETCH_PARALLEL, len(missing)), "orgmem-logread") as pool:
                list(pool.map(lambda p: self.read(*p), missing))

    def remember(self, writer: str, seq: int, records: list[Record], size: int = 0) -> None:
        """Cache an object's records (a writer calls this for its own commits); ``size`` is
        its uncompressed size, so large events bound the cache by bytes, not by count."""
        with self._lock:
            if (writer, seq) in self._cache:
                return
            self._cache[(writer, seq)] = (records, size)
            self._cached += len(records)
            self._cached_bytes += size
            while (self._cached > self._limit or self._cached_bytes > self._limit_bytes) \
                    and len(self._cache) > 1:
                _, (old, old_size) = self._cache.popitem(last=False)
                self._cached -= len(old)
                self._cached_bytes -= old_size

    def forget(self, writer: str, seq: int) -> None:
        with self._lock:
            old = self._cache.pop((writer, seq), None)
            if old is not None:
                self._cached -= len(old[0])
                self._cached_bytes -= old[1]
