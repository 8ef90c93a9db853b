"""Consumer checkpoints: how far each consumer has read, as compare-and-swap objects.

A checkpoint holds the consumer's positions and, beside them, whatever state must
change atomically with them: the biography compactor keeps its manifest of Parquet
segments here, so "these records were compacted" and "into these segments" are one
swap. Of two gateways consuming the same stretch at once, exactly one swap wins; the
other sees :class:`CheckpointConflict`, discards its work and reads again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ..store.base import ObjectStore, PreconditionFailed
from ..store.objects import read_object, swap_condition, write_object
from . import layout
from .layout import Positions

FORMAT_VERSION = 1


class CheckpointConflict(Exception):
    """Another process moved the checkpoint since it was loaded."""


@dataclass
class Checkpoint:
    consumer: str
    positions: Positions = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    #: the stored version this was loaded from (None: never saved)
    etag: str | None = None

    def passed(self, writer: str, seq: int) -> bool:
        return self.positions.get(writer, 0) >= seq


class Checkpoints:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def load(self, consumer: str) -> Checkpoint:
        found = read_object(self.store, layout.BUCKET, layout.checkpoint_key(consumer))
        if found is None:
            return Checkpoint(consumer)
        doc = orjson.loads(found[0])
        return Checkpoint(consumer, {w: int(s) for w, s in doc.get("positions", {}).items()},
                          doc.get("state", {}), found[1].etag)

    def save(self, checkpoint: Checkpoint, positions: Positions, state: dict[str, Any]) -> Checkpoint:
        """Swap in new positions and state, or raise :class:`CheckpointConflict`."""
        doc = {"format": FORMAT_VERSION, "consumer": checkpoint.consumer,
               "positions": dict(sorted(positions.items())), "state": state}
        try:
            info = write_object(self.store, layout.BUCKET, layout.checkpoint_key(checkpoint.consumer),
                                orjson.dumps(doc), "application/json", swap_condition(checkpoint.etag))
        except PreconditionFailed:
            raise CheckpointConflict(f"checkpoint {checkpoint.consumer} moved") from None
        return Checkpoint(checkpoint.consumer, dict(positions), state, info.etag)


def advance(positions: Positions, writer: str, seq: int) -> None:
    """Record that ``writer``'s objects up to ``seq`` were consumed."""
    if positions.get(writer, 0) < seq:
        positions[writer] = seq
