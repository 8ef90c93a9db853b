"""The manifest: which Parquet segments are current, and which wait out their grace period.

It lives in the compactor's log checkpoint (``checkpoints/compactor.json``), so the log
positions a compaction consumed and the segments it produced change in one
compare-and-swap. Readers take one loaded checkpoint as their snapshot: the segments it
names plus the log past its positions are exactly the acknowledged records, never a
half-merged set.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

FORMAT_VERSION = 1
#: Replaced segments stay readable this long, so a query that listed them never misses a file.
GRACE_SECONDS = 300.0
#: Segment files live under this prefix of the internal bucket, one folder per stream.
KEY_PREFIX = "parquet/"


@dataclass(frozen=True, slots=True)
class Segment:
    """One immutable Parquet file of one partition of one stream."""

    stream: str  # "bio" or "audit"
    partition: str  # Hive path: "agent=a/date=2026-11-30" or "date=2026-11-30"
    name: str  # "<id>.parquet"
    rows: int
    bytes: int
    min_ts: int  # microseconds, UTC
    max_ts: int
    created: float

    @property
    def key(self) -> str:
        """Where the segment is stored in the internal bucket."""
        return f"{KEY_PREFIX}{self.stream}/{self.partition}/{self.name}"

    @property
    def path(self) -> str:
        """Its name inside its stream: what the biographies bucket lists."""
        return f"{self.partition}/{self.name}"

    def value(self, name: str) -> str | None:
        """A partition value: ``value("agent")`` of ``agent=a/date=d`` is ``a``."""
        for part in self.partition.split("/"):
            key, _, value = part.partition("=")
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class Retired:
    key: str
    delete_after: float


@dataclass
class Manifest:
    segments: list[Segment] = field(default_factory=list)
    retired: list[Retired] = field(default_factory=list)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Manifest:
        return cls([Segment(**s) for s in state.get("segments", [])],
                   [Retired(**r) for r in state.get("retired", [])])

    def to_state(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, "segments": [asdict(s) for s in self.segments],
                "retired": [asdict(r) for r in self.retired]}

    def of(self, stream: str, partition: str | None = None) -> list[Segment]:
        return [s for s in self.segments
                if s.stream == stream and (partition is None or s.partition == partition)]

    def find(self, stream: str, path: str) -> Segment | None:
        return next((s for s in self.segments if s.stream == stream and s.path == path), None)

    def replace(self, added: Iterable[Segment], removed: Iterable[Segment], now: float,
                grace: float = GRACE_SECONDS) -> Manifest:
        """A new manifest with ``added`` current and ``removed`` retired."""
        gone = {s.key for s in removed}
        kept = [s for s in self.segments if s.key not in gone]
        retired = self.retired + [Retired(key, now + grace) for key in sorted(gone)]
        return Manifest(sorted(kept + list(added), key=lambda s: (s.stream, s.partition, s.name)), retired)

    def expired(self, now: float) -> list[Retired]:
        return [r for r in self.retired if r.delete_after <= now]

    def without_retired(self, keys: set[str]) -> Manifest:
        return Manifest(list(self.segments), [r for r in self.retired if r.key not in keys])
