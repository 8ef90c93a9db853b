"""Typed log records and the encoding of one log object.

Three kinds of record travel on the log, each its own type so a consumer never
guesses at a shape:

- :class:`BioRecord`: one biography event (the event's compact record dict);
- :class:`AuditEntry`: one audit record (the audit contract's dict);
- :class:`DocChanged`: "a document changed" (memory, skill, workspace file), for the
  search index to pick up.

A log object is zstd-compressed NDJSON: a header line, then one line per record
``{"k": <kind>, "v": <payload>}`` (a ``bio`` line may add ``"fresh"`` or ``"resent"``). The
header names the format version, the writer and its sequence number, and the record
count, so a truncated or misplaced object is refused rather than half-read, and says
``"ids_marked": true``: its writer marks ``fresh`` and ``resent`` lines. See
``gateway/log/DESIGN.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
import zstandard

FORMAT_VERSION = 1
#: zstd level 1: log objects live seconds, so speed beats ratio (still ~4x smaller)
_LEVEL = 1


class LogFormatError(Exception):
    """A log object that cannot be read: damaged, truncated, or of an unknown format."""


class BioRecord:
    """One biography event, as :meth:`gateway.biography.events.Event.to_record` gives it.

    ``fresh``: the gateway assigned the event's id in the acknowledged append that wrote
    this record, so no record written before it holds that id. The search index adds such
    an event without first deleting an earlier copy, which it would otherwise look up in
    every index segment (about a quarter of its indexing CPU).

    ``resent``: the client sent an id of the gateway's own form, which may repeat a fresh
    one (a re-import of an export, a retry with the ids an answer gave); the search index
    then upserts everything waiting in the log, where that fresh record may still be.

    ``raw``: the record's log line, when an ingest process encoded it (:meth:`of_line`) or it
    was read from a log object. Such a line is written as it is, and :attr:`event` is decoded
    from it only when asked for: the compactor and the search index read records as lines, so
    on the ingest path a gateway never turns them into Python objects (~6 µs an event for an
    agent transcript). ``raw`` always says what ``event``, ``fresh`` and ``resent`` say.
    """

    __slots__ = ("_event", "fresh", "resent", "raw")
    kind: ClassVar[str] = "bio"

    def __init__(self, event: dict[str, Any] | None, fresh: bool = False, resent: bool = False,
                 raw: bytes | None = None) -> None:
        if event is None and raw is None:
            raise TypeError("a BioRecord needs its event or its encoded line")
        self._event = event
        self.fresh = fresh
        self.resent = resent
        self.raw = raw

    @property
    def event(self) -> dict[str, Any]:
        event = self._event
        if event is None:  # two threads may both decode it: the same dict either way
            event = self._event = orjson.loads(self.raw)["v"]
        return event

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BioRecord):
            return NotImplemented
        return (self.event, self.fresh, self.resent) == (other.event, other.fresh, other.resent)

    __hash__ = None  # type: ignore[assignment]  # its event is a dict

    def __repr__(self) -> str:
        return f"BioRecord(event={self.event!r}, fresh={self.fresh}, resent={self.resent})"

    def line(self) -> dict[str, Any]:
        if self.fresh:
            return {"k": "bio", "v": self.event, "fresh": True}
        if self.resent:
            return {"k": "bio", "v": self.event, "resent": True}
        return {"k": "bio", "v": self.event}

    @classmethod
    def from_line(cls, line: dict[str, Any]) -> BioRecord:
        return cls(line["v"], line.get("fresh") is True, line.get("resent") is True)

    @classmethod
    def of_line(cls, raw: bytes) -> BioRecord:
        """The record whose log line is ``raw``, as :meth:`encoded` makes it (orjson, compact:
        the flags come last), without decoding it."""
        return cls(None, raw.endswith(_FRESH), raw.endswith(_RESENT), raw)

    def encoded(self) -> bytes:
        return self.raw if self.raw is not None else _dumps(self.line())


#: How :meth:`BioRecord.encoded` ends a fresh or a resent record's line.
_FRESH = b',"fresh":true}'
_RESENT = b',"resent":true}'


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit record, keys in the audit contract's order."""

    kind: ClassVar[str] = "audit"
    record: dict[str, Any]

    def line(self) -> dict[str, Any]:
        return {"k": "audit", "v": self.record}

    def encoded(self) -> bytes:
        return _dumps(self.line())

    @classmethod
    def from_line(cls, line: dict[str, Any]) -> AuditEntry:
        return cls(line["v"])


@dataclass(frozen=True, slots=True)
class DocChanged:
    """A document was written or removed; the search index re-reads it from its source."""

    kind: ClassVar[str] = "doc"
    doc_type: str  # "memory", "skill" or "file"
    ref: str  # where the document lives: "org/slug", "bucket/key"...
    op: str  # "put" or "delete"
    ts: float  # unix seconds of the change
    version: int | None = None
    etag: str | None = None
    by: str | None = None  # the principal who made the change

    def payload(self) -> dict[str, Any]:
        out = {"type": self.doc_type, "ref": self.ref, "op": self.op, "ts": self.ts}
        for name in ("version", "etag", "by"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def line(self) -> dict[str, Any]:
        return {"k": "doc", "v": self.payload()}

    def encoded(self) -> bytes:
        return _dumps(self.line())

    @classmethod
    def from_line(cls, line: dict[str, Any]) -> DocChanged:
        payload = line["v"]
        return cls(payload["type"], payload["ref"], payload["op"], payload["ts"],
                   payload.get("version"), payload.get("etag"), payload.get("by"))


Record = BioRecord | AuditEntry | DocChanged
KINDS: dict[str, type[BioRecord] | type[AuditEntry] | type[DocChanged]] = {
    cls.kind: cls for cls in (BioRecord, AuditEntry, DocChanged)}


def encode(records: list[Record], writer: str, seq: int) -> bytes:
    """One log object's bytes."""
    header = {"format": FORMAT_VERSION, "writer": writer, "seq": seq, "count": len(records),
              "ids_marked": True}
    lines = [orjson.dumps(header)]
    lines.extend(r.encoded() for r in records)
    lines.append(b"")
    return zstandard.ZstdCompressor(level=_LEVEL).compress(b"\n".join(lines))


def encodable(record: Record) -> bool:
    """Whether ``record`` can be written to a log object at all."""
    try:
        record.encoded()
        return True
    except Exception:  # noqa: BLE001 - whatever stops its encoding
        return False


def _dumps(line: dict) -> bytes:
    """A record's JSON line. Text that is not valid Unicode (a request header's stray byte,
    kept as a surrogate escape, goes into the audit record as the client sent it) is written
    with that byte spelled out, ``\\xff``: the record is kept, and readable."""
    try:
        return orjson.dumps(line)
    except TypeError:
        return orjson.dumps(_printable(line))


def printable(text: str) -> str:
    """``text`` as valid Unicode: a byte a client sent that is not UTF-8 (kept as a
    surrogate escape) is spelled ``\\xff``, any other lone surrogate ``\\udXXX``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:  # only surrogate escapes: the bytes the client sent, spelled out
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _printable(value):
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_printable(v) for v in value]
    return value


def encoded_size(data: bytes) -> int:
    """The uncompressed size of a log object, from its zstd frame header (no decompression)."""
    size = zstandard.frame_content_size(data)
    return size if size >= 0 else len(data) * 4


def decode(data: bytes, writer: str, seq: int) -> list[Record]:
    """The records of one log object, checked against the name it was read under."""
    try:
        text = zstandard.ZstdDecompressor().decompress(data)
    except zstandard.ZstdError as exc:
        raise LogFormatError(f"log object {writer}/{seq} is not valid zstd: {exc}") from None
    lines = text.split(b"\n")
    try:
        header = orjson.loads(lines[0])
        if header.get("format") != FORMAT_VERSION:
            raise LogFormatError(f"log object {writer}/{seq} has format {header.get('format')!r}; "
                                 f"this gateway reads format {FORMAT_VERSION}")
        if header.get("writer") != writer or header.get("seq") != seq:
            raise LogFormatError(f"log object {writer}/{seq} claims to be "
                                 f"{header.get('writer')}/{header.get('seq')}")
        raw = [line for line in lines[1:] if line]
        body = [orjson.loads(line) for line in raw]
        if len(body) != header.get("count"):
            raise LogFormatError(f"log object {writer}/{seq} holds {len(body)} of its "
                                 f"{header.get('count')} records")
        records = [_record(item, line) for item, line in zip(body, raw, strict=True)]
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise LogFormatError(f"log object {writer}/{seq} is damaged: {exc!r}") from None
    if header.get("ids_marked") is not True:
        records = [_unmarked(r) for r in records]
    return records


def _record(item: dict[str, Any], line: bytes) -> Record:
    """A decoded line's record; a biography record keeps its line, which compaction and the
    search index read as it is (rather than encoding the record again)."""
    if item["k"] == "bio":
        return BioRecord(item["v"], item.get("fresh") is True, item.get("resent") is True, line)
    return KINDS[item["k"]].from_line(item)


def _unmarked(record: Record) -> Record:
    """A record of a writer that marks no ids (a gateway of an earlier version, during a
    rolling upgrade): any of its events may repeat an id another gateway logged as fresh,
    so each counts as resent, and none as fresh."""
    if isinstance(record, BioRecord):
        return BioRecord(record.event, fresh=False, resent=True)
    return record
