"""Object metadata on the wire: request headers -> ObjectMeta -> response headers."""

from __future__ import annotations

from ..store.base import ObjectInfo, ObjectMeta
from .checksums import header_name
from .errors import S3Error
from .xml import http_date

#: AWS's limit on user-defined metadata (names plus values, in bytes).
USER_META_LIMIT = 2048

_STANDARD = {
    "content-encoding": "content_encoding",
    "content-language": "content_language",
    "content-disposition": "content_disposition",
    "cache-control": "cache_control",
    "expires": "expires",
}


def _utf8(name: str, value: str) -> str:
    """Header values arrive as UTF-8 with surrogate escapes; invalid bytes are refused
    here, before anything is stored, rather than making the object unreadable later."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise S3Error("InvalidArgument", f"The {name} header is not valid UTF-8.") from None
    return value


def meta_from_headers(headers: dict[str, str]) -> ObjectMeta:
    """What a PUT, CreateMultipartUpload or REPLACE copy says about the object."""
    meta = ObjectMeta(content_type=_utf8("content-type", headers.get("content-type")
                                         or "binary/octet-stream"))
    for header, attr in _STANDARD.items():
        value = headers.get(header)
        if value:
            setattr(meta, attr, _utf8(header, value))
    if meta.content_encoding:
        meta.content_encoding = _strip_aws_chunked(meta.content_encoding)
    size = 0
    for name, value in headers.items():
        if name.startswith("x-amz-meta-"):
            short = name[len("x-amz-meta-"):]
            meta.user[short] = _utf8(name, value)
            size += len(short.encode()) + len(value.encode())
    if size > USER_META_LIMIT:
        raise S3Error("MetadataTooLarge", f"Your metadata headers are {size} bytes; the limit is "
                      f"{USER_META_LIMIT} bytes.")
    return meta


def _strip_aws_chunked(encoding: str) -> str | None:
    """aws-chunked describes the transfer, not the object: it is never stored."""
    kept = [e.strip() for e in encoding.split(",") if e.strip() and e.strip() != "aws-chunked"]
    return ",".join(kept) or None


def object_headers(info: ObjectInfo, with_checksums: bool) -> list[tuple[str, str]]:
    """Headers that describe an object on GET and HEAD."""
    meta = info.meta
    headers = [
        ("etag", f'"{info.etag}"'),
        ("last-modified", http_date(info.last_modified)),
        ("content-type", meta.content_type),
        ("accept-ranges", "bytes"),
    ]
    for header, attr in _STANDARD.items():
        value = getattr(meta, attr)
        if value:
            headers.append((header, value))
    headers.extend((f"x-amz-meta-{k}", v) for k, v in meta.user.items())
    if with_checksums and meta.checksums:
        headers.extend(checksum_headers(meta.checksums))
        if meta.checksum_type:
            headers.append(("x-amz-checksum-type", meta.checksum_type))
    return headers


def checksum_headers(checksums: dict[str, str]) -> list[tuple[str, str]]:
    """``x-amz-checksum-<algorithm>`` response headers for stored checksums."""
    return [(header_name(algorithm), value) for algorithm, value in checksums.items()]


_OVERRIDES = {
    "response-content-type": "content-type",
    "response-content-language": "content-language",
    "response-expires": "expires",
    "response-cache-control": "cache-control",
    "response-content-disposition": "content-disposition",
    "response-content-encoding": "content-encoding",
}


def apply_overrides(headers: list[tuple[str, str]], query: dict[str, str]) -> list[tuple[str, str]]:
    """GET's response-* query parameters replace the stored header values."""
    overrides = {h: query[q] for q, h in _OVERRIDES.items() if q in query}
    if not overrides:
        return headers
    for name, value in overrides.items():
        if any(ord(c) < 32 or ord(c) == 127 for c in value) or not value.isascii():
            raise S3Error("InvalidArgument", f"The value for response-{name} must be printable "
                          "ASCII without control characters.")
    kept = [(k, v) for k, v in headers if k not in overrides]
    return kept + list(overrides.items())
