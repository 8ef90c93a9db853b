"""Reading a biography: compacted segments merged with the log's uncompacted tail.

One loaded checkpoint is the snapshot: its manifest names the segments and its
positions say where the tail starts, so every acknowledged event is seen exactly once,
including those acknowledged a moment ago (read-your-writes).

Retries of one event id collapse to the copy stored first: the one in the agent's
segments within a day of it if there is one, else the earliest in the log tail. A later
copy is dropped even when the first copy falls outside the filter or before the cursor,
so no page repeats an id (a retry sent without ``ts`` gets a new server time and may sort
far from the first copy, on another page). The compactor keeps the same copy, within
the same one-day window (see ``gateway/segments/compactor.py``), so pages read the same
before and after compaction.
"""

from __future__ import annotations

import base64
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ..log import BioRecord, LogReader
from ..segments.compactor import Snapshot
from ..segments.files import SegmentFiles
from ..segments.manifest import Segment
from . import schema
from .events import Event, format_ts, order_key, time_key

#: How much of a question's text the sessions summary shows.
QUESTION_PREVIEW = 200
#: Event ids of segments kept in memory (segments never change), about 35 bytes each.
ID_CACHE_IDS = 1_000_000
_INT64 = (-(2**63), 2**63 - 1)
_DAY_US = 86_400_000_000


class BadCursor(ValueError):
    """A cursor that this query did not hand out."""


@dataclass(frozen=True)
class Filter:
    agent: str
    session: str | None = None
    kinds: frozenset[str] | None = None
    since: int | None = None  # microseconds, inclusive
    until: int | None = None  # microseconds, exclusive
    #: the sessions the reader may see (a Deny can take some of a granted agent's); None: all
    readable: Callable[[str], bool] | None = field(default=None, compare=False)

    def keeps(self, e: Event) -> bool:
        return ((self.session is None or e.session == self.session)
                and (self.kinds is None or e.kind in self.kinds)
                and (self.since is None or e.ts >= self.since)
                and (self.until is None or e.ts < self.until)
                and (self.readable is None or self.readable(e.session)))

    def sort_key(self, e: Event) -> tuple:
        """A session reads in session order; an agent's timeline in time order."""
        return order_key(e) if self.session is not None else time_key(e)


def segments_for(snapshot: Snapshot, f: Filter, after_ts: int | None = None) -> list[Segment]:
    """The agent's segments that can hold matching events (by partition and ts range)."""
    out = []
    for s in snapshot.manifest.of("bio"):
        if s.value("agent") != f.agent:
            continue
        if f.since is not None and s.max_ts < f.since:
            continue
        if f.until is not None and s.min_ts >= f.until:
            continue
        if after_ts is not None and s.max_ts < after_ts:
            continue
        out.append(s)
    return out


def gather(snapshot: Snapshot, files: SegmentFiles, reader: LogReader, f: Filter,
           after: tuple | None = None, limit: int | None = None) -> list[Event]:
    """Matching events after ``after`` (a sort key), each id once, in the filter's order.

    In time order, each segment is cut to its first ``limit`` rows past the cursor in
    Arrow before any row becomes an Event, so reading page N costs a page, not N pages.
    Tail events are checked against the agent's segments by their id columns alone
    (cached), not by reading their rows.
    """
    timeline = f.session is None
    after_ts = after[0] if timeline and after else None
    kept: dict[str, list[int]] = {}  # event id -> the times of the copies kept
    out: list[Event] = []
    for segment in segments_for(snapshot, f, after_ts):
        table = _filtered(files.table(segment.key), f)
        if timeline and after:
            table = _past(table, after)
        if timeline and limit is not None:
            table = table.sort_by([("ts", "ascending"), ("event_id", "ascending")]).slice(0, limit + 1)
        for e in schema.table_to_events(table, f.agent):
            times = kept.get(e.event_id)
            if times is None:
                kept[e.event_id] = [e.ts]
            elif any(_same_window(t, e.ts) for t in times):
                continue  # a retry's second copy: the compactor's window, a day either side
            else:
                times.append(e.ts)  # the id used again days later: another event
            out.append(e)
    out += [e for e in first_copies(snapshot, files, reader, f.agent) if f.keeps(e)]
    out.sort(key=f.sort_key)
    if after is not None:
        out = out[_bisect(out, f, after):]
    return out


def first_copies(snapshot: Snapshot, files: SegmentFiles, reader: LogReader, agent: str) -> list[Event]:
    """The agent's tail events that are the first stored copy of their id: the earliest
    in the tail, unless a segment of the agent within a day of it holds the id already
    (the compactor's window, so a page reads the same before and after compaction)."""
    first: dict[str, list[Event]] = {}  # id -> its first copies, days apart
    for e in tail(snapshot, reader, agent):
        copies = first.setdefault(e.event_id, [])
        if not any(_same_window(c.ts, e.ts) for c in copies):
            copies.append(e)
    if not first:
        return []
    events = [e for copies in first.values() for e in copies]
    days = {d for e in events for d in _days_around(e.ts)}
    stored = _stored_ids(snapshot, files, agent, days, first.keys())
    return [e for e in events if not stored.get(e.event_id, set()).intersection(_days_around(e.ts))]


def _days_around(ts_us: int) -> tuple[str, ...]:
    """The dates of the day before, of, and after ``ts_us`` (those that exist: an event at
    the end of 9999-12-31 has no day after)."""
    days = []
    for step in (-1, 0, 1):
        try:
            days.append(schema.date_of(ts_us + step * _DAY_US))
        except OverflowError:
            pass
    return tuple(days)


def _same_window(first_ts: int, ts: int) -> bool:
    """Whether ``ts`` falls within a day either side of ``first_ts`` (by UTC date), where a
    second copy of an id is a retry of the first, not a new event."""
    return abs(ts // _DAY_US - first_ts // _DAY_US) <= 1


def _stored_ids(snapshot: Snapshot, files: SegmentFiles, agent: str, days: Collection[str],
                ids: Collection[str]) -> dict[str, set[str]]:
    """Those of ``ids`` that a segment of ``agent`` dated one of ``days`` holds, with the
    dates of the segments that hold each."""
    wanted = pa.array(list(ids), pa.string())
    found: dict[str, set[str]] = {}
    for segment in snapshot.manifest.of("bio"):
        date = segment.value("date")
        if segment.value("agent") == agent and date in days:
            held = _ID_CACHE.get(files, segment.key)
            for event_id in held.filter(pc.is_in(held, value_set=wanted)).to_pylist():
                found.setdefault(event_id, set()).add(date)
    return found


class _IdCache:
    """Segment key -> its ``event_id`` column (read alone; segments never change), least
    recently used dropped first, so a page of an agent with a busy tail does not decode
    every one of its segments again."""

    def __init__(self, limit: int) -> None:
        self._ids: OrderedDict[str, pa.Array] = OrderedDict()
        self._held = 0
        self._limit = limit
        self._lock = threading.Lock()

    def get(self, files: SegmentFiles, key: str) -> pa.Array:
        with self._lock:
            ids = self._ids.get(key)
            if ids is not None:
                self._ids.move_to_end(key)
                return ids
        ids = files.table(key, ["event_id"])["event_id"].combine_chunks()
        with self._lock:
            if key not in self._ids:
                self._ids[key] = ids
                self._held += len(ids)
                while self._held > self._limit and len(self._ids) > 1:
                    _, old = self._ids.popitem(last=False)
                    self._held -= len(old)
        return ids


_ID_CACHE = _IdCache(ID_CACHE_IDS)


def _past(table: pa.Table, after: tuple) -> pa.Table:
    """Rows whose (ts, event_id) comes after the cursor's."""
    ts = table["ts"].cast(pa.int64())
    later = pc.greater(ts, after[0])
    same = pc.and_(pc.equal(ts, after[0]), pc.greater(table["event_id"], after[1]))
    return table.filter(pc.or_(later, same))


def tail(snapshot: Snapshot, reader: LogReader, agent: str | None = None) -> Iterable[Event]:
    """Events acknowledged but not yet compacted (of one agent, or of all)."""
    for obj in reader.read_pending(snapshot.positions):
        for record in obj.records:
            if isinstance(record, BioRecord) and (agent is None or record.event["agent"] == agent):
                yield Event.from_record(record.event)


def _filtered(table: pa.Table, f: Filter) -> pa.Table:
    mask = None
    if f.session is not None:
        mask = _and(mask, pc.equal(table["session"], f.session))
    if f.kinds is not None:
        mask = _and(mask, pc.is_in(table["kind"], pa.array(sorted(f.kinds), pa.string())))
    ts = table["ts"].cast(pa.int64())
    if f.since is not None:
        mask = _and(mask, pc.greater_equal(ts, f.since))
    if f.until is not None:
        mask = _and(mask, pc.less(ts, f.until))
    if f.readable is not None:
        # before any page is cut from the segment, so a page is never short for it
        hidden = [s for s in pc.unique(table["session"]).to_pylist() if not f.readable(s)]
        if hidden:
            mask = _and(mask, pc.invert(pc.is_in(table["session"], pa.array(hidden, pa.string()))))
    return table if mask is None else table.filter(mask)


def _and(mask, more):
    return more if mask is None else pc.and_(mask, more)


# -- pages -----------------------------------------------------------------------


def page(snapshot: Snapshot, files: SegmentFiles, reader: LogReader, f: Filter, limit: int,
         cursor: str | None) -> tuple[list[Event], str | None]:
    """One page after ``cursor``, and the cursor of the next page (None at the end)."""
    after = decode_cursor(cursor, f) if cursor else None
    events = gather(snapshot, files, reader, f, after, limit)
    chosen = events[:limit]
    more = len(events) > limit
    return chosen, encode_cursor(f.sort_key(chosen[-1]), f) if more and chosen else None


def _bisect(events: list[Event], f: Filter, after: tuple) -> int:
    lo, hi = 0, len(events)
    while lo < hi:
        mid = (lo + hi) // 2
        if f.sort_key(events[mid]) <= after:
            lo = mid + 1
        else:
            hi = mid
    return lo


def encode_cursor(key: tuple, f: Filter) -> str:
    doc = {"k": list(key), "s": f.session}
    return base64.urlsafe_b64encode(orjson.dumps(doc)).decode().rstrip("=")


def decode_cursor(cursor: str, f: Filter) -> tuple:
    try:
        doc = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if type(doc) is not dict or doc.get("s") != f.session or type(doc.get("k")) is not list:
            raise ValueError
        key = tuple(doc["k"])
        # what the sort key holds (events.order_key in a session, else time_key), exactly
        types = (bool, int, int, str) if f.session is not None else (int, str)
        if len(key) != len(types) or any(type(v) is not t for v, t in zip(key, types, strict=True)):
            raise ValueError
        if any(type(v) is int and not _INT64[0] <= v <= _INT64[1] for v in key):
            raise ValueError
        return key
    except (ValueError, KeyError, TypeError):  # binascii.Error and JSONDecodeError are ValueErrors
        raise BadCursor("cursor is not one this query handed out; start again without it") from None


# -- sessions --------------------------------------------------------------------


def sessions(events: Iterable[Event]) -> list[dict]:
    """Per session: first and last time, event count, and the questions still open."""
    summary: dict[str, dict] = {}
    questions: dict[str, dict[str, Event]] = {}
    #: (session, question id) -> the session-order key of its latest answer
    answered: dict[tuple[str, str], tuple] = {}
    for e in events:
        s = summary.get(e.session)
        if s is None:
            s = summary[e.session] = {"session": e.session, "first_ts": e.ts, "last_ts": e.ts, "events": 0,
                                      "kinds": {}}
        s["events"] += 1
        s["first_ts"] = min(s["first_ts"], e.ts)
        s["last_ts"] = max(s["last_ts"], e.ts)
        s["kinds"][e.kind] = s["kinds"].get(e.kind, 0) + 1
        if e.kind == "question":
            questions.setdefault(e.session, {})[e.event_id] = e
        elif e.kind == "answer" and e.parent_id:
            key = (e.session, e.parent_id)
            answered[key] = max(answered.get(key, ()), order_key(e))
    out = []
    for name, s in sorted(summary.items(), key=lambda item: item[1]["last_ts"], reverse=True):
        # only a later answer (in session order, as the context pack reads it) closes a question
        open_questions = [q for qid, q in questions.get(name, {}).items()
                          if answered.get((name, qid), ()) <= order_key(q)]
        open_questions.sort(key=time_key)
        out.append({"session": name, "first_ts": format_ts(s["first_ts"]), "last_ts": format_ts(s["last_ts"]),
                    "events": s["events"], "kinds": dict(sorted(s["kinds"].items())),
                    "open_questions": [{"event_id": q.event_id, "ts": format_ts(q.ts),
                                        "content": (q.content or "")[:QUESTION_PREVIEW]}
                                       for q in open_questions]})
    return out

