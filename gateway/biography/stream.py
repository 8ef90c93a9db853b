"""Biography events as a compaction stream: partitions, ids, Arrow tables, Parquet bytes."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..log import BioRecord
from . import schema
from .events import Event


def partition(agent: str, date: str) -> str:
    return f"agent={agent}/date={date}"


class BioStream:
    name = "bio"
    record_type = BioRecord
    id_column = "event_id"
    ts_column = "ts"

    def payload(self, record: BioRecord) -> dict[str, Any]:
        return record.event

    def partition_of(self, payload: dict[str, Any]) -> str:
        missing = [name for name in schema.REQUIRED_FIELDS if payload.get(name) is None]
        if missing:  # the compactor skips and logs it: no segment can hold it
            raise KeyError(f"a record without {sorted(missing)}")
        return partition(payload["agent"], schema.date_of(payload["ts"]))

    def id_of(self, payload: dict[str, Any]) -> str:
        return payload["event_id"]

    def to_table(self, payloads: list[dict[str, Any]]) -> pa.Table:
        return schema.records_to_table(payloads)

    def partitions(self, records: list[BioRecord]) -> dict[str, pa.Table] | None:
        """A run's events by partition, each a table in segment order, made by Arrow rather
        than record by record (which cost ~5 µs an event of the interpreter the ingest path
        needs), from their log lines (as an ingest process left them, else encoded here): one
        sort of the run by (agent, day, then segment order), sliced. None when a record is
        unusable or an id comes twice in the run: the compactor then groups record by record,
        skipping the one and keeping the first of the other."""
        made = schema.lines_table([r.encoded() for r in records])
        if made is None:
            return None
        table, agents = made
        if pc.count_distinct(table.column("event_id")).as_py() != table.num_rows:
            return None
        days = pc.divide(table.column("ts").cast(pa.int64()), schema.DAY_US)
        keyed = table.append_column(_AGENT, agents).append_column(_DAY, days)
        keyed = keyed.take(pc.sort_indices(keyed, sort_keys=[(_AGENT, "ascending"), (_DAY, "ascending")]
                                           + schema.SORT_KEYS))
        # each (agent, day) with its row count, in the same order: the counts are the offsets
        groups = keyed.select([_AGENT, _DAY]).group_by([_AGENT, _DAY], use_threads=False) \
            .aggregate([(_DAY, "count")]).sort_by([(_AGENT, "ascending"), (_DAY, "ascending")])
        out, start = {}, 0
        table = keyed.drop_columns([_AGENT, _DAY])
        for agent, day, count in zip(groups.column(_AGENT).to_pylist(), groups.column(_DAY).to_pylist(),
                                     groups.column(f"{_DAY}_count").to_pylist(), strict=True):
            out[partition(agent, schema.date_of(day * schema.DAY_US))] = table.slice(start, count)
            start += count
        return out

    def sort(self, table: pa.Table) -> pa.Table:
        return table.sort_by(schema.SORT_KEYS)

    def encode(self, table: pa.Table, settled: bool = False) -> bytes:
        sink = io.BytesIO()
        schema.write_table(table, sink, compression_level=schema.SETTLED_ZSTD_LEVEL if settled else None)
        return sink.getvalue()


_AGENT, _DAY = "__agent", "__day"


def read_events(table: pa.Table, agent: str) -> list[Event]:
    return schema.table_to_events(table, agent)


__all__ = ["BioStream", "partition", "read_events"]
