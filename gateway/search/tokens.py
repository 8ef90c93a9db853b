"""Access tokens: what an index entry requires, and which of them a caller holds.

Every entry carries tokens qualified by its type, so a grant over one kind of item never
widens what a caller sees (or counts) of another:

=========  ==========================================  =========================================
type       entry tokens                                 caller holds it when the policy allows
=========  ==========================================  =========================================
event      ``bio:<agent>``                              ``bio:GetEvents`` on ``arn:orgmem:bio:::<agent>/*``
memory     ``memory:org|team:<t>|agent:<a>``            ``memory:GetDocument`` on ``…:memory:::<scope>/*``
skill      ``skill:org|team:<t>|agent:<a>``             ``skills:GetSkill`` on ``…:skills:::<scope>/*``
file       ``bucket:<b>``                               ``s3:GetObject`` on ``arn:aws:s3:::<b>/*``
=========  ==========================================  =========================================

and every entry also carries :data:`ROOT_TOKEN`, which only the root holds (it is never
subject to policies, and its biography reads cover agents that no longer exist). A type is
searchable at all only with ``search:Query`` on ``arn:orgmem:search:::<type>``.

A token grants a whole scope; an explicit Deny inside one (``memory:GetDocument`` on
``org/board-*``) becomes an :class:`indexer.Exclusion` over the entries' resources (the ARN
a read of the item is authorized on, :func:`resource_of`), so what it denies is neither
returned nor counted. Policies are evaluated with the request's condition context
(``aws:SourceIp``, ``aws:SecureTransport``), as the item's own read would be. Each hit is
still checked again against its exact resource before it is returned (:func:`hit_allowed`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from indexer import Exclusion, regex_literal

from ..iam.authz import Authorizer, Context
from ..iam.identities import IdentityStore
from ..iam.policy import Glob
from ..iam.principals import Principal
from ..s3.names import RESERVED_BUCKETS
from ..store.base import ObjectStore

ROOT_TOKEN = "root"
#: Seconds a caller's tokens (and the bucket list) are reused.
TTL = 1.5
SEARCH_ARN = "arn:orgmem:search:::"
TYPES = ("event", "memory", "skill", "file")
#: The action a read of each type's items is authorized on.
READ_ACTIONS = {"event": "bio:GetEvents", "memory": "memory:GetDocument", "skill": "skills:GetSkill",
                "file": "s3:GetObject"}
_NO_CONTEXT: Context = {}


@dataclass(frozen=True)
class Access:
    """What a caller's search may see: entries with one of ``tokens``, minus ``exclusions``."""

    tokens: frozenset[str]
    exclusions: tuple[Exclusion, ...] = ()


def event_token(agent: str) -> str:
    return f"bio:{agent}"


def memory_token(scope: str) -> str:
    """``scope`` as memory names it: ``org``, ``team:x``, ``agent:a``."""
    return f"memory:{scope}"


def skill_token(scope: str) -> str:
    return f"skill:{scope}"


def file_token(bucket: str) -> str:
    return f"bucket:{bucket}"


def _arn_part(scope: str) -> str:
    """``team:x`` -> ``team/x`` (the ARN form of a scope)."""
    return scope.replace(":", "/", 1)


def resource_of(kind: str, *, agent: str = "", session: str = "", scope: str = "", name: str = "",
                source: str = "") -> str:
    """The ARN a read of an item is authorized on ("" when the item cannot be named)."""
    if kind == "event":
        return f"arn:orgmem:bio:::{agent}/{session or '*'}"
    if kind in ("memory", "skill"):
        if not scope or not name:
            return ""
        service = "memory" if kind == "memory" else "skills"
        return f"arn:orgmem:{service}:::{_arn_part(scope)}/{name}"
    if kind == "file" and source.startswith("s3://"):
        return "arn:aws:s3:::" + source[len("s3://"):]
    return ""


def glob_regex(glob: Glob) -> str:
    """A policy's resource pattern as a Tantivy regex over whole resources."""
    return "".join("(?s:.*)" if unit is None else "(?s:.)" if unit == "" else regex_literal(unit)
                   for unit in glob)


def _denial(kind: str, globs: tuple[Glob, ...], not_resource: bool) -> list[Exclusion]:
    """One Deny statement's exclusions: what each of its patterns matches, or with NotResource
    all but what any of them matches (all of the type when none is left, e.g.
    ``${orgmem:teams}`` of an agent in no team)."""
    if not not_resource:
        return [Exclusion(kind, (glob_regex(glob),)) for glob in globs]
    if not globs:
        return [Exclusion(kind, (glob_regex((None,)),))]
    return [Exclusion(kind, tuple(glob_regex(glob) for glob in globs), inverted=True)]


def is_workspace_bucket(name: str) -> bool:
    """User buckets: not the gateway's internal bucket nor a memory feature's view."""
    return not name.startswith(".") and name not in RESERVED_BUCKETS


class AccessTokens:
    def __init__(self, identities: IdentityStore, authorizer: Authorizer, store: ObjectStore,
                 ttl: float = TTL) -> None:
        self.identities, self.authorizer, self.store, self.ttl = identities, authorizer, store, ttl
        self._cache: dict[tuple, tuple[float, frozenset[str]]] = {}
        self._buckets: tuple[float, list[str]] = (0.0, [])
        self._lock = threading.Lock()

    def buckets(self) -> list[str]:
        with self._lock:
            at, names = self._buckets
        if time.monotonic() - at < self.ttl:
            return names
        names = sorted(b.name for b in self.store.list_buckets() if is_workspace_bucket(b.name))
        with self._lock:
            self._buckets = (time.monotonic(), names)
        return names

    def types(self, principal: Principal, context: Context = _NO_CONTEXT) -> list[str]:
        """The entry types the caller may search at all."""
        if principal.is_root:
            return list(TYPES)
        allows = self.authorizer.allows
        return [t for t in TYPES if allows(principal, "search:Query", SEARCH_ARN + t, context)]

    def of(self, principal: Principal, context: Context = _NO_CONTEXT) -> frozenset[str]:
        """The tokens ``principal`` holds."""
        return self.access(principal, context).tokens

    def access(self, principal: Principal, context: Context = _NO_CONTEXT) -> Access:
        """What ``principal`` may see in this request's ``context`` (cached briefly, per
        identities generation and context)."""
        if principal.is_root:
            return Access(frozenset({ROOT_TOKEN}))
        # sandbox credentials with a session policy hold fewer tokens than their agent
        key = (principal.name, principal.teams, principal.disabled, principal.session_policy,
               self.identities.generation, _frozen(context))
        with self._lock:
            found = self._cache.get(key)
        if found is not None and time.monotonic() - found[0] < self.ttl:
            return found[1]
        access = self._compute(principal, context)
        with self._lock:
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = (time.monotonic(), access)
        return access

    def _compute(self, principal: Principal, context: Context) -> Access:
        if principal.disabled:
            return Access(frozenset())
        types = self.types(principal, context)
        denials, narrowings = self.authorizer.denials, self.authorizer.narrowings
        exclusions = [ex for t in types
                      for globs, not_resource in denials(principal, READ_ACTIONS[t], context)
                      for ex in _denial(t, globs, not_resource)]
        # an Allow with NotResource grants its scopes all but what it names: that is taken out,
        # unless another Allow of the same policies grants it back (finance's own documents)
        exclusions += [Exclusion(t, (glob_regex(glob),), False, tuple(glob_regex(g) for g in unless))
                       for t in types for glob, unless in narrowings(principal, READ_ACTIONS[t], context)]
        return Access(frozenset(self._tokens(principal, set(types), context)), tuple(exclusions))

    def _tokens(self, principal: Principal, types: set[str], context: Context) -> set[str]:
        """The scopes the caller may read whole. Asking the policy about the literal resource
        ``SCOPE/*`` is not enough: ``org/?`` matches that string, and so does an Allow whose
        NotResource names part of the scope. A scope is granted only when an Allow covers every
        resource in it (or, with NotResource, all but what an exclusion takes out)."""
        def allows(kind: str, resource: str) -> bool:
            action = READ_ACTIONS[kind]
            return (self.authorizer.allows(principal, action, resource, context)
                    and self.authorizer.covers(principal, action, resource.removesuffix("*"), context))

        agents = [a["name"] for a in self.identities.list_agents()]
        teams = [t["name"] for t in self.identities.list_teams()]
        scopes = ["org", *(f"team:{t}" for t in teams), *(f"agent:{a}" for a in agents)]
        out: set[str] = set()
        if "event" in types:
            out.update(event_token(a) for a in agents if allows("event", f"arn:orgmem:bio:::{a}/*"))
        if "memory" in types:
            out.update(memory_token(s) for s in scopes
                       if allows("memory", f"arn:orgmem:memory:::{_arn_part(s)}/*"))
        if "skill" in types:
            out.update(skill_token(s) for s in scopes
                       if allows("skill", f"arn:orgmem:skills:::{_arn_part(s)}/*"))
        if "file" in types:
            out.update(file_token(b) for b in self.buckets() if allows("file", f"arn:aws:s3:::{b}/*"))
        return out

    def hit_allowed(self, principal: Principal, hit: dict, context: Context = _NO_CONTEXT) -> bool:
        """Ask the authorizer again about one hit's exact resource."""
        if principal.is_root:
            return True
        kind = hit.get("type")
        resource = resource_of(str(kind), agent=hit.get("agent", ""), session=hit.get("session", ""),
                               scope=hit.get("scope", ""), name=hit.get("id", ""),
                               source=hit.get("source", ""))
        if not resource:
            return False
        return (self.authorizer.allows(principal, "search:Query", SEARCH_ARN + kind, context)
                and self.authorizer.allows(principal, READ_ACTIONS[kind], resource, context))


def _frozen(context: Context) -> tuple:
    return tuple(sorted((k, v if isinstance(v, str) else tuple(v)) for k, v in context.items()))
