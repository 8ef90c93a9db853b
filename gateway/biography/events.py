"""Biography events: the model, the limits, and how a request body becomes events.

One event is one thing an agent did or saw: a prompt, a response, a tool call and
its result, an artifact, a question, a decision, ... Events arrive in batches
(``POST /v1/events`` as a JSON array or NDJSON, or an S3 PUT of ``.ndjson`` /
``.jsonl``) and a batch is all-or-nothing: the first invalid event raises an
:class:`EventError` naming its line and field, and nothing of the batch is kept.

Validation is hand-written rather than a pydantic model per event because it
sits on the ingest hot path (a full batch is 10,000 events) and because it lets
every message name the line and the field in words a client can act on.

Inside the gateway an event is a plain :class:`Event` dataclass. ``ts`` is an
int of microseconds since the epoch (UTC) so ordering, partitioning and Parquet
need no datetime objects; ``data`` is kept as canonical JSON text (sorted keys)
so it goes into Parquet as a string column and compares byte-for-byte.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_FLOOR, Decimal
from operator import attrgetter

import orjson

from gateway.iam.model import IdentityError, check_name

# --------------------------------------------------------------------------- limits

#: Events in one request or one uploaded object.
MAX_EVENTS = 10_000
#: Bytes in one request body (JSON array or NDJSON).
MAX_BODY = 16 * 1024 * 1024
#: Bytes of one NDJSON line, refused before it is parsed. ``content`` and ``data``
#: each have their own limit as well; together they must fit in one line.
MAX_LINE = 2 * 1024 * 1024
#: UTF-8 bytes of ``content``.
MAX_CONTENT = 1024 * 1024
#: Bytes of ``data`` once serialised as canonical JSON.
MAX_DATA = 1024 * 1024
MAX_TAGS = 64
MAX_TAG = 128
MAX_ID = 128
MAX_SESSION = 256
MAX_ROLE = 64
MAX_TOOL = 256
MAX_MODEL = 256
MAX_URI = 2048
#: Token counts stay exact in JavaScript clients (2**53).
MAX_TOKENS = 2**53
#: ``seq`` fits a signed 64-bit column.
MAX_SEQ = 2**63 - 1

#: What an event can be. Order is the order shown in error messages and docs.
KINDS = ("prompt", "response", "tool_call", "tool_result", "artifact", "question",
         "answer", "decision", "note", "error", "state", "handoff")
_KINDS = frozenset(KINDS)

#: Event ids and parent ids: letters, digits and ``. _ : -``. The underscore is
#: allowed (beyond the ``[A-Za-z0-9._:-]`` of the issue) because the server's own
#: ids are ``ev_...`` and a client must be able to send them back as ``parent_id``.
_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_HEX32 = re.compile(r"[0-9a-fA-F]{32}")
_HEX16 = re.compile(r"[0-9a-fA-F]{16}")
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:\S+")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
#: Timestamps are accepted from 1970-01-01 up to the end of year 9999 (UTC): what
#: Parquet readers, JavaScript and date partitions all handle; older or later is a
#: unit mistake (milliseconds sent as seconds) far more often than a real time.
TS_MIN_US = 0
TS_MAX_US = (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC) - _EPOCH) // _ONE_US

# --------------------------------------------------------------------------- the model


@dataclass(slots=True)
class Event:
    """One biography event, validated. Field meanings are in the README's event table."""

    event_id: str
    agent: str
    session: str
    ts: int                      # microseconds since 1970-01-01T00:00:00Z
    kind: str
    seq: int | None = None
    role: str | None = None
    parent_id: str | None = None
    tool: str | None = None
    content: str | None = None
    data: str | None = None      # canonical JSON text (orjson, sorted keys)
    artifact_uri: str | None = None
    model: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    tags: list[str] = field(default_factory=list)
    trace_id: str | None = None  # 32 lowercase hex
    span_id: str | None = None   # 16 lowercase hex
    redactions: int = 0          # set by the server, never by a client
    #: the gateway made ``event_id`` for this request (not a record field: see ``BioRecord.fresh``)
    id_assigned: bool = field(default=False, compare=False)
    #: the client sent an ``event_id`` of the gateway's own ``ev_`` form: it may repeat one the
    #: gateway assigned (not a record field: see ``BioRecord.resent``)
    id_resent: bool = field(default=False, compare=False)

    def to_record(self) -> dict:
        """A compact JSON-ready dict for the log: ``None``, no tags and zero redactions
        are left out (they are the defaults), everything else is kept as is, so
        ``from_record(e.to_record()) == e``."""
        d = {"event_id": self.event_id, "agent": self.agent, "session": self.session,
             "ts": self.ts, "kind": self.kind}
        for name, v in zip(_OPTIONAL, _optional_values(self), strict=True):  # one C call for all twelve
            if v is not None:
                d[name] = v
        if self.tags:
            d["tags"] = list(self.tags)
        if self.redactions:
            d["redactions"] = self.redactions
        return d

    @classmethod
    def from_record(cls, d: dict) -> Event:
        """Rebuild an event from :meth:`to_record` output. Trusted input: no checks."""
        return cls(**d)

    def to_api(self) -> dict:
        """Every field, as the REST API shows it: ``ts`` in RFC 3339 with microseconds
        and ``Z``, ``data`` as parsed JSON."""
        return {
            "event_id": self.event_id, "agent": self.agent, "session": self.session,
            "seq": self.seq, "ts": format_ts(self.ts), "kind": self.kind,
            "role": self.role, "parent_id": self.parent_id, "tool": self.tool,
            "content": self.content,
            "data": None if self.data is None else orjson.loads(self.data),
            "artifact_uri": self.artifact_uri, "model": self.model,
            "tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
            "tags": list(self.tags), "trace_id": self.trace_id, "span_id": self.span_id,
            "redactions": self.redactions,
        }


#: Optional scalar fields, in schema order (``to_record`` walks them).
_OPTIONAL = ("seq", "role", "parent_id", "tool", "content", "data", "artifact_uri",
             "model", "tokens_in", "tokens_out", "trace_id", "span_id")
_optional_values = attrgetter(*_OPTIONAL)
#: Every field a client may send.
CLIENT_FIELDS = frozenset({
    "event_id", "agent", "session", "seq", "ts", "kind", "role", "parent_id", "tool",
    "content", "data", "artifact_uri", "model", "tokens_in", "tokens_out", "tags",
    "trace_id", "span_id",
})
#: Names clients often use for a field, for a better hint than difflib finds.
_ALIASES = {
    "id": "event_id", "uuid": "event_id", "timestamp": "ts", "time": "ts",
    "created_at": "ts", "type": "kind", "event_type": "kind", "text": "content",
    "message": "content", "body": "content", "session_id": "session",
    "conversation_id": "session", "thread_id": "session", "parent": "parent_id",
    "metadata": "data", "payload": "data", "input_tokens": "tokens_in",
    "output_tokens": "tokens_out", "prompt_tokens": "tokens_in",
    "completion_tokens": "tokens_out", "agent_id": "agent", "tool_name": "tool",
    "uri": "artifact_uri", "url": "artifact_uri", "sequence": "seq", "labels": "tags",
}


def order_key(e: Event) -> tuple:
    """How events of one session are ordered: events with ``seq`` first, by ``seq``;
    then events without it, by ``(ts, event_id)``. Ties on ``seq`` fall back to
    ``(ts, event_id)`` too, so the order is total and the same on every reader."""
    return (e.seq is None, e.seq or 0, e.ts, e.event_id)


def time_key(e: Event) -> tuple:
    """Order across sessions (an agent's timeline): by time, ties by id."""
    return (e.ts, e.event_id)


def format_ts(ts_us: int) -> str:
    """RFC 3339 in UTC with exactly six fractional digits: ``2026-11-30T12:00:00.123456Z``."""
    return (_EPOCH + timedelta(microseconds=ts_us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --------------------------------------------------------------------------- errors


class EventError(ValueError):
    """A batch that cannot be accepted, and the first reason why.

    ``line`` is the 1-based NDJSON line (or array index + 1), ``None`` when the
    problem is the whole body; ``field`` is the event field at fault, or ``None``.
    """

    def __init__(self, line: int | None, field: str | None, message: str) -> None:
        super().__init__(line, field, message)
        self.line = line
        self.field = field
        self.message = message

    def __str__(self) -> str:
        where = []
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.field is not None:
            where.append(f'field "{self.field}"')
        return f"{', '.join(where)}: {self.message}" if where else self.message


def _jtype(v: object) -> str:
    """The JSON name of a value's type, for messages."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def _got(v: object) -> str:
    """``got ...`` for an error message: a short JSON rendering, never the whole of a big value."""
    if isinstance(v, str):
        return "got " + _quote(v)
    if isinstance(v, dict):
        return "got an object"
    if isinstance(v, list):
        return "got an array"
    if isinstance(v, float) and not math.isfinite(v):
        return f"got {v}"
    try:
        return "got " + orjson.dumps(v).decode()
    except TypeError:
        return f"got {_jtype(v)}"


def _quote(s: str, limit: int = 60) -> str:
    return orjson.dumps(s if len(s) <= limit else s[:limit] + "...").decode()


# --------------------------------------------------------------------------- field checks
# Each returns the clean value or raises EventError; they run once per present field.


def _text(v: object, line: int, name: str, limit: int) -> str:
    """A short single-line label: 1..limit printable characters."""
    if type(v) is not str:
        raise EventError(line, name, f"must be a string ({_got(v)})")
    if not v:
        raise EventError(line, name, "must not be empty (leave the field out instead)")
    if len(v) > limit:
        raise EventError(line, name, f"must be at most {limit} characters (got {len(v)})")
    if not v.isprintable():
        raise EventError(line, name, "must be printable text: no control characters, "
                                     "line breaks or invisible separators")
    return v


def _ident(v: object, line: int, name: str) -> str:
    if type(v) is not str:
        raise EventError(line, name, f"must be a string id ({_got(v)})")
    if not _ID.fullmatch(v):
        if not v:
            raise EventError(line, name, "must not be empty (leave the field out instead)")
        if len(v) > MAX_ID:
            raise EventError(line, name, f"must be at most {MAX_ID} characters (got {len(v)})")
        raise EventError(line, name, "may only contain letters, digits and . _ : - "
                                     f"({_got(v)})")
    return v


def _int(v: object, line: int, name: str, hi: int) -> int:
    if type(v) is not int:  # bool is a subclass of int: refused on purpose
        raise EventError(line, name, f"must be an integer ({_got(v)})")
    if v < 0 or v > hi:
        raise EventError(line, name, f"must be between 0 and {hi} (got {v})")
    return v


def _hex_id(v: object, line: int, name: str, pattern: re.Pattern, digits: int) -> str:
    if type(v) is not str or not pattern.fullmatch(v):
        raise EventError(line, name, f"must be {digits} hexadecimal digits ({_got(v)})")
    v = v.lower()
    if v.count("0") == digits:
        raise EventError(line, name, "must not be all zeros (an invalid id in W3C Trace Context)")
    return v


def _ts(v: object, line: int) -> int:
    """RFC 3339 / ISO 8601 text with ``Z`` or an offset, or unix seconds as a number."""
    if type(v) is str:
        try:
            dt = datetime.fromisoformat(v)
        except ValueError:
            try:  # RFC 3339 allows a lowercase "t" and "z"; Python 3.11 does not
                dt = datetime.fromisoformat(v.upper())
            except ValueError:
                raise EventError(line, "ts", "must be an RFC 3339 time such as "
                                             f'"2026-11-30T12:00:00.123456Z" ({_got(v)})') from None
        if dt.tzinfo is None:
            raise EventError(line, "ts", "has no time zone: add Z for UTC or an offset "
                                         f'such as +02:00 ({_got(v)})')
        us = (dt - _EPOCH) // _ONE_US
    elif type(v) is int or type(v) is float:
        if not math.isfinite(v):
            raise EventError(line, "ts", f"must be a finite number of seconds ({_got(v)})")
        if v > TS_MAX_US // 1_000_000 + 1:  # before multiplying: a huge float would overflow
            raise EventError(line, "ts", f"is after year 9999 ({_got(v)}); a number is unix "
                                         "seconds, and this looks like milliseconds or microseconds")
        if v < 0:
            raise EventError(line, "ts", f"must be between 1970-01-01T00:00:00Z and the end of "
                                         f"year 9999 ({_got(v)})")
        # truncated, as RFC 3339 times are: from the number as written (its shortest repr),
        # since v * 10**6 in binary rounds 0.123456 down a microsecond or .9999997 up a second
        us = v * 1_000_000 if type(v) is int else \
            int((Decimal(repr(v)) * 1_000_000).to_integral_value(ROUND_FLOOR))
    else:
        raise EventError(line, "ts", "must be an RFC 3339 string or unix seconds as a number "
                                     f"({_got(v)})")
    if us < TS_MIN_US or us > TS_MAX_US:
        raise EventError(line, "ts", f"must be between 1970-01-01T00:00:00Z and the end of "
                                     f"year 9999 ({_got(v)})")
    return us


def _kind(v: object, line: int) -> str:
    if type(v) is str and v in _KINDS:
        return v
    if v is None:
        raise EventError(line, "kind", "is required")
    hint = ""
    if type(v) is str:
        close = difflib.get_close_matches(v, KINDS, n=1)
        if close:
            hint = f'; did you mean "{close[0]}"?'
    raise EventError(line, "kind", f"must be one of {', '.join(KINDS)} ({_got(v)}{hint})")


def _unknown(raw: dict, line: int) -> None:
    extra = sorted(k for k in raw if k not in CLIENT_FIELDS)
    first = extra[0]
    if "redactions" in extra:
        raise EventError(line, "redactions", "is set by the server; leave it out")
    if type(first) is not str:
        raise EventError(line, None, f"unknown field {_got(first)[4:]}")
    hints = []
    for k in extra:
        s = _ALIASES.get(k) if isinstance(k, str) else None
        if s is None and isinstance(k, str):
            close = difflib.get_close_matches(k, sorted(CLIENT_FIELDS), n=1)
            s = close[0] if close else None
        hints.append(f'"{k}"' + (f' (did you mean "{s}"?)' if s else ""))
    noun = "unknown field" if len(extra) == 1 else "unknown fields"
    raise EventError(line, first, f"{noun} {', '.join(hints)}")


# --------------------------------------------------------------------------- ids

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: Two Crockford characters for every 10-bit value: encoding is 13 look-ups.
_PAIRS = tuple(_CROCKFORD[i >> 5] + _CROCKFORD[i & 31] for i in range(1024))
_SHIFTS = tuple(range(120, -1, -10))
_id_lock = threading.Lock()
_last_ms = -1
_last_rand = 0
_last_head = ""


def _crockford128(value: int) -> str:
    """26 Crockford base32 characters of a 128-bit value, as ULID writes them
    (two leading zero bits), so lexicographic order is numeric order."""
    return "".join([_PAIRS[(value >> s) & 1023] for s in _SHIFTS])


def new_event_id(now_us: int) -> str:
    """A fresh id, ``ev_`` + a ULID (48-bit milliseconds + 80 random bits).

    Ids sort by their millisecond. Within one millisecond, ids made by one process
    are strictly increasing (the random part is incremented, as in ULID's
    monotonic mode), so a batch's ids follow the batch. Nothing relies on ids
    across processes or a clock that steps back: ordering uses ``ts`` first.
    """
    return new_event_ids(now_us, 1)[0]


def new_event_ids(now_us: int, count: int) -> list[str]:
    """``count`` fresh ids (see :func:`new_event_id`), increasing, under one lock: a batch
    takes it once rather than once per event, which many request threads contend for."""
    ms = (max(now_us, 0) // 1000) & 0xFFFF_FFFF_FFFF
    with _id_lock:
        return [_next_id(ms) for _ in range(count)]


def _next_id(ms: int) -> str:
    global _last_ms, _last_rand, _last_head
    if ms == _last_ms and _last_rand & 1023 != 1023:
        # the common case in a batch: only the last two characters change
        rand = _last_rand = _last_rand + 1
        head = _last_head
    else:
        if ms == _last_ms and _last_rand + 1 < 1 << 80:
            rand = _last_rand + 1
        else:
            # one bit of headroom so increments within this millisecond cannot overflow
            rand = _random80() >> 1
        head = ASSIGNED_PREFIX + _crockford128((ms << 80) | rand)[:24]
        _last_ms, _last_rand, _last_head = ms, rand, head
    return head + _PAIRS[rand & 1023]


_random_pool = b""


def _random80() -> int:
    """80 random bits (the caller holds ``_id_lock``), from a pool refilled with 1,000 bytes:
    ``os.urandom`` lets go of the GIL, and a request thread that does so once per batch
    waits its turn for the interpreter again on a busy gateway."""
    global _random_pool
    if len(_random_pool) < 10:
        _random_pool = os.urandom(1000)
    drawn, _random_pool = _random_pool[:10], _random_pool[10:]
    return int.from_bytes(drawn, "big")


def _forget_random_pool() -> None:
    """A forked child draws its own bits (two processes must not make the same ids)."""
    global _random_pool
    _random_pool = b""


os.register_at_fork(after_in_child=_forget_random_pool)


#: How every id the gateway makes begins (assigned and derived alike).
ASSIGNED_PREFIX = "ev_"


def derived_event_id(namespace: str, line: int, line_bytes: bytes) -> str:
    """A deterministic id for an event that came without one: the same object key,
    line number and line bytes always give the same id, so a retried upload adds
    nothing twice, while a changed line under the same key is a new event."""
    h = hashlib.sha256(namespace.encode() + b"\0" + str(line).encode() + b"\0" + line_bytes)
    return ASSIGNED_PREFIX + _crockford128(int.from_bytes(h.digest()[:16], "big"))


# --------------------------------------------------------------------------- validation

_known = CLIENT_FIELDS.issuperset


def validate(raw: dict, line: int, *, caller: str, now_us: int,
             default_id: Callable[[int], str] | None = None) -> Event:
    """Check one decoded event and build an :class:`Event`, or raise :class:`EventError`.

    ``caller`` is the authenticated principal: it is the agent unless the event
    names another (whether the caller may write for that agent is checked by the
    caller of this function). ``now_us`` is the server time used when ``ts`` is
    absent. A missing ``event_id`` comes from ``default_id(line)`` if given, else
    :func:`new_event_id`. A ``null`` optional field counts as absent.

    The common case of each check is written inline (this runs 10,000 times per
    full batch); the helpers it falls back to find and word the error.
    """
    if type(raw) is not dict:
        raise EventError(line, None, f"must be a JSON object ({_got(raw)})")
    if not _known(raw):
        _unknown(raw, line)
    get = raw.get

    session = get("session")
    if type(session) is not str or not 0 < len(session) <= MAX_SESSION \
            or not session.isprintable():
        if session is None:
            raise EventError(line, "session", "is required")
        _text(session, line, "session", MAX_SESSION)
    kind = get("kind")
    if type(kind) is not str or kind not in _KINDS:
        _kind(kind, line)

    v = get("event_id")
    if v is not None:
        if type(v) is not str or not _ID.fullmatch(v):
            _ident(v, line, "event_id")
        event_id = v
    elif default_id is not None:
        event_id = default_id(line)
    else:
        event_id = new_event_id(now_us)

    v = get("agent")
    if v is None or v == caller:
        agent = caller
    else:
        if type(v) is not str:
            raise EventError(line, "agent", f"must be a string ({_got(v)})")
        try:
            check_name("agent", v)
        except IdentityError as exc:
            raise EventError(line, "agent", exc.message) from None
        agent = v

    v = get("ts")
    if v is None:
        ts = now_us
    else:
        ts = _ts(v, line)

    if len(raw) <= 2 + ("event_id" in raw) + ("agent" in raw) + ("ts" in raw):
        return Event(event_id, agent, session, ts, kind)  # nothing optional was sent

    seq = get("seq")
    if seq is not None:
        _int(seq, line, "seq", MAX_SEQ)
    role = get("role")
    if role is not None and (type(role) is not str or not 0 < len(role) <= MAX_ROLE
                             or not role.isprintable()):
        _text(role, line, "role", MAX_ROLE)
    parent_id = get("parent_id")
    if parent_id is not None and (type(parent_id) is not str or not _ID.fullmatch(parent_id)):
        _ident(parent_id, line, "parent_id")
    tool = get("tool")
    if tool is not None and (type(tool) is not str or not 0 < len(tool) <= MAX_TOOL
                             or not tool.isprintable()):
        _text(tool, line, "tool", MAX_TOOL)
    content = get("content")
    if content is not None and (type(content) is not str or len(content) > MAX_CONTENT // 4):
        _content(content, line)
    data = get("data")
    if data is not None:
        data = _data(data, line)
    uri = get("artifact_uri")
    if uri is not None:
        _uri(uri, line)
    model = get("model")
    if model is not None and (type(model) is not str or not 0 < len(model) <= MAX_MODEL
                              or not model.isprintable()):
        _text(model, line, "model", MAX_MODEL)
    tokens_in = get("tokens_in")
    if tokens_in is not None and (type(tokens_in) is not int or not 0 <= tokens_in <= MAX_TOKENS):
        _int(tokens_in, line, "tokens_in", MAX_TOKENS)
    tokens_out = get("tokens_out")
    if tokens_out is not None and (type(tokens_out) is not int
                                   or not 0 <= tokens_out <= MAX_TOKENS):
        _int(tokens_out, line, "tokens_out", MAX_TOKENS)
    tags = get("tags")
    if tags is None:
        tags = []
    else:
        tags = _tags(tags, line)
    trace_id = get("trace_id")
    if trace_id is not None:
        trace_id = _hex_id(trace_id, line, "trace_id", _HEX32, 32)
    span_id = get("span_id")
    if span_id is not None:
        span_id = _hex_id(span_id, line, "span_id", _HEX16, 16)
    return Event(event_id, agent, session, ts, kind, seq, role, parent_id, tool, content,
                 data, uri, model, tokens_in, tokens_out, tags, trace_id, span_id)


def _content(v: object, line: int) -> str:
    if type(v) is not str:
        raise EventError(line, "content", f"must be a string ({_got(v)}); "
                                          "put structured values in data")
    try:
        n = len(v.encode())
    except UnicodeEncodeError:
        raise EventError(line, "content", "is not valid Unicode text") from None
    if n > MAX_CONTENT:
        raise EventError(line, "content", f"must be at most {MAX_CONTENT} bytes of UTF-8 "
                                          f"(got {n})")
    return v


def _data(v: object, line: int) -> str:
    """Any JSON value but null, kept as canonical text (sorted keys, compact)."""
    try:
        text = orjson.dumps(v, option=orjson.OPT_SORT_KEYS)
    except TypeError as exc:
        raise EventError(line, "data", f"is not JSON-serialisable: {exc}") from None
    if len(text) > MAX_DATA:
        raise EventError(line, "data", f"must be at most {MAX_DATA} bytes as JSON "
                                       f"(got {len(text)})")
    return text.decode()


#: A number in exponent form in canonical JSON: how the parser's float for an integer
#: beyond 64 bits comes out, always with "e+" (so does a float the client wrote so, which is
#: then checked). The plain "e+" test goes first: the regex alone cost ~7 µs an event.
_EXPONENT = re.compile(r"\d[eE][+-]?\d")


class _Big(str):
    """An integer literal beyond 64 bits, as the exact parse keeps it."""


def _check_data_integers(body: bytes, items: list[tuple[int, dict, bytes | None]]) -> None:
    """Refuse an integer beyond 64 bits in ``data``: the fast parser reads it as a float,
    and the event would silently hold a rounded number. Called at most once per batch,
    when some ``data`` holds a number in exponent form: the body is parsed again, exactly,
    and the first event whose ``data`` holds such an integer is named."""

    def exact(text: str) -> int | _Big:
        value = int(text)
        return value if -(2**63) <= value < 2**64 else _Big(text)

    text = body.decode("utf-8", "surrogatepass").removeprefix("\ufeff")
    if text.lstrip().startswith("["):
        parsed = [(n, item) for n, item in enumerate(json.loads(text, parse_int=exact), 1)]
    else:
        parsed = [(n, json.loads(raw.decode("utf-8", "surrogatepass"), parse_int=exact))
                  for n, _, raw in items if raw is not None]
        if not parsed:  # one pretty-printed object
            parsed = [(1, json.loads(text, parse_int=exact))]
    for line, item in parsed:
        big = _first_big(item.get("data") if isinstance(item, dict) else None)
        if big is not None:
            raise EventError(line, "data", f"holds the integer {big[:24]}{'...' if len(big) > 24 else ''}, "
                                           "beyond 64 bits, which JSON readers round; send it as a string")


def _first_big(value: object) -> str | None:
    if isinstance(value, _Big):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        for v in value:
            if (found := _first_big(v)) is not None:
                return found
    return None


def _uri(v: object, line: int) -> str:
    if type(v) is not str:
        raise EventError(line, "artifact_uri", f"must be a string ({_got(v)})")
    if len(v) > MAX_URI:
        raise EventError(line, "artifact_uri", f"must be at most {MAX_URI} characters "
                                               f"(got {len(v)})")
    if not _URI.fullmatch(v) or not v.isprintable():
        raise EventError(line, "artifact_uri", "must be a URI with a scheme and no spaces, "
                                               f'such as "s3://bucket/key" ({_got(v)})')
    return v


def _tags(v: object, line: int) -> list[str]:
    if type(v) is not list:
        raise EventError(line, "tags", f"must be an array of strings ({_got(v)})")
    if len(v) > MAX_TAGS:
        raise EventError(line, "tags", f"must have at most {MAX_TAGS} entries (got {len(v)})")
    for i, t in enumerate(v):
        if type(t) is not str or not 0 < len(t) <= MAX_TAG or not t.isprintable():
            raise EventError(line, "tags", f"entry {i} must be 1 to {MAX_TAG} printable "
                                           f"characters ({_got(t)})")
    return list(v)


# --------------------------------------------------------------------------- batches


def _too_many(limit: int) -> EventError:
    return EventError(None, None, f"more than {limit} events in one batch; "
                                  f"split it into batches of at most {limit}")


def _split(body: bytes, *, max_body: int, max_line: int,
           max_events: int) -> list[tuple[int, dict, bytes | None]]:
    """Decode a body into ``(line, object, line_bytes)``; ``line_bytes`` is the raw
    NDJSON line, or ``None`` for a JSON array or a pretty-printed single object."""
    if len(body) > max_body:
        raise EventError(None, None, f"the body is {len(body)} bytes; a batch is at most "
                                     f"{max_body} bytes")
    if body.startswith(b"\xef\xbb\xbf"):
        body = body[3:]
    stripped = body.lstrip()
    if not stripped:
        raise EventError(None, None, "no events: the body is empty")
    first = stripped[:1]
    if first == b"[":
        try:
            items = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise EventError(None, None, f"the body is not valid JSON: {exc}") from None
        if not isinstance(items, list):  # pragma: no cover - '[' always decodes to a list
            raise EventError(None, None, "the body must be a JSON array, NDJSON or one object")
        if not items:
            raise EventError(None, None, "no events: the array is empty")
        if len(items) > max_events:
            raise _too_many(max_events)
        out = []
        for i, item in enumerate(items, 1):
            if type(item) is not dict:
                raise EventError(i, None, f"each event must be a JSON object ({_got(item)})")
            out.append((i, item, None))
        return out
    if first == b"{" and b"\n" in stripped.rstrip():
        # Either NDJSON or one pretty-printed object. A whole-body parse of NDJSON
        # stops at the end of the first object, so trying it costs little.
        try:
            one = orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
        else:
            if type(one) is dict:
                return [(1, one, None)]
    out = []
    for n, chunk in enumerate(body.split(b"\n"), 1):
        if len(chunk) > max_line:
            raise EventError(n, None, f"the line is {len(chunk)} bytes; one event is at most "
                                      f"{max_line} bytes")
        if chunk.endswith(b"\r"):
            chunk = chunk[:-1]
        if not chunk.strip():
            continue
        if len(out) >= max_events:
            raise _too_many(max_events)
        try:
            obj = orjson.loads(chunk)
        except orjson.JSONDecodeError as exc:
            raise EventError(n, None, f"invalid JSON: {exc.msg} at column {exc.colno}") from None
        if type(obj) is not dict:
            raise EventError(n, None, f"each line must be one JSON object ({_got(obj)})")
        out.append((n, obj, chunk))
    if not out:
        raise EventError(None, None, "no events: the body has only blank lines")
    return out


def parse_batch(body: bytes, *, max_body: int = MAX_BODY, max_line: int = MAX_LINE,
                max_events: int = MAX_EVENTS) -> list[tuple[int, dict]]:
    """Split a request body into ``(line, object)`` pairs, checking only the framing.

    The body is a JSON array when its first non-space byte is ``[`` (line = index + 1),
    otherwise NDJSON (blank lines skipped, ``\\r\\n`` accepted, line numbers kept);
    a single JSON object, on one line or pretty-printed, is a batch of one. The
    limits are keyword arguments so an S3 upload path can choose its own.
    """
    return [(n, obj) for n, obj, _ in _split(body, max_body=max_body, max_line=max_line,
                                              max_events=max_events)]


def validate_batch(body: bytes, *, caller: str, now_us: int,
                   default_id: Callable[[int], str] | None = None,
                   id_namespace: str | None = None, max_body: int = MAX_BODY,
                   max_line: int = MAX_LINE, max_events: int = MAX_EVENTS) -> list[Event]:
    """Parse and validate a whole batch; raise the first :class:`EventError`.

    - Events without ``ts`` get ``now_us`` plus their position in the batch in
      microseconds, so that a batch sent without times keeps its order (ordering
      falls back to ``(ts, event_id)``, and ids alone need not follow the batch).
    - Events without ``event_id`` get ``default_id(line)``, or with ``id_namespace``
      (e.g. ``s3:<bucket>/<key>``) :func:`derived_event_id` of the namespace, the
      line and the line's bytes (canonical JSON of the event for a JSON array),
      else :func:`new_event_id` (and ``id_assigned``: no other event holds that id).
    - Two events with the same ``event_id`` are collapsed into the first when the
      client sent exactly the same object twice, and refused naming both lines
      when they differ.
    """
    items = _split(body, max_body=max_body, max_line=max_line, max_events=max_events)
    assigns = default_id is None and id_namespace is None
    if assigns:
        missing = sum(1 for _, raw, _ in items if isinstance(raw, dict) and raw.get("event_id") is None)
        fresh = iter(new_event_ids(now_us, missing))
        default_id = lambda _line: next(fresh)  # noqa: E731
    events: list[Event] = []
    seen: dict[str, tuple[int, dict]] = {}
    checked_numbers = False
    for i, (line, raw, line_bytes) in enumerate(items):
        ids = default_id
        if id_namespace is not None and raw.get("event_id") is None:
            if line_bytes is None:
                line_bytes = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS)
            derived = derived_event_id(id_namespace, line, line_bytes)
            ids = lambda _line, _id=derived: _id  # noqa: E731
        e = validate(raw, line, caller=caller, now_us=now_us + i, default_id=ids)
        if e.data is not None and not checked_numbers and "e+" in e.data and _EXPONENT.search(e.data):
            _check_data_integers(body, items)  # once per batch, and only then
            checked_numbers = True
        sent = raw.get("event_id")
        if sent is None:
            e.id_assigned = assigns
        elif sent.startswith(ASSIGNED_PREFIX):
            e.id_resent = True
        prior = seen.get(e.event_id)
        if prior is None:
            seen[e.event_id] = (line, raw)
            events.append(e)
        elif prior[1] != raw:
            raise EventError(line, "event_id",
                             f"{_quote(e.event_id)} is also the id of line {prior[0]}, "
                             "with different content; ids must be unique within a batch")
    return events
