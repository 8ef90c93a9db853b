"""The identities document: principals, their keys, teams and custom policies.

Plain dataclasses, serialised to one JSON document (see ``identities.py`` for
where it lives and how it changes). Team membership is kept on the principal
only, so it can never disagree with itself.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

FORMAT_VERSION = 1
KINDS = ("agent", "human")

#: Sandbox credentials live at least a second and at most a week, like AWS STS sessions:
#: long enough for a long job, short enough that a leaked key is soon useless.
SANDBOX_TTL_MIN = 1
SANDBOX_TTL_MAX = 7 * 24 * 3600
#: Sandbox keys per principal in the document (live, or expired and kept): keeps it small.
SANDBOX_KEYS_MAX = 100
#: How long an expired sandbox key stays in the document (it is refused all along): late
#: callers get the clear ``ExpiredToken`` instead of "this key does not exist".
EXPIRED_SANDBOX_KEPT = 24 * 3600

#: Agent and team names: they become bucket names (``agent-<name>``) and ARN paths.
_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,55}[a-z0-9])?\Z")
#: Policy names follow AWS's rule for managed policy names.
_POLICY_NAME = re.compile(r"^[A-Za-z0-9+=,.@_-]{1,128}\Z")
RESERVED_NAMES = frozenset({"root"})


class IdentityError(Exception):
    """A request about principals, teams or policies that cannot be done as asked."""

    code = "InvalidRequest"
    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NoSuchEntity(IdentityError):
    code = "NoSuchEntity"
    status = 404


class EntityAlreadyExists(IdentityError):
    code = "EntityAlreadyExists"
    status = 409


class DeleteConflict(IdentityError):
    code = "DeleteConflict"
    status = 409


def check_name(kind: str, name: str) -> None:
    """Agent and team names are lowercase, digits and inner hyphens, at most 57 characters."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise IdentityError(f"{kind} name {name!r} is not valid: use 1 to 57 lowercase letters, "
                            "digits and hyphens, starting and ending with a letter or digit.")
    if name in RESERVED_NAMES:
        raise IdentityError(f"{kind} name {name!r} is reserved.")


def check_policy_name(name: str) -> None:
    if not isinstance(name, str) or not _POLICY_NAME.match(name):
        raise IdentityError(f"policy name {name!r} is not valid: use 1 to 128 letters, digits "
                            "and the characters +=,.@_-")


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class AccessKey:
    access_key: str
    secret_key: str = field(repr=False)
    created_at: float
    #: set when the key was rotated away with a grace period; it works until then
    expires_at: float | None = None

    def active(self, now: float) -> bool:
        return self.expires_at is None or now < self.expires_at

    def public(self) -> dict:
        """What the admin API shows: everything but the secret."""
        return {"access_key": self.access_key,
                "status": "active" if self.expires_at is None else "expiring",
                "created_at": iso(self.created_at), "expires_at": iso(self.expires_at)}


@dataclass
class TemporaryKey:
    """Sandbox credentials: a key pair of one principal that expires by itself.

    It carries the principal's rights, narrowed by an optional session policy: a named
    policy (referenced, like AWS STS ``PolicyArns``) or an inline document (kept here).
    """

    access_key: str
    secret_key: str = field(repr=False)
    created_at: float
    expires_at: float
    policy: str | None = None
    policy_document: dict | None = None

    def active(self, now: float) -> bool:
        return now < self.expires_at

    def session_policy(self) -> str | None:
        """What names the session policy in a Principal and in the policy cache: the policy's
        name, or ``inline:<access key>`` (a colon never occurs in a policy name)."""
        if self.policy_document is not None:
            return f"inline:{self.access_key}"
        return self.policy

    def public(self) -> dict:
        """What the admin API shows: everything but the secret."""
        return {"access_key": self.access_key, "created_at": iso(self.created_at),
                "expires_at": iso(self.expires_at), "policy": self.policy,
                "inline_policy": self.policy_document is not None}


@dataclass
class Agent:
    """An agent or a human: a principal with keys, teams and attached policies."""

    name: str
    kind: str = "agent"
    teams: list[str] = field(default_factory=list)
    policies: list[str] = field(default_factory=list)
    disabled: bool = False
    created_at: float = 0.0
    keys: list[AccessKey] = field(default_factory=list)
    temporary_keys: list[TemporaryKey] = field(default_factory=list)

    def public(self, now: float) -> dict:
        return {"name": self.name, "kind": self.kind, "teams": sorted(self.teams),
                "policies": list(self.policies), "disabled": self.disabled,
                "created_at": iso(self.created_at),
                "keys": [k.public() for k in self.keys if k.active(now)],
                "temporary_keys": [k.public() for k in self.temporary_keys if k.active(now)]}

    def to_json(self) -> dict:
        """Without an empty ``temporary_keys``: a document that holds no sandbox credentials
        stays readable by gateways that predate them (a rolling upgrade keeps working)."""
        data = asdict(self)
        if not data["temporary_keys"]:
            del data["temporary_keys"]
        return data


@dataclass
class Team:
    name: str
    policies: list[str] = field(default_factory=list)
    created_at: float = 0.0


@dataclass
class CustomPolicy:
    name: str
    document: dict
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass
class Identities:
    """The whole document. ``generation`` counts changes; caches key on it."""

    generation: int = 0
    agents: dict[str, Agent] = field(default_factory=dict)
    teams: dict[str, Team] = field(default_factory=dict)
    policies: dict[str, CustomPolicy] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"format": FORMAT_VERSION, "generation": self.generation,
                "agents": [a.to_json() for a in self.agents.values()],
                "teams": [asdict(t) for t in self.teams.values()],
                "policies": [asdict(p) for p in self.policies.values()]}

    @classmethod
    def from_json(cls, data: dict) -> Identities:
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(f"identities document has format {data.get('format')!r}; this "
                             f"gateway reads format {FORMAT_VERSION}")
        agents = {}
        for raw in data.get("agents", []):
            keys = [AccessKey(**k) for k in raw.pop("keys", [])]
            temporary = [TemporaryKey(**k) for k in raw.pop("temporary_keys", [])]
            agents[raw["name"]] = Agent(**raw, keys=keys, temporary_keys=temporary)
        return cls(generation=data.get("generation", 0), agents=agents,
                   teams={t["name"]: Team(**t) for t in data.get("teams", [])},
                   policies={p["name"]: CustomPolicy(**p) for p in data.get("policies", [])})

    def members(self, team: str) -> list[str]:
        return sorted(a.name for a in self.agents.values() if team in a.teams)

    def attached_to(self, policy: str) -> dict[str, list[str]]:
        return {"agents": sorted(a.name for a in self.agents.values() if policy in a.policies),
                "teams": sorted(t.name for t in self.teams.values() if policy in t.policies)}
