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
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson

from ..log import BioRecord, DurableLog
from ..segments.compactor import Compactor, RunResult, Snapshot
from ..segments.files import SegmentFiles
from ..segments.manifest import Segment
from ..store.base import INTERNAL_BUCKET, ObjectStore, PreconditionFailed, WriteCondition
from ..store.objects import read_object, swap_condition, write_object
from . import query
from .events import Event, new_event_id
from .redact import Redactor, Views, scan_views_each
from .schema import date_of

REDACTION_KEY = "bio/redaction.key"
RETENTION = "bio/retention.json"
#: Retention settings are re-read at most this often (another gateway may change them).
RETENTION_TTL = 5.0
_DAY = 86400
#: Events per log append when ingesting a very large batch.
INGEST_SLICE = 50_000
#: Events redacted per hold of a slot (a 50,000-event S3 object does not hold one for long).
SLOT_EVENTS = 1_000
#: ... or this much of their content and data: a few events of megabytes each held a slot for
#: seconds (redaction runs at a few MB/s on text dense with credential keywords), and two such
#: requests stalled every other agent's append that long.
SLOT_CHARS = 256 * 1024


class Slots:
    """A counting semaphore that serves its waiters first come, first served.

    ``threading.Semaphore`` is not fair: a thread that releases and at once acquires again
    (a large batch redacted 1,000 events per hold) keeps the interpreter and wins the slot
    back, and a waiter can wait out the whole batch. Here a release hands the slot straight
    to the longest waiter.
    """

    def __init__(self, count: int) -> None:
        self._free = count
        self._lock = threading.Lock()
        self._waiters: deque[threading.Event] = deque()

    @property
    def free(self) -> int:
        return self._free

    def __enter__(self) -> None:
        with self._lock:
            if self._free and not self._waiters:
                self._free -= 1
                return
            turn = threading.Event()
            self._waiters.append(turn)
        try:
            turn.wait()  # set by the release that hands this thread its slot
        except BaseException:  # interrupted while waiting: leave the queue, or pass the slot on
            with self._lock:
                handed = turn.is_set()
                if not handed:
                    self._waiters.remove(turn)
            if handed:
                self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            if self._waiters:
                self._waiters.popleft().set()
            else:
                self._free += 1


#: Request threads that may validate and redact events at once. Only one runs Python at a
#: time (the GIL): sixteen clients' batches validated side by side take the interpreter in
#: turns, 1 ms each, while the threads that finish requests (the event loop, the log writer)
#: queue behind them. Two slots keep one large batch from holding up the rest.
INGEST_SLOTS = Slots(2)


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
                 files: SegmentFiles) -> None:
        self.store = store
        self.log = log
        self.compactor = compactor
        self.files = files
        self.redactor = Redactor(_redaction_key(store))
        self._retention = RetentionPolicy()
        self._retention_etag: str | None = None
        self._retention_read = 0.0
        self._retention_lock = threading.Lock()
        compactor.retention = lambda segment, now: self.retention().expired(segment, now)

    # -- writing --------------------------------------------------------------

    def ingest(self, events: list[Event]) -> list[str]:
        """Redact and append ``events``; returns once they are durable (their ids).

        A very large batch (an NDJSON object from S3) is appended in slices; should the
        log fail midway, a retry is harmless: ids are stable and duplicates collapse."""
        for start in range(0, len(events), INGEST_SLICE):
            self.log.append(self._records(events[start:start + INGEST_SLICE]))
        return [e.event_id for e in events]

    def _records(self, events: list[Event]) -> list[BioRecord]:
        """The redacted log records of ``events``, made in :data:`INGEST_SLOTS`, a slot held
        for at most :data:`SLOT_EVENTS` events or :data:`SLOT_CHARS` of their text."""
        records = []
        for chunk in _slot_chunks(events):
            with INGEST_SLOTS:
                views = scan_views_each([text for e in chunk for text in (e.content or "", e.data or "")])
                records += [BioRecord(self._redacted(e, views[2 * i], views[2 * i + 1]).to_record(),
                                      e.id_assigned, e.id_resent) for i, e in enumerate(chunk)]
        return records

    def note(self, events: list[Event]) -> None:
        """Append without waiting (artifact events): durable within the log's flush interval."""
        self.log.append_nowait([BioRecord(self._redacted(e).to_record()) for e in events])

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

    def _redacted(self, e: Event, content_views: Views | None = None,
                  data_views: Views | None = None) -> Event:
        """``e`` with its secrets redacted; the views: what :func:`scan_views_each` found in
        its content and data (the trigger pass made for a whole batch)."""
        hits = 0
        if e.content:
            e.content, n = self.redactor.redact_text(e.content, content_views)
            hits += n
        if e.data is not None:
            e.data, n = self.redactor.redact_json_text(e.data, data_views)
            hits += n
        if self.redactor.has_values:
            hits += self._redacted_names(e)
        e.redactions = hits
        return e

    def _redacted_names(self, e: Event) -> int:
        """A vault value pasted anywhere else (a URI's query, a tag) goes too; the pattern
        rules stay on content and data, where prose and tool output live."""
        hits = 0
        for name in ("artifact_uri", "tool", "model"):
            text = getattr(e, name)
            if text:
                text, n = self.redactor.redact_values(text)
                if n:
                    setattr(e, name, text)
                    hits += n
        if e.tags:
            redacted = [self.redactor.redact_values(tag) for tag in e.tags]
            if any(n for _, n in redacted):
                e.tags = [tag for tag, _ in redacted]
                hits += sum(n for _, n in redacted)
        return hits

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


def _slot_chunks(events: list[Event]) -> Iterator[list[Event]]:
    """``events`` in runs of at most SLOT_EVENTS events or SLOT_CHARS characters of text (a
    larger event alone)."""
    chunk: list[Event] = []
    size = 0
    for e in events:
        chunk.append(e)
        size += len(e.content or "") + len(e.data or "")
        if len(chunk) >= SLOT_EVENTS or size >= SLOT_CHARS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def uri_path(key: str) -> str:
    """An object key as the path of an ``s3://`` URI, as event validation takes one: what a URI
    cannot hold as is (spaces, control characters, a byte a client sent that is not UTF-8) and
    ``%`` percent-encoded, everything else kept as the key spells it."""
    return "".join(c if c.isprintable() and not c.isspace() and c != "%" else
                   "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogateescape")) for c in key)
