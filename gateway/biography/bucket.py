"""The ``biographies`` bucket as a read-only store view over the current Parquet segments.

Listing comes from one manifest snapshot, so a client (DuckDB's glob, an ``aws s3 ls``)
sees a whole set of segments, never a half-merged one. Keys are the Hive paths
``agent=<id>/date=<yyyy-mm-dd>/<segment>.parquet``; only the agents the caller may read
are shown. Segments are immutable, so their ETag is derived from their name and
agrees across LIST, HEAD and GET.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace

from ..segments.compactor import Snapshot
from ..segments.manifest import Segment
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
    return hashlib.md5(segment.key.encode(), usedforsecurity=False).hexdigest()


class BiographyBucket:
    """Just enough of the store protocol for the S3 listing and read handlers."""

    def __init__(self, store: ObjectStore, snapshot: Snapshot, may_read: Callable[[str], bool]) -> None:
        self.store = store
        self._segments = {s.path: s for s in snapshot.manifest.of("bio") if may_read(s.value("agent") or "")}

    def list_objects(self, bucket: str, prefix: str = "", delimiter: str = "", after: str = "",
                     limit: int = 1000) -> ListPage:
        entries = {path: ListEntry(path, s.bytes, segment_etag(s), s.created)
                   for path, s in self._segments.items()}
        return page_of(entries, prefix, delimiter, after, limit)

    def head_object(self, bucket: str, key: str) -> ObjectInfo:
        segment = self._find(key)
        return self._info(segment, self.store.head_object(INTERNAL_BUCKET, segment.key))

    def open_object(self, bucket: str, key: str, start: int = 0, end: int | None = None) -> ObjectReader:
        segment = self._find(key)
        reader = self.store.open_object(INTERNAL_BUCKET, segment.key, start, end)
        reader.info = self._info(segment, reader.info)
        return reader

    def _find(self, key: str) -> Segment:
        segment = self._segments.get(key)
        if segment is None:
            raise NoSuchKey("The specified key does not exist: biographies hold the current Parquet "
                            "segments, agent=<id>/date=<yyyy-mm-dd>/<segment>.parquet")
        return segment

    @staticmethod
    def _info(segment: Segment, stored: ObjectInfo) -> ObjectInfo:
        return replace(stored, bucket=BUCKET, key=segment.path, etag=segment_etag(segment),
                       last_modified=segment.created)
