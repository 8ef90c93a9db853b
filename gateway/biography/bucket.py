"""The ``biographies`` bucket as a read-only store view over the current Parquet segments.

Listing comes from one manifest snapshot, so a client (DuckDB's glob, an ``aws s3 ls``)
sees a whole set of segments, never a half-merged one. A segment a merge replaced is still
served (not listed) until its grace period ends, so a query that listed it before the merge
reads what it listed. Keys are the Hive paths
``agent=<id>/date=<yyyy-mm-dd>/<segment>.parquet``; only the agents the caller may read
are shown. Segments are immutable, so their ETag is derived from their name and
agrees across LIST, HEAD and GET.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import replace

from ..segments.compactor import Snapshot
from ..segments.manifest import KEY_PREFIX, Segment
from ..store.base import (
    INTERNAL_BUCKET,
    ListEntry,
    ListPage,
    NoSuchKey,
    ObjectInfo,
    ObjectReader,
    ObjectStore,
    page_of,
)

BUCKET = "biographies"


def segment_etag(segment: Segment) -> str:
    return key_etag(segment.key)


def key_etag(stored_key: str) -> str:
    """A segment's ETag, from its name: segments are immutable."""
    return hashlib.md5(stored_key.encode(), usedforsecurity=False).hexdigest()


class BiographyBucket:
    """Just enough of the store protocol for the S3 listing and read handlers."""

    def __init__(self, store: ObjectStore, snapshot: Snapshot, may_read: Callable[[str], bool]) -> None:
        self.store = store
        self._segments = {s.path: s for s in snapshot.manifest.of("bio") if may_read(s.value("agent") or "")}
        prefix, now = f"{KEY_PREFIX}bio/", time.time()
        #: replaced segments in their grace period, by path: readable, never listed
        self._retired = {r.key[len(prefix):]: r.key for r in snapshot.manifest.retired
                         if r.key.startswith(prefix) and r.delete_after > now
                         and may_read(_agent_of(r.key[len(prefix):]))}

    def list_objects(self, bucket: str, prefix: str = "", delimiter: str = "", after: str = "",
                     limit: int = 1000) -> ListPage:
        entries = {path: ListEntry(path, s.bytes, segment_etag(s), s.created)
                   for path, s in self._segments.items()}
        return page_of(entries, prefix, delimiter, after, limit)

    def head_object(self, bucket: str, key: str) -> ObjectInfo:
        stored_key, created = self._find(key)
        return self._info(key, stored_key, created, self.store.head_object(INTERNAL_BUCKET, stored_key))

    def open_object(self, bucket: str, key: str, start: int = 0, end: int | None = None) -> ObjectReader:
        stored_key, created = self._find(key)
        reader = self.store.open_object(INTERNAL_BUCKET, stored_key, start, end)
        reader.info = self._info(key, stored_key, created, reader.info)
        return reader

    def _find(self, key: str) -> tuple[str, float | None]:
        """Where ``key`` is stored, and its listed Last-Modified (None for a replaced one)."""
        segment = self._segments.get(key)
        if segment is not None:
            return segment.key, segment.created
        if key in self._retired:
            return self._retired[key], None
        raise NoSuchKey("The specified key does not exist: biographies hold the current Parquet "
                        "segments, agent=<id>/date=<yyyy-mm-dd>/<segment>.parquet")

    @staticmethod
    def _info(path: str, stored_key: str, created: float | None, stored: ObjectInfo) -> ObjectInfo:
        return replace(stored, bucket=BUCKET, key=path, etag=key_etag(stored_key),
                       last_modified=stored.last_modified if created is None else created)


def _agent_of(path: str) -> str:
    """``a`` of ``agent=a/date=d/x.parquet``."""
    first = path.split("/", 1)[0]
    return first.partition("=")[2] if first.startswith("agent=") else ""
