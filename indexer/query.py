"""From a caller's text, filters and access tokens to one Tantivy query.

Access control is part of the query: a must-clause over the caller's tokens, so
ranking, counting and paging only ever see readable entries and a count never
leaks what the caller cannot read. Filters are further must-clauses.

User text is parsed leniently. Before Tantivy sees it, the text is tidied so odd
input still means something: ``word:`` with an unknown field is read as words,
``AND NOT x`` becomes ``-x`` (Tantivy reads it as a clause that matches nothing),
a query of only exclusions excludes from everything, and a bare date in a
``time:`` range gets a time of day. What the lenient parser still complains about
comes back as warnings; only input we refuse outright (too long, bad filters,
bad paging) raises :class:`QueryError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime

import tantivy

from .schema import FILTER_FIELDS, QUERY_FIELDS, TIME_MAX, TIME_MIN, TYPES, clamp_time

#: Characters of user query text accepted.
MAX_QUERY_CHARS = 4096
#: Levels of nested parentheses accepted: Tantivy's parser recurses per level, and a few
#: thousand overflow the native stack (the process dies, not the request).
MAX_NESTING = 64
MAX_LIMIT = 1000
MAX_OFFSET = 10_000
#: Default fields for words without a field, with their boosts.
DEFAULT_FIELDS = ["title", "body"]
FIELD_BOOSTS = {"title": 2.0, "body": 1.0}


class QueryError(ValueError):
    """A search request we refuse; the message says what to change (HTTP 400)."""


def _values(name: str, value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    for item in items:
        if not isinstance(item, str) or not item or len(item) > 1024:
            raise QueryError(f"{name}: expected non-empty strings of at most 1024 characters")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            raise QueryError(f"{name}: not valid UTF-8 (was it percent-encoded from other bytes?)") from None
    return items


def parse_time(name: str, value: datetime | float | int | str | None) -> datetime | None:
    """A datetime from a datetime, unix seconds, or ISO 8601 text (``2024-05-01``, ``...T12:00:00Z``)."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, bool):
        raise QueryError(f"{name}: expected a time")
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(float(value), UTC)
        except (OverflowError, OSError, ValueError) as e:
            raise QueryError(f"{name}: {value!r} is not a valid unix time") from e
    if isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError as e:
            raise QueryError(f"{name}: {value!r} is not an ISO 8601 time like 2024-05-01T12:00:00Z") from e
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    raise QueryError(f"{name}: expected a time")


@dataclass
class Filters:
    """Must-match restrictions; each a value or a list of values (any of them matches)."""

    type: str | list[str] | None = None
    agent: str | list[str] | None = None
    session: str | list[str] | None = None
    scope: str | list[str] | None = None
    kind: str | list[str] | None = None
    status: str | list[str] | None = None
    tags: str | list[str] | None = None
    bucket: str | list[str] | None = None
    key: str | list[str] | None = None
    since: datetime | float | str | None = None  # inclusive
    until: datetime | float | str | None = None  # exclusive

    @classmethod
    def of(cls, value: Filters | Mapping | None) -> Filters:
        if value is None:
            return cls()
        if isinstance(value, Filters):
            return value
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise QueryError(f"unknown filter {', '.join(unknown)}; use {', '.join(sorted(known))}")
        return cls(**{k: v for k, v in value.items() if v is not None})


def _term_set(schema: tantivy.Schema, name: str, values: Sequence[str]) -> tantivy.Query:
    if len(values) == 1:
        return tantivy.Query.term_query(schema, name, values[0], index_option="basic")
    return tantivy.Query.term_set_query(schema, name, list(values))


def filter_clauses(schema: tantivy.Schema, filters: Filters) -> list[tantivy.Query]:
    clauses = []
    for name in FILTER_FIELDS:
        values = _values(name, getattr(filters, name))
        if name == "type":
            bad = [v for v in values if v not in TYPES]
            if bad:
                raise QueryError(f"type: {bad[0]!r} is not one of {', '.join(TYPES)}")
        if values:
            clauses.append(_term_set(schema, name, values))
    since, until = parse_time("since", filters.since), parse_time("until", filters.until)
    if since and until and since >= until:
        raise QueryError("since must be before until")
    # beyond the index's span: no bound on that side; within it, entries are clamped alike
    # The index keeps times to the second: since is taken from the start of its second, so an
    # item later in that second is not missed (a poller passing the last hit's time sees that
    # hit again rather than losing the ones after it); until is compared as the index holds
    # times, so an item in until's own second counts as before it.
    since = clamp_time(since.replace(microsecond=0)) if since and since > TIME_MIN else None
    until = clamp_time(until) if until and until <= TIME_MAX else None
    if since or until:
        clauses.append(tantivy.Query.range_query(schema, "time", tantivy.FieldType.Date, since, until,
                                                 include_lower=True, include_upper=until is None))
    return clauses


@dataclass(frozen=True)
class Exclusion:
    """Entries of ``type`` the caller may not read, by patterns over their ``resource``.

    Tokens grant whole scopes; an exclusion takes out what a narrower rule denies inside
    one (a policy's Deny on ``org/board-*``), so counts and pages stay exact. Each of
    ``patterns`` is a Tantivy regex matched against the whole resource (see
    :func:`regex_literal`), and an entry matches when any does; ``inverted`` excludes the
    entries that match none (a Deny with NotResource: all but the union of its patterns).
    Each pattern is its own regex query: one alternation of them all can pass the 1,000
    states Tantivy compiles a regex into.
    """

    type: str
    patterns: tuple[str, ...]
    inverted: bool = False
    #: patterns of resources readable all the same (granted by another Allow): not excluded
    unless: tuple[str, ...] = ()


def regex_literal(text: str) -> str:
    """``text`` as a Tantivy regex that matches exactly it (every non-alphanumeric escaped)."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):X}}}" for c in text)


def exclusion_clauses(schema: tantivy.Schema, exclusions: Iterable[Exclusion]) -> list[tantivy.Query]:
    """One must-not clause per exclusion: (its type AND its resource pattern, or not it)."""
    out = []
    for ex in exclusions:
        if ex.type not in TYPES:
            raise QueryError(f"exclusion: type {ex.type!r} is not one of {', '.join(TYPES)}")
        of_type = tantivy.Query.term_query(schema, "type", ex.type, index_option="basic")
        occur = tantivy.Occur.MustNot if ex.inverted else tantivy.Occur.Must
        if not ex.patterns:
            raise QueryError("exclusion: at least one pattern is needed")
        matches = [_resource_regex(schema, pattern) for pattern in ex.patterns]
        matched = matches[0] if len(matches) == 1 else \
            tantivy.Query.boolean_query([(tantivy.Occur.Should, m) for m in matches])
        parts = [(tantivy.Occur.Must, of_type), (occur, matched)]
        parts += [(tantivy.Occur.MustNot, _resource_regex(schema, pattern)) for pattern in ex.unless]
        out.append(tantivy.Query.boolean_query(parts))
    return out


def _resource_regex(schema: tantivy.Schema, pattern: str) -> tantivy.Query:
    try:
        return tantivy.Query.regex_query(schema, "resource", pattern)
    except ValueError as e:
        raise QueryError(f"exclusion: {pattern[:80]!r} is not a regex Tantivy reads ({e})") from e


def access_clause(schema: tantivy.Schema, tokens: Iterable[str]) -> tantivy.Query:
    """Matches the entries readable with any of ``tokens``; no tokens, no entries."""
    tokens = sorted({t for t in tokens if isinstance(t, str) and t})
    if not tokens:
        return tantivy.Query.empty_query()
    return tantivy.Query.term_set_query(schema, "access", tokens)


# -- user text --------------------------------------------------------------------------

_QUOTED_OR_FIELD = re.compile(r'"[^"]*"?|(?<![\w.])([A-Za-z_][\w.\-]*):')
#: an unquoted word with a slash (a path, a URL): ``/`` would start a regex, so it is quoted
_SLASHED = re.compile(r'"[^"]*"?|(?<!\S)([+-]?(?:[A-Za-z_][\w.\-]*:)?)([^\s"()\[\]{}]*/[^\s"()\[\]{}]*)')
#: ``field:*`` asks Tantivy for an "exists" query, which needs a fast field: read it as ``*``
_FIELD_STAR = re.compile(r"(?<!\S)([+-]?)[A-Za-z_][\w.\-]*:\*(?=\s|$)")
_AND_NOT = re.compile(r"\bAND\s+NOT\s+", re.IGNORECASE)
_OR_NOT = re.compile(r"\bOR\s+NOT\s+")
_LEADING_NOT = re.compile(r"^\s*NOT\s+(?=\S)")
_BARE_DATE = re.compile(r"(?<![\d\-])(\d{4}-\d{2}-\d{2})(?![\dT:])")
_TIME_CLAUSE = re.compile(r"\btime:(\[[^\]]*\]?|\{[^}]*\}?|[<>]=?\s*\S+|\S+)")


def _unknown_fields(text: str) -> str:
    """``http://x`` or ``foo:bar`` outside quotes: read the colon as a space, not as a field."""
    def repl(m: re.Match) -> str:
        name = m.group(1)
        if name is None or name in QUERY_FIELDS:
            return m.group(0)
        return name + " "
    return _QUOTED_OR_FIELD.sub(repl, text)


def _slashes(text: str) -> str:
    def repl(m: re.Match) -> str:
        if m.group(2) is None:
            return m.group(0)
        return f'{m.group(1)}"{m.group(2)}"'
    return _SLASHED.sub(repl, text)


_FIELD_CLAUSE = re.compile(r"([A-Za-z_][\w.\-]*):")
#: Fields whose ``field:value`` in user text restricts rather than ranks.
_RESTRICTING = QUERY_FIELDS - {"title", "body"}


def _top_level_tokens(text: str) -> list[str]:
    """Split on whitespace outside quotes, parentheses and range brackets (unbalanced: to the end)."""
    tokens, current, depth, quote = [], [], 0, False
    for ch in text:
        if quote:
            quote = ch != '"'
        elif ch == '"':
            quote = True
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch.isspace() and depth == 0:
            if current:
                tokens.append("".join(current))
                current = []
            continue
        current.append(ch)
    if current:
        tokens.append("".join(current))
    return tokens


def _require_fields(text: str) -> str:
    """``kind:decision deploy`` means decisions about deploying: a top-level ``field:value``
    on a filter-like field becomes a must-clause (``+``) unless it is part of an ``OR``."""
    tokens = _top_level_tokens(text)
    out = []
    for i, token in enumerate(tokens):
        m = _FIELD_CLAUSE.match(token)
        near_or = (i > 0 and tokens[i - 1] == "OR") or (i + 1 < len(tokens) and tokens[i + 1] == "OR")
        if m and m.group(1) in _RESTRICTING and not near_or:
            token = "+" + token
        out.append(token)
    return " ".join(out)


def _dates(text: str) -> str:
    def clause(m: re.Match) -> str:
        return "time:" + _BARE_DATE.sub(r"\1T00:00:00Z", m.group(1))
    return _TIME_CLAUSE.sub(clause, text)


def tidy(text: str) -> str:
    """The user's text, rewritten where Tantivy would read it surprisingly (see the module docstring)."""
    text = text.replace("\x00", " ")
    text = _unknown_fields(text)
    text = _slashes(text)
    text = _FIELD_STAR.sub(lambda m: "" if m.group(1) == "-" else "*", text)
    text = _AND_NOT.sub("-", text)
    text = _OR_NOT.sub("-", text)
    text = _LEADING_NOT.sub("-", text)
    return _require_fields(_dates(text))


def _only_exclusions(ast: object) -> bool:
    if not isinstance(ast, dict) or ast.get("type") != "bool":
        return False
    clauses = ast.get("clauses") or []
    return bool(clauses) and all(occur == "must_not" for occur, _ in clauses)


def nesting(text: str) -> int:
    """The deepest level of open parentheses (unbalanced ones count: the parser recurses on them too)."""
    depth = deepest = 0
    for ch in text:
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")" and depth:
            depth -= 1
    return deepest


@dataclass
class ParsedQuery:
    """The text part of a search: what ranks and what the snippet highlights."""

    query: tantivy.Query
    match_all: bool  # no words at all: every entry matches, newest first
    warnings: list[str]


def parse_user_text(index: tantivy.Index, text: str | None) -> ParsedQuery:
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise QueryError("q: expected text")
    if len(text) > MAX_QUERY_CHARS:
        raise QueryError(f"q: {len(text)} characters; at most {MAX_QUERY_CHARS} are accepted")
    if text.count("(") > MAX_NESTING and (depth := nesting(text)) > MAX_NESTING:
        raise QueryError(f"q: parentheses nest {depth} levels deep; at most {MAX_NESTING} are accepted")
    tidied = tidy(text).strip()
    if not tidied or tidied == "*":
        return ParsedQuery(tantivy.Query.all_query(), True, [])
    try:
        ast, _ = tantivy.parse_query_lenient(tidied)
    except Exception:  # noqa: BLE001 - the AST is only a hint here
        ast = None
    if _only_exclusions(ast):
        tidied = "* " + tidied
    try:
        query, errors = index.parse_query_lenient(tidied, DEFAULT_FIELDS, field_boosts=FIELD_BOOSTS)
    except Exception as e:  # noqa: BLE001 - lenient parsing should not raise; if it does, say so
        raise QueryError(f"q: could not be read ({e})") from e
    return ParsedQuery(query, False, [str(err) for err in errors][:10])
