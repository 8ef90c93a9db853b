"""Segment files in the store, and the streams that fill them.

Segments are immutable, so their decrypted bytes are cached (bounded) and a query or
a DuckDB range read pays the store and the AEAD once per segment, not per request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from ..store.base import INTERNAL_BUCKET, NoSuchKey, ObjectStore
from ..store.objects import read_object, write_object

CACHE_BYTES = 256 * 1024 * 1024
PARQUET_TYPE = "application/vnd.apache.parquet"


class Stream(Protocol):
    """One kind of log record compacted into its own Parquet partitions."""

    name: str  # the key prefix and the manifest's stream name: "bio", "audit"
    record_type: type  # the log record class it consumes
    id_column: str  # duplicates (retries) are dropped by this column
    ts_column: str  # a timestamp column: segments record its range

    def payload(self, record: Any) -> dict[str, Any]: ...
    def partition_of(self, payload: dict[str, Any]) -> str: ...
    def id_of(self, payload: dict[str, Any]) -> str: ...
    def to_table(self, payloads: list[dict[str, Any]]) -> pa.Table: ...
    def partitions(self, records: list[Any]) -> dict[str, pa.Table] | None:
        """A run's records as a table per partition (segment order, ids unique), made in one
        go; None to have the compactor go record by record (:meth:`partition_of`)."""
    def sort(self, table: pa.Table) -> pa.Table: ...
    def encode(self, table: pa.Table, settled: bool = False) -> bytes:
        """Parquet bytes; ``settled`` segments (large enough not to be merged again) are
        expected to live long and get the stronger, slower compression."""


class SegmentFiles:
    def __init__(self, store: ObjectStore, cache_bytes: int = CACHE_BYTES) -> None:
        self.store = store
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cached = 0
        self._limit = cache_bytes
        self._lock = threading.Lock()

    def write(self, key: str, data: bytes) -> None:
        write_object(self.store, INTERNAL_BUCKET, key, data, PARQUET_TYPE)
        self._remember(key, data)

    def read(self, key: str) -> bytes:
        """A segment's bytes; raises NoSuchKey when it was collected."""
        with self._lock:
            data = self._cache.get(key)
            if data is not None:
                self._cache.move_to_end(key)
                return data
        found = read_object(self.store, INTERNAL_BUCKET, key)
        if found is None:
            raise NoSuchKey(f"segment {key} is gone")
        self._remember(key, found[0])
        return found[0]

    def table(self, key: str, columns: list[str] | None = None, use_threads: bool = True) -> pa.Table:
        """A segment's table; ``use_threads=False`` decodes it in the calling thread (the
        compactor's, which runs below requests in priority and must not lend that to Arrow's
        thread pool, whose threads keep the priority of the thread that started them)."""
        return pq.read_table(pa.BufferReader(self.read(key)), columns=columns, use_threads=use_threads)

    def delete(self, key: str) -> None:
        try:
            self.store.delete_object(INTERNAL_BUCKET, key)
        except NoSuchKey:
            pass
        with self._lock:
            data = self._cache.pop(key, None)
            if data is not None:
                self._cached -= len(data)

    def _remember(self, key: str, data: bytes) -> None:
        if len(data) > self._limit // 4:
            return
        with self._lock:
            if key in self._cache:
                return
            self._cache[key] = data
            self._cached += len(data)
            while self._cached > self._limit:
                _, old = self._cache.popitem(last=False)
                self._cached -= len(old)
