"""The biography service: ingestion, artifact events, queries, compaction and retention.

Handlers (REST and the ``biographies`` S3 bucket) call this; it knows nothing of HTTP.
Events are redacted before anything is stored, appended to the durable log (the
acknowledgement waits for the log object to be durable), and compacted into Parquet
in the background.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..log import BioRecord, DurableLog
from ..segments.compactor import Compactor, RunResult, Snapshot
from ..segments.files import SegmentFiles
from ..segments.manifest import Segment
from ..store.base import INTERNAL_BUCKET, ObjectStore, PreconditionFailed, WriteCondition
from ..store.objects import read_object, swap_condition, write_object
from . import query
from .events import Event, new_event_id
from .prepare import Prepared, Preparer
from .redact import Redactor
from .schema import date_of
from .workers import MIN_BODY, IngestWorkerGone, IngestWorkers

REDACTION_KEY = "bio/redaction.key"
RETENTION = "bio/retention.json"
#: Retention settings are re-read at most this often (another gateway may change them).
RETENTION_TTL = 5.0
_DAY = 86400
#: Events per log append when ingesting a very large batch.
INGEST_SLICE = 50_000


@dataclass
class RetentionPolicy:
    """Days a partition is kept, by its UTC date; None keeps it forever. Biographies have a
    default and per-agent days; audit records their own days."""

    default_days: int | None = None
    agents: dict[str, int | None] = field(default_factory=dict)
    audit_days: int | None = None

    def days_for(self, agent: str) -> int | None:
        return self.agents.get(agent, self.default_days)

    def expired(self, segment: Segment, now: float) -> bool:
        if segment.stream == "bio":
            days = self.days_for(segment.value("agent") or "")
        elif segment.stream == "audit":
            days = self.audit_days
        else:
            return False
        if days is None:
            return False
        cutoff = date_of(int((now - days * _DAY) * 1_000_000))
        return (segment.value("date") or "") < cutoff

    def to_dict(self) -> dict:
        return {"default_days": self.default_days, "agents": dict(sorted(self.agents.items())),
                "audit_days": self.audit_days}

    @classmethod
    def from_dict(cls, doc: dict) -> RetentionPolicy:
        return cls(doc.get("default_days"), doc.get("agents", {}), doc.get("audit_days"))


class Biographies:
    def __init__(self, store: ObjectStore, log: DurableLog, compactor: Compactor,
                 files: SegmentFiles, ingest_processes: int = 0) -> None:
        self.store = store
        self.log = log
        self.compactor = compactor
        self.files = files
        key = _redaction_key(store)
        self.redactor = Redactor(key)
        self.preparer = Preparer(self.redactor)
        #: ingest processes for large batches (None: every batch is prepared in-process)
        self.workers = IngestWorkers(key, ingest_processes) if ingest_processes else None
        self._retention = RetentionPolicy()
        self._retention_etag: str | None = None
        self._retention_read = 0.0
        self._retention_lock = threading.Lock()
        compactor.retention = lambda segment, now: self.retention().expired(segment, now)

    # -- writing --------------------------------------------------------------

    def prepare(self, body: bytes, caller: str, now_us: int, **limits: Any) -> Prepared:
        """A batch's records, ready for :meth:`append` (``limits``: see
        :meth:`Preparer.prepare`): prepared by an ingest process when the body is large enough
        to be worth one (see :mod:`.workers`), else here. Raises :class:`~.events.EventError`
        for an invalid batch."""
        if self.workers is not None and len(body) >= MIN_BODY:
            try:
                prepared = self.workers.prepare(body, caller, now_us, **limits)
            except IngestWorkerGone:
                prepared = None
            if prepared is not None:
                return prepared
        return self.preparer.prepare(body, caller, now_us, **limits)

    def append(self, prepared: Prepared) -> list[str]:
        """Append a prepared batch; returns once it is durable (its ids). A very large batch
        (an NDJSON object from S3) is appended in slices; should the log fail midway, a retry
        is harmless: ids are stable and duplicates collapse."""
        for start in range(0, len(prepared.records), INGEST_SLICE):
            self.log.append(prepared.records[start:start + INGEST_SLICE])
        return prepared.ids

    def ingest(self, events: list[Event]) -> list[str]:
        """Redact and append ``events``; returns once they are durable (their ids).

        A very large batch (an NDJSON object from S3) is appended in slices; should the
        log fail midway, a retry is harmless: ids are stable and duplicates collapse."""
        for start in range(0, len(events), INGEST_SLICE):
            self.log.append(self.preparer.records(events[start:start + INGEST_SLICE]))
        return [e.event_id for e in events]

    def replace_values(self, values: Iterable[str]) -> None:
        """The vault's values, redacted from every event from now on (here and in the ingest
        processes)."""
        values = list(values)
        self.redactor.replace_values(values)
        if self.workers is not None:
            self.workers.replace_values(values)

    def close(self) -> None:
        """Stop the ingest processes (the gateway is stopping: no request is left to prepare)."""
        if self.workers is not None:
            self.workers.close()

    def note(self, events: list[Event]) -> None:
        """Append without waiting (artifact events): durable within the log's flush interval."""
        self.log.append_nowait([BioRecord(self.preparer.redacted(e).to_record()) for e in events])

    def artifact(self, agent: str, op: str, bucket: str, key: str, size: int | None = None,
                 etag: str | None = None, source: str | None = None) -> None:
        """An object write, copy or delete an agent made in a workspace bucket."""
        now = int(time.time() * 1_000_000)
        data = {"op": op, "bucket": bucket, "key": key}
        for name, value in (("size", size), ("etag", etag), ("source", source)):
            if value is not None:
                data[name] = value
        event = Event(new_event_id(now), agent, f"s3:{bucket}", now, "artifact", tool=f"s3:{op}",
                      artifact_uri=f"s3://{bucket}/{uri_path(key)}",
                      data=orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode())
        self.note([event])

    # -- reading --------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return self.compactor.snapshot()

    def events(self, f: query.Filter, limit: int = 100,
               cursor: str | None = None) -> tuple[list[Event], str | None]:
        return self.compactor.consistent(
            lambda snapshot: query.page(snapshot, self.files, self.log.reader, f, limit, cursor))

    def sessions(self, agent: str) -> list[dict]:
        return query.sessions(self.compactor.consistent(
            lambda snapshot: query.gather(snapshot, self.files, self.log.reader, query.Filter(agent))))

    def segments(self, snapshot: Snapshot | None = None) -> list[Segment]:
        """The current biography segments (what the ``biographies`` bucket lists)."""
        return (snapshot or self.snapshot()).manifest.of("bio")

    def segment(self, path: str) -> Segment | None:
        """A current segment by its path in the bucket, ``agent=a/date=d/<id>.parquet``."""
        return self.snapshot().manifest.find("bio", path)

    # -- upkeep ---------------------------------------------------------------

    def compact(self) -> RunResult:
        """Commit what is buffered, then compact until the log holds nothing new."""
        self.log.flush()
        return self.compactor.run()

    def retention(self) -> RetentionPolicy:
        with self._retention_lock:
            if time.monotonic() - self._retention_read > RETENTION_TTL:
                self._load_retention()
            return self._retention

    def set_retention(self, agent: str | None, days: int | None, reset: bool = False) -> RetentionPolicy:
        """Set the default (agent None) or one agent's retention; days None keeps forever.
        ``reset`` drops an agent's own setting, so the default applies to it again."""

        def change(policy: RetentionPolicy) -> None:
            if agent is None:
                policy.default_days = days
            elif reset:
                policy.agents.pop(agent, None)
            else:
                policy.agents[agent] = days

        return self._change_retention(change)

    def set_audit_retention(self, days: int | None) -> RetentionPolicy:
        """How many days audit records are kept (None: forever)."""

        def change(policy: RetentionPolicy) -> None:
            policy.audit_days = days

        return self._change_retention(change)

    def _change_retention(self, change) -> RetentionPolicy:
        for _ in range(10):
            with self._retention_lock:
                self._load_retention()
                policy = RetentionPolicy.from_dict(self._retention.to_dict())
                change(policy)
                try:
                    info = write_object(self.store, INTERNAL_BUCKET, RETENTION,
                                        orjson.dumps(policy.to_dict()), "application/json",
                                        swap_condition(self._retention_etag))
                except PreconditionFailed:
                    continue
                self._retention, self._retention_etag = policy, info.etag
                self._retention_read = time.monotonic()
                return policy
        raise PreconditionFailed("retention settings kept changing; try again")

    def _load_retention(self) -> None:
        found = read_object(self.store, INTERNAL_BUCKET, RETENTION)
        if found is None:
            self._retention, self._retention_etag = RetentionPolicy(), None
        else:
            self._retention = RetentionPolicy.from_dict(orjson.loads(found[0]))
            self._retention_etag = found[1].etag
        self._retention_read = time.monotonic()


def _redaction_key(store: ObjectStore) -> bytes:
    """The deployment's key for redaction hashes: random, made once, sealed like everything."""
    found = read_object(store, INTERNAL_BUCKET, REDACTION_KEY)
    if found is not None:
        return found[0]
    try:
        write_object(store, INTERNAL_BUCKET, REDACTION_KEY, os.urandom(32),
                     condition=WriteCondition(if_none_match=True))
    except PreconditionFailed:
        pass  # another gateway made it first
    found = read_object(store, INTERNAL_BUCKET, REDACTION_KEY)
    assert found is not None
    return found[0]


def uri_path(key: str) -> str:
    """An object key as the path of an ``s3://`` URI, as event validation takes one: what a URI
    cannot hold as is (spaces, control characters, a byte a client sent that is not UTF-8) and
    ``%`` percent-encoded, everything else kept as the key spells it."""
    return "".join(c if c.isprintable() and not c.isspace() and c != "%" else
                   "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogateescape")) for c in key)
