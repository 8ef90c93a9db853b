"""The ``memory`` bucket as a store view over the current documents.

Keys are ``org/<id>.json``, ``teams/<t>/<id>.json`` and ``agents/<a>/<id>.json``; each maps
to the stored ``current`` object, so ETags agree with the REST API's and If-Match on a PUT
compares against the same value. Only the documents the caller may read are listed or served.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

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
from .documents import DocumentError, Scope, check_id
from .service import CURRENT, Memory, current_key

BUCKET = "memory"


def parse_key(key: str) -> tuple[Scope, str]:
    """``teams/finance/vendor-payments.json`` -> (team:finance, vendor-payments)."""
    if not key.endswith(".json"):
        raise DocumentError(f"Objects in the {BUCKET} bucket are JSON documents at org/<id>.json, "
                            f"teams/<team>/<id>.json or agents/<agent>/<id>.json, not {key!r}.",
                            "InvalidArgument")
    path, _, name = key[:-len(".json")].rpartition("/")
    try:
        return Scope.from_path(path), check_id(name)
    except DocumentError as exc:
        raise DocumentError(f"{exc} (the key is {key!r}; documents live at org/<id>.json, "
                            "teams/<team>/<id>.json or agents/<agent>/<id>.json)",
                            "InvalidArgument") from None


def object_key(scope: Scope, doc_id: str) -> str:
    return f"{scope.path}/{doc_id}.json"


class MemoryBucket:
    """Just enough of the store protocol for the S3 listing and read handlers."""

    def __init__(self, store: ObjectStore, memory: Memory, may_read: Callable[[Scope, str], bool]) -> None:
        self.store = store
        self.memory = memory
        self.may_read = may_read

    def list_objects(self, bucket: str, prefix: str = "", delimiter: str = "", after: str = "",
                     limit: int = 1000) -> ListPage:
        keys: dict[str, ListEntry] = {}
        page_after = ""
        while True:
            page = self.store.list_objects(INTERNAL_BUCKET, prefix=CURRENT + prefix, after=page_after,
                                           limit=1000)
            for entry in page.entries:
                key = entry.key[len(CURRENT):]
                try:
                    scope, doc_id = parse_key(key)
                except DocumentError:
                    continue
                if self.may_read(scope, doc_id):
                    keys[key] = ListEntry(key, entry.size, entry.etag, entry.last_modified)
            if not page.is_truncated or not page.next_marker:
                break
            page_after = page.next_marker
        return page_of(keys, prefix, delimiter, after, limit)

    def _inner(self, key: str) -> str:
        try:
            scope, doc_id = parse_key(key)
        except DocumentError:
            raise NoSuchKey("The specified key does not exist.") from None
        if not self.may_read(scope, doc_id):
            raise NoSuchKey("The specified key does not exist.")
        return current_key(scope, doc_id)

    def head_object(self, bucket: str, key: str) -> ObjectInfo:
        return self._info(key, self.store.head_object(INTERNAL_BUCKET, self._inner(key)))

    def open_object(self, bucket: str, key: str, start: int = 0, end: int | None = None) -> ObjectReader:
        reader = self.store.open_object(INTERNAL_BUCKET, self._inner(key), start, end)
        reader.info = self._info(key, reader.info)
        return reader

    @staticmethod
    def _info(key: str, stored: ObjectInfo) -> ObjectInfo:
        return replace(stored, bucket=BUCKET, key=key)
