"""Biography events as a compaction stream: partitions, ids, Arrow tables, Parquet bytes."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa

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

    def sort(self, table: pa.Table) -> pa.Table:
        return table.sort_by(schema.SORT_KEYS)

    def encode(self, table: pa.Table, settled: bool = False) -> bytes:
        sink = io.BytesIO()
        schema.write_table(table, sink, compression_level=schema.SETTLED_ZSTD_LEVEL if settled else None)
        return sink.getvalue()


def read_events(table: pa.Table, agent: str) -> list[Event]:
    return schema.table_to_events(table, agent)


__all__ = ["BioStream", "partition", "read_events"]
