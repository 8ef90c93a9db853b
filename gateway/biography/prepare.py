"""From a request body to the log records of its events: parse, validate, redact.

:class:`Preparer` is what both the gateway's request threads and its ingest processes
(:mod:`.workers`) run, so a body becomes the same records wherever it is prepared. It holds
no store and no log: only the deployment's :class:`~.redact.Redactor`.

Validation and redaction take a slot of :data:`INGEST_SLOTS` in the gateway's interpreter:
only one thread runs Python at a time, and two slots keep one large batch from holding up
the threads that finish requests (the event loop, the log writer).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..log import BioRecord
from .events import Event, validate_batch
from .redact import Redactor, Views, scan_views_each

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


@dataclass(slots=True)
class Prepared:
    """A batch ready for the log: its records, its ids, and whose biographies it writes (what
    the caller must be allowed: the first event's ``(agent, session)``, then the others')."""

    records: list[BioRecord]
    ids: list[str]
    first: tuple[str, str]
    others: list[tuple[str, str]]


class Preparer:
    """Validates and redacts events with one deployment's :class:`Redactor`."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor

    def prepare(self, body: bytes, caller: str, now_us: int, **limits: Any) -> Prepared:
        """The records of a batch (a ``POST /v1/events`` body, an uploaded NDJSON object);
        ``limits``: :func:`~.events.validate_batch`'s ``id_namespace``, ``max_body`` and
        ``max_events``. Raises :class:`~.events.EventError`."""
        with INGEST_SLOTS:
            events = validate_batch(body, caller=caller, now_us=now_us, **limits)
        first = (events[0].agent, events[0].session)
        others = sorted({(e.agent, e.session) for e in events[1:]})
        return Prepared(self.records(events), [e.event_id for e in events], first, others)

    def records(self, events: list[Event]) -> list[BioRecord]:
        """The redacted log records of ``events``, made in :data:`INGEST_SLOTS`, a slot held
        for at most :data:`SLOT_EVENTS` events or :data:`SLOT_CHARS` of their text."""
        records = []
        for chunk in _slot_chunks(events):
            with INGEST_SLOTS:
                views = scan_views_each([text for e in chunk for text in (e.content or "", e.data or "")])
                records += [BioRecord(self.redacted(e, views[2 * i], views[2 * i + 1]).to_record(),
                                      e.id_assigned, e.id_resent) for i, e in enumerate(chunk)]
        return records

    def redacted(self, e: Event, content_views: Views | None = None,
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
