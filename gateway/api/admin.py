"""The admin API (``/admin/v1``): principals, keys, sandbox credentials, teams, policies,
simulation, audit.

Thin: parse the body into a pydantic model, call the identity service, shape
the JSON. The route table is the place to read which action each call needs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..iam import actions, audit
from ..iam.authz import Authorizer
from ..iam.identities import DEFAULT_POLICIES, IdentityStore
from ..iam.model import iso
from ..iam.principals import Principal
from ..metrics import CONTENT_TYPE, Metrics
from ..rotation import KeyRotation
from . import kek
from .rest import ApiError, Call, Reply, Router

PREFIX = "/admin/v1"
ARN = "arn:orgmem:admin:::"
MAX_GRACE_SECONDS = 90 * 24 * 3600


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NewAgent(_Body):
    name: str
    kind: Literal["agent", "human"] = "agent"
    teams: list[str] = Field(default_factory=list, max_length=100)
    policies: list[str] | None = Field(default=None, max_length=20)


class SandboxRequest(_Body):
    """Strict integer seconds: "3600" or 1.5 is refused rather than guessed at; the range is
    checked by the identity service, whose message names the bounds."""

    ttl_seconds: int = Field(strict=True)
    policy: str | None = None
    policy_document: dict[str, Any] | None = None


class Rotation(_Body):
    access_key: str | None = None
    grace_seconds: int = Field(default=0, ge=0, le=MAX_GRACE_SECONDS)


class NewTeam(_Body):
    name: str
    policies: list[str] = Field(default_factory=list, max_length=20)


class Attachment(_Body):
    agent: str | None = None
    team: str | None = None


class Simulation(_Body):
    principal: str
    action: str
    resource: str
    context: dict[str, str | list[str]] = Field(default_factory=dict)


def _arn(kind: str, param: str = "name") -> Callable[[Call], str]:
    return lambda call: f"{ARN}{kind}/{call.params[param]}"


def _fixed(path: str) -> Callable[[Call], str]:
    return lambda call: ARN + path


def build_router(identities: IdentityStore, authorizer: Authorizer, audit_log: audit.AuditLog,
                 metrics: Metrics, rotation: KeyRotation | None = None) -> Router:
    """Every admin route, with the action it needs and the resource it acts on."""
    api = AdminApi(identities, authorizer, audit_log, metrics)
    r = Router()
    if rotation is not None:
        kek.add_routes(r, PREFIX, rotation)
    add = r.add
    add("GET", "/metrics", "GetMetrics", "admin:GetMetrics", _fixed("metrics"), api.metrics)
    p = PREFIX
    add("GET", f"{p}/whoami", "WhoAmI", None, lambda c: f"{ARN}agent/{c.principal.name}", api.whoami)
    add("GET", f"{p}/agents", "ListAgents", "admin:ListAgents", _fixed("agent/*"), api.list_agents)
    add("POST", f"{p}/agents", "CreateAgent", "admin:CreateAgent", api.new_agent_arn, api.create_agent,
        also=_grants_in_body(DEFAULT_POLICIES))
    add("GET", f"{p}/agents/{{name}}", "GetAgent", "admin:GetAgent", _arn("agent"), api.get_agent)
    add("DELETE", f"{p}/agents/{{name}}", "DeleteAgent", "admin:DeleteAgent", _arn("agent"), api.delete_agent)
    add("POST", f"{p}/agents/{{name}}/disable", "DisableAgent", "admin:UpdateAgent", _arn("agent"),
        api.disable_agent)
    add("POST", f"{p}/agents/{{name}}/enable", "EnableAgent", "admin:UpdateAgent", _arn("agent"),
        api.enable_agent)
    add("POST", f"{p}/agents/{{name}}/keys", "CreateKey", "admin:CreateKey", _arn("agent"), api.create_key)
    add("POST", f"{p}/agents/{{name}}/keys/rotate", "RotateKey", "admin:RotateKey", _arn("agent"),
        api.rotate_key)
    # Sandbox credentials are keys of the agent, narrower and shorter-lived: issuing them is
    # CreateKey on the agent, and a session policy needs no right of its own (it only narrows).
    add("POST", f"{p}/agents/{{name}}/sandbox-credentials", "CreateSandboxCredentials",
        "admin:CreateKey", _arn("agent"), api.create_sandbox_credentials)
    add("DELETE", f"{p}/keys/{{key}}", "RevokeKey", "admin:RevokeKey", api.key_owner_arn, api.revoke_key)
    add("GET", f"{p}/teams", "ListTeams", "admin:ListTeams", _fixed("team/*"), api.list_teams)
    add("POST", f"{p}/teams", "CreateTeam", "admin:CreateTeam", api.new_team_arn, api.create_team,
        also=_grants_in_body(()))
    add("GET", f"{p}/teams/{{name}}", "GetTeam", "admin:GetTeam", _arn("team"), api.get_team)
    add("DELETE", f"{p}/teams/{{name}}", "DeleteTeam", "admin:DeleteTeam", _arn("team"), api.delete_team)
    add("PUT", f"{p}/teams/{{name}}/members/{{agent}}", "AddTeamMember", "admin:UpdateTeam", _arn("team"),
        api.add_member, also=_member_agent)
    add("DELETE", f"{p}/teams/{{name}}/members/{{agent}}", "RemoveTeamMember", "admin:UpdateTeam",
        _arn("team"), api.remove_member, also=_member_agent)
    add("GET", f"{p}/policies", "ListPolicies", "admin:ListPolicies", _fixed("policy/*"), api.list_policies)
    add("POST", f"{p}/policies/simulate", "SimulatePolicy", "admin:SimulatePolicy",
        _fixed("policy/*"), api.simulate, durable=False)
    add("PUT", f"{p}/policies/{{name}}", "PutPolicy", "admin:PutPolicy", _arn("policy"), api.put_policy)
    add("GET", f"{p}/policies/{{name}}", "GetPolicy", "admin:GetPolicy", _arn("policy"), api.get_policy)
    add("DELETE", f"{p}/policies/{{name}}", "DeletePolicy", "admin:DeletePolicy", _arn("policy"),
        api.delete_policy)
    add("POST", f"{p}/policies/{{name}}/attach", "AttachPolicy", "admin:AttachPolicy", _arn("policy"),
        api.attach_policy, also=_attachment_target)
    add("POST", f"{p}/policies/{{name}}/detach", "DetachPolicy", "admin:DetachPolicy", _arn("policy"),
        api.detach_policy, also=_attachment_target)
    add("GET", f"{p}/audit", "ReadAudit", "admin:ReadAudit", _fixed("audit"), api.read_audit)
    return r


class AdminApi:
    def __init__(self, identities: IdentityStore, authorizer: Authorizer, audit_log: audit.AuditLog,
                 metrics: Metrics) -> None:
        self.identities = identities
        self.authorizer = authorizer
        self.audit_log = audit_log
        self._metrics = metrics

    # resources named by the body or by a key's owner
    def new_agent_arn(self, call: Call) -> str:
        return f"{ARN}agent/{_body_name(call)}"

    def new_team_arn(self, call: Call) -> str:
        return f"{ARN}team/{_body_name(call)}"

    def key_owner_arn(self, call: Call) -> str:
        return f"{ARN}agent/{self.identities.owner_of(call.params['key']) or '*'}"

    # -- principals and keys ------------------------------------------------------

    def whoami(self, call: Call) -> Reply:
        p = call.principal
        policies = [] if p.is_root else self.identities.attached_policy_names(p.name)
        return Reply(data={"name": p.name, "kind": p.kind, "teams": list(p.teams),
                           "policies": policies, "is_root": p.is_root,
                           "expires_at": iso(p.expires_at), "session_policy": _session_label(p)})

    def list_agents(self, call: Call) -> Reply:
        return Reply(data={"agents": self.identities.list_agents()})

    def create_agent(self, call: Call) -> Reply:
        _refuse_temporary_caller(call)  # a new agent comes with a lasting key
        body = call.model(NewAgent)
        agent, key = self.identities.create_agent(body.name, body.kind, body.teams, body.policies)
        return Reply(201, {"name": body.name, "access_key": key.access_key, "secret_key": key.secret_key,
                           "agent": agent})

    def get_agent(self, call: Call) -> Reply:
        return Reply(data=self.identities.get_agent(call.params["name"]))

    def delete_agent(self, call: Call) -> Reply:
        self.identities.delete_agent(call.params["name"])
        return Reply(204)

    def disable_agent(self, call: Call) -> Reply:
        return Reply(data=self.identities.set_disabled(call.params["name"], True))

    def enable_agent(self, call: Call) -> Reply:
        return Reply(data=self.identities.set_disabled(call.params["name"], False))

    def create_key(self, call: Call) -> Reply:
        _refuse_temporary_caller(call)
        key = self.identities.create_key(call.params["name"])
        return Reply(201, {"name": call.params["name"], "access_key": key.access_key,
                           "secret_key": key.secret_key})

    def rotate_key(self, call: Call) -> Reply:
        _refuse_temporary_caller(call)
        body = call.model(Rotation) if call.body.strip() else Rotation()
        old, new = self.identities.rotate_key(call.params["name"], body.access_key, body.grace_seconds)
        return Reply(201, {"name": call.params["name"], "access_key": new.access_key,
                           "secret_key": new.secret_key, "replaced": old.access_key,
                           "old_key_expires_at": iso(old.expires_at)})

    def revoke_key(self, call: Call) -> Reply:
        self.identities.revoke_key(call.params["key"])
        return Reply(204)

    def create_sandbox_credentials(self, call: Call) -> Reply:
        _refuse_temporary_caller(call)
        body = call.model(SandboxRequest)
        name = call.params["name"]
        key = self.identities.create_sandbox_credentials(name, body.ttl_seconds, body.policy,
                                                         body.policy_document)
        return Reply(201, {"agent": name, "access_key": key.access_key, "secret_key": key.secret_key,
                           "expires": int(key.expires_at), "expires_at": iso(key.expires_at),
                           "policy": key.policy, "inline_policy": key.policy_document is not None})

    # -- teams ---------------------------------------------------------------------

    def list_teams(self, call: Call) -> Reply:
        return Reply(data={"teams": self.identities.list_teams()})

    def create_team(self, call: Call) -> Reply:
        body = call.model(NewTeam)
        return Reply(201, self.identities.create_team(body.name, body.policies))

    def get_team(self, call: Call) -> Reply:
        return Reply(data=self.identities.get_team(call.params["name"]))

    def delete_team(self, call: Call) -> Reply:
        self.identities.delete_team(call.params["name"])
        return Reply(204)

    def add_member(self, call: Call) -> Reply:
        return Reply(data=self.identities.set_membership(call.params["name"], call.params["agent"], True))

    def remove_member(self, call: Call) -> Reply:
        return Reply(data=self.identities.set_membership(call.params["name"], call.params["agent"], False))

    # -- policies ------------------------------------------------------------------

    def list_policies(self, call: Call) -> Reply:
        return Reply(data={"policies": self.identities.list_policies()})

    def put_policy(self, call: Call) -> Reply:
        return Reply(data=self.identities.put_policy(call.params["name"], call.body))

    def get_policy(self, call: Call) -> Reply:
        return Reply(data=self.identities.get_policy(call.params["name"]))

    def delete_policy(self, call: Call) -> Reply:
        self.identities.delete_policy(call.params["name"])
        return Reply(204)

    def attach_policy(self, call: Call) -> Reply:
        body = call.model(Attachment)
        return Reply(data=self.identities.attach_policy(call.params["name"], body.agent, body.team, True))

    def detach_policy(self, call: Call) -> Reply:
        body = call.model(Attachment)
        return Reply(data=self.identities.attach_policy(call.params["name"], body.agent, body.team, False))

    def simulate(self, call: Call) -> Reply:
        body = call.model(Simulation)
        if not actions.is_known_action(body.action):
            raise ApiError("InvalidArgument", f"{body.action!r} is not an action orgmem knows; actions "
                           "are named like s3:GetObject or memory:PutDocument (see the README).")
        principal = self.identities.principal(body.principal)
        context = {k.lower(): v for k, v in body.context.items()}
        decision = self.authorizer.decide(principal, body.action, body.resource, context)
        return Reply(data={
            "principal": principal.name, "action": body.action, "resource": body.resource,
            "allowed": decision.allowed, "decision": decision.decision,
            "statement": _ref(decision.statement), "explanation": decision.explanation,
            "matched": [_ref(m) for m in decision.matched]})

    # -- audit and metrics ---------------------------------------------------------------

    def read_audit(self, call: Call) -> Reply:
        q = call.query
        try:
            since = audit.parse_since(q["since"], _now()) if q.get("since") else None
            limit = int(q.get("limit", "100"))
        except ValueError as exc:
            raise ApiError("InvalidArgument", str(exc)) from None
        except (OverflowError, OSError):
            raise ApiError("InvalidArgument", "since is out of range.") from None
        if not 1 <= limit <= 1000:
            raise ApiError("InvalidArgument", "limit must be between 1 and 1000.")
        denied = q.get("denied")
        if denied not in (None, "true", "false"):
            raise ApiError("InvalidArgument", "denied must be true or false.")
        self.audit_log.flush()  # a reader sees every request this gateway answered before it asked
        try:
            records, cursor = self.audit_log.query(since=since, principal=q.get("principal"),
                                                   denied=None if denied is None else denied == "true",
                                                   after=q.get("after"), limit=limit)
        except ValueError as exc:
            raise ApiError("InvalidArgument", str(exc)) from None
        return Reply(data={"records": records, "cursor": cursor})

    def metrics(self, call: Call) -> Reply:
        return Reply(raw=self._metrics.render(), content_type=CONTENT_TYPE)


def _refuse_temporary_caller(call: Call) -> None:
    """Sandbox credentials must not mint keys: a lasting key (of a new agent too), or fresh
    sandbox credentials, would outlive the expiry that is the point of them."""
    if call.principal.temporary:
        raise ApiError("AccessDenied", "Sandbox credentials cannot create agents, access keys or "
                       "sandbox credentials; ask with the agent's own keys or an administrator's.", 403)


def _session_label(principal: Principal) -> str | None:
    """The session policy's name, or ``(inline)``, which no policy can be named."""
    policy = principal.session_policy
    return "(inline)" if policy and policy.startswith("inline:") else policy


def _body_object(call: Call) -> dict:
    try:
        body = call.json()
    except ApiError:
        return {}
    return body if isinstance(body, dict) else {}


def _names(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _grants_in_body(default_policies: tuple[str, ...]) -> Callable[[Call], list[tuple[str, str]]]:
    """Creating a principal or team with policies and teams is attaching those policies and
    joining those teams: the caller needs those rights too, or a narrow grant escalates."""
    def needs(call: Call) -> list[tuple[str, str]]:
        body = _body_object(call)
        given = body.get("policies")
        policies = list(default_policies) if given is None else _names(given)
        return ([("admin:AttachPolicy", f"{ARN}policy/{p}") for p in policies]
                + [("admin:UpdateTeam", f"{ARN}team/{t}") for t in _names(body.get("teams"))])
    return needs


def _member_agent(call: Call) -> list[tuple[str, str]]:
    """Changing a membership changes the agent's rights as much as the team's."""
    return [("admin:UpdateAgent", f"{ARN}agent/{call.params['agent']}")]


def _attachment_target(call: Call) -> list[tuple[str, str]]:
    body = _body_object(call)
    if isinstance(body.get("agent"), str):
        return [("admin:UpdateAgent", f"{ARN}agent/{body['agent']}")]
    if isinstance(body.get("team"), str):
        return [("admin:UpdateTeam", f"{ARN}team/{body['team']}")]
    return []


def _body_name(call: Call) -> str:
    """The name a create request asks for; ``*`` while the body is unreadable, so the
    caller is authorized before being told what is wrong with the body."""
    try:
        body = call.json()
    except ApiError:
        return "*"
    name = body.get("name") if isinstance(body, dict) else None
    return name if isinstance(name, str) else "*"


def _ref(ref) -> dict | None:
    if ref is None:
        return None
    return {"policy": ref.policy, "index": ref.index, "sid": ref.sid, "effect": ref.effect}


def _now() -> float:
    return time.time()
