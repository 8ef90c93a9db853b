"""What goes into the index: one :class:`Entry` per searchable item, and builders per type.

An entry's identity is its *source reference*, the string the gateway resolves to
fetch the full item, so an upsert deletes by that reference and adds the new
version in the same commit (replaying a stretch of the log changes nothing):

==========  =====================================
type        source reference
==========  =====================================
``event``   ``bio:<agent>/<event_id>``
``memory``  ``memory:<scope-path>/<id>``  (scope path: ``org``, ``teams/x``, ``agents/a``)
``skill``   ``skill:<scope-path>/<name>``
``file``    ``s3://<bucket>/<key>``
==========  =====================================

Access tokens are what a caller must hold (one of) to see an entry: ``org``,
``team:<name>``, ``agent:<id>``, ``owner:<id>``, ``bucket:<name>``... The builders
give a default per type; the gateway, which knows the policies, may pass its own.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import tantivy

from .schema import TYPES, clamp_time, status_weight

#: Characters of ``body`` indexed and stored per entry; longer text is cut (and says so
#: in :attr:`Entry.truncated`). Biography ``content`` can be 1 MiB; a snippet needs far less.
MAX_BODY_CHARS = 256 * 1024
#: Workspace files larger than this are not indexed (their bytes are not read).
MAX_FILE_BYTES = 1024 * 1024
#: How many leading bytes are sniffed for NUL bytes / valid UTF-8.
SNIFF_BYTES = 8192


def _utc(value: datetime | float | int | None) -> datetime:
    if value is None:
        return datetime.now(UTC)
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromtimestamp(float(value), UTC)


def _list(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [v for v in value if v]


@dataclass
class Entry:
    """One searchable item. ``source`` is its identity (see the module docstring)."""

    type: str
    id: str
    source: str
    title: str
    body: str
    time: datetime
    access: list[str]
    agent: str = ""
    session: str = ""
    scope: str = ""
    kind: str = ""
    tags: list[str] = field(default_factory=list)
    bucket: str = ""
    key: str = ""
    status: str = "active"
    #: the caller's name for the entry in its access decisions (the gateway: the ARN a read
    #: of the item is authorized on); searches can exclude entries by patterns over it
    resource: str = ""
    truncated: bool = False

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"type: {self.type!r} is not one of {', '.join(TYPES)}")
        if not self.source:
            raise ValueError("source: required (it is the entry's identity)")
        if not self.access:
            raise ValueError("access: at least one token is required, or no one could ever find it")
        self.time = clamp_time(_utc(self.time))
        if len(self.body) > MAX_BODY_CHARS:
            self.body, self.truncated = self.body[:MAX_BODY_CHARS], True

    def to_document(self) -> tantivy.Document:
        doc = tantivy.Document()
        doc.add_text("uid", self.source)
        doc.add_text("source", self.source)
        for name in ("type", "id", "agent", "session", "scope", "kind", "bucket", "key", "status"):
            value = getattr(self, name)
            if value:
                doc.add_text(name, value)
        for tag in self.tags:
            doc.add_text("tags", tag)
        for token in self.access:
            doc.add_text("access", token)
        doc.add_text("title", self.title)
        doc.add_text("body", self.body)
        if self.resource:
            doc.add_text("resource", self.resource)
        doc.add_date("time", self.time)
        doc.add_float("weight", status_weight(self.status))
        return doc


# -- source references -----------------------------------------------------------------


def scope_path(scope: str) -> str:
    """``org`` -> ``org``, ``team:x`` -> ``teams/x``, ``agent:a`` -> ``agents/a`` (as memory stores it)."""
    if scope == "org":
        return "org"
    kind, sep, name = scope.partition(":")
    if not sep or kind not in ("team", "agent") or not name:
        raise ValueError(f"scope: {scope!r} is not org, team:<name> or agent:<name>")
    return f"{kind}s/{name}"


def event_ref(agent: str, event_id: str) -> str:
    return f"bio:{agent}/{event_id}"


def memory_ref(scope: str, doc_id: str) -> str:
    return f"memory:{scope_path(scope)}/{doc_id}"


def skill_ref(scope: str, name: str) -> str:
    return f"skill:{scope_path(scope)}/{name}"


def file_ref(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


def scope_tokens(scope: str) -> list[str]:
    """Who may read something of ``scope``: the scope itself is the token (``org``, ``team:x``...)."""
    scope_path(scope)  # validates
    return [scope]


# -- builders per type -------------------------------------------------------------------


def event_entry(agent: str, event_id: str, *, kind: str, content: str,
                time: datetime | float, session: str = "", title: str | None = None, tags: Sequence[str] = (),
                access: Sequence[str] | None = None, resource: str = "") -> Entry:
    """A biography event. Default access: ``agent:<agent>`` and ``owner:<agent>`` (its own biography)."""
    # the first line, from the text's start only: stripping or splitting a whole tool output
    # (kilobytes) for 120 characters of title cost more than the rest of the entry
    first = content[:512].strip().split("\n", 1)[0][:120] if content else ""
    return Entry(type="event", id=event_id, source=event_ref(agent, event_id),
                 title=title if title is not None else (f"{kind}: {first}" if first else kind),
                 body=content, time=time, agent=agent, session=session, kind=kind, tags=list(tags),
                 access=list(access) if access else [f"agent:{agent}", f"owner:{agent}"], resource=resource)


def memory_entry(scope: str, doc_id: str, *, kind: str, title: str, body: str, time: datetime | float,
                 status: str = "active", tags: Sequence[str] = (), rationale: str = "",
                 agent: str = "", access: Sequence[str] | None = None, resource: str = "") -> Entry:
    """An open-memory document (``agent``: who decided). Default access: its scope."""
    text = f"{body}\n\n{rationale}" if rationale else body
    return Entry(type="memory", id=doc_id, source=memory_ref(scope, doc_id), title=title, body=text,
                 time=time, scope=scope, kind=kind, status=status, tags=list(tags), agent=agent,
                 access=list(access) if access else scope_tokens(scope), resource=resource)


def skill_entry(scope: str, name: str, *, description: str, body: str, time: datetime | float,
                tags: Sequence[str] = (), status: str = "active",
                access: Sequence[str] | None = None, resource: str = "") -> Entry:
    """A skill (``SKILL.md``): title is its name and description, body its instructions."""
    return Entry(type="skill", id=name, source=skill_ref(scope, name), title=f"{name}: {description}",
                 body=body, time=time, scope=scope, kind="skill", tags=list(tags), status=status,
                 access=list(access) if access else scope_tokens(scope), resource=resource)


def file_entry(bucket: str, key: str, data: bytes, *, time: datetime | float,
               content_type: str | None = None, access: Sequence[str] | None = None, resource: str = "",
               agent: str = "", session: str = "", max_bytes: int = MAX_FILE_BYTES) -> Entry | None:
    """A workspace file, or None when it is not indexable (see :func:`skip_reason`).

    The title is the key (its path words are searchable); the body is the text.
    Default access: ``bucket:<bucket>``.
    """
    if skip_reason(key, content_type, len(data), data[:SNIFF_BYTES], max_bytes) is not None:
        return None
    text = data.decode("utf-8", errors="replace")
    return Entry(type="file", id=key, source=file_ref(bucket, key), title=key, body=text, time=time,
                 bucket=bucket, key=key, kind=_extension(key) or "file", agent=agent, session=session,
                 access=list(access) if access else [f"bucket:{bucket}"], resource=resource)


# -- which files are indexable -------------------------------------------------------------

_TEXT_TYPES = frozenset({
    "application/json", "application/ld+json", "application/x-ndjson", "application/jsonl",
    "application/xml", "application/yaml", "application/x-yaml", "application/toml",
    "application/javascript", "application/x-javascript", "application/typescript", "application/sql",
    "application/x-sh", "application/x-shellscript", "application/x-python", "application/x-tex",
    "application/graphql", "application/x-httpd-php", "application/csv", "application/x-ipynb+json",
})
_TEXT_EXTENSIONS = frozenset("""
    txt md markdown rst adoc org tex csv tsv log json jsonl ndjson yaml yml toml ini cfg conf env
    xml html htm css scss less svg py pyi ipynb rs go java kt kts scala c h cc cpp cxx hpp hh cs m mm
    swift js mjs cjs jsx ts tsx vue svelte rb php pl pm lua r jl dart ex exs erl hrl hs ml mli clj
    cljs el lisp scm sh bash zsh fish ps1 bat cmd sql graphql proto thrift tf hcl nix gradle cmake
    make mk dockerfile gitignore editorconfig properties lock patch diff
""".split())
_TEXT_NAMES = frozenset({"makefile", "dockerfile", "readme", "license", "changelog", "gemfile",
                         "rakefile", "procfile", "jenkinsfile", "vagrantfile"})
#: Content types that are surely binary: never sniffed, never indexed.
_BINARY_PREFIXES = ("image/", "audio/", "video/", "font/", "application/zip", "application/gzip",
                    "application/pdf", "application/x-tar", "application/vnd.", "application/x-7z",
                    "application/wasm", "application/x-parquet", "application/vnd.apache.parquet",
                    "application/zstd", "application/x-executable", "application/x-sharedlib")


def _extension(key: str) -> str:
    base = posixpath.basename(key).lower()
    if base in _TEXT_NAMES:
        return base
    _, dot, ext = base.rpartition(".")
    return ext if dot else ""


def _looks_textual(head: bytes) -> bool:
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        # a multi-byte character cut at the end of the sniffed bytes is fine
        return e.start >= len(head) - 3 and e.reason == "unexpected end of data"
    return True


def skip_reason(key: str, content_type: str | None, size: int, head: bytes = b"",
                max_bytes: int = MAX_FILE_BYTES) -> str | None:
    """Why a workspace file is not indexed, or None when it is.

    ``head`` is the file's first bytes (:data:`SNIFF_BYTES` suffice). Reasons:
    ``too-large`` (over ``max_bytes``), ``binary-type`` (a content type that is never
    text), ``not-text`` (neither a text type, a known text extension, nor sniffed as text),
    ``binary-content`` (NUL bytes or invalid UTF-8 in ``head``, whatever the type says).
    """
    if size > max_bytes:
        return "too-large"
    ctype = (content_type or "").split(";", 1)[0].strip().lower()
    if ctype.startswith(_BINARY_PREFIXES) and not ctype.endswith(("+json", "+xml")):
        return "binary-type"
    declared = (ctype.startswith("text/") or ctype in _TEXT_TYPES or ctype.endswith(("+json", "+xml"))
                or _extension(key) in _TEXT_EXTENSIONS)
    generic = ctype in ("", "application/octet-stream", "binary/octet-stream")
    if not declared and not generic:
        return "not-text"
    if not _looks_textual(head):
        return "binary-content"
    return None


def is_indexable(key: str, content_type: str | None, size: int, head: bytes = b"",
                 max_bytes: int = MAX_FILE_BYTES) -> bool:
    """Whether a workspace file is indexed (see :func:`skip_reason`)."""
    return skip_reason(key, content_type, size, head, max_bytes) is None
