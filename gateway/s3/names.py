"""Validation of bucket names and object keys, with AWS's rules and messages."""

from __future__ import annotations

import re

from .errors import S3Error

#: Bucket names the memory features of orgmem own; clients cannot create them.
RESERVED_BUCKETS = frozenset({"biographies", "memory", "skills"})
#: Names that would collide with the gateway's own routes in path-style requests.
ROUTE_NAMES = frozenset({"health", "ready", "v1", "admin", "mcp", "metrics"})
MAX_KEY_BYTES = 1024

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
_IP = re.compile(r"^\d+\.\d+\.\d+\.\d+\Z")


def check_bucket_name(name: str) -> None:
    """Raise InvalidBucketName unless ``name`` follows S3's general-purpose bucket rules."""
    problem = None
    if not _BUCKET.match(name):
        problem = ("must be 3 to 63 characters of lowercase letters, digits, dots and hyphens, "
                   "beginning and ending with a letter or digit")
    elif ".." in name or ".-" in name or "-." in name:
        problem = "must not contain two adjacent periods or a period next to a hyphen"
    elif _IP.match(name):
        problem = "must not be formatted as an IP address"
    elif name.startswith(("xn--", "sthree-")) or name.endswith(("-s3alias", "--ol-s3", "--x-s3")):
        problem = "must not use a prefix or suffix that S3 reserves"
    if problem:
        raise S3Error("InvalidBucketName", f"The specified bucket is not valid: a bucket name {problem}.",
                      BucketName=name)


def check_new_bucket_name(name: str) -> None:
    check_bucket_name(name)
    if name in RESERVED_BUCKETS:
        raise S3Error("InvalidBucketName", f"The bucket name '{name}' is reserved for orgmem's "
                      "memory features.", BucketName=name)
    if name in ROUTE_NAMES:
        raise S3Error("InvalidBucketName", f"The bucket name '{name}' is reserved: it is one of "
                      "the gateway's own paths.", BucketName=name)


def check_key(key: str) -> None:
    if len(key.encode()) > MAX_KEY_BYTES:
        raise S3Error("KeyTooLongError", "Your key is too long: keys are at most 1024 bytes "
                      "of UTF-8.")
