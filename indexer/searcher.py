"""Searching the index: ranked, filtered, access-controlled hits with snippets.

The whole request is one Tantivy query — user text (ranked) AND access tokens AND
filters — so ``count`` is the number of readable matches and paging never skips
or leaks. Scores are BM25 over ``title`` (boost 2) and ``body``, scaled by status
(:data:`indexer.schema.STATUS_FACTOR`): a superseded memory keeps a third of its
score and is marked ``superseded``. With no words (empty text or ``*``), every
readable entry matching the filters is returned, newest first.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime

import tantivy

from .query import (
    MAX_LIMIT,
    MAX_OFFSET,
    Exclusion,
    Filters,
    QueryError,
    access_clause,
    exclusion_clauses,
    filter_clauses,
    parse_user_text,
)
from .schema import open_index, unweight

#: Characters of a snippet.
SNIPPET_CHARS = 240


@dataclass
class Hit:
    type: str
    id: str
    score: float
    time: str  # ISO 8601, UTC
    title: str
    #: a fragment of the body around the best match (its start when nothing in the body matched)
    snippet: str
    #: ``[start, end)`` character offsets of the matched words in ``snippet``
    highlights: list[tuple[int, int]]
    #: the snippet as HTML: escaped, matches in ``<b>``
    snippet_html: str
    #: what the gateway resolves to fetch the full item (see :mod:`indexer.documents`)
    source: str
    status: str
    superseded: bool
    agent: str = ""
    session: str = ""
    scope: str = ""
    kind: str = ""
    tags: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SearchResult:
    hits: list[Hit]
    count: int  # readable matches in all, not just this page
    warnings: list[str] = field(default_factory=list)  # what the lenient parser passed over

    def to_dict(self) -> dict:
        return {"hits": [h.to_dict() for h in self.hits], "count": self.count, "warnings": self.warnings}


def _first(doc: tantivy.Document, name: str) -> str:
    value = doc.get_first(name)
    return value if isinstance(value, str) else ""


def _char_ranges(fragment: str, ranges: Iterable) -> list[tuple[int, int]]:
    """Tantivy's highlight ranges are UTF-8 byte offsets; callers want character offsets."""
    encoded = fragment.encode()
    out = []
    for r in ranges:
        start = len(encoded[:r.start].decode(errors="ignore"))
        end = len(encoded[:r.end].decode(errors="ignore"))
        out.append((start, end))
    return out


class IndexSearcher:
    """Searches one index: pass the writer's ``tantivy.Index`` (sees its commits) or a directory."""

    def __init__(self, index: tantivy.Index | str | os.PathLike) -> None:
        if isinstance(index, tantivy.Index):
            self.index = index
        else:
            self.index = open_index(index, create=False)
        self.schema = self.index.schema

    def reload(self) -> None:
        """See commits made through another ``tantivy.Index`` object on the same directory."""
        self.index.reload()

    @property
    def num_docs(self) -> int:
        return self.index.searcher().num_docs

    def search(self, query_text: str | None, filters: Filters | Mapping | None = None,
               tokens: Iterable[str] = (), limit: int = 10, offset: int = 0,
               exclusions: Iterable[Exclusion] = ()) -> SearchResult:
        """Hits readable with any of ``tokens``, and not taken out by ``exclusions``, that match
        ``query_text`` and ``filters``.

        Raises :class:`QueryError` for input refused outright; anything the lenient
        parser passes over is reported in ``warnings``.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_LIMIT:
            raise QueryError(f"limit: expected 0 to {MAX_LIMIT}")
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_OFFSET:
            raise QueryError(f"offset: expected 0 to {MAX_OFFSET}")
        if isinstance(tokens, str):
            raise QueryError("tokens: expected a list of access tokens, not one string")
        tokens = list(tokens)
        parsed = parse_user_text(self.index, query_text)
        clauses = [(tantivy.Occur.Must, access_clause(self.schema, tokens))]
        clauses += [(tantivy.Occur.Must, q) for q in filter_clauses(self.schema, Filters.of(filters))]
        clauses += [(tantivy.Occur.MustNot, q) for q in exclusion_clauses(self.schema, exclusions)]
        if not parsed.match_all:
            clauses.append((tantivy.Occur.Must, parsed.query))
        query = tantivy.Query.boolean_query(clauses)
        searcher = self.index.searcher()
        try:
            if parsed.match_all:
                result = searcher.search(query, limit=max(limit, 1), offset=offset, count=True,
                                         order_by_field="time", order=tantivy.Order.Desc)
            else:
                result = searcher.search(query, limit=max(limit, 1), offset=offset, count=True,
                                         weight_by_field="weight")
        except ValueError as e:  # e.g. a range over a field that is not indexed for ranges
            raise QueryError(f"q: cannot be run ({e})") from e
        hits = []
        allowed = set(tokens)
        body_snippets = None
        if not parsed.match_all and result.hits and limit:
            body_snippets = tantivy.SnippetGenerator.create(searcher, parsed.query, self.schema, "body")
            body_snippets.set_max_num_chars(SNIPPET_CHARS)
        for score, address in result.hits[:limit]:
            doc = searcher.doc(address)
            # defence in depth: the query already required a token; never return a hit without one
            if not allowed.intersection(doc.get_all("access")):
                continue
            hits.append(self._hit(doc, score, parsed.match_all, body_snippets))
        return SearchResult(hits, result.count or 0, parsed.warnings)

    @staticmethod
    def _hit(doc: tantivy.Document, score: float, match_all: bool,
             generator: tantivy.SnippetGenerator | None) -> Hit:
        body = _first(doc, "body")
        fragment, ranges, html = "", [], ""
        if generator is not None:
            snippet = generator.snippet_from_doc(doc)
            fragment = snippet.fragment()
            if fragment:
                ranges, html = _char_ranges(fragment, snippet.highlighted()), snippet.to_html()
        if not fragment:
            fragment = body[:SNIPPET_CHARS]
            html = (fragment.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                    .replace('"', "&quot;").replace("'", "&#x27;"))
        when = doc.get_first("time")
        status = _first(doc, "status") or "active"
        return Hit(type=_first(doc, "type"), id=_first(doc, "id"),
                   score=0.0 if match_all else round(unweight(score), 6),
                   time=when.isoformat() if isinstance(when, datetime) else "",
                   title=_first(doc, "title"), snippet=fragment, highlights=ranges, snippet_html=html,
                   source=_first(doc, "source"), status=status, superseded=status == "superseded",
                   agent=_first(doc, "agent"), session=_first(doc, "session"), scope=_first(doc, "scope"),
                   kind=_first(doc, "kind"), tags=list(doc.get_all("tags")))
