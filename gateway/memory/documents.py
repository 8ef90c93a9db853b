"""Open-memory documents: the fields, their order, and the one validator REST and S3 share.

A document is one JSON object, pretty-printed (indent 2) with the keys always in
:data:`FIELDS` order and a trailing newline, so people can read and diff it.

What a writer may send is :data:`WRITABLE`; the server sets the rest. Provenance
(``created_*``, ``updated_*``, ``version``, ``superseded_by``, ``format``) can never be set
by a body: a body may carry those fields only unchanged from the stored document (so a
document read with GET, edited and PUT back is accepted), and even then the server
overwrites them. ``decided_by`` is content (who decided: often a person, not the writer)
and may be given; when absent it is the writer. ``status`` is changed only by superseding
and retracting; a write makes the document active.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from ..iam.model import _NAME as NAME_RE

FORMAT = 1
#: The largest document (the JSON a client sends) accepted.
MAX_DOCUMENT = 256 * 1024

KINDS = ("fact", "lesson", "preference", "decision")
STATUSES = ("active", "superseded", "retracted")

#: Every field, in the order documents are written.
FIELDS = ("format", "id", "kind", "title", "body", "tags", "scope", "applies_to", "rationale",
          "evidence", "decided_by", "decided_at", "valid_from", "valid_until", "status", "supersedes",
          "superseded_by", "version", "created_at", "created_by", "updated_at", "updated_by")
WRITABLE = frozenset({"id", "kind", "title", "body", "tags", "scope", "applies_to", "rationale",
                      "evidence", "decided_by", "decided_at", "valid_from", "valid_until", "status",
                      "supersedes"})
SERVER_SET = ("format", "version", "created_at", "created_by", "updated_at", "updated_by",
              "superseded_by")

ID_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,126}[a-z0-9])?\Z")
TAG_RE = re.compile(r"^[a-z0-9][a-z0-9._:/-]{0,63}\Z")
MAX_TITLE = 300
MAX_TAGS = 50
MAX_EVIDENCE = 200
MAX_EVIDENCE_ITEM = 1024
MAX_APPLIES = 500
MAX_RATIONALE = 16 * 1024


class DocumentError(ValueError):
    """A document that cannot be stored; the message names the field."""

    def __init__(self, message: str, code: str = "InvalidDocument", status: int = 400,
                 names: tuple[Scope, str] | None = None, hidden: str | None = None) -> None:
        super().__init__(message)
        self.code, self.status = code, status
        #: the other document the message names (a duplicate's holder, a successor), and the
        #: message for a caller that may not read that document
        self.names = names
        self.hidden = hidden or "It conflicts with a document you may not read; nothing was stored."


# -- scopes ----------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Scope:
    """``org``, ``team:<name>`` or ``agent:<name>``."""

    kind: str  # "org", "team" or "agent"
    name: str = ""

    def __str__(self) -> str:
        return "org" if self.kind == "org" else f"{self.kind}:{self.name}"

    @property
    def path(self) -> str:
        """Where it lives in storage and in the ``memory`` bucket: ``org``, ``teams/x``, ``agents/a``."""
        return "org" if self.kind == "org" else f"{self.kind}s/{self.name}"

    @property
    def arn_part(self) -> str:
        """Its part of ``arn:orgmem:memory:::SCOPE/ID``: ``org``, ``team/x``, ``agent/a``."""
        return "org" if self.kind == "org" else f"{self.kind}/{self.name}"

    @classmethod
    def parse(cls, text: Any) -> Scope:
        if not isinstance(text, str):
            raise DocumentError("scope: must be a string: org, team:<name> or agent:<name>.")
        if text == "org":
            return cls("org")
        kind, sep, name = text.partition(":")
        if not sep or kind not in ("team", "agent") or not NAME_RE.match(name):
            raise DocumentError(f"scope: {text!r} is not a scope; use org, team:<name> or agent:<name> "
                                "(names are lowercase letters, digits and inner hyphens).")
        return cls(kind, name)

    @classmethod
    def from_path(cls, path: str) -> Scope:
        """The inverse of :attr:`path`."""
        if path == "org":
            return cls("org")
        plural, _, name = path.partition("/")
        if plural not in ("teams", "agents") or not NAME_RE.match(name):
            raise DocumentError(f"{path!r} is not a memory scope path; use org, teams/<name> or "
                                "agents/<name>.")
        return cls(plural[:-1], name)


def check_id(doc_id: str) -> str:
    if not isinstance(doc_id, str) or not ID_RE.match(doc_id):
        raise DocumentError(f"id: {doc_id!r} is not a document id: use 1 to 128 lowercase letters, "
                            "digits and hyphens, starting and ending with a letter or digit.")
    return doc_id


# -- times -----------------------------------------------------------------------------


def now_text(ts: float) -> str:
    """Canonical RFC 3339 text, UTC, microseconds; the year always four digits (strftime's
    %Y drops the zeros of years before 1000), so canonical texts compare as the times do."""
    t = datetime.fromtimestamp(ts, UTC)
    return f"{t.year:04d}-{t:%m-%dT%H:%M:%S.%f}Z"


def parse_time(text: Any, field: str = "time") -> float:
    """RFC 3339 (with a zone, or ``Z``) to unix seconds; DocumentError naming ``field``."""
    if isinstance(text, str) and len(text) >= 20 and text[:4].isdigit() and text[10:11] in ("T", "t"):
        try:
            dt = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
        except ValueError:
            dt = None
        if dt is not None and dt.tzinfo is not None:
            return dt.timestamp()
    raise DocumentError(f"{field}: {text!r} is not an RFC 3339 time with a zone, "
                        "such as 2026-03-02T09:30:00Z.")


def _normal_time(value: Any, field: str) -> str:
    seconds = parse_time(value, field)
    try:
        return now_text(seconds)
    except (ValueError, OverflowError, OSError):  # 9999-12-31T23:59:59-01:00 is in year 10000
        raise DocumentError(f"{field}: {value!r} is out of range; times run from "
                            "0001-01-01 to 9999-12-31 UTC.") from None


# -- validation ------------------------------------------------------------------------


def parse_json(data: bytes) -> dict:
    if len(data) > MAX_DOCUMENT:
        raise DocumentError(f"A memory document is at most {MAX_DOCUMENT} bytes; this one is "
                            f"{len(data)}. Keep the body short and link the rest as evidence.",
                            "EntityTooLarge", 413)
    if not data.strip():
        raise DocumentError("The body is empty: send the document as a JSON object.")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DocumentError(f"The document is not valid JSON: {exc}.") from None
    if not isinstance(doc, dict):
        raise DocumentError("The document must be a JSON object.")
    return doc


def _string(doc: dict, name: str, limit: int, required: bool = False, empty: bool = True) -> str | None:
    value = doc.get(name)
    if value is None:
        if required:
            raise DocumentError(f"{name}: required.")
        return None
    if not isinstance(value, str):
        raise DocumentError(f"{name}: must be a string, not {_type(value)}.")
    if not empty and not value.strip():
        raise DocumentError(f"{name}: must not be empty.")
    if len(value) > limit:
        raise DocumentError(f"{name}: at most {limit} characters.")
    return value


def _strings(value: Any, name: str, limit: int, item_limit: int, pattern: re.Pattern | None = None,
             what: str = "") -> list[str]:
    """``value`` (the field ``name``'s own value) as a list of distinct valid strings."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise DocumentError(f"{name}: must be a list of strings, not {_type(value)}.")
    if len(value) > limit:
        raise DocumentError(f"{name}: at most {limit} entries.")
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise DocumentError(f"{name}[{i}]: must be a string, not {_type(item)}.")
        if not item or len(item) > item_limit or (pattern is not None and not pattern.match(item)):
            raise DocumentError(f"{name}[{i}]: {item!r} is not {what or 'valid'}.")
        if item not in out:
            out.append(item)
    return out


def _type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


@dataclass
class Draft:
    """A validated write: the writable fields, normalized, plus what was asserted unchanged."""

    fields: dict[str, Any]
    #: server-set fields the body carried (must equal the stored document's)
    echoed: dict[str, Any]


def validate(doc: dict, scope: Scope, doc_id: str) -> Draft:
    """Check a client's document for ``scope``/``doc_id``; DocumentError names the first problem."""
    unknown = sorted(set(doc) - WRITABLE - set(SERVER_SET))
    if unknown:
        raise DocumentError(f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                            f"a document has {', '.join(FIELDS)}.")
    given_id = doc.get("id")
    if given_id is not None and given_id != doc_id:
        raise DocumentError(f"id: the document says {given_id!r} but is written at {doc_id!r}; "
                            "they must match.")
    if "scope" in doc and doc["scope"] is not None and Scope.parse(doc["scope"]) != scope:
        raise DocumentError(f"scope: the document says {doc['scope']!r} but is written to scope "
                            f"{scope}; they must match.")
    kind = doc.get("kind")
    if kind is None:
        raise DocumentError(f"kind: required; one of {', '.join(KINDS)}.")
    if kind not in KINDS:
        raise DocumentError(f"kind: {kind!r} is not a kind; use one of {', '.join(KINDS)}.")
    fields: dict[str, Any] = {"id": doc_id, "kind": kind,
                              "title": _string(doc, "title", MAX_TITLE, required=True, empty=False),
                              "body": _string(doc, "body", MAX_DOCUMENT) or "",
                              "tags": _strings(doc.get("tags"), "tags", MAX_TAGS, 64, TAG_RE,
                                               "a tag (lowercase letters, digits and . _ : / -)"),
                              "scope": str(scope)}
    applies = doc.get("applies_to")
    if applies is None:
        applies = {}
    if not isinstance(applies, dict):
        raise DocumentError(f"applies_to: must be an object with agents and teams, not {_type(applies)}.")
    extra = sorted(set(applies) - {"agents", "teams"})
    if extra:
        raise DocumentError(f"applies_to: unknown field {extra[0]}; it has agents and teams.")
    fields["applies_to"] = {
        "agents": _strings(applies.get("agents"), "applies_to.agents", MAX_APPLIES, 57, NAME_RE,
                           "an agent name"),
        "teams": _strings(applies.get("teams"), "applies_to.teams", MAX_APPLIES, 57, NAME_RE,
                          "a team name"),
    }
    fields["rationale"] = _string(doc, "rationale", MAX_RATIONALE)
    fields["evidence"] = _strings(doc.get("evidence"), "evidence", MAX_EVIDENCE, MAX_EVIDENCE_ITEM, None,
                                  f"evidence (at most {MAX_EVIDENCE_ITEM} characters)")
    decided_by = doc.get("decided_by")
    if decided_by is not None:
        decided_by = _string(doc, "decided_by", 200, empty=False)
    fields["decided_by"] = decided_by
    for name in ("decided_at", "valid_from", "valid_until"):
        value = doc.get(name)
        fields[name] = None if value is None else _normal_time(value, name)
    if fields["valid_from"] and fields["valid_until"] and \
            parse_time(fields["valid_until"]) < parse_time(fields["valid_from"]):
        raise DocumentError("valid_until: must not be earlier than valid_from.")
    if fields["valid_from"] and fields["valid_until"] == fields["valid_from"] \
            and doc.get("status") != "superseded":
        # an empty window is only what superseding leaves a document whose successor
        # started first (it was never in force); a write asks for a real one
        raise DocumentError("valid_until: must be later than valid_from.")
    status = doc.get("status")
    if status is not None and status not in STATUSES:
        raise DocumentError(f"status: {status!r} is not a status; use one of {', '.join(STATUSES)}.")
    fields["status"] = status
    supersedes = doc.get("supersedes")
    if supersedes is not None:
        supersedes = check_id(supersedes) if isinstance(supersedes, str) else _bad_supersedes(supersedes)
        if supersedes == doc_id:
            raise DocumentError("supersedes: a document cannot supersede itself.")
    fields["supersedes"] = supersedes
    echoed = {name: doc[name] for name in SERVER_SET if name in doc}
    return Draft(fields, echoed)


def _bad_supersedes(value: Any) -> str:
    raise DocumentError(f"supersedes: must be the id of a document of the same scope, not {_type(value)}.")


def check_echoed(draft: Draft, current: dict | None) -> None:
    """Server-set fields in a body must be what the stored document holds: provenance is the
    server's. A stale ``version`` is a lost update, answered 412 like a failed If-Match."""
    for name, value in draft.echoed.items():
        stored = current.get(name) if current is not None else None
        if name == "format" and value == FORMAT:
            continue
        if name == "version" and current is not None and value != stored and isinstance(value, int):
            raise DocumentError(f"version: the document was edited from version {value} but the "
                                f"current version is {stored}; read it again and reapply the change.",
                                "PreconditionFailed", 412)
        if value != stored:
            raise DocumentError(f"{name}: provenance is set by the server from the authenticated caller "
                                f"and cannot be given in a document (leave {name} out).")


# -- rendering -------------------------------------------------------------------------


def render(doc: dict) -> bytes:
    """The stored form: every field in order, indent 2, trailing newline."""
    ordered = {name: doc.get(name) for name in FIELDS}
    return orjson.dumps(ordered, option=orjson.OPT_INDENT_2) + b"\n"


def fingerprint(doc: dict) -> str:
    """What makes two documents duplicates: title and body, casefolded, whitespace collapsed."""
    text = " ".join(f"{doc.get('title') or ''}\n{doc.get('body') or ''}".casefold().split())
    return hashlib.sha256(text.encode()).hexdigest()


def valid_at(doc: dict, ts: float) -> bool:
    """Whether ``ts`` lies in the document's validity window."""
    start = doc.get("valid_from")
    end = doc.get("valid_until")
    return (start is None or parse_time(start) <= ts) and (end is None or ts < parse_time(end))


def applies(doc: dict, agent: str, teams: tuple[str, ...] | list[str]) -> bool:
    """Whether a document of a scope the agent belongs to applies to it (empty: everyone in scope)."""
    target = doc.get("applies_to") or {}
    agents, wanted = target.get("agents") or [], target.get("teams") or []
    if not agents and not wanted:
        return True
    return agent in agents or any(t in wanted for t in teams)
