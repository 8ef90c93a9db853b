"""Read preconditions (RFC 7232 as S3 applies them) and Range parsing."""

from __future__ import annotations

from email.utils import parsedate_to_datetime

from ..store.base import ObjectInfo, WriteCondition
from .errors import S3Error

_FAILED = "At least one of the pre-conditions you specified did not hold"


def _etags(value: str) -> list[str]:
    return [v.strip().removeprefix("W/").strip('"') for v in value.split(",")]


def _when(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None  # S3 ignores unparseable dates


def check_read(info: ObjectInfo, headers: dict[str, str], prefix: str = "") -> None:
    """Raise 412 or 304 as AWS does for GET/HEAD (or copy-source with ``x-amz-copy-source-``)."""
    if_match = headers.get(prefix + "if-match")
    if_none_match = headers.get(prefix + "if-none-match")
    modified_since = _when(headers.get(prefix + "if-modified-since"))
    unmodified_since = _when(headers.get(prefix + "if-unmodified-since"))
    mtime = int(info.last_modified)
    if if_match is not None:
        if "*" not in _etags(if_match) and info.etag not in _etags(if_match):
            raise S3Error("PreconditionFailed", _FAILED,
                          Condition="If-Match")
    elif unmodified_since is not None and mtime > unmodified_since:
        raise S3Error("PreconditionFailed", _FAILED,
                      Condition="If-Unmodified-Since")
    not_modified = 412 if prefix else 304
    if if_none_match is not None:
        tags = _etags(if_none_match)
        if "*" in tags or info.etag in tags:
            raise S3Error("PreconditionFailed" if prefix else "NotModified", "Not Modified", not_modified)
    elif modified_since is not None and mtime <= modified_since:
        raise S3Error("PreconditionFailed" if prefix else "NotModified", "Not Modified", not_modified)


def write_condition(headers: dict[str, str], writer: str | None) -> WriteCondition:
    """If-None-Match: * and If-Match on PutObject / CompleteMultipartUpload / CopyObject,
    and who is writing (so the store can recognise a retried conditional write)."""
    none_match = headers.get("if-none-match")
    match = headers.get("if-match")
    if none_match is not None and none_match.strip() != "*":
        raise S3Error("NotImplemented", "If-None-Match on a write accepts only '*'.")
    return WriteCondition(if_none_match=none_match is not None,
                          if_match=match.strip().strip('"') if match is not None else None,
                          writer=writer)


def parse_range(value: str | None, size: int) -> tuple[int, int] | None:
    """``(start, end_exclusive)`` of a single byte range, or None for the whole object.

    Like AWS: a malformed or multi-range header is ignored; an unsatisfiable
    one is 416 InvalidRange.
    """
    if not value or not value.startswith("bytes=") or "," in value:
        return None
    first, sep, last = value[6:].strip().partition("-")
    if not sep:
        return None
    try:
        if first == "":
            suffix = int(last)
            if suffix <= 0 or size == 0:
                raise _unsatisfiable(size)
            return max(0, size - suffix), size
        start = int(first)
        end = int(last) + 1 if last else size
    except ValueError:
        return None
    if start < 0 or end <= start and last:
        return None
    if start >= size:
        raise _unsatisfiable(size)
    return start, min(end, size)


def _unsatisfiable(size: int) -> S3Error:
    return S3Error("InvalidRange", "The requested range is not satisfiable",
                   ActualObjectSize=str(size))
