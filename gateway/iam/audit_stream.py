"""Audit records as a compaction stream: one Parquet partition per UTC day.

The compactor turns the :class:`~gateway.log.AuditEntry` records of the durable log into
zstd Parquet segments under ``parquet/audit/date=<yyyy-mm-dd>/`` of the internal bucket
(sealed like everything else). A segment has one column per field of the audit contract
(:class:`~gateway.iam.audit.AuditRecord`), in its order: ``time`` is a UTC timestamp in
microseconds (the records carry milliseconds), ``status`` an int32, ``bytes_in`` and
``bytes_out`` int64, everything else a string. Rows are sorted by ``(time, request_id)``,
and the file says so in its ``sorting_columns``; the partition's date is in the path only.
"""

from __future__ import annotations

import io
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..log import AuditEntry

FORMAT_VERSION = 1
ZSTD_LEVEL = 3
ROW_GROUP_ROWS = 65_536
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def _f(name: str, type_: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"description": doc})


AUDIT_SCHEMA = pa.schema(
    [
        _f("time", pa.timestamp("us", tz="UTC"), "When the request was answered (UTC, milliseconds).",
           nullable=False),
        _f("request_id", pa.string(), "The request's id (the x-amz-request-id header).", nullable=False),
        _f("principal", pa.string(), "Who made it; null when authentication failed."),
        _f("access_key", pa.string(), "The access key ID used or claimed; never a secret."),
        _f("action", pa.string(), "The action authorized, e.g. s3:GetObject."),
        _f("resource", pa.string(), "The ARN it was authorized on."),
        _f("operation", pa.string(), "The S3 or API operation, e.g. GetObject, CreateAgent."),
        _f("decision", pa.string(), "allow or deny."),
        _f("reason", pa.string(), "The deciding statement (policy#Sid), root, implicit-deny, ..."),
        _f("status", pa.int32(), "The HTTP status answered."),
        _f("bytes_in", pa.int64(), "Request body bytes received."),
        _f("bytes_out", pa.int64(), "Response body bytes sent."),
        _f("remote_addr", pa.string(), "The client's address."),
        _f("user_agent", pa.string(), "The client's User-Agent, at most 512 characters."),
        _f("error", pa.string(), "The error code answered, if any."),
        _f("version", pa.int64(), "The secret version a vault request read or wrote; null elsewhere."),
    ],
    metadata={
        "orgmem.format_version": str(FORMAT_VERSION),
        "orgmem.partitioning": "date=<yyyy-mm-dd> (UTC date of time)",
        "orgmem.sort": "time, request_id",
    },
)
#: The fields of a record, in the contract's order.
FIELDS = AUDIT_SCHEMA.names
_INT_FIELDS = [f.name for f in AUDIT_SCHEMA if pa.types.is_integer(f.type)]
SORT_KEYS = [("time", "ascending"), ("request_id", "ascending")]
DICTIONARY_COLUMNS = ["principal", "access_key", "action", "operation", "decision", "reason",
                      "remote_addr", "user_agent", "error"]
STATISTICS_COLUMNS = ["time", "request_id", "principal", "access_key", "action", "operation",
                      "decision", "status"]
_SORTING = [pq.SortingColumn(AUDIT_SCHEMA.get_field_index("time")),
            pq.SortingColumn(AUDIT_SCHEMA.get_field_index("request_id"))]


def time_us(text: str) -> int:
    """A record's ``time`` ("2026-11-30T09:30:00.123Z") as microseconds since the epoch."""
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - _EPOCH) // _US


def iso_us(us: int) -> str:
    """Microseconds since the epoch as a record's ``time`` (milliseconds, truncated)."""
    sec, rest = divmod(us, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{rest // 1000:03d}Z"


def date_of(us: int) -> str:
    """The UTC date of a time in microseconds: the partition value."""
    return (_EPOCH + timedelta(microseconds=us)).date().isoformat()


def partition(date: str) -> str:
    return f"date={date}"


class AuditStream:
    name = "audit"
    record_type = AuditEntry
    id_column = "request_id"
    ts_column = "time"

    def payload(self, record: AuditEntry) -> dict[str, Any]:
        return record.record

    def partition_of(self, payload: dict[str, Any]) -> str:
        return partition(date_of(time_us(payload["time"])))

    def id_of(self, payload: dict[str, Any]) -> str:
        return payload["request_id"]

    def to_table(self, payloads: list[dict[str, Any]]) -> pa.Table:
        return records_to_table(payloads)

    def partitions(self, records: list[AuditEntry]) -> None:
        return None  # one record per request: record by record costs little

    def sort(self, table: pa.Table) -> pa.Table:
        return table.sort_by(SORT_KEYS)

    def encode(self, table: pa.Table, settled: bool = False) -> bytes:
        sink = io.BytesIO()
        write_table(table, sink)
        return sink.getvalue()


def _is_int64(value: Any) -> bool:
    return type(value) is int and -(1 << 63) <= value < (1 << 63)


def records_to_table(records: list[dict[str, Any]]) -> pa.Table:
    """Audit records (the contract's dicts) as an Arrow table in :data:`AUDIT_SCHEMA`, sorted."""
    columns: dict[str, list] = {name: [] for name in FIELDS}
    for r in records:
        for name in FIELDS:
            columns[name].append(r.get(name))
    columns["time"] = [time_us(t) for t in columns["time"]]
    for name in _INT_FIELDS:  # a value no int64 holds (a record written before it was checked)
        columns[name] = [v if _is_int64(v) else None for v in columns[name]]
    table = pa.Table.from_pydict({f.name: pa.array(columns[f.name], type=f.type) for f in AUDIT_SCHEMA},
                                 schema=AUDIT_SCHEMA)
    return table.sort_by(SORT_KEYS)


def table_to_records(table: pa.Table) -> list[dict[str, Any]]:
    """Records back from (rows of) a segment: the contract's dicts, keys in its order."""
    return [record for _, record in table_rows(table)]


def table_rows(table: pa.Table) -> list[tuple[int, dict[str, Any]]]:
    """``(time in microseconds, record)`` of every row of (a selection from) a segment."""
    cols: dict[str, list] = {}
    for name in FIELDS:
        if name in table.column_names:
            cols[name] = table.column(name).to_pylist() if name != "time" else \
                table.column(name).cast(pa.int64()).to_pylist()
        else:
            cols[name] = [None] * table.num_rows
    times = cols["time"]
    cols["time"] = [iso_us(us) for us in times]
    return [(times[i], {name: cols[name][i] for name in FIELDS}) for i in range(table.num_rows)]


def write_table(table: pa.Table, sink: io.BytesIO) -> None:
    """One segment's Parquet: zstd, dictionary pages for the repetitive columns, statistics
    on the columns queries filter by, a page index, the sort order declared."""
    if not table.schema.equals(AUDIT_SCHEMA, check_metadata=True):
        for f in AUDIT_SCHEMA:  # a segment written before the field existed
            if f.name not in table.column_names:
                table = table.append_column(f.name, pa.nulls(table.num_rows, f.type))
        table = table.select(FIELDS).cast(AUDIT_SCHEMA)
    with pq.ParquetWriter(
        sink, AUDIT_SCHEMA,
        compression="zstd", compression_level=ZSTD_LEVEL,
        use_dictionary=DICTIONARY_COLUMNS,
        write_statistics=STATISTICS_COLUMNS,
        write_page_index=True,
        sorting_columns=_SORTING,
    ) as writer:
        writer.write_table(table, row_group_size=ROW_GROUP_ROWS)


__all__ = ["AUDIT_SCHEMA", "AuditStream", "date_of", "iso_us", "partition", "records_to_table",
           "table_rows", "table_to_records", "time_us"]
