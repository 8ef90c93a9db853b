"""The search pipeline: the durable log -> the indexer library -> sealed snapshots.

One gateway writes the index at a time: whoever holds the ``index`` lease. It keeps a
working index in a temporary directory (removed at close; no plaintext index under the
data dir), tails the log past its positions, maps each record to an index change
(:mod:`gateway.search.entries`), commits every :data:`COMMIT_INTERVAL` seconds when
something changed (that is what makes an acknowledged write searchable within a
second or so), and every :data:`PUBLISH_INTERVAL` seconds publishes a snapshot through
the sealed store (``.orgmem/index/``) whose manifest carries the positions it covers.
Only then is the log consumer checkpoint ``index`` moved to those positions, so log
objects are collected only once a snapshot covers them: restoring the latest snapshot
and replaying the log past its checkpoint loses nothing, and replays are upserts by
source reference, so nothing is doubled.

At start (and when taking over the lease) the writer restores the latest snapshot and
catches up from its checkpoint; it rebuilds from the sources only when there is no
snapshot at all (or none can be restored). Gateways without the lease serve searches
from the latest snapshot, re-restored when a newer manifest appears, and say how stale
it is. A gateway started with ``--no-index-writer`` never takes the lease (a replica kept
for ingest and reads, or one that must not spend CPU on indexing).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from indexer import (
    IndexSearcher,
    IndexWriter,
    IndexWriterGone,
    LocalCopy,
    ProcessIndexWriter,
    QueryError,
    Restored,
    SnapshotConflict,
    SnapshotError,
    collect,
    latest,
    publish,
    restore_latest,
)

from .biography import schema as bio_schema
from .biography.service import Biographies
from .iam.principals import Principal
from .log import BioRecord, CheckpointConflict, DurableLog, advance
from .log.layout import Positions
from .log.lease import TTL as LEASE_TTL
from .log.lease import Lease
from .logs import log
from .search import workdirs
from .search.blobs import StoreBlobs
from .search.entries import Sources, event_of
from .search.tokens import AccessTokens
from .search.workers import SearchCrashed, SearchWorkers, WorkerFailed
from .store.base import ObjectStore, StoreError

#: The log consumer (its checkpoint holds back log collection) and the lease's job name.
CONSUMER = "index"
#: Snapshots live under this prefix of the internal bucket.
PREFIX = "index"
#: Seconds between pipeline steps (each reads the log and commits when it found changes).
COMMIT_INTERVAL = 0.5
#: Seconds between published snapshots (when the index changed).
PUBLISH_INTERVAL = 5.0
#: Seconds between a follower's checks for a newer snapshot (and lease attempts).
POLL_INTERVAL = 2.0
#: Seconds between renewals of the lease by its holder.
RENEW_INTERVAL = 3.0
#: Log objects one step reads at most (the reader fetches them a window at a time; the step
#: stops earlier at STEP_SECONDS or STEP_RECORDS). Many small objects (one per memory write)
#: are then one commit, not one per 32.
MAX_OBJECTS = 1024
#: Work one step does before it commits, so a backlog never hides new entries for long:
#: seconds of applying, and records.
STEP_SECONDS = 0.5
STEP_RECORDS = 20_000
#: The same while catching up: when more than FAR_BEHIND log objects wait (a restart after
#: downtime), or the last step could not read all there was (ingest outpacing the index).
#: Each commit has a cost of its own (Tantivy finishes its segments, and they are merged
#: later), so fewer, larger commits catch up sooner (a 300,000-event backlog indexed 15%
#: faster), and an index that is behind is not made staler by them.
CATCHUP_STEP_SECONDS = 2.0
CATCHUP_STEP_RECORDS = 100_000
FAR_BEHIND = 128
#: While catching up, snapshots are published this many times less often: each one uploads
#: the segments merged since the last, and those are large and short-lived then.
CATCHUP_PUBLISH_FACTOR = 4
#: Entries upserted per call during a rebuild.
BATCH = 1000
WRITER_HEAP = 64 * 1024 * 1024
#: A search slower than this (ms) is logged with where its time went: the worker's reload
#: and search, or waiting in the gateway (for the GIL and the CPU, under load).
SLOW_SEARCH_MS = 100


class IndexNotReady(Exception):
    """The index is being restored or built; searches answer once it is open."""


class SearchFailed(Exception):
    """A search killed its worker process or ran out of time (HTTP 503)."""


#: What the event phase of a rebuild yields before it reads every event again.
_READ_AGAIN = object()


class _LeaseLost(Exception):
    """The index lease went to another gateway while this one was writing."""


class NotIndexWriter(Exception):
    """This gateway does not hold the index lease (another one writes the index)."""


class SearchIndex:
    """The gateway's search index: pipeline step, searches, status and rebuild."""

    def __init__(self, store: ObjectStore, durable_log: DurableLog, sources: Sources,
                 tokens: AccessTokens, biographies: Biographies, holder: str,
                 lease_ttl: float = LEASE_TTL, may_write: bool = True) -> None:
        self.store = store
        #: False: never take the lease; serve searches from the published snapshots
        self.may_write = may_write
        self.log = durable_log
        self.sources = sources
        self.tokens = tokens
        self.biographies = biographies
        self.blobs = StoreBlobs(store)
        self.lease = Lease(store, CONSUMER, holder, ttl=lease_ttl)
        self.positions: Positions = {}
        self._dir: Path | None = None
        #: the working directory's files as a snapshot named them: a newer snapshot's
        #: unchanged files are linked from here rather than fetched again
        self._local: LocalCopy | None = None
        self._writer: ProcessIndexWriter | None = None
        self._searcher: IndexSearcher | None = None
        #: bumped at every commit and directory swap: a search worker reloads when it grew
        self._generation = 0
        self._workers = SearchWorkers()
        swept = workdirs.sweep()  # working copies of gateways that were killed
        if swept:
            log.info("index_workdirs_removed", count=swept)
        self._backlog = False  # the last step left log records unread
        self._far_behind = False  # more than FAR_BEHIND objects waited at the last step
        self._catching_up = False  # this step catches up (see CATCHUP_STEP_SECONDS)
        self._left_backlog = False  # the last _consume stopped before the end of the log
        self._checkpoint = None
        self._published: Positions = {}
        self._dirty = False  # committed changes not yet in a snapshot
        self._snapshot: dict[str, Any] = {}  # seq, created, docs of the snapshot this index is at
        #: the snapshot a writer's index was built on (restored, last published, or the latest
        #: when a rebuild began): it publishes only while that is still the latest
        self._base = 0
        self._last_try = self._last_renew = self._last_publish = 0.0
        self._rebuild_requested = False
        #: an apply failed part way since the last commit: add nothing without its delete
        self._careful = False
        #: the positions the last commit (or the restored snapshot) covers: a rollback returns there
        self._committed: Positions = {}
        #: log objects up to here are upserted even where their records are fresh (see _fence_waiting)
        self._fence: Positions = {}
        self._closed = False
        self._step_lock = threading.Lock()
        self.stats: dict[str, Any] = {"started_from": None, "restores": 0, "restore_fetched_bytes": 0,
                                      "restore_linked_bytes": 0, "rebuilds": 0, "upserts": 0,
                                      "deletes": 0, "commits": 0, "publishes": 0, "skipped": 0,
                                      "last_commit": None}
        self.progress: dict[str, Any] = {"state": "idle"}

    # -- the background step ------------------------------------------------------------

    @property
    def role(self) -> str:
        if self._writer is not None:
            return "writer"
        return "follower" if self._searcher is not None else "starting"

    def step(self) -> bool:
        """One turn of the pipeline; the gateway calls it every :data:`COMMIT_INTERVAL` s, or
        at once again while it answers True (a backlog is left)."""
        if not self._step_lock.acquire(blocking=False):
            return False
        self._backlog = False
        try:
            if self._closed:
                return False
            now = time.monotonic()
            if self._writer is None:
                if now - self._last_try < POLL_INTERVAL and self._searcher is not None:
                    return
                self._last_try = now
                if self.may_write and self.lease.acquire():
                    self._last_renew = now
                    self._take_over()
                else:
                    self._follow()
                return False
            if not self._keep_lease():
                self._step_down()
                return False
            if self._rebuild_requested:
                self._rebuild_requested = False
                self._rebuild()
                if self._writer is None:  # the lease went elsewhere meanwhile
                    return False
            if self._consume():
                self._commit()
            elif not self._writer.pending:  # what it read held nothing to index (audit records)
                self._committed = dict(self.positions)
            every = PUBLISH_INTERVAL * (CATCHUP_PUBLISH_FACTOR if self._far_behind else 1)
            if self._dirty and time.monotonic() - self._last_publish >= every:
                self._publish()
            return self._backlog
        except IndexWriterGone as exc:
            # what it held since its last commit is gone: take the index over again (the
            # latest snapshot, then the log past it) at the next step
            log.error("index_writer_gone", detail=str(exc)[:200])
            self._step_down()
            raise
        finally:
            self._step_lock.release()

    def _keep_lease(self) -> bool:
        """Renew the lease when due; False when another gateway holds it now."""
        now = time.monotonic()
        if now - self._last_renew < RENEW_INTERVAL:
            return True
        if not self.lease.acquire():
            log.warning("index_lease_lost")
            return False
        self._last_renew = now
        return True

    def _new_dir(self) -> Path:
        return workdirs.new()

    def _swap(self, directory: Path, searcher: IndexSearcher, writer: ProcessIndexWriter | None,
              manifest: dict | None = None) -> None:
        old = self._dir
        self._dir, self._searcher, self._writer = directory, searcher, writer
        self._local = LocalCopy.of(directory, manifest) if manifest else None
        self._generation += 1
        if old is not None and old != directory:
            workdirs.remove(old)

    def _take_over(self) -> None:
        """Become the writer: restore the latest snapshot and catch up, or build from the sources."""
        directory = self._new_dir()
        try:
            restored = self._restore(directory)
        except SnapshotError as exc:
            log.error("index_restore_failed", detail=str(exc)[:300])
            workdirs.remove(directory)
            directory, restored = self._new_dir(), None
        except BaseException:  # the store failed part way: no plaintext copy is left behind
            workdirs.remove(directory)
            raise
        try:
            writer = ProcessIndexWriter(directory, heap_size=WRITER_HEAP, num_threads=2, entry_of=event_of)
        except BaseException:
            workdirs.remove(directory)
            raise
        self._swap(directory, IndexSearcher(writer.index), writer, restored and restored.manifest)
        self._checkpoint = self.log.checkpoints.load(CONSUMER)
        if restored is not None and self._lost_since(restored):
            restored = None  # the log no longer holds what lies between: rebuild instead
        if restored is not None:
            self.positions = {w: int(s) for w, s in (restored.checkpoint.get("positions") or {}).items()}
            self._published = dict(self.positions)
            self._committed = dict(self.positions)
            self._fence = {w: int(s) for w, s in (restored.checkpoint.get("fence") or {}).items()}
            if "fence" not in restored.checkpoint:  # a snapshot from before fences
                self._fence_waiting()
            self._snapshot = _about(restored.manifest)
            # a newer snapshot that could not be restored (damaged) is published over
            self._base = max(int(restored.manifest["seq"]), restored.newest)
            self.stats["started_from"] = self.stats["started_from"] or "snapshot"
            self._last_publish = time.monotonic()
        else:
            self.stats["started_from"] = self.stats["started_from"] or "rebuild"
            try:
                self._rebuild()
            except Exception:
                self._step_down()  # the next step takes over (and rebuilds) again
                raise

    def _lost_since(self, restored: Restored) -> bool:
        """Whether log objects past the restored snapshot were collected (an older snapshot was
        restored because the newest could not be): catching up from it would miss them."""
        have = {w: int(s) for w, s in (restored.checkpoint.get("positions") or {}).items()}
        for writer, collected_to in (self._checkpoint.positions if self._checkpoint else {}).items():
            start = have.get(writer, 0)
            if collected_to <= start:
                continue
            following = next(iter(self.log.reader.sequences(writer, start)), None)
            if following != start + 1:
                log.error("index_snapshot_behind_log", writer=writer, snapshot=start, next=following,
                          collected_to=collected_to)
                return True
        return False

    def _step_down(self) -> None:
        """Another gateway writes now: keep serving what we have until its snapshot comes."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.rollback()
                writer.close()
            except Exception as exc:  # noqa: BLE001 - the directory is dropped anyway
                log.warning("index_writer_close_failed", error=exc.__class__.__name__)
        self._snapshot = {}
        self._last_try = 0.0

    def _follow(self) -> None:
        """Serve from the latest snapshot: restore it again when a newer one appears."""
        manifest = latest(self.blobs, PREFIX)
        if manifest is None:
            if self._searcher is None:  # nothing published yet: an empty index until there is
                directory = self._new_dir()
                IndexWriter(directory, heap_size=WRITER_HEAP, num_threads=1).close()
                self._swap(directory, IndexSearcher(directory), None)
            return
        if manifest.get("seq") == self._snapshot.get("seq") and self._searcher is not None:
            return
        directory = self._new_dir()
        try:
            restored = self._restore(directory)
        except BaseException as exc:  # damaged, or the store failed part way: drop the copy
            workdirs.remove(directory)
            if not isinstance(exc, SnapshotError):
                raise
            log.warning("index_follow_failed", detail=str(exc)[:300])
            return
        if restored is None:  # every snapshot was collected meanwhile: keep what we serve
            workdirs.remove(directory)
            return
        self.positions = {w: int(s) for w, s in (restored.checkpoint.get("positions") or {}).items()}
        self._swap(directory, IndexSearcher(directory), None, restored.manifest)
        self._snapshot = _about(restored.manifest)
        self.stats["started_from"] = self.stats["started_from"] or "snapshot"

    def _restore(self, directory: Path) -> Restored | None:
        """The latest snapshot into ``directory``, linking the files the current working copy
        shares with it; counted in the stats and logged."""
        restored = restore_latest(self.blobs, PREFIX, directory, self._local)
        if restored is None:
            return None
        self.stats["restores"] += 1
        for name in ("fetched_bytes", "linked_bytes"):
            self.stats[f"restore_{name}"] += getattr(restored, name)
        log.info("index_restored", seq=restored.manifest.get("seq"), docs=restored.manifest.get("docs"),
                 fetched_files=restored.fetched_files, fetched_bytes=restored.fetched_bytes,
                 linked_files=restored.linked_files, linked_bytes=restored.linked_bytes)
        return restored

    # -- writing ------------------------------------------------------------------------

    def _consume(self, limit: int = MAX_OBJECTS) -> bool:
        """Apply the log past our positions to the writer; True when anything changed.

        The step fences at most once: every object it applies was in its own listing, so the
        fresh record any repeat among them repeats was stored before that listing ended, and
        the first fence, which lists the log after it, already covers them all."""
        changed = fenced = False
        deadline, records, objects = None, 0, 0
        pending = self.log.reader.pending(self.positions, limit)
        self._far_behind = len(pending) > FAR_BEHIND  # snapshots less often (see _publish)
        # catching up: that, or the last step could not read all there was
        self._catching_up = self._far_behind or self._left_backlog
        seconds, most = ((CATCHUP_STEP_SECONDS, CATCHUP_STEP_RECORDS) if self._catching_up
                         else (STEP_SECONDS, STEP_RECORDS))
        for obj in self.log.reader.read_listed(pending):
            objects += 1
            if deadline is None:
                deadline = time.monotonic() + seconds  # from the first object: fetching is not applying
            elif records >= most or time.monotonic() > deadline:
                self._backlog = True
                break  # commit what we have; the next step goes on from here
            records += len(obj.records)
            adds, upserts, deletes, expired = [], [], [], []
            events: tuple[list[BioRecord], list[BioRecord]] = ([], [])  # added, upserted
            if not fenced and any(isinstance(r, BioRecord) and r.resent for r in obj.records):
                self._fence_waiting()
                fenced = True
            may_add = not self._careful and obj.seq > self._fence.get(obj.writer, 0)
            for record in obj.records:
                if isinstance(record, BioRecord):
                    events[0 if record.fresh and may_add else 1].append(record)
                    continue
                try:
                    change = self.sources.from_record(record)
                except StoreError:
                    raise  # the store is unwell: this object is read again next step
                except Exception as exc:  # noqa: BLE001 - one odd record must not stop the index
                    self.stats["skipped"] += 1
                    log.warning("index_record_skipped", error=exc.__class__.__name__, detail=str(exc)[:200])
                    continue
                if change is None:
                    continue
                op, item = change
                if op == "add" and may_add:
                    adds.append(item)
                elif op == "delete":
                    deletes.append(item)
                elif op == "expire":
                    expired.append(item)
                else:
                    upserts.append(item)
            try:
                self._apply(adds, upserts, deletes, *events)
                self._expire(expired)
            except BaseException:
                # part of the object may be in the writer: the next step applies it again, and
                # until a commit has settled that, adds must not leave a second copy
                self._careful = True
                raise
            advance(self.positions, obj.writer, obj.seq)
            touched = adds or upserts or deletes or expired or events[0] or events[1]
            changed = changed or bool(touched)
            if not touched:
                self._dirty = True  # positions moved: the next snapshot says so
        if objects >= limit:
            self._backlog = True  # the log may hold more than one step reads
        self._left_backlog = self._backlog
        return changed

    def _fence_waiting(self) -> None:
        """Upsert, whenever it is applied, every log object waiting now.

        Called before a record that may repeat an assigned id (``BioRecord.resent``) is
        applied: the fresh record it repeats was stored before the client could know the id,
        so before this listing began, and it is either applied already or listed here. The
        pipeline takes each writer's objects in turn, so without the fence that fresh record,
        in a writer applied later, would be added beside the copy the repeat leaves. Each
        writer is listed from where its fence already stands, so a fence lists only what is
        new (one LIST per writer), and a step fences once however many repeats it applies."""
        start = dict(self.positions)
        for writer, seq in self._fence.items():
            advance(start, writer, seq)
        for writer, seq in self.log.reader.pending(start):
            advance(self._fence, writer, seq)

    def _apply(self, adds: list, upserts: list, deletes: list, event_adds: list[BioRecord],
               event_upserts: list[BioRecord]) -> None:
        """``adds``: entries no other record holds (see ``BioRecord.fresh``), added without
        the delete an upsert does first. ``event_adds`` and ``event_upserts``: biography
        events, sent to the writer's process as their log lines; it makes their entries."""
        assert self._writer is not None
        if deletes:
            self._writer.delete(deletes)
            self.stats["deletes"] += len(deletes)
        skipped = 0
        try:
            if upserts:
                self._writer.upsert(upserts)
            if event_upserts:
                skipped += self._writer.upsert_lines([r.encoded() for r in event_upserts])[1]
            if adds:
                self._writer.add(adds)
            if event_adds:
                skipped += self._writer.add_lines([r.encoded() for r in event_adds])[1]
        except (ValueError, TypeError):
            # upserts repeat harmlessly (each deletes what an earlier try added): redo them all
            # one by one, the adds as upserts too
            self._upsert_each(upserts + adds + self._event_entries(event_upserts + event_adds))
            return
        if skipped:
            self.stats["skipped"] += skipped
            log.warning("index_records_skipped", count=skipped)
        self.stats["upserts"] += len(upserts) + len(adds) + len(event_upserts) + len(event_adds) - skipped

    def _event_entries(self, records: list[BioRecord]) -> list:
        """The entries of biography events, made here (the rare path: one the writer refused)."""
        entries = []
        for record in records:
            try:
                entries.append(event_of(record.event))
            except Exception as exc:  # noqa: BLE001 - one odd record must not stop the index
                self.stats["skipped"] += 1
                log.warning("index_record_skipped", error=exc.__class__.__name__, detail=str(exc)[:200])
        return entries

    def _expire(self, days: list[tuple[str, str]]) -> None:
        """Drop the events of the (agent, UTC date) days retention removed from biographies."""
        assert self._writer is not None
        for agent, day in days:
            try:
                start = datetime.fromisoformat(day).replace(tzinfo=UTC)
            except ValueError:
                continue
            self._writer.delete_events(agent, start, start + timedelta(days=1))
            self.stats["deletes"] += 1

    def _upsert_each(self, upserts: list) -> None:
        """Upsert one at a time, skipping the entries Tantivy refuses: one odd entry must not
        hold the whole log (and its collection) back."""
        assert self._writer is not None
        for entry in upserts:
            try:
                self._writer.upsert(entry)
                self.stats["upserts"] += 1
            except (ValueError, TypeError) as exc:
                self.stats["skipped"] += 1
                log.warning("index_entry_skipped", source=entry.source[:200], error=exc.__class__.__name__,
                            detail=str(exc)[:200])

    def _commit(self) -> None:
        assert self._writer is not None
        self._writer.commit()
        self._committed = dict(self.positions)
        self._careful = False
        self._generation += 1
        self._dirty = True
        self.stats["commits"] += 1
        self.stats["last_commit"] = time.time()

    def _roll_back(self) -> None:
        """Forget the changes since the last commit, and the log positions they advanced: a step
        that failed part way may have applied log objects it never committed, and they must be
        read again rather than skipped."""
        assert self._writer is not None
        self._writer.rollback()
        self.positions = dict(self._committed)
        self._careful = False

    def _publish(self) -> None:
        assert self._writer is not None and self._dir is not None
        try:  # writers whose objects were all collected are forgotten (they only ever grow)
            alive = set(self.log.reader.writers())
            self.positions = {w: s for w, s in self.positions.items() if w in alive}
            self._fence = {w: s for w, s in self._fence.items() if w in alive}
        except StoreError:
            pass
        positions = dict(self.positions)
        if self._writer.pending:
            self._commit()
        self._fence = {w: s for w, s in self._fence.items() if s > positions.get(w, 0)}
        try:
            checkpoint = {"positions": positions, "fence": dict(self._fence)}
            manifest = publish(self.blobs, PREFIX, self._dir, checkpoint, local=self._local, base=self._base)
        except SnapshotConflict as exc:
            # another writer published since this index's base: it holds the lease now, or
            # did; step down, and the next take-over restores its snapshot
            log.warning("index_publish_conflict", detail=str(exc)[:200])
            self._step_down()
            return
        self._base = int(manifest["seq"])
        self._snapshot = _about(manifest)
        self._local = LocalCopy.of(self._dir, manifest)
        self._published, self._dirty = positions, False
        self._last_publish = time.monotonic()
        self.stats["publishes"] += 1
        for _ in range(3):  # the collection floor: what the newest snapshot covers
            if int(self._checkpoint.state.get("snapshot") or 0) > manifest["seq"]:
                break  # a later snapshot (another writer's) set the floor: never move it for ours
            try:
                self._checkpoint = self.log.checkpoints.save(self._checkpoint, positions,
                                                             {"snapshot": manifest["seq"]})
                break
            except CheckpointConflict:
                self._checkpoint = self.log.checkpoints.load(CONSUMER)
        try:
            collect(self.blobs, PREFIX, keep=2)
        except StoreError as exc:  # retried after the next publish
            log.warning("index_collect_failed", error=exc.__class__.__name__)

    # -- rebuild --------------------------------------------------------------------------

    def request_rebuild(self) -> dict:
        """Ask the writer's next step to rebuild from the sources."""
        if self._writer is None:
            holder = None
            try:
                holder = (self.lease.holder_now() or {}).get("holder")
            except StoreError:
                pass
            raise NotIndexWriter(f"This gateway does not write the index ({holder or 'nobody'} does); "
                                 "ask that gateway to rebuild.")
        self._rebuild_requested = True
        self.progress = {"state": "requested", "requested": time.time()}
        return self.progress

    def _rebuild(self) -> None:
        """Drop every entry and index the sources again; the log continues past ``target``."""
        assert self._writer is not None
        started = time.time()
        counts = {"event": 0, "memory": 0, "skill": 0, "file": 0}
        self.progress = {"state": "running", "phase": "event", "counts": counts, "started": started}
        newest = latest(self.blobs, PREFIX)  # read from the sources, published over this one
        self._base = int(newest["seq"]) if newest else 0
        target: Positions = {}
        for writer, seq in self.log.reader.pending({}):
            advance(target, writer, seq)
        # documents added since the last commit survive Tantivy's delete-all: drop them first
        self._roll_back()
        self._writer.delete_all()
        tail: Positions = {}
        phases: list[tuple[str, Iterable]] = [
            ("event", self._all_events(tail)), ("memory", self.sources.all_memory()),
            ("skill", self.sources.all_skills()), ("file", self.sources.all_files())]
        try:
            for phase, entries in phases:
                self.progress["phase"] = phase
                batch = []
                for entry in entries:
                    if entry is _READ_AGAIN:  # upserts: the index holds each once; count it so
                        self._writer.upsert(batch)
                        batch, counts[phase] = [], 0
                        continue
                    batch.append(entry)
                    if len(batch) >= BATCH:
                        self._writer.upsert(batch)
                        counts[phase] += len(batch)
                        batch = []
                        if not self._keep_lease():  # a long rebuild must not outlive the lease
                            raise _LeaseLost("another gateway took the index lease during the rebuild")
                if batch:
                    self._writer.upsert(batch)
                    counts[phase] += len(batch)
        except _LeaseLost as exc:
            self._roll_back()
            self.progress = {"state": "failed", "error": str(exc), "counts": counts, "started": started,
                             "finished": time.time()}
            self._step_down()
            return
        except Exception as exc:
            self._roll_back()
            self.progress = {"state": "failed", "error": f"{exc.__class__.__name__}: {str(exc)[:200]}",
                             "counts": counts, "started": started, "finished": time.time()}
            raise
        # the event phase may have read log objects written since ``target`` was listed: the
        # positions cover them, so a snapshot's positions say exactly which objects its index
        # holds and nothing is read again (the later phases read their sources as they are now)
        for writer, seq in tail.items():
            advance(target, writer, seq)
        self.positions = target
        # the tail may have held a repeat of an assigned id whose fresh record waits still
        self._fence_waiting()
        self._commit()
        self.stats["rebuilds"] += 1
        self.progress = {"state": "done", "counts": counts, "started": started, "finished": time.time(),
                         "seconds": round(time.time() - started, 3)}
        log.info("index_rebuilt", events=counts["event"], memories=counts["memory"], skills=counts["skill"],
                 files=counts["file"], seconds=self.progress["seconds"])
        self._publish()

    def _all_events(self, tail: Positions) -> Iterator:
        """Every event's entry: the current segments, then the log past them (``tail`` records
        the log objects both cover)."""
        bios = self.biographies
        for attempt in range(5):  # a compaction between reading segments and the tail: read again
            if attempt:
                yield _READ_AGAIN
            snapshot = bios.snapshot()
            for writer, seq in snapshot.positions.items():  # what the segments hold
                advance(tail, writer, seq)
            for segment in bios.segments(snapshot):
                agent = segment.value("agent") or ""
                for event in bio_schema.table_to_events(bios.files.table(segment.key), agent):
                    yield event_of(event.to_record())
            for obj in self.log.reader.read_pending(snapshot.positions):
                for record in obj.records:
                    if isinstance(record, BioRecord):
                        yield event_of(record.event)
                advance(tail, obj.writer, obj.seq)
            if self.log.checkpoints.load("compactor").etag == snapshot.etag:
                return

    # -- reading ------------------------------------------------------------------------

    def search(self, principal: Principal, query: str, filters: Mapping[str, Any] | None = None,
               limit: int = 10, offset: int = 0, context: Mapping[str, str] | None = None) -> dict:
        """``/v1/search``'s answer: ``{hits, count, took_ms, warnings, index}``. ``context``: the
        request's policy condition keys (``aws:sourceip``...), as the items' own reads see them.

        Raises :class:`indexer.QueryError` (a 400) for input refused outright and
        :class:`IndexNotReady` while the index is being opened."""
        started = time.perf_counter()
        searcher = self._searcher
        if searcher is None:
            raise IndexNotReady("The search index is being opened; try again in a moment.")
        context = context or {}
        access = self.tokens.access(principal, context)
        tokens = sorted(access.tokens)
        clean = {k: v for k, v in (filters or {}).items() if v not in (None, "", [])}
        t_access, sent = time.perf_counter(), time.monotonic()
        try:
            found = self._workers.search(str(self._dir), self._generation, query or "", clean, tokens,
                                         limit, offset, access.exclusions)
        except SearchCrashed as exc:
            log.error("search_worker_crashed", detail=str(exc)[:300])
            raise SearchFailed("The search stopped before it finished and was not retried; "
                               "simplify the query or try again.") from None
        except WorkerFailed as exc:
            log.warning("search_worker_failed", detail=str(exc)[:300])
            result = searcher.search(query or "", clean, tokens, limit, offset, access.exclusions)
            found = {"hits": [hit.to_dict() for hit in result.hits], "count": result.count,
                     "warnings": result.warnings}
        t_found, got = time.perf_counter(), time.monotonic()
        hits, refused = [], 0
        for row in found["hits"]:
            if not self.tokens.hit_allowed(principal, row, context):
                refused += 1
                continue
            row["href"] = href(row)
            hits.append(row)
        took = (time.perf_counter() - started) * 1000
        if took > SLOW_SEARCH_MS:
            # where the time went: the caller's tokens, the pipe to the worker, its reload and
            # search, the pipe back (monotonic clocks agree across processes on one host)
            timing = found.get("timing") or {}
            log.info("search_slow", took_ms=round(took, 1), access_ms=round((t_access - started) * 1000, 1),
                     to_worker_ms=round((timing.get("received", sent) - sent) * 1000, 1),
                     reload_ms=timing.get("reload_ms"), search_ms=timing.get("search_ms"),
                     from_worker_ms=round((got - timing.get("answered", got)) * 1000, 1),
                     wait_ms=round((t_found - started) * 1000, 1), hits=len(hits))
        return {"hits": hits, "count": max(0, found["count"] - refused),
                "took_ms": round(took, 3),
                "warnings": found["warnings"], "index": self.freshness()}

    def freshness(self) -> dict:
        out: dict[str, Any] = {"role": self.role}
        if self._writer is None and self._snapshot.get("created"):
            out["snapshot_age_seconds"] = round(max(0.0, time.time() - self._snapshot["created"]), 3)
        return out

    def status(self) -> dict:
        """Checkpoint, lag, snapshot age and holder (``/v1/index/status``)."""
        now = time.time()
        manifest = latest(self.blobs, PREFIX)
        # a writer has read past its last commit; what it read is not searchable until then
        shown = self._committed if self._writer is not None else self.positions
        try:
            lag = len(self.log.reader.pending(shown))
        except StoreError:
            lag = None
        searcher = self._searcher
        holder = self.lease.holder_now()
        return {
            "role": self.role,
            "may_write": self.may_write,
            "holder": holder.get("holder") if holder and holder.get("expires", 0) > now else None,
            "checkpoint": dict(sorted(self.positions.items())),
            "lag_objects": lag,
            "docs": searcher.num_docs if searcher is not None else 0,
            "snapshot": None if manifest is None else {
                "seq": manifest.get("seq"), "docs": manifest.get("docs"),
                "created": manifest.get("created"),
                "age_seconds": round(max(0.0, now - float(manifest.get("created") or now)), 3)},
            "loaded_snapshot": self._snapshot.get("seq"),
            "stats": dict(self.stats),
            "rebuild": dict(self.progress),
        }

    # -- shutdown -------------------------------------------------------------------------

    def close(self) -> None:
        """Commit and publish what is pending (writer), give the lease up, drop the working copy."""
        with self._step_lock:
            self._closed = True
            if self._writer is not None:
                try:
                    if self._consume():
                        self._commit()
                    if self._dirty or self._writer.pending:
                        self._publish()
                except Exception as exc:  # noqa: BLE001 - the next writer catches up from the log
                    log.warning("index_final_publish_failed", error=exc.__class__.__name__)
                writer, self._writer = self._writer, None
                if writer is not None:
                    try:
                        writer.close()
                    except Exception:  # noqa: BLE001
                        pass
                try:
                    self.lease.release()
                except StoreError:
                    pass
            self._searcher = None
            self._workers.close()
            if self._dir is not None:
                workdirs.remove(self._dir)
                self._dir = None


def _about(manifest: dict | None) -> dict:
    if not manifest:
        return {}
    return {"seq": manifest.get("seq"), "created": manifest.get("created"), "docs": manifest.get("docs")}


def href(hit: Mapping[str, Any]) -> str:
    """Where the full item is fetched (REST path, or the s3:// URI of a workspace file)."""
    kind, source = hit.get("type"), str(hit.get("source", ""))
    if kind == "event":
        return f"/v1/events?agent={hit.get('agent', '')}&session={hit.get('session', '')}"
    if kind == "memory":
        return f"/v1/memory/{hit.get('scope', '')}/{hit.get('id', '')}"
    if kind == "skill":
        return f"/v1/skills/{hit.get('id', '')}?scope={hit.get('scope', '')}"
    return source


__all__ = ["CONSUMER", "IndexNotReady", "NotIndexWriter", "QueryError", "SearchIndex"]
