"""The Parquet form of biography events: one Arrow schema, and segment files written with it.

Segments live under Hive partitions ``agent=<id>/date=<yyyy-mm-dd>/``. The file
itself has no ``agent`` (nor ``date``) column: the path carries them, and hive
readers (DuckDB, pyarrow datasets) refuse or disagree when a file repeats a
partition column. Within a file, rows are sorted by session and then by
:func:`~gateway.biography.events.order_key`, and the file says so in its
``sorting_columns`` so engines can skip work.

Storage choices, for range reads from object storage: zstd level 3 (a good
ratio at little CPU), dictionary pages for the low-cardinality columns,
statistics on the columns worth filtering by (not on ``content``/``data``, whose
min/max would only bloat the footer), a page index, and row groups bounded
both by rows and by bytes so a reader fetching one session reads little else.
"""

from __future__ import annotations

import os
from datetime import date, timedelta
from functools import lru_cache
from typing import IO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

from gateway.biography.events import Event

FORMAT_VERSION = 1

#: Rows per row group, at most.
ROW_GROUP_ROWS = 16_384
#: Uncompressed bytes per row group, about: big events make smaller groups.
ROW_GROUP_BYTES = 8 * 1024 * 1024
ZSTD_LEVEL = 3
#: Segments that last (merged, or large) are compressed harder: ~5.3x instead of ~4.7x
#: smaller than NDJSON on agent transcripts, for ~2x the compaction CPU.
SETTLED_ZSTD_LEVEL = 7
#: One data page per column chunk, about: zstd sees more of the text at once (a row group
#: is ~8 MiB, so range reads stay row-group sized).
DATA_PAGE_BYTES = 8 * 1024 * 1024
#: Columns stored with dictionary pages (few distinct values per file).
DICTIONARY_COLUMNS = ["kind", "session", "tool", "model", "role"]
#: Columns with min/max statistics: the ones queries filter or sort by.
STATISTICS_COLUMNS = ["event_id", "session", "seq", "ts", "kind", "role", "parent_id",
                      "tool", "model", "tokens_in", "tokens_out", "trace_id", "span_id",
                      "redactions"]


def _f(name: str, type_: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"description": doc})


EVENT_SCHEMA = pa.schema(
    [
        _f("event_id", pa.string(), "Unique id: the client's, or ev_ + ULID assigned by the "
                                    "gateway, or derived from an S3 object key and line.",
           nullable=False),
        _f("session", pa.string(), "Session (conversation, run) the event belongs to.",
           nullable=False),
        _f("seq", pa.int64(), "Client-supplied order within the session; null if not given."),
        _f("ts", pa.timestamp("us", tz="UTC"), "When it happened (UTC, microseconds); the "
                                               "gateway's receive time if not given.",
           nullable=False),
        _f("kind", pa.string(), "prompt, response, tool_call, tool_result, artifact, question, "
                                "answer, decision, note, error, state or handoff.",
           nullable=False),
        _f("role", pa.string(), "Who spoke: user, assistant, system, tool, ... (free text)."),
        _f("parent_id", pa.string(), "event_id this event answers; a tool_result points at "
                                     "its tool_call."),
        _f("tool", pa.string(), "Tool name for tool_call / tool_result."),
        _f("content", pa.large_string(), "Text content, at most 1 MiB of UTF-8."),
        _f("data", pa.large_string(), "Structured payload as canonical JSON text (sorted keys)."),
        _f("artifact_uri", pa.string(), "Where an artifact lives, e.g. s3://bucket/key."),
        _f("model", pa.string(), "Model that produced or consumed the event."),
        _f("tokens_in", pa.int64(), "Input tokens used."),
        _f("tokens_out", pa.int64(), "Output tokens produced."),
        _f("tags", pa.list_(pa.string()), "Free labels; an empty list when none.",
           nullable=False),
        _f("trace_id", pa.string(), "W3C / OpenTelemetry trace id, 32 lowercase hex."),
        _f("span_id", pa.string(), "W3C / OpenTelemetry span id, 16 lowercase hex."),
        _f("redactions", pa.int32(), "How many secrets the gateway redacted from the event.",
           nullable=False),
    ],
    metadata={
        "orgmem.format_version": str(FORMAT_VERSION),
        "orgmem.partitioning": "agent=<id>/date=<yyyy-mm-dd> (UTC date of ts)",
        "orgmem.sort": "session, seq nulls last, ts, event_id",
    },
)

_SORTING = [
    pq.SortingColumn(EVENT_SCHEMA.get_field_index("session")),
    pq.SortingColumn(EVENT_SCHEMA.get_field_index("seq"), nulls_first=False),
    pq.SortingColumn(EVENT_SCHEMA.get_field_index("ts")),
    pq.SortingColumn(EVENT_SCHEMA.get_field_index("event_id")),
]

_EPOCH_DATE = date(1970, 1, 1)
DAY_US = 86_400_000_000


def date_of(ts_us: int) -> str:
    """The UTC date of a timestamp in microseconds, as ``yyyy-mm-dd`` (the partition value)."""
    return _date_of_day(ts_us // DAY_US)


@lru_cache(maxsize=4096)
def _date_of_day(day: int) -> str:
    # every compacted event asks, and a busy log holds a handful of distinct days
    return (_EPOCH_DATE + timedelta(days=day)).isoformat()


def partition_of(event: Event) -> tuple[str, str]:
    """``(agent, date)``: the Hive partition ``agent=<id>/date=<yyyy-mm-dd>/`` of an event."""
    return event.agent, date_of(event.ts)


def events_to_table(events: list[Event]) -> pa.Table:
    """Events as an Arrow table in :data:`EVENT_SCHEMA`, sorted by session then
    :func:`order_key` (Arrow sorts strings by UTF-8 bytes, which is code-point order,
    as Python does, and as Parquet compares them)."""
    return records_to_table([e.to_record() for e in events])


#: Defaults of the non-null columns a log record leaves out (see ``Event.to_record``).
_RECORD_DEFAULTS = {"tags": [], "redactions": 0}
#: The non-null columns a log record must carry itself.
REQUIRED_FIELDS = frozenset(f.name for f in EVENT_SCHEMA if not f.nullable) - set(_RECORD_DEFAULTS)
#: A log record as Arrow reads it: every column may be absent (null) until defaults are filled.
_RECORD_STRUCT = pa.struct([f.with_nullable(True) for f in EVENT_SCHEMA])
#: The segment order, as Arrow sorts it (the same order as :func:`order_key` in a session).
SORT_KEYS = [("session", "ascending"), ("seq", "ascending", "at_end"), ("ts", "ascending"),
             ("event_id", "ascending")]


def records_to_table(records: list[dict]) -> pa.Table:
    """Log records (``Event.to_record`` dicts) as a table in :data:`EVENT_SCHEMA`, in
    segment order (:data:`SORT_KEYS`).

    The compactor's path: Arrow reads the dicts as one struct array in C++ (2.2 against
    5.7 µs per event of interpreter time for a list per column, which the ingest path,
    sharing the interpreter, gets back), the defaults a record leaves out are filled in,
    and Arrow sorts. A record without a non-null column raises ``ValueError`` (the
    compactor skips such records before they get here: see ``REQUIRED_FIELDS``).
    """
    table = pa.Table.from_struct_array(pa.array(records, type=_RECORD_STRUCT))
    return _with_defaults(table).cast(EVENT_SCHEMA).sort_by(SORT_KEYS)


#: A biography log line (``{"k": "bio", "v": record, ...}``) as Arrow's JSON reader takes it: the
#: record with its agent (the partition, not a column) and ``ts`` as the integer it is there.
_LINE_SCHEMA = pa.schema([pa.field("v", pa.struct(
    [pa.field("agent", pa.string())]
    + [f.with_type(pa.int64()) if f.name == "ts" else f for f in _RECORD_STRUCT]))])
_TS = pa.timestamp("us", tz="UTC")


def lines_table(lines: list[bytes]) -> tuple[pa.Table, pa.Array] | None:
    """Log lines of biography events as (:data:`EVENT_SCHEMA` table, agents), unsorted, parsed
    by Arrow's JSON reader straight from the bytes (no Python object per event, and no GIL);
    None when some line is not a usable event (a required field missing or null, a value of
    the wrong type): the caller then goes record by record to find and skip it, which ingest
    makes rare."""
    data = b"\n".join(lines)
    try:
        parsed = pj.read_json(pa.BufferReader(data),
                              read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 1),
                              parse_options=pj.ParseOptions(explicit_schema=_LINE_SCHEMA,
                                                            unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    events = parsed.column("v").combine_chunks()
    if events.null_count or parsed.num_rows != len(lines):
        return None
    table = pa.Table.from_struct_array(events)
    agents = table.column("agent").combine_chunks()
    table = table.drop_columns(["agent"])
    table = table.set_column(table.schema.get_field_index("ts"), "ts", table.column("ts").cast(_TS))
    if agents.null_count or any(table.column(name).null_count for name in REQUIRED_FIELDS):
        return None
    return _with_defaults(table).cast(EVENT_SCHEMA), agents


def _with_defaults(table: pa.Table) -> pa.Table:
    for name, default in _RECORD_DEFAULTS.items():
        column = table.column(name)
        if column.null_count:
            table = table.set_column(table.schema.get_field_index(name), name,
                                     pc.if_else(pc.is_valid(column), column, pa.scalar(default, column.type)))
    return table


def table_to_events(table: pa.Table, agent: str) -> list[Event]:
    """Events back from a table read from a segment of ``agent``'s partition.

    Columns that are missing (a file from a reader that selected columns, or a
    later format with fewer of them) read as their defaults; extra columns such as
    hive's ``agent``/``date`` are ignored.
    """
    n = table.num_rows
    cols: dict[str, list] = {}
    for f in EVENT_SCHEMA:
        if f.name not in table.column_names:
            continue
        col = table.column(f.name)
        if f.name == "ts":
            col = col.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        cols[f.name] = col.to_pylist()
    for required in ("event_id", "session", "ts", "kind"):
        if required not in cols:
            raise ValueError(f"the table has no {required!r} column; it is not a biography segment")
    optional = [name for name in ("seq", "role", "parent_id", "tool", "content", "data",
                                  "artifact_uri", "model", "tokens_in", "tokens_out",
                                  "trace_id", "span_id") if name in cols]
    tags = cols.get("tags")
    redactions = cols.get("redactions")
    out = []
    for i in range(n):
        e = Event(cols["event_id"][i], agent, cols["session"][i], cols["ts"][i],
                  cols["kind"][i])
        for name in optional:
            v = cols[name][i]
            if v is not None:
                setattr(e, name, v)
        if tags is not None and tags[i]:
            e.tags = tags[i]
        if redactions is not None and redactions[i]:
            e.redactions = redactions[i]
        out.append(e)
    return out


def _row_group_rows(table: pa.Table, row_group_rows: int) -> int:
    if table.num_rows == 0:
        return row_group_rows
    per_row = max(1, table.nbytes // table.num_rows)
    return max(1, min(row_group_rows, ROW_GROUP_BYTES // per_row))


def write_segment(events: list[Event], sink: str | os.PathLike | IO[bytes],
                  row_group_rows: int = ROW_GROUP_ROWS) -> dict:
    """Write one segment (one partition's events) as zstd Parquet to a path or a
    writable binary file; return ``{rows, bytes, min_ts, max_ts, row_groups}``
    (``min_ts``/``max_ts`` in microseconds, for the manifest).

    A segment holds one ``(agent, date)`` partition only, because the file has no
    column to tell agents or dates apart: mixing them is refused.
    """
    if not events:
        raise ValueError("a segment needs at least one event")
    parts = {partition_of(e) for e in events}
    if len(parts) > 1:
        shown = ", ".join(f"agent={a}/date={d}" for a, d in sorted(parts)[:3])
        raise ValueError(f"a segment holds one partition, got {len(parts)}: {shown}...")
    return write_table(events_to_table(events), sink, row_group_rows)


def write_table(table: pa.Table, sink: str | os.PathLike | IO[bytes],
                row_group_rows: int = ROW_GROUP_ROWS, compression_level: int | None = None) -> dict:
    """Write a table already in segment order (as :func:`events_to_table` makes it,
    or merged and re-sorted by the compactor) with the segment settings; return
    the same summary as :func:`write_segment`. The table is cast to
    :data:`EVENT_SCHEMA` first if its types or metadata differ."""
    if not table.schema.equals(EVENT_SCHEMA, check_metadata=True):
        table = table.select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA)
    rows_per_group = _row_group_rows(table, row_group_rows)
    start = None if isinstance(sink, (str, os.PathLike)) else sink.tell()
    with pq.ParquetWriter(
        sink, EVENT_SCHEMA,
        compression="zstd", compression_level=compression_level or ZSTD_LEVEL,
        use_dictionary=DICTIONARY_COLUMNS,
        write_statistics=STATISTICS_COLUMNS,
        write_page_index=True,
        sorting_columns=_SORTING,
        data_page_size=DATA_PAGE_BYTES,
    ) as writer:
        writer.write_table(table, row_group_size=rows_per_group)
    size = os.path.getsize(sink) if start is None else sink.tell() - start
    bounds = pc.min_max(table.column("ts").cast(pa.int64()))
    return {"rows": table.num_rows, "bytes": size,
            "min_ts": bounds["min"].as_py(), "max_ts": bounds["max"].as_py(),
            "row_groups": -(-table.num_rows // rows_per_group)}
