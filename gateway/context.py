"""The context pack (``POST /v1/context``): what an agent needs to continue its work, in a budget.

Knows nothing of HTTP or policies: the caller passes ``permits(action, resource)`` (the REST
layer's per-item check), and only what that allows is read into the pack.

A pack has four sections, filled in this priority order:

1. ``decisions``: the standing decisions and preferences that apply to the agent (its own, its
   teams', the org's: :meth:`Memory.for_agent`, the same set as ``GET /v1/memory/for/AGENT``);
2. ``session``: for a session, its last state: open questions (a ``question`` with no later
   ``answer`` whose ``parent_id`` names it), the last error, the last ``state`` event, and the
   artifacts produced (newest first, one per URI);
3. ``relevant``: the memories (lessons and facts) and skills most relevant to the query, from
   the search index when one is attached (:attr:`ContextPacks.search`), else from a simple word
   overlap over the agent's applicable documents and the skills of its scopes. Without a query,
   a session's open questions and last error stand in for one;
4. ``recent``: the session's most recent events, newest first.

Every item names its source: ``memory:<scope path>/<id>``, ``skill:<scope path>/<name>``,
``bio:<agent>/<event_id>`` or an artifact's ``s3://bucket/key``.

**Budget.** The pack is also rendered as one Markdown document (what ``orgmem context``
prints, and what an agent would load); ``used_tokens`` is :func:`count_tokens` of that
document and never exceeds ``budget_tokens``. Required items (open questions, the last error,
the last artifact) have a small reservation taken first, so they survive tight budgets; then
each section takes what it needs in priority order, an item that does not fit whole is cut
(its text ends in "…") rather than dropped while a useful part fits, and what is dropped is
counted per section. Sections that lost or cut anything are listed in ``truncated``.
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from .biography.events import Event, format_ts
from .biography.query import Filter
from .biography.service import Biographies
from .logs import log
from .memory.documents import Scope
from .memory.service import Memory
from .memory.skills import Scope as SkillScope
from .memory.skills import Skills

#: The bounds of ``budget_tokens``.
MIN_BUDGET = 100
MAX_BUDGET = 200_000
#: The longest query accepted (characters).
MAX_QUERY = 4096
#: Events read per page while walking a session.
SESSION_PAGE = 50_000
#: Recent events kept (the budget decides how many are shown).
RECENT = 50
#: Artifacts listed (newest first, one per URI).
ARTIFACTS = 20
#: Open questions listed (oldest first: the longest waiting).
OPEN_QUESTIONS = 50
#: Relevant memories and skills considered.
RELEVANT = 20
#: No item's text is longer than this many characters, whatever the budget.
MAX_ITEM_CHARS = 16_000
#: Tokens kept for the text of a required item under a tight budget.
REQUIRED_TEXT_TOKENS = 24
#: An optional item is cut only if at least this many tokens of its text fit.
MIN_CUT_TOKENS = 12

#: ``permits(action, resource)``: whether the caller may.
Permits = Callable[[str, str], bool]

SECTIONS = (("decisions", "Decisions and preferences"), ("session", "Session state"),
            ("relevant", "Relevant memories and skills"), ("recent", "Recent events, newest first"))

# -- counting tokens -------------------------------------------------------------------------

#: An ASCII word, or any other single visible character (punctuation, a CJK ideograph, an emoji).
_PIECES = re.compile(r"[A-Za-z0-9_]+|[^\sA-Za-z0-9_]")

TOKEN_HEURISTIC = ("max(ceil(utf8_bytes / 4), pieces): pieces are ASCII words plus every other "
                   "visible character (punctuation, CJK, emoji)")


def count_tokens(text: str) -> int:
    """Tokens ``text`` costs, estimated without a tokenizer: the larger of a quarter of its UTF-8
    bytes (English prose runs about four bytes a token) and its pieces (ASCII words, and each
    other visible character on its own: punctuation-dense text and CJK cost more than bytes/4
    says). It is subadditive: the pieces of a text joined by newlines never cost more than the
    sum of the pieces, so summing items bounds the whole document."""
    if not text:
        return 0
    return max(math.ceil(len(text.encode("utf-8", "surrogatepass")) / 4), len(_PIECES.findall(text)))


# -- items -----------------------------------------------------------------------------------


@dataclass
class Item:
    """One entry of a pack: a heading line (kept whole) and a text that may be cut."""

    type: str
    title: str
    text: str
    source: str
    time: str | None = None
    required: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    truncated: bool = False

    def __post_init__(self) -> None:
        if len(self.text) > MAX_ITEM_CHARS:  # no one item eats a large budget
            self.text, self.truncated = self.text[:MAX_ITEM_CHARS] + " …", True

    def head(self) -> str:
        """The line kept whole: what it is and where it comes from."""
        return f"- **{_one_line(self.title)[:200]}** `{self.source}`"

    def render(self, text: str | None = None) -> str:
        """The head, and on a second line its time and (some of) its text; a text cut to
        nothing leaves the head alone."""
        body = _one_line(self.text if text is None else text)
        if body and self.time:
            body = f"{_short_time(self.time)} — {body}"
        return self.head() + (f"\n  {body}" if body else "") + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "title": self.title, "text": self.text, "source": self.source,
                "time": self.time, "truncated": self.truncated, **self.extra}


def _short_time(value: Any) -> str:
    """``2026-03-02T09:30:00.123456Z`` -> ``2026-03-02T09:30:00Z``; anything else as it is."""
    text = str(value)
    return text[:19] + "Z" if len(text) > 20 and text[10:11] == "T" and text.endswith("Z") else text


def _one_line(text: str) -> str:
    return " ".join(text.replace("\r", " ").split())


def _cut(item: Item, tokens: int) -> str | None:
    """The longest prefix of the item's text (ending in " …") whose rendering costs at most
    ``tokens``; None when not even the heading fits."""
    if count_tokens(item.render("")) > tokens:
        return None
    text = _one_line(item.text)
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(item.render(text[:mid].rstrip() + " …")) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        return ""
    cut = text[:lo]
    if " " in cut[len(cut) // 2:]:
        cut = cut.rsplit(" ", 1)[0]  # end on a word
    return cut.rstrip() + " …"


@dataclass
class Section:
    name: str
    title: str
    items: list[Item] = field(default_factory=list)
    kept: list[Item] = field(default_factory=list)
    omitted: int = 0
    truncated: bool = False

    def heading(self) -> str:
        return f"\n## {self.title}\n\n"


# -- the search index, when there is one ------------------------------------------------------


class SearchIndex(Protocol):
    def search(self, principal: Any, query: str, filters: dict, limit: int, offset: int) -> dict: ...


def teams_of(identities: Any) -> Callable[[str], tuple[str, ...]]:
    """An agent's teams from the identity store (an unknown agent belongs to none)."""
    def teams(agent: str) -> tuple[str, ...]:
        try:
            return tuple(identities.principal(agent).teams)
        except Exception:  # noqa: BLE001 - a deleted agent's biography has no teams
            return ()
    return teams


# -- the service -----------------------------------------------------------------------------


@dataclass
class Request:
    agent: str
    budget_tokens: int
    session: str | None = None
    query: str | None = None


class ContextPacks:
    def __init__(self, biographies: Biographies, memory: Memory, skills: Skills,
                 teams_of: Callable[[str], tuple[str, ...]], search: SearchIndex | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.bios = biographies
        self.memory = memory
        self.skills = skills
        self.teams_of = teams_of
        #: the search index (``gateway.indexing``) once there is one; None: simple relevance
        self.search = search
        self.clock = clock

    def pack(self, req: Request, principal: Any, permits: Permits) -> dict[str, Any]:
        started = time.perf_counter()
        agent = req.agent
        teams = self.teams_of(agent)
        docs = self.memory.for_agent(
            agent, teams, lambda s, i: permits("memory:GetDocument", _memory_arn(s, i)))
        sections = {name: Section(name, title) for name, title in SECTIONS}
        sections["decisions"].items = [_doc_item(doc) for doc in _decisions(docs)]
        state = self._session(agent, req.session) if req.session else None
        if state is not None:
            sections["session"].items = state["items"]
            sections["recent"].items = state["recent"]
        query, query_from = (req.query or "").strip(), "request"
        if not query and state is not None:
            query, query_from = state["query"], "session"
        if not query:
            query_from = None
        relevant, how = self._relevant(agent, teams, docs, query, principal, permits)
        sections["relevant"].items = relevant
        head = _header(agent, req.session, query if query_from == "request" else None)
        markdown, used = _fit(head, [sections[name] for name, _ in SECTIONS], req.budget_tokens)
        return {
            "agent": agent, "teams": list(teams), "session": req.session,
            "query": query or None, "query_from": query_from, "relevance": how,
            "budget_tokens": req.budget_tokens, "used_tokens": used, "token_heuristic": TOKEN_HEURISTIC,
            "sections": [{"name": s.name, "title": s.title, "items": [i.to_dict() for i in s.kept],
                          "omitted": s.omitted, "truncated": s.truncated}
                         for s in (sections[name] for name, _ in SECTIONS)],
            "truncated": [name for name, _ in SECTIONS if sections[name].truncated],
            "markdown": markdown,
            "took_ms": round((time.perf_counter() - started) * 1000, 1),
        }

    # -- the session -------------------------------------------------------------------------

    def _session(self, agent: str, session: str) -> dict[str, Any]:
        """Walk the session once, in session order, keeping what a pack shows of it."""
        recent: deque[Event] = deque(maxlen=RECENT)
        questions: dict[str, Event] = {}
        last_error = last_state = None
        artifacts: dict[str, Event] = {}
        count = 0
        cursor = None
        while True:
            events, cursor = self.bios.events(Filter(agent, session), SESSION_PAGE, cursor)
            for e in events:
                count += 1
                recent.append(e)
                if e.kind == "question":
                    questions[e.event_id] = e
                elif e.kind == "answer" and e.parent_id:
                    questions.pop(e.parent_id, None)  # only a later answer closes a question
                elif e.kind == "error":
                    last_error = e
                elif e.kind == "state":
                    last_state = e
                elif e.kind == "artifact" and e.artifact_uri:
                    artifacts.pop(e.artifact_uri, None)  # one per URI, at its latest place
                    if _artifact_op(e) != "delete":
                        artifacts[e.artifact_uri] = e
            if cursor is None:
                break
        items: list[Item] = []
        open_qs = list(questions.values())[:OPEN_QUESTIONS]
        for q in open_qs:
            items.append(_event_item(q, "open_question", "Open question", required=True))
        if last_error is not None:
            items.append(_event_item(last_error, "last_error", "Last error", required=True))
        produced = list(reversed(artifacts.values()))
        for n, a in enumerate(produced[:ARTIFACTS]):
            items.append(_artifact_item(a, required=n == 0))
        if last_state is not None:
            items.append(_event_item(last_state, "last_state", "Last state"))
        # required first, so a tight budget keeps them before the rest
        items.sort(key=lambda i: not i.required)
        shown = {i.extra.get("event_id") for i in items}
        recent_items = [_event_item(e, "event", e.kind) for e in reversed(recent) if e.event_id not in shown]
        query = " ".join(_one_line(e.content or "")[:500] for e in [*open_qs[-3:], last_error] if e)
        return {"items": items, "recent": recent_items, "query": query[:MAX_QUERY].strip(),
                "events": count}

    # -- relevance ---------------------------------------------------------------------------

    def _relevant(self, agent: str, teams: tuple[str, ...], docs: list[dict], query: str,
                  principal: Any, permits: Permits) -> tuple[list[Item], str]:
        pool = [doc for doc in docs if doc["kind"] not in ("decision", "preference")]
        skills = self._skills(agent, teams, permits)
        found: list[Item] = []
        if query and self.search is not None:
            try:
                found = self._searched(query, pool, skills, principal)
            except Exception as exc:  # noqa: BLE001 - an index that fails must not fail the pack
                log.warning("context_search_failed", error=exc.__class__.__name__, detail=str(exc)[:200])
        if not query:
            newest = sorted(pool, key=lambda doc: doc["updated_at"], reverse=True)
            items = [_doc_item(doc) for doc in newest[:RELEVANT]]
            room = RELEVANT - len(items)
            items += [_skill_item(m) for m in skills[:room]]
            return items, "recent"
        terms = _terms(query)
        scored: list[tuple[float, str, Item]] = []
        for doc in pool:
            score = _score(terms, doc["title"], " ".join(doc.get("tags") or []), doc.get("body") or "")
            if score > 0:
                scored.append((score, doc["updated_at"], _doc_item(doc, score)))
        for m in skills:
            score = _score(terms, m["name"].replace("-", " "), "", m["description"])
            if score > 0:
                scored.append((score, m["created_at"], _skill_item(m, score)))
        scored.sort(key=lambda row: (row[0], row[1]), reverse=True)
        if not found:
            return [item for _, _, item in scored[:RELEVANT]], "words"
        # the index ranks first; word matches it has not seen yet (it lags writes by a moment) follow
        seen = {item.source for item in found}
        more = [item for _, _, item in scored if item.source not in seen]
        return (found + more)[:RELEVANT], "search"

    def _skills(self, agent: str, teams: tuple[str, ...], permits: Permits) -> list[dict]:
        """The latest version of every skill of the agent's scopes the caller may list."""
        out = []
        for scope in (SkillScope("agent", agent), *(SkillScope("team", t) for t in teams), SkillScope("org")):
            out.extend(self.skills.latest(lambda s, n: permits("skills:ListSkills", s.arn(n)), scope))
        return out

    def _searched(self, query: str, docs: list[dict], skills: list[dict], principal: Any) -> list[Item]:
        """The index ranks; what it finds is shown only when it is one of the agent's applicable
        documents or skills the caller may list (already read and checked), so a hit the index
        lets through wrongly, or a stale one, never reaches the pack."""
        by_source = {memory_ref(doc["scope"], doc["id"]): doc for doc in docs
                     if doc["kind"] not in ("decision", "preference")}
        by_skill = {skill_ref(m["scope"], m["name"]): m for m in skills}
        ranked: list[tuple[float, Item]] = []
        for kind in ("memory", "skill"):
            answer = self.search.search(principal, query, {"type": kind}, RELEVANT * 2, 0)
            for hit in answer.get("hits") or []:
                source = str(hit.get("source") or "")
                score = float(hit.get("score") or 0.0)
                if source in by_source:
                    ranked.append((score, _doc_item(by_source.pop(source), score)))
                elif source in by_skill:
                    ranked.append((score, _skill_item(by_skill.pop(source), score)))
        ranked.sort(key=lambda row: row[0], reverse=True)
        return [item for _, item in ranked[:RELEVANT]]


# -- building items --------------------------------------------------------------------------


_KIND_ORDER = {"decision": 0, "preference": 1, "lesson": 2, "fact": 3}


def _specificity(scope: str) -> int:
    return 0 if scope.startswith("agent:") else 1 if scope.startswith("team:") else 2


def _decisions(docs: list[dict]) -> list[dict]:
    """Decisions before preferences; the agent's own, then its teams', then the org's; newest first."""
    chosen = [doc for doc in docs if doc["kind"] in ("decision", "preference")]
    chosen.sort(key=lambda doc: doc["updated_at"], reverse=True)
    chosen.sort(key=lambda doc: (_KIND_ORDER[doc["kind"]], _specificity(doc["scope"])))
    return chosen


def _memory_arn(scope: Scope, doc_id: str) -> str:
    return f"arn:orgmem:memory:::{scope.arn_part}/{doc_id}"


def memory_ref(scope: str, doc_id: str) -> str:
    return f"memory:{Scope.parse(scope).path}/{doc_id}"


def skill_ref(scope: str, name: str) -> str:
    return f"skill:{SkillScope.parse(scope).path}/{name}"


def event_ref(agent: str, event_id: str) -> str:
    return f"bio:{agent}/{event_id}"


def _doc_item(doc: dict, score: float | None = None) -> Item:
    text = doc.get("body") or ""
    if doc.get("rationale"):
        text += f" Why: {doc['rationale']}"
    extra = {"kind": doc["kind"], "scope": doc["scope"], "id": doc["id"], "version": doc["version"],
             "decided_by": doc.get("decided_by")}
    if score is not None:
        extra["score"] = round(score, 3)
    return Item(doc["kind"] if doc["kind"] in ("decision", "preference") else "memory", doc["title"],
                text, memory_ref(doc["scope"], doc["id"]), doc.get("updated_at"), extra=extra)


def _skill_item(manifest: dict, score: float | None = None) -> Item:
    extra = {"scope": manifest["scope"], "name": manifest["name"], "version": manifest["version"]}
    if score is not None:
        extra["score"] = round(score, 3)
    return Item("skill", f"Skill {manifest['name']}", manifest["description"],
                skill_ref(manifest["scope"], manifest["name"]), manifest.get("created_at"), extra=extra)


def _event_text(e: Event) -> str:
    text = e.content or ""
    if not text and e.data:
        text = e.data
    if e.tool:
        text = f"[{e.tool}] {text}"
    return text


def _event_item(e: Event, kind: str, label: str, required: bool = False) -> Item:
    return Item(kind, label, _event_text(e), event_ref(e.agent, e.event_id), format_ts(e.ts), required,
                {"event_id": e.event_id, "kind": e.kind})


def _artifact_op(e: Event) -> str | None:
    """What the gateway's own artifact events did (``put``, ``copy``, ``delete``), if they say."""
    if not e.data:
        return None
    try:
        op = orjson.loads(e.data).get("op")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return op if isinstance(op, str) else None


def _artifact_item(e: Event, required: bool) -> Item:
    op = _artifact_op(e)
    extra = {"event_id": e.event_id, "kind": e.kind, "artifact_uri": e.artifact_uri,
             "event": event_ref(e.agent, e.event_id)}
    if op:
        extra["op"] = op
    label = "Last artifact" if required else "Artifact"
    return Item("artifact", label + (f" ({op})" if op else ""), e.content or "",
                e.artifact_uri or event_ref(e.agent, e.event_id), format_ts(e.ts), required, extra)


# -- simple relevance ------------------------------------------------------------------------

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_STOP = frozenset("a an and are as at be by do does for from how i in is it its of on or that the this "
                  "to was we what when where which who why will with you".split())


def _stem(word: str) -> str:
    for suffix in ("ing", "edly", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[:-len(suffix)]
    return word


def _terms(text: str) -> set[str]:
    return {_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP}


def _score(terms: set[str], title: str, tags: str, body: str) -> float:
    """Matched query terms, weighted by where: title 3, tags 2, body 1; a share of the query."""
    if not terms:
        return 0.0
    fields = [(_terms(title), 3.0), (_terms(tags), 2.0), (_terms(body), 1.0)]
    total = 0.0
    for term in terms:
        total += max((weight for words, weight in fields if term in words), default=0.0)
    return total / len(terms)


# -- fitting the budget ----------------------------------------------------------------------


def _header(agent: str, session: str | None, query: str | None) -> str:
    """The title, and the session and query it was made for (short: a hostile session name or
    query must not eat a small budget)."""
    short = f"# Context for {agent}\n"
    parts = [short]
    said = [f"Session `{_one_line(session)[:80]}`."] if session else []
    if query:
        said.append(f"Query: {_one_line(query)[:120]}")
    if said:
        parts.append("\n" + " ".join(said))
    full = "".join(parts) + "\n"
    return full if count_tokens(full) <= MIN_BUDGET // 3 else short


def _fit(head: str, sections: list[Section], budget: int) -> tuple[str, int]:
    """Choose and cut items so the Markdown costs at most ``budget`` tokens; returns it and its cost."""
    used = count_tokens(head)
    headings = {s.name: count_tokens(s.heading()) for s in sections}
    reserve = _reserve(sections, headings, budget - used)
    need = sum(reserve.values())
    for s in sections:
        need -= reserve.pop(s.name, 0)  # its heading: the section is being filled now
        opened = False
        for n, item in enumerate(s.items):
            mine = reserve.pop(id(item), 0)
            need -= mine
            room = budget - used - need - (0 if opened else headings[s.name])
            if item.required:
                # the required items still to come share what is left, none below its reservation
                sharing = 1 + sum(1 for later in s.items[n + 1:] if later.required)
                share = (room + need - sum(reserve.get(id(i), 0) for i in s.items[n + 1:]
                                           if not i.required)) // sharing
                room = min(room, max(mine, share))
            text = _placed(item, room)
            if text is None:
                s.omitted += 1
                s.truncated = True
                continue
            if not opened:
                used += headings[s.name]
                opened = True
            if text != _one_line(item.text):
                item.truncated = True
                item.text = text
            s.truncated = s.truncated or item.truncated
            used += count_tokens(item.render())
            s.kept.append(item)
    markdown = _markdown(head, sections)
    total = count_tokens(markdown)
    while total > budget:  # cannot happen (counts are subadditive); never answer over budget
        log.warning("context_over_budget", total=total, budget=budget)
        last = next(s for s in reversed(sections) if s.kept)
        last.kept.pop()
        last.omitted += 1
        last.truncated = True
        markdown = _markdown(head, sections)
        total = count_tokens(markdown)
    return markdown, total


def _markdown(head: str, sections: list[Section]) -> str:
    return head + "".join(s.heading() + "".join(i.render() for i in s.kept) for s in sections if s.kept)


def _reserve(sections: list[Section], headings: dict[str, int], room: int) -> dict[Any, int]:
    """Tokens set aside for the required items (and their sections' headings): each with a short
    text if all fit so, else each as its heading line, else as many heading lines as fit."""
    required = [(s, [i for i in s.items if i.required]) for s in sections]
    for text_tokens in (REQUIRED_TEXT_TOKENS, 0):
        reserve: dict[Any, int] = {}
        for s, items in required:
            if items:
                reserve[s.name] = headings[s.name]
            for item in items:
                cut = _cut(item, count_tokens(item.head()) + text_tokens)
                reserve[id(item)] = count_tokens(item.render(cut or ""))
        if sum(reserve.values()) <= room:
            return reserve
    reserve = {}
    left = room
    # the first open question, the last error and the last artifact before further questions
    ranked = sorted(((s, item, n) for s, items in required for n, item in enumerate(items)),
                    key=lambda entry: entry[1].type == "open_question" and entry[2] > 0)
    for s, item, _ in ranked:
        cost = count_tokens(item.render("")) + (0 if s.name in reserve else headings[s.name])
        if cost <= left:
            reserve.setdefault(s.name, headings[s.name])
            reserve[id(item)] = count_tokens(item.render(""))
            left -= cost
    return reserve


def _placed(item: Item, room: int) -> str | None:
    """The item's text as placed in ``room`` tokens: whole, cut, or None (left out)."""
    whole = _one_line(item.text)
    if count_tokens(item.render(whole)) <= room:
        return whole
    cut = _cut(item, room)
    if cut is None:
        return None
    if not item.required and whole and count_tokens(cut) < min(MIN_CUT_TOKENS, count_tokens(whole)):
        return None
    return cut


