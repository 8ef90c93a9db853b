"""The indexer's :class:`~indexer.BlobStore` over the gateway's (sealed) ObjectStore."""

from __future__ import annotations

from indexer import PreconditionFailed

from ..store.base import (
    INTERNAL_BUCKET,
    NoSuchKey,
    ObjectMeta,
    ObjectReader,
    ObjectStore,
    Readable,
    WriteCondition,
)
from ..store.base import PreconditionFailed as StorePreconditionFailed
from ..store.objects import read_object, swap_condition, write_object


class StoreBlobs:
    """Objects under one bucket of the gateway's store (the internal bucket by default):
    manifests whole, segment files streamed both ways.

    The store passed in is the sealed one, so snapshot files are ciphertext in the backend.
    """

    def __init__(self, store: ObjectStore, bucket: str = INTERNAL_BUCKET) -> None:
        self.store, self.bucket = store, bucket

    def get(self, key: str) -> bytes | None:
        try:
            found = read_object(self.store, self.bucket, key)
        except NoSuchKey:
            return None
        return found[0] if found else None

    def put(self, key: str, data: bytes, if_match: str | None = None, if_none_match: bool = False) -> str:
        condition = swap_condition(if_match) if (if_match or if_none_match) else None
        try:
            return write_object(self.store, self.bucket, key, data, condition=condition).etag
        except StorePreconditionFailed as exc:
            raise PreconditionFailed(key) from exc

    def open(self, key: str) -> ObjectReader | None:
        try:
            return self.store.open_object(self.bucket, key)
        except NoSuchKey:
            return None

    def put_stream(self, key: str, body: Readable, if_none_match: bool = False) -> str:
        condition = WriteCondition(if_none_match=True) if if_none_match else None
        try:
            return self.store.put_object(self.bucket, key, body, ObjectMeta(), condition).etag
        except StorePreconditionFailed as exc:
            raise PreconditionFailed(key) from exc

    def list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        after = ""
        while True:
            page = self.store.list_objects(self.bucket, prefix=prefix, after=after, limit=1000)
            keys += [e.key for e in page.entries]
            if not page.is_truncated or not page.next_marker:
                return keys
            after = page.next_marker

    def delete(self, key: str) -> None:
        try:
            self.store.delete_object(self.bucket, key)
        except NoSuchKey:
            pass
