"""A secret path's metadata: its settings, custom key/values and the table of kept versions.

The metadata object is the authority on what exists: a version is readable only when the
table lists it (not destroyed) and points at its record. Every change is one compare-and-swap
of this object, so version numbers, deletes and destroys never interleave badly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..iam.audit import iso_ms
from .errors import SecretError

DEFAULT_MAX_VERSIONS = 10
MAX_MAX_VERSIONS = 100
MAX_META_KEYS = 32
MAX_META_KEY = 128
MAX_META_VALUE = 1024


@dataclass
class VersionEntry:
    created: float
    created_by: str
    #: the record's object name under the path's data prefix; None once destroyed
    record: str | None
    deleted: float | None = None

    @property
    def destroyed(self) -> bool:
        return self.record is None

    def view(self, version: int) -> dict[str, Any]:
        return {"version": version, "created_time": iso_ms(self.created), "created_by": self.created_by,
                "deleted_time": iso_ms(self.deleted) if self.deleted else None,
                "destroyed": self.destroyed}


@dataclass
class SecretMeta:
    path: str
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    current: int = 0
    max_versions: int = DEFAULT_MAX_VERSIONS
    custom: dict[str, str] = field(default_factory=dict)
    versions: dict[int, VersionEntry] = field(default_factory=dict)

    # -- storage ------------------------------------------------------------------

    def encode(self) -> bytes:
        return orjson.dumps({
            "format": 1, "path": self.path, "created": self.created, "updated": self.updated,
            "current": self.current, "max_versions": self.max_versions, "metadata": self.custom,
            "versions": {str(n): {"created": e.created, "created_by": e.created_by, "record": e.record,
                                  "deleted": e.deleted} for n, e in sorted(self.versions.items())},
        }, option=orjson.OPT_INDENT_2)

    @classmethod
    def decode(cls, raw: bytes) -> SecretMeta:
        try:
            doc = orjson.loads(raw)
            versions = {int(n): VersionEntry(e["created"], e["created_by"], e["record"], e.get("deleted"))
                        for n, e in doc["versions"].items()}
            return cls(doc["path"], doc["created"], doc["updated"], doc["current"], doc["max_versions"],
                       dict(doc["metadata"]), versions)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            raise SecretError("SecretDamaged", "A secret's metadata is damaged; restore it from "
                              "backup.") from None

    @property
    def empty(self) -> bool:
        """No version was ever written (or the path was destroyed whole): no such secret."""
        return self.current == 0 and not self.versions

    # -- views --------------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        """What GET metadata answers: never a value, never a record name."""
        return {"path": self.path, "current_version": self.current, "max_versions": self.max_versions,
                "created_time": iso_ms(self.created), "updated_time": iso_ms(self.updated),
                "metadata": dict(self.custom),
                "versions": [e.view(n) for n, e in sorted(self.versions.items())]}

    def summary(self) -> dict[str, Any]:
        """One row of a listing."""
        latest = self.versions.get(self.current)
        return {"path": self.path, "current_version": self.current,
                "updated_time": iso_ms(self.updated), "metadata": dict(self.custom),
                "deleted": latest is None or latest.deleted is not None or latest.destroyed}

    # -- changes ------------------------------------------------------------------

    def add_version(self, record: str, by: str, now: float) -> tuple[int, list[str]]:
        """Append a version; returns its number and the records of versions pruned past
        ``max_versions`` (their objects are deleted once this metadata is stored)."""
        self.current += 1
        self.versions[self.current] = VersionEntry(now, by, record)
        self.updated = now
        return self.current, self.prune()

    def prune(self) -> list[str]:
        """Forget the oldest versions beyond ``max_versions``; their records, to delete."""
        dropped = []
        while len(self.versions) > self.max_versions:
            oldest = min(self.versions)
            entry = self.versions.pop(oldest)
            if entry.record:
                dropped.append(entry.record)
        return dropped

    def entry(self, version: int) -> VersionEntry:
        found = self.versions.get(version)
        if found is None:
            kept = f"kept versions: {min(self.versions)}-{max(self.versions)}" if self.versions \
                else "no versions are kept"
            raise SecretError("NoSuchSecret", f"The secret {self.path} has no version {version} "
                              f"({kept}).")
        return found


def check_custom(custom: Any) -> dict[str, str]:
    """Custom metadata: a small object of short strings (it is listed, never secret)."""
    if not isinstance(custom, dict):
        raise SecretError("InvalidRequest", "metadata must be a JSON object of string values.")
    if len(custom) > MAX_META_KEYS:
        raise SecretError("InvalidRequest", f"metadata holds at most {MAX_META_KEYS} keys.")
    for key, value in custom.items():
        if not key or len(key) > MAX_META_KEY:
            raise SecretError("InvalidRequest", f"metadata keys are 1-{MAX_META_KEY} characters.")
        if not isinstance(value, str):
            raise SecretError("InvalidRequest", f"metadata values are strings; {key!r} is not.")
        if len(value) > MAX_META_VALUE:
            raise SecretError("InvalidRequest", f"metadata values are at most {MAX_META_VALUE} "
                              f"characters; {key!r} is longer.")
    return dict(custom)


def check_max_versions(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MAX_VERSIONS:
        raise SecretError("InvalidRequest", f"max_versions is a whole number from 1 to "
                          f"{MAX_MAX_VERSIONS}.")
    return value
