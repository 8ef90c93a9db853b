"""The durable log: group-committed, typed records in the object store.

Everything that needs later work (biography events, audit records, "document changed"
notices) is appended here first; consumers (the biography compactor, later the search
index) read it with checkpoints, and objects every consumer has passed are collected.
The design note is ``gateway/log/DESIGN.md``.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..store.base import ObjectStore
from .checkpoints import Checkpoint, CheckpointConflict, Checkpoints, advance
from .collector import collect
from .layout import Positions
from .reader import LogObject, LogReader
from .records import AuditEntry, BioRecord, DocChanged, LogFormatError, Record
from .writer import LogUnavailable, LogWriter, Position


class DurableLog:
    """One gateway's handle on the shared log: its own writer, a reader of everyone's objects."""

    def __init__(self, store: ObjectStore, consumers: Iterable[str] = (), flush_interval: float = 1.0,
                 writer_id: str | None = None) -> None:
        self.store = store
        self.reader = LogReader(store)
        self.writer = LogWriter(store, writer_id, flush_interval, on_commit=self.reader.remember)
        self.checkpoints = Checkpoints(store)
        #: every consumer whose checkpoint holds back collection
        self.consumers = tuple(consumers)

    @property
    def writer_id(self) -> str:
        return self.writer.writer_id

    def start(self) -> DurableLog:
        self.writer.start()
        return self

    def close(self) -> None:
        self.writer.close()

    def append(self, records: list[Record], timeout: float = 30.0) -> Position:
        """Acknowledged: returns once the records are durable in the store."""
        return self.writer.append(records, timeout)

    def append_nowait(self, records: list[Record]) -> None:
        """Buffered: durable within the writer's flush interval."""
        self.writer.append_nowait(records)

    def flush(self) -> Position | None:
        return self.writer.flush()

    def collect(self) -> int:
        """Remove the log objects every consumer has passed."""
        return collect(self.store, self.reader, self.checkpoints, self.consumers)


__all__ = [
    "AuditEntry", "BioRecord", "Checkpoint", "CheckpointConflict", "Checkpoints", "DocChanged",
    "DurableLog", "LogFormatError", "LogObject", "LogReader", "LogUnavailable", "LogWriter", "Position",
    "Positions", "Record", "advance", "collect",
]
