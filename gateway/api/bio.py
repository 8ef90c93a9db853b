"""The biography API (``/v1/events``, ``/v1/sessions``, ``/v1/bio/...``).

Thin: validate, check the per-agent grants, call :class:`Biographies`, shape the JSON.
An agent writes and reads its own biography under the built-in policy; writing or
reading another agent's needs a ``bio:`` grant on ``arn:orgmem:bio:::AGENT/SESSION``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from ..biography import events as ev
from ..biography.prepare import Prepared
from ..biography.query import BadCursor, Filter
from ..biography.service import Biographies
from ..iam.audit import parse_since_us
from ..iam.model import RESERVED_NAMES, IdentityError, check_name
from .rest import ApiError, Call, Reply, Router

ARN = "arn:orgmem:bio:::"
MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
#: ``since``/``until`` are kept in signed 64-bit microseconds.
MAX_SECONDS = (2**63 - 1) // 1_000_000


class AuditRetentionBody(BaseModel):
    # strict: retention deletes data, so "days": true or "7" is a mistake to refuse, not coerce
    model_config = ConfigDict(extra="forbid", strict=True)
    days: int | None = Field(default=None, ge=1, le=36500)


class RetentionBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    days: int | None = Field(default=None, ge=1, le=36500)
    agent: str | None = Field(default=None, min_length=1)
    #: drop the agent's own setting (the default applies again)
    reset: bool = False


def add_routes(r: Router, bios: Biographies) -> None:
    api = BioApi(bios)
    r.add("POST", "/v1/events", "PutEvents", "bio:PutEvents", api.first_event_arn, api.put_events,
          durable=False, also=api.other_event_arns, max_body=ev.MAX_BODY)
    r.add("GET", "/v1/events", "GetEvents", "bio:GetEvents", api.read_arn, api.get_events)
    r.add("GET", "/v1/sessions", "ListSessions", "bio:ListSessions", api.agent_arn, api.list_sessions)
    r.add("POST", "/v1/bio/compact", "Compact", "bio:Compact", lambda c: ARN + "*", api.compact)
    r.add("GET", "/v1/bio/retention", "GetRetention", "bio:GetRetention", api.retention_arn,
          api.get_retention)
    r.add("PUT", "/v1/bio/retention", "PutRetention", "bio:PutRetention", api.retention_arn,
          api.put_retention)
    audit_arn = "arn:orgmem:admin:::audit"
    r.add("GET", "/admin/v1/audit/retention", "GetAuditRetention", "admin:ReadAudit",
          lambda c: audit_arn, api.get_audit_retention)
    r.add("PUT", "/admin/v1/audit/retention", "SetAuditRetention", "admin:SetAuditRetention",
          lambda c: audit_arn, api.put_audit_retention)


class BioApi:
    def __init__(self, bios: Biographies) -> None:
        self.bios = bios

    # -- writing ----------------------------------------------------------------

    def _batch(self, call: Call) -> Prepared:
        """The batch validated and redacted (once, by the resource check, kept for the handler)."""
        batch = call.state.get("events")
        if batch is None:
            try:
                batch = self.bios.prepare(call.body, call.principal.name, int(time.time() * 1_000_000))
            except ev.EventError as exc:
                raise ApiError("InvalidEvent", f"{exc}; nothing was stored.") from None
            call.state["events"] = batch
        return batch

    def first_event_arn(self, call: Call) -> str:
        agent, session = self._batch(call).first
        return f"{ARN}{agent}/{session}"

    def other_event_arns(self, call: Call) -> list[tuple[str, str]]:
        return [("bio:PutEvents", f"{ARN}{a}/{s}") for a, s in self._batch(call).others]

    def put_events(self, call: Call) -> Reply:
        ids = self.bios.append(self._batch(call))
        return Reply(200, {"event_ids": ids, "count": len(ids)})

    # -- reading ----------------------------------------------------------------

    def _agent(self, call: Call) -> str:
        return _checked_agent(call.query.get("agent") or call.principal.name)

    def agent_arn(self, call: Call) -> str:
        return f"{ARN}{self._agent(call)}/*"

    def read_arn(self, call: Call) -> str:
        return f"{ARN}{self._agent(call)}/{call.query.get('session') or '*'}"

    def get_events(self, call: Call) -> Reply:
        q = call.query
        agent, session = self._agent(call), q.get("session") or None
        f = Filter(agent, session, _kinds(q.get("kind")), _time(q.get("since"), "since"),
                   _time(q.get("until"), "until"),
                   readable=None if session else _sessions_allowed(call, "bio:GetEvents", agent))
        try:
            events, cursor = self.bios.events(f, _limit(q.get("limit")), q.get("cursor") or None)
        except BadCursor as exc:
            raise ApiError("InvalidArgument", f"cursor: {exc}") from None
        return Reply(200, {"events": [e.to_api() for e in events], "next_cursor": cursor})

    def list_sessions(self, call: Call) -> Reply:
        """The agent's sessions that the caller may list; the open questions (events) of
        those whose events it may read."""
        agent = self._agent(call)
        listed = _sessions_allowed(call, "bio:ListSessions", agent)
        readable = _sessions_allowed(call, "bio:GetEvents", agent)
        sessions = [s for s in self.bios.sessions(agent) if listed is None or listed(s["session"])]
        for s in sessions:
            if readable is not None and not readable(s["session"]):
                s["open_questions"] = []
        return Reply(200, {"agent": agent, "sessions": sessions})

    # -- upkeep -----------------------------------------------------------------

    def compact(self, call: Call) -> Reply:
        return Reply(200, self.bios.compact().to_dict())

    def retention_arn(self, call: Call) -> str:
        agent = call.query.get("agent")
        if call.body.strip():
            agent = call.model(RetentionBody).agent
        if agent:
            return f"{ARN}{_checked_agent(agent)}/*"
        return ARN + "*"

    def get_retention(self, call: Call) -> Reply:
        return Reply(200, self.bios.retention().to_dict())

    def get_audit_retention(self, call: Call) -> Reply:
        return Reply(200, _audit_days(self.bios.retention()))

    def put_audit_retention(self, call: Call) -> Reply:
        body = call.model(AuditRetentionBody)
        return Reply(200, _audit_days(self.bios.set_audit_retention(body.days)))

    def put_retention(self, call: Call) -> Reply:
        body = call.model(RetentionBody)
        if body.reset and (body.agent is None or body.days is not None):
            raise ApiError("InvalidArgument",
                           "reset drops one agent's own setting: give agent, without days.")
        return Reply(200, self.bios.set_retention(body.agent, body.days, body.reset).to_dict())


def _sessions_allowed(call: Call, action: str, agent: str) -> Callable[[str], bool] | None:
    """Which of ``agent``'s sessions the caller may ``action``: the request was allowed on
    ``AGENT/*``, but a Deny may still take some sessions (``AGENT/hr-*``). Each session is
    decided once per request; None for root, who is never denied."""
    if call.principal.is_root:
        return None
    decided: dict[str, bool] = {}

    def allowed(session: str) -> bool:
        if session not in decided:
            decided[session] = call.permits(action, f"{ARN}{agent}/{session}")
        return decided[session]

    return allowed


def _audit_days(policy) -> dict:
    return {"days": policy.audit_days}


def _checked_agent(agent: str) -> str:
    if agent not in RESERVED_NAMES:  # root has a biography too
        try:
            check_name("agent", agent)
        except IdentityError as exc:
            raise ApiError("InvalidArgument", str(exc)) from None
    return agent


def _kinds(value: str | None) -> frozenset[str] | None:
    if not value:
        return None
    kinds = frozenset(k.strip() for k in value.split(",") if k.strip())
    if not kinds:  # "kind=," matched nothing at all
        raise ApiError("InvalidArgument", f"kind: name one or more kinds ({', '.join(ev.KINDS)}), "
                       "or leave kind out for all.")
    unknown = sorted(kinds - frozenset(ev.KINDS))
    if unknown:
        raise ApiError("InvalidArgument",
                       f"kind: unknown kind {unknown[0]!r}; kinds are {', '.join(ev.KINDS)}.")
    return kinds


def _time(value: str | None, name: str) -> int | None:
    """``since``/``until``: RFC 3339, unix seconds, or a duration back from now ("10m", "7d")."""
    if not value:
        return None
    try:
        us = parse_since_us(value, time.time())
    except ValueError:
        raise ApiError("InvalidArgument", f"{name}: {_short(value)} is not a time; use RFC 3339 "
                       f"({datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}), unix seconds, or a duration like "
                       "10m or 7d.") from None
    except OverflowError:  # a duration of more seconds than a float holds
        us = 2**64
    if not -(2**63) <= us <= 2**63 - 1:
        raise ApiError("InvalidArgument", f"{name}: {_short(value)} is out of range; a time must lie within "
                       f"{MAX_SECONDS} seconds (about 292,000 years) of 1970-01-01T00:00:00Z.")
    return us


def _short(value: str, limit: int = 40) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")


def _limit(value: str | None) -> int:
    if value is None or value == "":
        return DEFAULT_LIMIT
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_LIMIT:
        raise ApiError("InvalidArgument", f"limit: must be a whole number from 1 to {MAX_LIMIT}.")
    return int(value)
