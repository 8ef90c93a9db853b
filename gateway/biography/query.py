"""Reading a biography: compacted segments merged with the log's uncompacted tail.

One loaded checkpoint is the snapshot: its manifest names the segments and its
positions say where the tail starts, so every acknowledged event is seen exactly once
(retries of one event id collapse to the first), including those acknowledged a moment
ago (read-your-writes).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass

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


class BadCursor(ValueError):
    """A cursor that this query did not hand out."""


@dataclass(frozen=True)
class Filter:
    agent: str
    session: str | None = None
    kinds: frozenset[str] | None = None
    since: int | None = None  # microseconds, inclusive
    until: int | None = None  # microseconds, exclusive

    def keeps(self, e: Event) -> bool:
        return ((self.session is None or e.session == self.session)
                and (self.kinds is None or e.kind in self.kinds)
                and (self.since is None or e.ts >= self.since)
                and (self.until is None or e.ts < self.until))

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
    """
    timeline = f.session is None
    after_ts = after[0] if timeline and after else None
    seen: set[str] = set()
    out: list[Event] = []
    for segment in segments_for(snapshot, f, after_ts):
        table = _filtered(files.table(segment.key), f)
        if timeline and after:
            table = _past(table, after)
        if timeline and limit is not None:
            table = table.sort_by([("ts", "ascending"), ("event_id", "ascending")]).slice(0, limit + 1)
        for e in schema.table_to_events(table, f.agent):
            if e.event_id not in seen:
                seen.add(e.event_id)
                out.append(e)
    for e in tail(snapshot, reader, f.agent):
        if e.event_id not in seen and f.keeps(e):
            seen.add(e.event_id)
            out.append(e)
    out.sort(key=f.sort_key)
    if after is not None:
        out = out[_bisect(out, f, after):]
    return out


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
        key = tuple(doc["k"])
        if doc.get("s") != f.session or len(key) != (4 if f.session is not None else 2):
            raise ValueError
        return key
    except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        raise BadCursor("cursor is not one this query handed out; start again without it") from None


# -- sessions --------------------------------------------------------------------


def sessions(events: Iterable[Event]) -> list[dict]:
    """Per session: first and last time, event count, and the questions still open."""
    summary: dict[str, dict] = {}
    questions: dict[str, dict[str, Event]] = {}
    answered: set[tuple[str, str]] = set()
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
            answered.add((e.session, e.parent_id))
    out = []
    for name, s in sorted(summary.items(), key=lambda item: item[1]["last_ts"], reverse=True):
        open_questions = [q for qid, q in questions.get(name, {}).items() if (name, qid) not in answered]
        open_questions.sort(key=time_key)
        out.append({"session": name, "first_ts": format_ts(s["first_ts"]), "last_ts": format_ts(s["last_ts"]),
                    "events": s["events"], "kinds": dict(sorted(s["kinds"].items())),
                    "open_questions": [{"event_id": q.event_id, "ts": format_ts(q.ts),
                                        "content": (q.content or "")[:QUESTION_PREVIEW]}
                                       for q in open_questions]})
    return out

