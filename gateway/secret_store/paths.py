"""Secret paths: what a valid path is, and where a path's records live in the internal bucket.

A path names a secret the way a file path names a file (``agents/a1/github-token``); it
becomes part of object keys and of IAM resources, so it is checked strictly and early:
segments of letters, digits and ``._@=+-``, never ``.`` or ``..``, never empty.

Layout (internal bucket, sealed by the store like everything else)::

    vault/meta/<path>.json                  the path's metadata and version table (CAS)
    vault/data/<path>/<version>.<nonce>     one sealed record per version

The ``.json`` suffix keeps a secret ``a/b`` and a folder ``a/b/`` apart. A version's object
name carries a random part, so two writers racing for the same version number never write
the same object: the one whose metadata swap wins keeps its record, the other deletes its own.
"""

from __future__ import annotations

import re
import secrets

from .errors import SecretError

MAX_PATH = 512
MAX_SEGMENTS = 16
_SEGMENT = re.compile(r"^[A-Za-z0-9._@=+-]{1,128}\Z")
META_PREFIX = "vault/meta/"
DATA_PREFIX = "vault/data/"
_META_SUFFIX = ".json"


def check_path(path: str) -> str:
    """``path`` itself when valid; a 400 InvalidPath naming the problem otherwise."""
    if not path:
        raise SecretError("InvalidPath", "A secret path is required, e.g. agents/a1/github-token.")
    if len(path) > MAX_PATH:
        raise SecretError("InvalidPath", f"A secret path is at most {MAX_PATH} characters; this one "
                          f"has {len(path)}.")
    segments = path.split("/")
    if len(segments) > MAX_SEGMENTS:
        raise SecretError("InvalidPath", f"A secret path has at most {MAX_SEGMENTS} segments.")
    for segment in segments:
        _check_segment(path, segment)
    return path


def check_prefix(prefix: str) -> str:
    """A listing prefix: empty (everything) or a valid path followed by ``/``."""
    if prefix == "":
        return prefix
    if not prefix.endswith("/"):
        raise SecretError("InvalidPath", "A listing prefix ends with '/', e.g. agents/a1/.")
    check_path(prefix[:-1])
    return prefix


def _check_segment(path: str, segment: str) -> None:
    if segment == "":
        raise SecretError("InvalidPath", f"The secret path {_shown(path)} has an empty segment "
                          "(a leading, trailing or doubled '/').")
    if segment in (".", ".."):
        raise SecretError("InvalidPath", f"The secret path {_shown(path)} has a '{segment}' segment; "
                          "paths are literal names, without relative parts.")
    if not _SEGMENT.match(segment):
        raise SecretError("InvalidPath", f"The secret path {_shown(path)} has an invalid segment: "
                          "segments are 1-128 of A-Z a-z 0-9 . _ @ = + -.")


def _shown(path: str) -> str:
    """A path as an error quotes it: bounded, and only printable ASCII."""
    text = path[:80] + ("..." if len(path) > 80 else "")
    return repr("".join(c if " " <= c <= "~" else "?" for c in text))


def meta_key(path: str) -> str:
    return META_PREFIX + path + _META_SUFFIX


def path_of_meta(key: str) -> str | None:
    """The secret path a metadata key belongs to; None for anything else."""
    if key.startswith(META_PREFIX) and key.endswith(_META_SUFFIX):
        return key[len(META_PREFIX):-len(_META_SUFFIX)]
    return None


def data_prefix(path: str) -> str:
    return DATA_PREFIX + path + "/"


def new_record_name(version: int) -> str:
    """The object name (under the path's data prefix) of a version about to be written."""
    return f"{version:010d}.{secrets.token_hex(4)}"
