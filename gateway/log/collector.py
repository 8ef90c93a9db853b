"""Removing log objects every consumer has passed.

An object goes only when every registered consumer's checkpoint lies at or beyond it;
a consumer that never saved a checkpoint holds everything. Deleting is idempotent, so
two gateways collecting at once only repeat each other's work.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..store.base import NoSuchKey, ObjectStore
from . import layout
from .checkpoints import Checkpoints
from .reader import LogReader


def collect(store: ObjectStore, reader: LogReader, checkpoints: Checkpoints,
            consumers: Iterable[str]) -> int:
    """Delete every log object all ``consumers`` have passed; returns how many went."""
    loaded = [checkpoints.load(name) for name in consumers]
    if not loaded:
        return 0
    removed = 0
    for writer in reader.writers():
        floor = min(cp.positions.get(writer, 0) for cp in loaded)
        if floor <= 0:
            continue
        for seq in list(reader.sequences(writer)):
            if seq > floor:
                break
            try:
                store.delete_object(layout.BUCKET, layout.log_key(writer, seq))
            except NoSuchKey:
                pass
            reader.forget(writer, seq)
            removed += 1
    return removed
