"""Removing log objects every consumer has passed.

An object goes only when every registered consumer's checkpoint lies at or beyond it;
a consumer that never saved a checkpoint holds everything. Deleting is idempotent, so
two gateways collecting at once only repeat each other's work.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from ..store.base import NoSuchKey, ObjectStore
from . import layout
from .checkpoints import Checkpoints
from .reader import LogReader

#: Deletes in flight at once.
PARALLEL = 16


def collect(store: ObjectStore, reader: LogReader, checkpoints: Checkpoints,
            consumers: Iterable[str]) -> int:
    """Delete every log object all ``consumers`` have passed; returns how many went."""
    loaded = [checkpoints.load(name) for name in consumers]
    if not loaded:
        return 0
    doomed = []
    for writer in reader.writers():
        floor = min(cp.positions.get(writer, 0) for cp in loaded)
        if floor <= 0:
            continue
        for seq in reader.sequences(writer):
            if seq > floor:
                break
            doomed.append((writer, seq))
    if not doomed:
        return 0

    def delete(item: tuple[str, int]) -> None:
        try:
            store.delete_object(layout.BUCKET, layout.log_key(*item))
        except NoSuchKey:
            pass
        reader.forget(*item)

    with ThreadPoolExecutor(min(PARALLEL, len(doomed)), "orgmem-logcollect") as pool:
        list(pool.map(delete, doomed))  # an upstream S3 answers each delete in milliseconds
    return len(doomed)
