"""The compactor: log records into zstd Parquet segments, committed by one swap.

One run reads the log past the compactor's checkpoint, groups records by stream and
partition, drops retries (records whose id a partition already holds), writes new
segments (merging a partition's small ones into them), and then swaps the checkpoint:
new positions and new manifest together. Files are written first and the manifest
last, so a reader never sees a segment that is not whole. When two gateways compact
the same stretch at once, one swap wins; the loser deletes what it wrote and finds
nothing left to do on its next run, so no record is lost or doubled. A swap that fails
otherwise (a timeout) may have landed: its files are kept, and if no manifest names
them the sweep removes them after the grace period.

Retries are recognised by id within a partition and, for biography events (whose time
the server assigns again when a retry comes without ``ts``), also in the same agent's
partitions of the day before and after, and on any day within one run: the first
stored copy is kept.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from ..log import Checkpoint, CheckpointConflict, DocChanged, DurableLog, advance
from ..log.layout import Positions
from ..logs import log as event_log
from ..store.base import INTERNAL_BUCKET, StoreError
from .files import SegmentFiles, Stream
from .manifest import GRACE_SECONDS, KEY_PREFIX, Manifest, Segment

CONSUMER = "compactor"
#: Records consumed by one run at most (bounds memory; the next run takes the rest).
MAX_RECORDS = 500_000
#: Log objects one run reads at most (bounds the run's time on a slow upstream).
MAX_OBJECTS = 5_000
#: A partition's segments below this size are merged once MERGE_AT of them exist.
SMALL_BYTES = 8 * 1024 * 1024
MERGE_AT = 4
#: Arrow bytes per Parquet byte, about, at the cheap level (4.5 on agent transcripts): what
#: tells, before writing, whether a segment will reach SMALL_BYTES and stay as written.
ARROW_PER_PARQUET_BYTE = 4
#: Runs between sweeps for segment files no manifest names (left by a crash mid-run).
SWEEP_EVERY = 50
#: Streams whose records are stamped anew when retried (a biography event sent without ``ts``
#: gets the server's time at each try), so a retry can land on the day before or after: for
#: these, a partition's ids count as held by the same partition of the adjacent days too.
RESTAMPED = frozenset({"bio"})

T = TypeVar("T")
#: Days of ids kept in memory from segments already written (about 120 bytes an id): those
#: of partitions dated within this many days of the newest one up to today; an older
#: partition's are read again from its segments when a late record for it comes, and dropped
#: after that run.
ID_DAYS = 2

#: Decides whether a segment has outlived its retention: (segment, now) -> drop it?
Retention = Callable[[Segment, float], bool]


@dataclass
class Snapshot:
    """What readers see: current segments plus the log past the positions they cover."""

    manifest: Manifest
    positions: Positions
    #: the version of the checkpoint it was loaded from
    etag: str | None = None


#: Attempts at a consistent read while compactions keep swapping the checkpoint.
READ_TRIES = 5


@dataclass
class RunResult:
    records: int = 0
    log_objects: int = 0
    written: list[str] = field(default_factory=list)
    merged: int = 0
    retired_by_retention: int = 0
    deleted: int = 0
    log_removed: int = 0
    conflict: bool = False
    #: the segments retention removed in this run (for the search index's notices)
    expired: list[Segment] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"records": self.records, "log_objects": self.log_objects,
                "segments_written": len(self.written),
                "segments_merged": self.merged, "segments_expired": self.retired_by_retention,
                "files_deleted": self.deleted, "log_objects_removed": self.log_removed,
                "conflict": self.conflict}


class Compactor:
    def __init__(self, log: DurableLog, files: SegmentFiles, streams: Sequence[Stream],
                 retention: Retention | None = None, grace: float = GRACE_SECONDS,
                 max_records: int = MAX_RECORDS) -> None:
        self.log = log
        self.files = files
        self.streams = {s.name: s for s in streams}
        self._by_type = {s.record_type: s for s in streams}
        self.retention = retention
        self.grace = grace
        self.max_records = max_records
        self.max_objects = MAX_OBJECTS
        self._ids: dict[str, frozenset[str]] = {}  # segment key -> its ids (segments never change)
        self._lock = threading.Lock()
        self._runs = 0

    def snapshot(self) -> Snapshot:
        cp = self.log.checkpoints.load(CONSUMER)
        return Snapshot(Manifest.from_state(cp.state), cp.positions, cp.etag)

    def consistent(self, read: Callable[[Snapshot], T]) -> T:
        """``read(snapshot)``, repeated if a compaction swapped the checkpoint meanwhile.

        A reader takes the log tail past the snapshot's positions; a compaction committed
        in between may already have collected objects of that stretch (their records are
        in segments the snapshot does not name), so such a read is done again."""
        for _ in range(READ_TRIES):
            snapshot = self.snapshot()
            result = read(snapshot)
            if self.log.checkpoints.load(CONSUMER).etag == snapshot.etag:
                return result
        return result

    def run(self, max_runs: int = 20) -> RunResult:
        """Compact everything the log held when called (writes arriving meanwhile may wait
        for the next run); the totals of the runs it took."""
        target: Positions = {}
        for writer, seq in self.log.reader.pending(self.snapshot().positions):
            advance(target, writer, seq)
        total = RunResult()
        for _ in range(max_runs):
            result = self.run_once()
            total.records += result.records
            total.log_objects += result.log_objects
            total.written += result.written
            total.merged += result.merged
            total.retired_by_retention += result.retired_by_retention
            total.deleted += result.deleted
            total.log_removed += result.log_removed
            reached = self.snapshot().positions
            if all(reached.get(w, 0) >= seq for w, seq in target.items()):
                break
        return total

    def run_once(self) -> RunResult:
        with self._lock:
            self._runs += 1
            result = self._run()
            if self._runs % SWEEP_EVERY == 0:
                self.sweep()
            return result

    # -- one run ------------------------------------------------------------

    def _run(self) -> RunResult:
        now = time.time()
        result = RunResult()
        cp = self.log.checkpoints.load(CONSUMER)
        manifest = Manifest.from_state(cp.state)
        self._forget_gone(manifest)
        positions, batches = self._read_log(cp.positions, result)
        added: list[Segment] = []
        try:
            removed = self._build(manifest, batches, now, result, added)
        except BaseException:
            self._discard(added)  # no swap was attempted: nothing names them
            raise
        due = manifest.expired(now)
        if not added and not removed and not due and positions == cp.positions:
            return result
        updated = manifest.replace(added, removed, now, self.grace).without_retired({r.key for r in due})
        if not self._swap(cp, positions, updated, added):
            result.conflict = True
            return result
        result.written = [s.key for s in added]
        self._notice_expired(result.expired, now)
        # past their grace, no reader can still be using them; the manifest no longer names
        # them, so one left behind (a failed delete) is an orphan the sweep removes
        result.deleted = self._delete_quietly([r.key for r in due])
        try:
            result.log_removed = self.log.collect()
        except StoreError as exc:  # collection is retried on the next run
            event_log.warning("log_collect_failed", error=exc.__class__.__name__)
        return result

    def _notice_expired(self, expired: list[Segment], now: float) -> None:
        """Tell the search index which agents' days retention removed, so their events stop
        being found too. On the log before the run returns (durably: retention is rare)."""
        days = sorted({(s.value("agent"), s.value("date")) for s in expired
                       if s.stream == "bio" and s.value("agent") and s.value("date")})
        if days:
            try:
                self.log.append([DocChanged("events", f"{agent}/{date}", "delete", now)
                                 for agent, date in days])
            except StoreError as exc:  # LogUnavailable too; the days are gone anyway: a rebuild catches up
                event_log.warning("retention_notice_failed", error=exc.__class__.__name__, days=len(days))

    def _build(self, manifest: Manifest, batches: dict[str, list], now: float, result: RunResult,
               added: list[Segment]) -> list[Segment]:
        """Write the run's segments, appending each to ``added`` as soon as it is stored (so a
        failure midway can delete them); returns the segments they replace or that expired."""
        removed: list[Segment] = []
        for stream_name, records in batches.items():
            stream = self.streams[stream_name]
            for partition, table in _partitions(stream, records).items():
                new, old = self._compact_partition(stream, manifest, partition, table, now)
                added += new
                removed += old
        expired = self._expired_by_retention(manifest.segments, now)
        result.merged = sum(1 for s in removed if s not in expired)
        # written this run for a day already past its retention (late events of an expired day,
        # a compaction right after `bio retain`): named by no manifest yet, so deleted now
        written_expired = self._expired_by_retention(added, now)
        if written_expired:
            added[:] = [s for s in added if s not in written_expired]
            self._discard(written_expired)
        result.expired = expired + written_expired
        result.retired_by_retention = len(result.expired)
        return removed + expired

    def _swap(self, cp: Checkpoint, positions: Positions, manifest: Manifest, added: list[Segment]) -> bool:
        """Save the new positions and manifest; False if another gateway moved the checkpoint
        first (this run's files are then deleted: no manifest will name them).

        Any other error is raised and deletes nothing: the write may have landed all the
        same (an upstream timeout after the PUT), and then the stored manifest names the
        new files. If it did not, they are orphans that :meth:`sweep` removes after the
        grace period."""
        try:
            self.log.checkpoints.save(cp, positions, manifest.to_state())
        except CheckpointConflict:
            self._discard(added)
            return False
        return True

    def _read_log(self, start: Positions, result: RunResult) -> tuple[Positions, dict[str, list]]:
        """The records past ``start``, by stream, and the positions they reach."""
        live = set(self.log.reader.writers())
        # a writer with no objects left can be forgotten: everything it wrote was collected
        positions = {w: s for w, s in start.items() if w in live}
        batches: dict[str, list] = defaultdict(list)
        for obj in self.log.reader.read_pending(start, self.max_objects):
            for record in obj.records:
                stream = self._by_type.get(type(record))
                if stream is not None:
                    batches[stream.name].append(record)
            advance(positions, obj.writer, obj.seq)
            result.records += len(obj.records)
            result.log_objects += 1
            if result.records >= self.max_records:
                break
        return positions, batches

    def _compact_partition(self, stream: Stream, manifest: Manifest, partition: str,
                           table: pa.Table, now: float) -> tuple[list[Segment], list[Segment]]:
        existing = manifest.of(stream.name, partition)
        neighbours = self._neighbours(stream, manifest, partition)
        held = [self._segment_ids(stream, s) for s in existing + neighbours]
        table = _unheld(stream, table, held)
        if table is None:
            return [], []
        small = [s for s in existing if s.bytes < SMALL_BYTES]
        merged: list[Segment] = []
        if len(small) + 1 >= MERGE_AT:
            tables = [self.files.table(s.key, use_threads=False) for s in small] + [table]
            table = stream.sort(pa.concat_tables(tables, promote_options="default"))
            merged = small
        return [self._write(stream, partition, table, now)], merged

    def _write(self, stream: Stream, partition: str, table: pa.Table, now: float) -> Segment:
        data = stream.encode(table, _lasts(table))
        low, high = pc.min_max(table[stream.ts_column].cast(pa.int64())).values()
        name = f"{int(now * 1000):012x}-{os.urandom(6).hex()}.parquet"
        segment = Segment(stream.name, partition, name, table.num_rows, len(data),
                          low.as_py(), high.as_py(), now)
        self.files.write(segment.key, data)
        self._ids[segment.key] = frozenset(table[stream.id_column].to_pylist())
        return segment

    def _segment_ids(self, stream: Stream, segment: Segment) -> frozenset[str]:
        ids = self._ids.get(segment.key)
        if ids is None:
            ids = frozenset(self.files.table(segment.key, [stream.id_column], use_threads=False)
                            [stream.id_column].to_pylist())
            self._ids[segment.key] = ids
        return ids

    def _neighbours(self, stream: Stream, manifest: Manifest, partition: str) -> list[Segment]:
        """Segments of the partitions a retry of a record in ``partition`` may have landed in."""
        if stream.name not in RESTAMPED:
            return []
        return [s for p in _adjacent_days(partition) for s in manifest.of(stream.name, p)]

    def _forget_gone(self, manifest: Manifest) -> None:
        """Keep the cached ids of current segments only (merged, retired and expired ones go),
        and of those only the recent days' (every day's segments stay current: the cache
        held every id ever compacted)."""
        current = {s.key: s.value("date") or "" for s in manifest.segments}
        # the newest day up to today: one event dated 9999 must not push every real day out
        today = datetime.now(UTC).date().isoformat()
        newest = max((d for d in current.values() if d <= today), default=max(current.values(), default=""))
        try:
            floor = (date.fromisoformat(newest) - timedelta(days=ID_DAYS)).isoformat()
        except ValueError:  # no dated partitions
            floor = ""
        self._ids = {key: ids for key, ids in self._ids.items() if key in current and current[key] >= floor}

    def _expired_by_retention(self, segments: list[Segment], now: float) -> list[Segment]:
        if self.retention is None:
            return []
        return [s for s in segments if self.retention(s, now)]

    def _discard(self, segments: list[Segment]) -> None:
        self._delete_quietly([s.key for s in segments])
        for segment in segments:
            self._ids.pop(segment.key, None)

    def _delete_quietly(self, keys: list[str]) -> int:
        """Delete segment files no manifest names; one that fails stays an orphan for the sweep."""
        deleted = 0
        for key in keys:
            try:
                self.files.delete(key)
                deleted += 1
            except StoreError as exc:
                event_log.warning("segment_delete_failed", key=key, error=exc.__class__.__name__)
        return deleted

    # -- housekeeping ---------------------------------------------------------

    def sweep(self) -> int:
        """Delete segment files no manifest names and older than the grace period."""
        snapshot = self.snapshot()
        known = {s.key for s in snapshot.manifest.segments} | {r.key for r in snapshot.manifest.retired}
        cutoff = time.time() - self.grace
        removed = 0
        for stream in self.streams:
            after = ""
            while True:
                page = self.log.store.list_objects(INTERNAL_BUCKET, f"{KEY_PREFIX}{stream}/", "", after, 1000)
                for entry in page.entries:
                    if entry.key not in known and entry.last_modified < cutoff:
                        self.files.delete(entry.key)
                        removed += 1
                if not page.is_truncated or not page.next_marker:
                    break
                after = page.next_marker
        return removed


def _lasts(table: pa.Table) -> bool:
    """Whether a segment will stay as written, so earns the stronger, slower compression.

    One that comes out below SMALL_BYTES is merged again soon: compressing it hard would be
    paid twice (11 against 5 µs per event on the bench's transcripts), so it is written
    cheaply until a merge makes it large."""
    return table.nbytes >= SMALL_BYTES * ARROW_PER_PARQUET_BYTE


def _partitions(stream: Stream, records: list) -> dict[str, pa.Table]:
    """A run's records as a table per partition, in segment order, each id once: made by the
    stream in one go where it can (see ``BioStream.partitions``), else record by record."""
    tables = stream.partitions(records)
    if tables is not None:
        return tables
    grouped = _group(stream, [stream.payload(r) for r in records])
    return {partition: stream.to_table(_first_of_each(stream, payloads))
            for partition, payloads in grouped.items()}


def _first_of_each(stream: Stream, payloads: list[dict]) -> list[dict]:
    """``payloads`` with each id's first one only."""
    seen: set[str] = set()
    first = []
    for payload in payloads:
        ident = stream.id_of(payload)
        if ident not in seen:
            seen.add(ident)
            first.append(payload)
    return first


def _unheld(stream: Stream, table: pa.Table, held: list[frozenset[str]]) -> pa.Table | None:
    """The rows of a partition's table (in segment order, ids unique) whose id no segment in
    ``held`` has; None if there are none."""
    if held:
        ids = table.column(stream.id_column).to_pylist()
        repeated = [ident for ident in ids if any(ident in h for h in held)]
        if repeated:
            table = table.filter(pc.invert(pc.is_in(table.column(stream.id_column),
                                                    value_set=pa.array(repeated, pa.string()))))
    return table if table.num_rows else None


def _group(stream: Stream, payloads: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    seen: dict[tuple[str, str], list[int | None]] = {}  # (family, id) -> the days kept
    for payload in payloads:
        try:
            partition = stream.partition_of(payload)
            ident = stream.id_of(payload)
        except (KeyError, TypeError, ValueError) as exc:
            # a record no reader could use must not stop every stream's compaction
            event_log.error("record_unreadable", stream=stream.name, error=exc.__class__.__name__)
            continue
        if stream.name in RESTAMPED:  # a retry read in this run may sit on the next day
            family, day = (_without_date(partition), ident), _day_number(partition)
            days = seen.setdefault(family, [])
            if any(day is None or kept is None or abs(day - kept) <= 1 for kept in days):
                continue  # a retry's copy; the same id days apart is another event
            days.append(day)
        groups[partition].append(payload)
    return groups


@lru_cache(maxsize=4096)
def _day_number(partition: str) -> int | None:
    """The partition's date as a day number, None if it names none."""
    for part in partition.split("/"):
        if part.startswith("date="):
            try:
                return date.fromisoformat(part.removeprefix("date=")).toordinal()
            except ValueError:
                return None
    return None


@lru_cache(maxsize=4096)
def _without_date(partition: str) -> str:
    # asked once per record; a run holds a handful of distinct partitions
    return "/".join(part for part in partition.split("/") if not part.startswith("date="))


def _adjacent_days(partition: str) -> list[str]:
    """``partition`` on the day before and the day after (none if it names no date)."""
    parts = partition.split("/")
    dated = [i for i, part in enumerate(parts) if part.startswith("date=")]
    if not dated:
        return []
    try:
        day = date.fromisoformat(parts[dated[0]].removeprefix("date="))
    except ValueError:
        return []
    out = []
    for step in (-1, 1):
        try:
            parts[dated[0]] = f"date={day + timedelta(days=step)}"
        except OverflowError:  # no day before 0001-01-01 or after 9999-12-31
            continue
        out.append("/".join(parts))
    return out
