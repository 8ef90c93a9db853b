"""The context pack API (``POST /v1/context``).

    POST /v1/context   {"agent", "session"?, "query"?, "budget_tokens"}

Thin: validate, check the grants, call :class:`~gateway.context.ContextPacks`. The route needs
``search:GetContext`` on ``arn:orgmem:search:::context``, and the pack of agent A needs what
reading A's sources needs: ``memory:ListDocuments`` on ``arn:orgmem:memory:::agent/A/*`` (as
``GET /v1/memory/for/A`` does) and, for a session S, ``bio:GetEvents`` on
``arn:orgmem:bio:::A/S``; without them the answer is 403. Inside the pack every memory
document is checked with ``memory:GetDocument`` and every skill with ``skills:ListSkills``, so
nothing the caller could not read itself is included.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from ..biography.events import MAX_SESSION
from ..context import MAX_BUDGET, MAX_QUERY, MIN_BUDGET, ContextPacks, Request
from ..iam.model import RESERVED_NAMES, IdentityError, check_name
from .rest import ApiError, Call, Reply, Router

ARN = "arn:orgmem:search:::context"
#: A context request is a few small fields.
MAX_CONTEXT_BODY = 64 * 1024


class ContextBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent: StrictStr
    session: StrictStr | None = None
    query: StrictStr | None = Field(default=None, max_length=MAX_QUERY)
    budget_tokens: StrictInt = Field(ge=MIN_BUDGET, le=MAX_BUDGET)


def add_routes(r: Router, packs: ContextPacks) -> None:
    api = ContextApi(packs)
    r.add("POST", "/v1/context", "GetContext", "search:GetContext", lambda call: ARN, api.context,
          durable=False, also=api.also, max_body=MAX_CONTEXT_BODY)


def _request(call: Call) -> Request:
    """The validated body (parsed once, by the grant check, kept for the handler)."""
    found = call.state.get("context")
    if found is None:
        body = call.json()
        if isinstance(body, dict) and "budget_tokens" in body:
            budget = body["budget_tokens"]
            if not isinstance(budget, int) or isinstance(budget, bool) \
                    or not MIN_BUDGET <= budget <= MAX_BUDGET:
                raise ApiError("InvalidArgument", f"budget_tokens: {str(budget)[:40]!r} is not a whole "
                               f"number from {MIN_BUDGET} to {MAX_BUDGET}.")
        body = call.model(ContextBody)
        agent = body.agent
        if agent not in RESERVED_NAMES:  # root has a biography too
            try:
                check_name("agent", agent)
            except IdentityError as exc:
                raise ApiError("InvalidArgument", str(exc)) from None
        session = body.session
        if session is not None and not (0 < len(session) <= MAX_SESSION and session.isprintable()):
            raise ApiError("InvalidArgument", f"session: 1 to {MAX_SESSION} printable characters.")
        found = call.state["context"] = Request(agent, body.budget_tokens, session, body.query)
    return found


class ContextApi:
    def __init__(self, packs: ContextPacks) -> None:
        self.packs = packs

    @staticmethod
    def also(call: Call) -> list[tuple[str, str]]:
        req = _request(call)
        needs = []
        if req.session is not None:
            needs.append(("bio:GetEvents", f"arn:orgmem:bio:::{req.agent}/{req.session}"))
        needs.append(("memory:ListDocuments", f"arn:orgmem:memory:::agent/{req.agent}/*"))
        return needs

    def context(self, call: Call) -> Reply:
        return Reply(200, self.packs.pack(_request(call), call.principal, call.permits))
