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
searchable at all only with ``search:Query`` on ``arn:orgmem:search:::<type>``. Each hit is
checked again against its exact resource before it is returned (:func:`hit_allowed`).
"""

from __future__ import annotations

import threading
import time

from ..iam.authz import Authorizer
from ..iam.identities import IdentityStore
from ..iam.principals import Principal
from ..s3.names import RESERVED_BUCKETS
from ..store.base import ObjectStore

ROOT_TOKEN = "root"
#: Seconds a caller's tokens (and the bucket list) are reused.
TTL = 1.5
SEARCH_ARN = "arn:orgmem:search:::"
TYPES = ("event", "memory", "skill", "file")


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

    def types(self, principal: Principal) -> list[str]:
        """The entry types the caller may search at all."""
        if principal.is_root:
            return list(TYPES)
        return [t for t in TYPES if self.authorizer.allows(principal, "search:Query", SEARCH_ARN + t, {})]

    def of(self, principal: Principal) -> frozenset[str]:
        """The tokens ``principal`` holds (cached briefly, per identities generation)."""
        if principal.is_root:
            return frozenset({ROOT_TOKEN})
        # sandbox credentials with a session policy hold fewer tokens than their agent
        key = (principal.name, principal.teams, principal.disabled, principal.session_policy,
               self.identities.generation)
        with self._lock:
            found = self._cache.get(key)
        if found is not None and time.monotonic() - found[0] < self.ttl:
            return found[1]
        tokens = frozenset(self._compute(principal))
        with self._lock:
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = (time.monotonic(), tokens)
        return tokens

    def _compute(self, principal: Principal) -> set[str]:
        if principal.disabled:
            return set()
        allows = self.authorizer.allows
        types = set(self.types(principal))
        agents = [a["name"] for a in self.identities.list_agents()]
        teams = [t["name"] for t in self.identities.list_teams()]
        scopes = ["org", *(f"team:{t}" for t in teams), *(f"agent:{a}" for a in agents)]
        out: set[str] = set()
        if "event" in types:
            out.update(event_token(a) for a in agents
                       if allows(principal, "bio:GetEvents", f"arn:orgmem:bio:::{a}/*", {}))
        if "memory" in types:
            out.update(memory_token(s) for s in scopes if allows(
                principal, "memory:GetDocument", f"arn:orgmem:memory:::{_arn_part(s)}/*", {}))
        if "skill" in types:
            out.update(skill_token(s) for s in scopes
                       if allows(principal, "skills:GetSkill", f"arn:orgmem:skills:::{_arn_part(s)}/*", {}))
        if "file" in types:
            out.update(file_token(b) for b in self.buckets()
                       if allows(principal, "s3:GetObject", f"arn:aws:s3:::{b}/*", {}))
        return out

    def hit_allowed(self, principal: Principal, hit: dict) -> bool:
        """Ask the authorizer again about one hit's exact resource."""
        if principal.is_root:
            return True
        kind, source = hit.get("type"), hit.get("source", "")
        if kind == "event":
            resource = f"arn:orgmem:bio:::{hit.get('agent', '')}/{hit.get('session') or '*'}"
            action = "bio:GetEvents"
        elif kind in ("memory", "skill"):
            scope, name = hit.get("scope", ""), hit.get("id", "")
            if not scope or not name:
                return False
            action = "memory:GetDocument" if kind == "memory" else "skills:GetSkill"
            service = "memory" if kind == "memory" else "skills"
            resource = f"arn:orgmem:{service}:::{_arn_part(scope)}/{name}"
        elif kind == "file" and source.startswith("s3://"):
            action, resource = "s3:GetObject", "arn:aws:s3:::" + source[len("s3://"):]
        else:
            return False
        return (self.authorizer.allows(principal, "search:Query", SEARCH_ARN + kind, {})
                and self.authorizer.allows(principal, action, resource, {}))
