"""The Tantivy schema: one index for all four document types.

Every entry has the same fields; a field a type does not use stays empty. Filter
fields use the ``raw`` tokenizer (the whole value is one term, matched exactly);
``title`` and ``body`` use ``en_stem`` (lowercased, English Snowball stems) so
"running" finds "runs". ``time`` is a date field, indexed for ranges and fast for
ordering. ``weight`` is a fast float that scales the text score by status (see
:data:`STATUS_FACTOR`); Tantivy applies it as ``score * log2(2 + weight)``.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

import tantivy

#: Bumped whenever the fields change; snapshots of another version are not restored
#: (the caller rebuilds from the sources instead).
SCHEMA_VERSION = 2

#: The four document types.
TYPES = ("event", "memory", "skill", "file")

#: Exact-match fields, each one term per value (several values allowed: ``tags``, ``access``).
RAW_FIELDS = ("uid", "type", "id", "agent", "session", "scope", "kind", "tags", "bucket", "key",
              "status", "access", "source")
#: Ranked full-text fields.
TEXT_FIELDS = ("title", "body")
#: Fields a user may name in query text (``kind:decision``, ``time:[... TO ...]``); any other
#: ``word:`` in user text is read as plain words, never as an unknown field.
QUERY_FIELDS = frozenset({"type", "id", "agent", "session", "scope", "kind", "tags", "bucket", "key",
                          "status", "title", "body", "time"})
#: Fields a caller may filter on (see :class:`indexer.query.Filters`).
FILTER_FIELDS = ("type", "agent", "session", "scope", "kind", "status", "tags", "bucket", "key")

#: How much of a text score each status keeps: a superseded memory ranks well below
#: its replacement for the same words, a retracted one further still.
STATUS_FACTOR = {"active": 1.0, "superseded": 1 / 3, "retracted": 0.1}
#: ``log2(2 + weight)`` for an active entry; scores are divided by it so an active
#: entry's reported score is its plain BM25 score.
_ACTIVE_MULTIPLIER = 3.0


def status_weight(status: str) -> float:
    """The ``weight`` fast-field value giving ``status`` its :data:`STATUS_FACTOR`."""
    factor = STATUS_FACTOR.get(status, 1.0)
    return 2 ** (_ACTIVE_MULTIPLIER * factor) - 2


def unweight(score: float) -> float:
    """A weighted Tantivy score back on the BM25 scale (status factor kept)."""
    return score / _ACTIVE_MULTIPLIER


#: The span Tantivy's date field holds (nanoseconds in an int64: 1677-09-21 to 2262-04-11),
#: with a margin. Entries and ``since``/``until`` outside it are taken at the nearest end.
TIME_MIN = datetime(1678, 1, 1, tzinfo=UTC)
TIME_MAX = datetime(2262, 1, 1, tzinfo=UTC)


def clamp_time(value: datetime) -> datetime:
    """``value`` within :data:`TIME_MIN` .. :data:`TIME_MAX` (an event may be dated to 9999)."""
    return min(max(value, TIME_MIN), TIME_MAX)


def build_schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    for name in RAW_FIELDS:
        builder.add_text_field(name, stored=True, tokenizer_name="raw",
                               fast=name in ("type", "status"), index_option="basic")
    for name in TEXT_FIELDS:
        builder.add_text_field(name, stored=True, tokenizer_name="en_stem", index_option="position")
    # the caller's name of the entry in its access decisions, matched by exclusion patterns
    builder.add_text_field("resource", stored=False, tokenizer_name="raw", index_option="basic")
    builder.add_date_field("time", stored=True, indexed=True, fast=True)
    builder.add_float_field("weight", stored=False, indexed=False, fast=True)
    return builder.build()


class SchemaMismatch(Exception):
    """The index directory holds an index of another schema; rebuild it from the sources."""


def open_index(path: str | os.PathLike, create: bool = True) -> tantivy.Index:
    """Open the index in ``path`` (creating it when ``create`` and absent).

    Raises :class:`SchemaMismatch` when the directory holds an index of another schema.
    """
    path = os.fspath(path)
    if not create and not tantivy.Index.exists(path):
        raise FileNotFoundError(f"no index in {path}")
    os.makedirs(path, exist_ok=True)
    try:
        return tantivy.Index(build_schema(), path=path, reuse=True)
    except ValueError as e:
        if "schema does not match" in str(e):
            raise SchemaMismatch(f"the index in {path} has another schema; rebuild it") from e
        raise


__all__ = ["SCHEMA_VERSION", "TYPES", "QUERY_FIELDS", "FILTER_FIELDS", "STATUS_FACTOR", "build_schema",
           "open_index", "status_weight", "unweight", "SchemaMismatch"]
