"""Return values that are plain Python values plus the version tag a later write needs.

A :class:`Memory` is the document ``dict`` itself and a :class:`FileData` is the object's
``bytes``, so they print, compare and serialise like what they are; the ``etag`` rides along
for the compare-and-swap write that usually follows a read (``if_match=doc.etag``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Memory(dict):
    """An open-memory document with the ETag it was read or written at."""

    def __init__(self, doc: Mapping[str, Any] | None = None, etag: str | None = None) -> None:
        super().__init__(doc or {})
        self.etag = etag

    def __repr__(self) -> str:
        return f"Memory({dict.__repr__(self)}, etag={self.etag!r})"

    def __reduce__(self):
        return (Memory, (dict(self), self.etag))


class FileData(bytes):
    """An object's bytes with its ETag and content type."""

    etag: str | None
    content_type: str | None

    def __new__(cls, data: bytes, etag: str | None = None, content_type: str | None = None) -> FileData:
        obj = super().__new__(cls, data)
        obj.etag = etag
        obj.content_type = content_type
        return obj

    def __repr__(self) -> str:
        shown = bytes.__repr__(self[:60]) + ("..." if len(self) > 60 else "")
        return f"FileData({shown}, size={len(self)}, etag={self.etag!r})"

    def __reduce__(self):
        return (FileData, (bytes(self), self.etag, self.content_type))
