"""``GET /v1/memory/for/{agent}.md``: one MEMORY.md-style digest to load at the start of a session.

Bounded (:data:`MAX_DIGEST` bytes): the most specific documents come first (the agent's own,
then its teams', then the org's), decisions before preferences, lessons and facts; each
entry names its source (scope/id and version), who decided and when, and its evidence.
What does not fit is counted at the end, with where to read it whole.
"""

from __future__ import annotations

from .documents import KINDS

MAX_DIGEST = 16 * 1024
#: Characters of a document's body quoted in the digest.
MAX_EXCERPT = 600
_ORDER = {"decision": 0, "preference": 1, "lesson": 2, "fact": 3}
_HEADINGS = {"decision": "Decisions", "preference": "Preferences", "lesson": "Lessons", "fact": "Facts"}


def _specificity(doc: dict) -> int:
    scope = doc["scope"]
    return 0 if scope.startswith("agent:") else 1 if scope.startswith("team:") else 2


def _one_line(text: str) -> str:
    return " ".join(text.replace("\r", " ").split())


def _short(text: str, limit: int = MAX_EXCERPT) -> str:
    """One title or evidence item at most ``limit`` characters, so no entry crowds out the rest."""
    return text if len(text) <= limit else text[:limit] + "…"


def _entry(doc: dict) -> str:
    body = _one_line(doc.get("body") or "")
    if len(body) > MAX_EXCERPT:
        body = body[:MAX_EXCERPT].rsplit(" ", 1)[0] + " …"
    lines = [f"- **{_short(_one_line(doc['title']))}**" + (f" — {body}" if body else "")]
    source = (f"  - source: `{doc['scope']}/{doc['id']}` v{doc['version']}; decided by "
              f"{_one_line(doc.get('decided_by') or '?')} on {(doc.get('decided_at') or '?')[:10]}")
    if doc.get("valid_until"):
        source += f"; valid until {doc['valid_until'][:10]}"
    lines.append(source)
    if doc.get("rationale"):
        why = _one_line(doc["rationale"])
        lines.append(f"  - why: {why[:MAX_EXCERPT]}")
    if doc.get("evidence"):
        lines.append("  - evidence: " + ", ".join(f"`{_short(_one_line(e).replace('`', ''), 200)}`"
                                                  for e in doc["evidence"][:10])
                     + (" …" if len(doc["evidence"]) > 10 else ""))
    return "\n".join(lines) + "\n"


def render(agent: str, teams: tuple[str, ...], docs: list[dict], generated: str,
           limit: int = MAX_DIGEST) -> str:
    scopes = ", ".join(["org", *(f"team:{t}" for t in teams), f"agent:{agent}"])
    head = (f"# Memory for {agent}\n\n"
            f"What is in force for {agent} ({scopes}) as of {generated}: {len(docs)} document"
            f"{'' if len(docs) == 1 else 's'}. Each entry names its source; read one whole with "
            f"GET /v1/memory/SCOPE/ID.\n")
    newest_first = sorted(docs, key=lambda doc: doc["updated_at"], reverse=True)
    ordered = sorted(newest_first, key=lambda doc: (_ORDER.get(doc["kind"], 9), _specificity(doc)))
    parts = [head]
    size = len(head.encode())
    left = 0
    kind = None
    for doc in ordered:
        section = f"\n## {_HEADINGS[doc['kind']]}\n\n" if doc["kind"] != kind else ""
        text = section + _entry(doc)
        if size + len(text.encode()) > limit - 200:
            left += 1  # a smaller entry after it may still fit
            continue
        parts.append(text)
        size += len(text.encode())
        kind = doc["kind"]
    if left:
        parts.append(f"\n_{left} more document{'' if left == 1 else 's'} did not fit; list them all with "
                     f"GET /v1/memory/for/{agent}._\n")
    return "".join(parts)


__all__ = ["KINDS", "MAX_DIGEST", "render"]
