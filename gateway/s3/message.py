"""The request and response shapes the S3 handlers see: no ASGI, no sockets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_to_bytes

from ..store.base import ObjectReader, Readable


@dataclass
class Request:
    method: str
    raw_path: str  # exactly as sent, still percent-encoded (SigV4 signs it)
    raw_query: str
    query: dict[str, str]  # decoded; the first value of each name
    query_pairs: list[tuple[str, str]]
    headers: dict[str, str]  # lowercase names; repeated headers joined with ","
    client_ip: str
    request_id: str
    bucket: str | None = None
    key: str | None = None
    body: Readable | None = None
    principal: Any = None
    signing: Any = None  # SigningContext of a verified SigV4 request
    payload_hash: str | None = None
    scheme: str = "http"
    #: checksum algorithms to compute even if the client sent none (a multipart upload's)
    extra_checksums: tuple[str, ...] = ()
    #: what the audit record and metrics will say about this request
    outcome: Any = None

    def permits(self, action: str, resource: str, counted: bool = True) -> bool:
        """Whether the caller may ``action`` on ``resource``; replaced once authenticated."""
        return False

    def denies_under(self, action: str, prefix: str) -> bool:
        """Whether a Deny may take some resource under ``prefix`` from the caller (see
        ``Authorizer.denies_some_under``); replaced once authenticated."""
        return True

    def allows_under(self, action: str, prefix: str) -> bool:
        """Whether an Allow may reach some resource under ``prefix`` (see
        ``Authorizer.allows_some_under``); replaced once authenticated."""
        return False

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name, default)

    @property
    def writer(self) -> str | None:
        """The name writes are recorded under (see WriteCondition.writer)."""
        return getattr(self.principal, "name", None)

    @property
    def resource(self) -> str:
        if self.bucket is None:
            return "/"
        return f"/{self.bucket}/{self.key}" if self.key else f"/{self.bucket}"


@dataclass
class Response:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    #: a body streamed from the store instead of ``body``
    stream: ObjectReader | None = None
    length: int | None = None
    #: the S3 error code of an error response, for the audit record
    error: str | None = None
    #: the keys a multi-object request changed (DeleteObjects: also when Quiet leaves them
    #: out of the answer), for the artifact events and the search index
    changed_keys: list[str] | None = None

    @classmethod
    def xml(cls, body: bytes, status: int = 200) -> Response:
        return cls(status, [("content-type", "application/xml")], body)


def split_path(raw_path: str, host_bucket: str | None) -> tuple[str | None, str | None]:
    """Bucket and key from a path-style or virtual-host-style request path.

    ``raw_path`` is the wire bytes as latin-1 text; percent-escapes and raw
    UTF-8 alike decode to the same key.
    """
    path = unquote_to_bytes(raw_path.encode("latin-1")).decode("utf-8")
    if host_bucket is not None:
        key = path[1:] if path.startswith("/") else path
        return host_bucket, key or None
    trimmed = path[1:] if path.startswith("/") else path
    if not trimmed:
        return None, None
    bucket, _, key = trimmed.partition("/")
    return bucket, key or None
