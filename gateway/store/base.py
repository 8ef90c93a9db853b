"""The ObjectStore protocol: one storage contract every backend and decorator keeps.

Storage knows nothing of HTTP. The S3 layer, the REST API and the memory
services all speak to a store through this protocol, so a decorator (sealing,
caching, metrics) wraps any backend without either side noticing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

#: Buckets whose names start with this character hold gateway-internal data.
#: S3 bucket names can never start with ".", so no client can reach them.
INTERNAL_PREFIX = "."
#: The gateway's own bucket: identities, the seal record, checkpoints.
INTERNAL_BUCKET = ".orgmem"


class Readable(Protocol):
    """Anything with ``read(n)`` returning ``b""`` at end of stream."""

    def read(self, n: int = -1) -> bytes: ...


class StoreError(Exception):
    """Base of every error a store raises; ``code`` is an S3-style error code."""

    code = "InternalError"

    def __init__(self, message: str = "") -> None:
        default = " ".join((self.__doc__ or self.code).split())
        super().__init__(message or default)
        self.message = message or default


class NoSuchBucket(StoreError):
    """The specified bucket does not exist."""

    code = "NoSuchBucket"


class BucketAlreadyExists(StoreError):
    """Your previous request to create the named bucket succeeded and you already own it."""

    code = "BucketAlreadyOwnedByYou"


class BucketNotEmpty(StoreError):
    """The bucket you tried to delete is not empty."""

    code = "BucketNotEmpty"


class NoSuchKey(StoreError):
    """The specified key does not exist."""

    code = "NoSuchKey"


class NoSuchUpload(StoreError):
    """The specified multipart upload does not exist. The upload ID may be invalid,
    or the upload may have been aborted or completed."""

    code = "NoSuchUpload"


class PreconditionFailed(StoreError):
    """At least one of the pre-conditions you specified did not hold."""

    code = "PreconditionFailed"


class SourceChanged(PreconditionFailed):
    """The copy source is no longer the version its conditions were checked against."""


class InvalidPart(StoreError):
    """One or more of the specified parts could not be found, or its entity tag did not match."""

    code = "InvalidPart"


class InvalidPartOrder(StoreError):
    """The list of parts was not in ascending order."""

    code = "InvalidPartOrder"


#: S3's smallest part but the last of a multipart upload (of the client's bytes).
MIN_PART_SIZE = 5 * 1024 * 1024


class EntityTooSmall(StoreError):
    """Your proposed upload is smaller than the minimum allowed object size."""

    code = "EntityTooSmall"


class IncompleteBody(StoreError):
    """The body did not match its declared length; nothing was written."""

    code = "IncompleteBody"


class StoreUnavailable(StoreError):
    """The storage backend is not reachable; retry later."""

    #: 503 with Retry-After, which S3 clients (boto3, the aws cli, rclone...) back off on
    code = "SlowDown"


class StoreTimeout(StoreUnavailable):
    """The storage backend did not answer in time. Not retried: a retry would wait as
    long again, and no caller should wait much longer than the timeout."""


@dataclass(frozen=True)
class WriteCondition:
    """A conditional write: ``If-None-Match: *`` and/or ``If-Match: <etag>``.

    Evaluated atomically with the write, so of several concurrent conditional
    writers exactly one wins.
    """

    if_none_match: bool = False
    if_match: str | None = None  # etag without quotes
    #: who writes (a principal's name): a failed condition whose object this same
    #: writer just wrote with the same bytes is a retry, answered with success
    writer: str | None = None


@dataclass
class ObjectMeta:
    """What a client said about an object besides its bytes."""

    content_type: str = "binary/octet-stream"
    content_encoding: str | None = None
    content_language: str | None = None
    content_disposition: str | None = None
    cache_control: str | None = None
    expires: str | None = None
    user: dict[str, str] = field(default_factory=dict)
    #: algorithm name (``CRC32`` ...) -> base64 value, as verified on upload
    checksums: dict[str, str] = field(default_factory=dict)
    checksum_type: str | None = None  # FULL_OBJECT or COMPOSITE
    #: the sealed store's bookkeeping, never shown to clients: the wrapped data key, and
    #: the client's metadata sealed under the object's data key
    sealed: str | None = None
    sealed_meta: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in (None, {}, "")}

    @classmethod
    def from_dict(cls, data: dict) -> ObjectMeta:
        return cls(**data)


@dataclass
class ObjectInfo:
    """An object's stored facts, identical across LIST, HEAD and GET."""

    bucket: str
    key: str
    size: int
    etag: str  # without quotes
    last_modified: float  # unix seconds
    meta: ObjectMeta
    #: sizes of the parts of a multipart object, in order (empty otherwise)
    part_sizes: Sequence[int] = ()


@dataclass(frozen=True)
class BucketInfo:
    name: str
    created: float


@dataclass
class ListEntry:
    """One row of a listing; ``meta`` is left empty because listings never need it."""

    key: str
    size: int
    etag: str
    last_modified: float


@dataclass
class ListPage:
    entries: list[ListEntry]
    common_prefixes: list[str]
    is_truncated: bool
    #: the last key or common prefix returned; a listing resumes after it
    next_marker: str | None


@dataclass(frozen=True)
class PartInfo:
    part_number: int
    size: int
    etag: str
    last_modified: float
    checksums: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class UploadInfo:
    bucket: str
    key: str
    upload_id: str
    initiated: float
    meta: ObjectMeta


class ObjectReader(Protocol):
    """An open object: its info and a stream over the requested byte range."""

    info: ObjectInfo

    def read(self, n: int = -1) -> bytes: ...

    def close(self) -> None: ...


class ObjectStore(Protocol):
    """The storage contract. Every method is synchronous and thread-safe;
    callers in an event loop run them in a worker thread."""

    # buckets
    def create_bucket(self, name: str) -> BucketInfo: ...
    def delete_bucket(self, name: str) -> None: ...
    def head_bucket(self, name: str) -> BucketInfo: ...
    def list_buckets(self) -> list[BucketInfo]: ...

    # objects
    def put_object(
        self,
        bucket: str,
        key: str,
        body: Readable,
        meta: ObjectMeta,
        condition: WriteCondition | None = None,
        finalize: Finalizer | None = None,
    ) -> ObjectInfo: ...
    def head_object(self, bucket: str, key: str) -> ObjectInfo: ...
    def open_object(
        self, bucket: str, key: str, start: int = 0, end: int | None = None
    ) -> ObjectReader: ...
    def delete_object(self, bucket: str, key: str) -> None: ...
    def copy_object(
        self,
        src_bucket: str,
        src_key: str,
        bucket: str,
        key: str,
        meta: ObjectMeta | None,
        condition: WriteCondition | None = None,
        source_etag: str | None = None,
    ) -> ObjectInfo: ...
    def list_objects(
        self,
        bucket: str,
        prefix: str = "",
        delimiter: str = "",
        after: str = "",
        limit: int = 1000,
    ) -> ListPage: ...

    # multipart
    def create_multipart(self, bucket: str, key: str, meta: ObjectMeta) -> UploadInfo: ...
    def upload_part(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_number: int,
        body: Readable,
        finalize: Finalizer | None = None,
        size: int | None = None,  # the declared length, when known (the sealed store needs it)
    ) -> PartInfo: ...
    def complete_multipart(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        parts: Sequence[tuple[int, str]],
        condition: WriteCondition | None = None,
        meta_update: MetaUpdate | None = None,
    ) -> ObjectInfo: ...
    def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None: ...
    def list_parts(self, bucket: str, key: str, upload_id: str) -> list[PartInfo]: ...
    def list_uploads(self, bucket: str, prefix: str = "") -> list[UploadInfo]: ...
    def get_upload(self, bucket: str, key: str, upload_id: str) -> UploadInfo: ...
    def expire_uploads(self, older_than: float) -> int: ...
    def count_uploads(self) -> int: ...

    # health
    def check(self) -> None: ...
    def close(self) -> None: ...


class Finalizer(Protocol):
    """Called after the whole body was read, before the write becomes visible.

    It may raise (a checksum mismatch) to abandon the write, and may return
    metadata learned only at the end of the body (trailing checksums).
    """

    def __call__(self) -> dict[str, str]: ...


class MetaUpdate(Protocol):
    """Completes an object's metadata from its parts (composite checksums)."""

    def __call__(self, meta: ObjectMeta, parts: Sequence[PartInfo]) -> ObjectMeta: ...


def page_of(entries: dict[str, ListEntry], prefix: str = "", delimiter: str = "", after: str = "",
            limit: int = 1000) -> ListPage:
    """One S3 listing page over an in-memory set of entries (a store view of a service's
    documents): keys under ``prefix`` past ``after``, rolled up at ``delimiter``."""
    rows: list[ListEntry] = []
    prefixes: list[str] = []
    last = None
    for key in sorted(entries):
        if not key.startswith(prefix) or key <= after:
            continue
        if delimiter:
            cut = key.find(delimiter, len(prefix))
            if cut >= 0:
                common = key[: cut + len(delimiter)]
                if (prefixes and prefixes[-1] == common) or common <= after:
                    continue
                if len(rows) + len(prefixes) >= limit:
                    return ListPage(rows, prefixes, True, last)
                prefixes.append(common)
                last = common
                continue
        if len(rows) + len(prefixes) >= limit:
            return ListPage(rows, prefixes, True, last)
        rows.append(entries[key])
        last = key
    return ListPage(rows, prefixes, False, None)
