"""Principals, keys, teams and policies, kept as one document in the store.

The document lives in the reserved internal bucket (``.orgmem/iam/identities.json``)
and is changed only by compare-and-swap (``If-Match`` on its ETag), so several
gateways sharing one bucket never lose each other's changes; each re-reads it
when its ETag moves (``refresh``, called about once a second). Because it is an
ordinary object in the store, the sealing decorator of the encryption issue
encrypts it, secret keys included, like everything else it stores.

Every request consults this service, so lookups are in-memory dictionary reads;
compiled policy sets are cached per principal, session policy and generation.

Sandbox credentials (``create_sandbox_credentials``) are temporary keys kept in the
same document. Their expiry is checked by the authenticator at each request; expired
ones are dropped from the document at its next change once a day has passed.
"""

from __future__ import annotations

import copy
import math
import secrets
import string
import threading
import time
from collections.abc import Callable
from io import BytesIO
from typing import TypeVar

import orjson

from ..logs import log
from ..store.base import (
    INTERNAL_BUCKET,
    BucketAlreadyExists,
    NoSuchKey,
    ObjectMeta,
    ObjectStore,
    PreconditionFailed,
    WriteCondition,
)
from .builtin import BUILTIN_POLICIES
from .model import (
    EXPIRED_SANDBOX_KEPT,
    KINDS,
    SANDBOX_KEYS_MAX,
    SANDBOX_TTL_MAX,
    SANDBOX_TTL_MIN,
    AccessKey,
    Agent,
    CustomPolicy,
    DeleteConflict,
    EntityAlreadyExists,
    Identities,
    IdentityError,
    NoSuchEntity,
    Team,
    TemporaryKey,
    check_name,
    check_policy_name,
    iso,
)
from .policy import PolicyDocument, PolicyError, PolicySet, SessionPolicySet, parse_policy
from .principals import Principal, RootCredentials

DOCUMENT_KEY = "iam/identities.json"
DEFAULT_POLICIES = ("agent-default",)
_CAS_ATTEMPTS = 8
_KEY_ALPHABET = string.ascii_uppercase + string.digits

T = TypeVar("T")


def new_key_pair(now: float) -> AccessKey:
    # never "OMS...", which marks a temporary key to a person reading a log
    access = "OM" + secrets.choice(_KEY_ALPHABET.replace("S", "")) + \
        "".join(secrets.choice(_KEY_ALPHABET) for _ in range(17))
    return AccessKey(access, secrets.token_urlsafe(30)[:40], now)


def new_temporary_key(now: float, expires_at: float, policy: str | None,
                      document: dict | None) -> TemporaryKey:
    """A sandbox key pair; ``OMS`` tells a person reading a log that the key is temporary."""
    access = "OMS" + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(17))
    return TemporaryKey(access, secrets.token_urlsafe(30)[:40], now, expires_at, policy, document)


class IdentityStore:
    """The CredentialStore of the authenticator, and the service behind the admin API."""

    def __init__(self, store: ObjectStore, root: RootCredentials,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._root = root
        self._clock = clock
        self._lock = threading.Lock()
        self._state = Identities()
        self._etag: str | None = None
        self._keys: dict[str, tuple[Agent, AccessKey]] = {}
        self._temporary: dict[str, tuple[Agent, TemporaryKey]] = {}
        self._compiled: dict[tuple[str, str | None], tuple[int, PolicySet | SessionPolicySet]] = {}
        self._documents: dict[str, PolicyDocument] = {}
        try:
            store.create_bucket(INTERNAL_BUCKET)
        except BucketAlreadyExists:
            pass
        self.refresh()

    # -- reading -----------------------------------------------------------

    def refresh(self) -> bool:
        """Re-read the document if another gateway changed it; True when it changed."""
        try:
            info = self._store.head_object(INTERNAL_BUCKET, DOCUMENT_KEY)
        except NoSuchKey:
            return False
        if info.etag == self._etag:
            return False
        with self._lock:
            self._load()
        return True

    def _load(self) -> None:
        try:
            reader = self._store.open_object(INTERNAL_BUCKET, DOCUMENT_KEY)
        except NoSuchKey:
            return
        try:
            data, etag = reader.read(), reader.info.etag
        finally:
            reader.close()
        self._install(Identities.from_json(orjson.loads(data)), etag)

    def _install(self, state: Identities, etag: str | None,
                 documents: dict[str, PolicyDocument] | None = None) -> None:
        documents = documents if documents is not None else self._parse_all(state)
        self._keys = {k.access_key: (a, k) for a in state.agents.values() for k in a.keys}
        self._temporary = {k.access_key: (a, k) for a in state.agents.values() for k in a.temporary_keys}
        self._documents = documents
        self._compiled = {}  # keyed by generation anyway; dropping it keeps pruned keys' sets from piling up
        self._state, self._etag = state, etag

    def _parse_all(self, state: Identities) -> dict[str, PolicyDocument]:
        """Every policy, parsed; unchanged ones are reused. A stored policy that no longer
        parses (written by a newer gateway, or damaged) denies everything: failing closed
        keeps one bad document from stopping the gateway or widening anyone's rights."""
        documents = dict(_BUILTIN_DOCUMENTS)
        stored = [(p.name, p.document) for p in state.policies.values()]
        stored += [(k.session_policy(), k.policy_document) for a in state.agents.values()
                   for k in a.temporary_keys if k.policy_document is not None]
        for name, source in stored:
            previous = self._documents.get(name)
            if previous is not None and previous.source == source:
                documents[name] = previous
                continue
            try:
                documents[name] = parse_policy(orjson.dumps(source))
            except (PolicyError, TypeError) as exc:
                log.error("policy_unusable", policy=name, error=str(exc)[:300],
                          effect="denies everything until it is replaced")
                documents[name] = _DENY_ALL
        return documents

    @property
    def generation(self) -> int:
        return self._state.generation

    def lookup(self, access_key: str) -> tuple[Principal, str] | None:
        """The principal and secret behind an access key; None if unknown or expired.

        Expired sandbox credentials are the exception: still returned (with their expiry on
        the principal) until pruned, so the authenticator can say ``ExpiredToken``.
        """
        found = self._root.lookup(access_key)
        if found is not None:
            return found
        temporary = self._temporary.get(access_key)
        if temporary is not None:
            agent, key = temporary
            return self._temporary_principal(agent, key), key.secret_key
        entry = self._keys.get(access_key)
        if entry is None or not entry[1].active(self._clock()):
            return None
        agent, key = entry
        return self._principal(agent, key.access_key), key.secret_key

    def _principal(self, agent: Agent, access_key: str) -> Principal:
        return Principal(agent.name, access_key, teams=tuple(agent.teams), kind=agent.kind,
                         disabled=agent.disabled)

    def _temporary_principal(self, agent: Agent, key: TemporaryKey) -> Principal:
        return Principal(agent.name, key.access_key, teams=tuple(agent.teams), kind=agent.kind,
                         disabled=agent.disabled, expires_at=key.expires_at,
                         session_policy=key.session_policy())

    def principal(self, name: str) -> Principal:
        """A principal by name (for ``policy simulate``)."""
        if name == self._root.principal.name:
            return self._root.principal
        agent = self._agent(self._state, name)
        return self._principal(agent, "")

    def policy_set(self, principal: Principal) -> PolicySet | SessionPolicySet:
        """The compiled policies of a principal: its own and its teams', in that order; for
        sandbox credentials with a session policy, intersected with that policy."""
        state = self._state
        key = (principal.name, principal.session_policy)
        cached = self._compiled.get(key)
        if cached is not None and cached[0] == state.generation:
            return cached[1]
        compiled = self._identity_set(state, principal.name)
        if principal.session_policy is not None:
            compiled = self._session_set(principal.name, principal.session_policy, compiled)
        self._compiled[key] = (state.generation, compiled)
        return compiled

    def _identity_set(self, state: Identities, name: str) -> PolicySet:
        agent = state.agents.get(name)
        names: list[str] = list(agent.policies) if agent else []
        teams = list(agent.teams) if agent else []
        for team in teams:
            names += [p for p in state.teams[team].policies if p not in names] if team in state.teams else []
        documents = [(n, self._documents[n]) for n in names if n in self._documents]
        return PolicySet.compile(documents, name, teams)

    def _session_set(self, name: str, session_policy: str, identity: PolicySet) -> SessionPolicySet:
        """The session policy compiled for the same name and teams, so ``${aws:username}`` in it
        is still the agent. A session policy that is gone or unusable denies everything."""
        document = self._documents.get(session_policy, _DENY_ALL)
        inline = session_policy.startswith("inline:")
        label = "session:inline" if inline else f"session:{session_policy}"
        session = PolicySet.compile([(label, document)], name, identity.teams)
        return SessionPolicySet(identity, session, "an inline policy" if inline else session_policy)

    def attached_policy_names(self, name: str) -> list[str]:
        agent = self._agent(self._state, name)
        names = list(agent.policies)
        for team in agent.teams:
            names += [p for p in self._state.teams.get(team, Team(team)).policies if p not in names]
        return names

    # -- views for the admin API -----------------------------------------------

    def list_agents(self) -> list[dict]:
        now = self._clock()
        return [a.public(now) for a in sorted(self._state.agents.values(), key=lambda a: a.name)]

    def get_agent(self, name: str) -> dict:
        return self._agent(self._state, name).public(self._clock())

    def list_teams(self) -> list[dict]:
        return [self._team_view(self._state, t) for t in sorted(self._state.teams)]

    def get_team(self, name: str) -> dict:
        self._team(self._state, name)
        return self._team_view(self._state, name)

    def list_policies(self) -> list[dict]:
        names = sorted(set(BUILTIN_POLICIES) | set(self._state.policies))
        return [self._policy_summary(self._state, n) for n in names]

    def get_policy(self, name: str) -> dict:
        state = self._state
        if name in BUILTIN_POLICIES:
            document = BUILTIN_POLICIES[name]
        elif name in state.policies:
            document = state.policies[name].document
        else:
            raise NoSuchEntity(f"There is no policy named {name!r}.")
        return {**self._policy_summary(state, name), "document": document}

    def owner_of(self, access_key: str) -> str | None:
        entry = self._keys.get(access_key) or self._temporary.get(access_key)
        return entry[0].name if entry else None

    # -- changes -------------------------------------------------------------

    def create_agent(self, name: str, kind: str = "agent", teams: list[str] | None = None,
                     policies: list[str] | None = None) -> tuple[dict, AccessKey]:
        check_name("agent", name)
        if kind not in KINDS:
            raise IdentityError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}.")
        teams = _unique(teams or [])
        policies = _unique(list(DEFAULT_POLICIES) if policies is None else policies)

        def change(state: Identities) -> tuple[dict, AccessKey]:
            if name in state.agents:
                raise EntityAlreadyExists(f"An agent named {name!r} already exists.")
            for team in teams:
                self._team(state, team)
            for policy in policies:
                self._require_policy(state, policy)
            now = self._clock()
            key = new_key_pair(now)
            agent = Agent(name, kind, teams, policies, False, now, [key])
            state.agents[name] = agent
            return agent.public(now), key
        return self._update(change)

    def set_disabled(self, name: str, disabled: bool) -> dict:
        def change(state: Identities) -> dict:
            agent = self._agent(state, name)
            agent.disabled = disabled
            return agent.public(self._clock())
        return self._update(change)

    def delete_agent(self, name: str) -> None:
        def change(state: Identities) -> None:
            self._agent(state, name)
            del state.agents[name]
        self._update(change)

    def create_key(self, name: str) -> AccessKey:
        def change(state: Identities) -> AccessKey:
            agent = self._agent(state, name)
            self._prune(agent)
            if len(agent.keys) >= 10:
                raise IdentityError(f"{name} already has 10 access keys; revoke one first.")
            key = new_key_pair(self._clock())
            agent.keys.append(key)
            return key
        return self._update(change)

    def rotate_key(self, name: str, access_key: str | None = None,
                   grace_seconds: float = 0) -> tuple[AccessKey, AccessKey]:
        """A new key pair for ``name``; the old key stops now or after the grace period."""
        if grace_seconds < 0:
            raise IdentityError("grace_seconds must not be negative.")

        def change(state: Identities) -> tuple[AccessKey, AccessKey]:
            agent = self._agent(state, name)
            now = self._clock()
            self._prune(agent)
            old = self._key_to_rotate(agent, access_key, now)
            if grace_seconds and len(agent.keys) >= 10:
                raise IdentityError(f"{name} already has 10 access keys; revoke one before rotating "
                                    "with a grace period.")
            new = new_key_pair(now)
            if grace_seconds:
                old.expires_at = now + grace_seconds
            else:
                agent.keys.remove(old)
            agent.keys.append(new)
            return old, new
        old, new = self._update(change)
        return old, new

    def revoke_key(self, access_key: str) -> str:
        """Revoke a lasting key or sandbox credentials before they expire."""
        def change(state: Identities) -> str:
            for agent in state.agents.values():
                for keys in (agent.keys, agent.temporary_keys):
                    for key in keys:
                        if key.access_key == access_key:
                            keys.remove(key)
                            return agent.name
            raise NoSuchEntity(f"There is no access key {access_key!r}.")
        return self._update(change)

    def create_sandbox_credentials(self, name: str, ttl_seconds: int, policy: str | None = None,
                                   document: dict | None = None) -> TemporaryKey:
        """Temporary keys of principal ``name`` that stop working ``ttl_seconds`` from now.

        They carry the principal's rights, narrowed by the named ``policy`` or the inline
        ``document`` if given. Everything is checked before the change, so a bad request
        writes nothing.
        """
        _check_ttl(ttl_seconds)
        if policy is not None and document is not None:
            raise IdentityError("Give a policy name or an inline policy document, not both.")
        if name == self._root.principal.name:
            raise IdentityError("The root cannot have sandbox credentials; name an agent.")
        parsed = _parse_session_document(document) if document is not None else None

        def change(state: Identities) -> TemporaryKey:
            agent = self._sandbox_holder(state, name)
            if policy is not None:
                self._require_policy(state, policy)
            now = self._clock()
            expires_at = float(math.ceil(now) + ttl_seconds)
            key = new_temporary_key(now, expires_at, policy, parsed.source if parsed else None)
            agent.temporary_keys.append(key)
            return key
        return self._update(change)

    def create_team(self, name: str, policies: list[str] | None = None) -> dict:
        check_name("team", name)
        policies = _unique(policies or [])

        def change(state: Identities) -> dict:
            if name in state.teams:
                raise EntityAlreadyExists(f"A team named {name!r} already exists.")
            for policy in policies:
                self._require_policy(state, policy)
            state.teams[name] = Team(name, policies, self._clock())
            return self._team_view(state, name)
        return self._update(change)

    def delete_team(self, name: str) -> None:
        """Refused while the team has members (as AWS's DeleteGroup is): deleting it would
        take its policies, a Deny among them, from every member, which removing a member or
        detaching a policy needs its own rights for."""
        def change(state: Identities) -> None:
            self._team(state, name)
            members = sum(1 for a in state.agents.values() if name in a.teams)
            if members:  # not named: the caller may not be allowed to see the team
                raise DeleteConflict(f"Team {name!r} still has {members} member(s): remove them first "
                                     f"(orgmem admin team show {name}; orgmem admin team remove {name} "
                                     "AGENT).")
            del state.teams[name]
        self._update(change)

    def set_membership(self, team: str, agent_name: str, member: bool) -> dict:
        def change(state: Identities) -> dict:
            self._team(state, team)
            agent = self._agent(state, agent_name)
            if member and team not in agent.teams:
                agent.teams.append(team)
            elif not member:
                if team not in agent.teams:
                    raise NoSuchEntity(f"{agent_name} is not a member of team {team!r}.")
                agent.teams.remove(team)
            return self._team_view(state, team)
        return self._update(change)

    def put_policy(self, name: str, text: bytes) -> dict:
        check_policy_name(name)
        if name in BUILTIN_POLICIES:
            raise IdentityError(f"{name!r} is a built-in policy and cannot be replaced; put your "
                                "policy under another name.")
        document = _parse_for_storage(text)

        def change(state: Identities) -> dict:
            now = self._clock()
            existing = state.policies.get(name)
            created = existing.created_at if existing else now
            state.policies[name] = CustomPolicy(name, document.source, created, now)
            return {**self._policy_summary(state, name), "document": document.source}
        return self._update(change)

    def delete_policy(self, name: str) -> None:
        if name in BUILTIN_POLICIES:
            raise IdentityError(f"{name!r} is a built-in policy and cannot be deleted.")

        def change(state: Identities) -> None:
            if name not in state.policies:
                raise NoSuchEntity(f"There is no policy named {name!r}.")
            attached = state.attached_to(name)
            if attached["agents"] or attached["teams"]:
                raise DeleteConflict(f"Policy {name!r} is still attached to "
                                     f"{_describe(attached)}; detach it first.")
            self._refuse_if_session_policy(state, name)
            del state.policies[name]
        self._update(change)

    def attach_policy(self, name: str, agent: str | None, team: str | None, attach: bool) -> dict:
        if (agent is None) == (team is None):
            raise IdentityError("Name exactly one of an agent or a team.")

        def change(state: Identities) -> dict:
            self._require_policy(state, name)
            holder = self._agent(state, agent) if agent else self._team(state, team)
            if attach and name not in holder.policies:
                holder.policies.append(name)
            elif not attach:
                if name not in holder.policies:
                    raise NoSuchEntity(f"Policy {name!r} is not attached to {agent or team}.")
                holder.policies.remove(name)
            return self._policy_summary(state, name)
        return self._update(change)

    # -- machinery -------------------------------------------------------------

    def _update(self, change: Callable[[Identities], T]) -> T:
        """Apply ``change`` to a copy and publish it with compare-and-swap; retry on races."""
        with self._lock:
            for _ in range(_CAS_ATTEMPTS):
                state = copy.deepcopy(self._state)
                result = change(state)
                _prune_expired_sandbox_keys(state, self._clock())
                state.generation += 1
                documents = self._parse_all(state)  # before writing: nothing unusable is published
                body = orjson.dumps(state.to_json(), option=orjson.OPT_INDENT_2)
                condition = (WriteCondition(if_match=self._etag) if self._etag
                             else WriteCondition(if_none_match=True))
                try:
                    info = self._store.put_object(INTERNAL_BUCKET, DOCUMENT_KEY, BytesIO(body),
                                                  ObjectMeta(content_type="application/json"),
                                                  condition)
                except (PreconditionFailed, NoSuchKey):
                    self._load()  # another gateway changed it first: redo on its version
                    continue
                self._install(state, info.etag, documents)
                return result
        raise IdentityError("The identities document kept changing under this request; retry.")

    def _agent(self, state: Identities, name: str) -> Agent:
        agent = state.agents.get(name)
        if agent is None:
            raise NoSuchEntity(f"There is no agent named {name!r}.")
        return agent

    def _team(self, state: Identities, name: str) -> Team:
        team = state.teams.get(name)
        if team is None:
            raise NoSuchEntity(f"There is no team named {name!r}.")
        return team

    def _require_policy(self, state: Identities, name: str) -> None:
        if name not in BUILTIN_POLICIES and name not in state.policies:
            raise NoSuchEntity(f"There is no policy named {name!r}.")

    def _sandbox_holder(self, state: Identities, name: str) -> Agent:
        """The principal sandbox credentials are for; a team's name gets a pointed answer."""
        agent = state.agents.get(name)
        if agent is None and name in state.teams:
            raise NoSuchEntity(f"{name!r} is a team, not an agent: sandbox credentials belong to "
                               "one agent (or human).")
        agent = self._agent(state, name)
        if agent.disabled:
            raise IdentityError(f"Agent {name!r} is disabled, so its sandbox credentials would be "
                                "refused; enable it first.")
        if len(agent.temporary_keys) >= SANDBOX_KEYS_MAX:
            # expired keys are kept only for a clearer error; at the limit they make room
            now = self._clock()
            agent.temporary_keys = [k for k in agent.temporary_keys if k.active(now)]
        if len(agent.temporary_keys) >= SANDBOX_KEYS_MAX:
            raise IdentityError(f"{name} already has {SANDBOX_KEYS_MAX} live sandbox credentials; "
                                "revoke some or wait for them to expire.")
        return agent

    def _refuse_if_session_policy(self, state: Identities, name: str) -> None:
        """A named session policy is referenced, not copied: deleting it under live sandbox
        credentials would silently change them (to deny-all), so it waits for them."""
        now = self._clock()
        holders = sorted({a.name for a in state.agents.values() for k in a.temporary_keys
                          if k.policy == name and k.active(now)})
        if holders:
            raise DeleteConflict(f"Policy {name!r} is the session policy of live sandbox credentials "
                                 f"of {', '.join(holders)}; revoke them or wait until they expire.")

    def _prune(self, agent: Agent) -> None:
        now = self._clock()
        agent.keys = [k for k in agent.keys if k.active(now)]

    def _key_to_rotate(self, agent: Agent, access_key: str | None, now: float) -> AccessKey:
        current = [k for k in agent.keys if k.expires_at is None]
        if access_key is not None:
            for key in current:
                if key.access_key == access_key:
                    return key
            raise NoSuchEntity(f"{agent.name} has no active access key {access_key!r}.")
        if len(current) != 1:
            raise IdentityError(f"{agent.name} has {len(current)} active access keys; name the "
                                "one to rotate.")
        return current[0]

    def _team_view(self, state: Identities, name: str) -> dict:
        team = state.teams[name]
        return {"name": name, "members": state.members(name), "policies": list(team.policies),
                "created_at": iso(team.created_at)}

    def _policy_summary(self, state: Identities, name: str) -> dict:
        return {"name": name, "builtin": name in BUILTIN_POLICIES, "attached_to": state.attached_to(name)}


class MalformedPolicy(IdentityError):
    code = "MalformedPolicyDocument"
    status = 400


def _parse_for_storage(text: bytes) -> PolicyDocument:
    """Parse a policy as given and again in the form it is stored in, so what is kept is
    exactly what was checked (re-serialising can grow numbers past the size limit)."""
    try:
        document = parse_policy(text)
        stored = orjson.dumps(document.source)
        return parse_policy(stored)
    except PolicyError as exc:
        raise MalformedPolicy(str(exc)) from None
    except TypeError:
        raise MalformedPolicy("The policy holds a value that cannot be stored: integers must fit "
                              "in 64 bits and text must be valid Unicode.") from None


_BUILTIN_DOCUMENTS = {name: parse_policy(orjson.dumps(doc)) for name, doc in BUILTIN_POLICIES.items()}
_DENY_ALL = parse_policy(orjson.dumps({"Version": "2012-10-17", "Statement": [
    {"Sid": "UnusablePolicyDeniesEverything", "Effect": "Deny", "Action": "*", "Resource": "*"}]}))


def _check_ttl(ttl_seconds: object) -> None:
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) \
            or not SANDBOX_TTL_MIN <= ttl_seconds <= SANDBOX_TTL_MAX:
        raise IdentityError(f"The lifetime of sandbox credentials must be a whole number of seconds "
                            f"from {SANDBOX_TTL_MIN} to {SANDBOX_TTL_MAX} (7 days), not {ttl_seconds!r}.")


def _parse_session_document(document: object) -> PolicyDocument:
    """An inline session policy gets exactly the checks of a stored policy."""
    if not isinstance(document, dict):
        raise MalformedPolicy("An inline session policy must be a JSON object.")
    try:
        text = orjson.dumps(document)
    except TypeError:
        raise MalformedPolicy("The policy holds a value that cannot be stored: integers must fit "
                              "in 64 bits and text must be valid Unicode.") from None
    return _parse_for_storage(text)


def _prune_expired_sandbox_keys(state: Identities, now: float) -> None:
    """Long-expired sandbox credentials leave the document, so it does not grow forever."""
    for agent in state.agents.values():
        agent.temporary_keys = [k for k in agent.temporary_keys
                                if now < k.expires_at + EXPIRED_SANDBOX_KEPT]


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _describe(attached: dict[str, list[str]]) -> str:
    parts = [f"agent {a}" for a in attached["agents"]] + [f"team {t}" for t in attached["teams"]]
    return ", ".join(parts)
