"""Whole small objects in and out of a store: documents, manifests, checkpoints, log objects.

The store protocol streams, because client objects can be gigabytes; the gateway's own
records are small and always read and written whole, together with the ETag a
compare-and-swap needs.
"""

from __future__ import annotations

from io import BytesIO

from .base import NoSuchKey, ObjectInfo, ObjectMeta, ObjectStore, WriteCondition

READ_SIZE = 1 << 20


def read_object(store: ObjectStore, bucket: str, key: str) -> tuple[bytes, ObjectInfo] | None:
    """The object's bytes and its info (the ETag to compare-and-swap on); None when absent."""
    try:
        reader = store.open_object(bucket, key)
    except NoSuchKey:
        return None
    try:
        chunks = []
        while chunk := reader.read(READ_SIZE):
            chunks.append(chunk)
        return b"".join(chunks), reader.info
    finally:
        reader.close()


def write_object(store: ObjectStore, bucket: str, key: str, data: bytes,
                 content_type: str = "application/octet-stream",
                 condition: WriteCondition | None = None) -> ObjectInfo:
    """Store ``data`` whole; ``condition`` makes it a compare-and-swap."""
    return store.put_object(bucket, key, BytesIO(data), ObjectMeta(content_type=content_type), condition)


def swap_condition(etag: str | None) -> WriteCondition:
    """Replace exactly the version read (``etag``), or create when there was none."""
    return WriteCondition(if_match=etag) if etag else WriteCondition(if_none_match=True)
