"""The REST layer: JSON routes under the same identities, policies and audit as S3.

Small on purpose: a route table of (method, path pattern, IAM action, handler),
SigV4 or bearer authentication with the signed body hash checked, an
authorization decision per route, JSON errors ``{"error": {"code", "message"}}``,
and one audit record plus metrics per request. Handlers are plain functions
that run on a worker thread and call services; they know nothing of ASGI.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
import pydantic

from ..iam.authn import Authenticator
from ..iam.authz import PER_ITEM_DECISION, ROOT_DECISION, SELF_DECISION, Authorizer, denial_message
from ..iam.principals import Principal
from ..logs import log
from ..recorder import Outcome, Recorder
from ..s3.body import drain, receive_some, unsupported_transfer_coding, waits_for_continue
from ..s3.errors import from_exception
from ..s3.sigv4 import AuthError, not_utf8, parse_query

#: REST bodies are small documents (a policy is at most 20 KB).
MAX_BODY = 1024 * 1024
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")


class ApiError(Exception):
    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


@dataclass
class Call:
    """What a handler gets: who calls, the path parameters, the query and the body."""

    principal: Principal
    params: dict[str, str]
    query: dict[str, str]
    body: bytes
    client_ip: str
    request_id: str
    #: what the resource function learned from the body, kept for the handler
    state: dict[str, Any] = field(default_factory=dict)
    #: whether the caller may ``action`` on ``resource``: for handlers that decide item by item
    permits: Callable[[str, str], bool] = field(default=lambda action, resource: False)
    #: whether an explicit Deny takes ``resource`` from an ``action`` allowed on a scope
    #: around it (a listing authorized on its prefix leaves such items out)
    denies: Callable[[str, str], bool] = field(default=lambda action, resource: True)
    #: the request headers, lowercase names (If-Match ...)
    headers: dict[str, str] = field(default_factory=dict)
    #: the version the call read or wrote, for its audit record (vault secrets)
    version: int | None = None
    #: the request's policy condition keys (``aws:sourceip``, ``aws:securetransport``)
    context: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        if not self.body.strip():
            raise ApiError("InvalidRequest", "This request needs a JSON body.")
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError as exc:
            raise ApiError("InvalidRequest", f"The body is not valid JSON: {exc}.") from None

    def model(self, cls: type[pydantic.BaseModel]) -> Any:
        try:
            return cls.model_validate(self.json())
        except pydantic.ValidationError as exc:
            raise ApiError("InvalidRequest", _validation_message(exc)) from None


@dataclass
class Reply:
    status: int = 200
    data: Any = None
    #: a non-JSON body (the Prometheus text format) and its content type
    raw: bytes | None = None
    content_type: str = "application/json"
    #: further response headers (ETag ...)
    headers: list[tuple[str, str]] = field(default_factory=list)

    def payload(self) -> bytes:
        if self.raw is not None:
            return self.raw
        return b"" if self.status == 204 else orjson.dumps(self.data)


Handler = Callable[[Call], Reply]


class PerItem(str):
    """A resource its handler decides item by item (a listing across scopes, a name resolved
    in the first scope the caller may read): the call is let through, each item is decided
    with ``Call.permits``. The string is what the audit record names."""

#: The ARN a route acts on, from its path parameters (and sometimes its body).
ResourceOf = Callable[[Call], str]
#: Further (action, resource) permissions a call needs, e.g. attaching the policies
#: a new agent is created with: without them a narrow grant would escalate.
AlsoNeeds = Callable[[Call], list[tuple[str, str]]]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern
    operation: str
    #: the IAM action a policy must allow; None for the caller asking about itself
    action: str | None
    resource: ResourceOf
    handler: Handler
    #: whose audit record must be durable before the response (changes)
    durable: bool = False
    also: AlsoNeeds | None = None
    max_body: int = MAX_BODY
    #: answer 503 rather than the reply when its audit record cannot be made durable
    audit_or_fail: bool = False


@dataclass
class Router:
    routes: list[Route] = field(default_factory=list)

    def add(self, method: str, path: str, operation: str, action: str | None, resource: ResourceOf,
            handler: Handler, durable: bool | None = None, also: AlsoNeeds | None = None,
            max_body: int = MAX_BODY, audit_or_fail: bool = False) -> None:
        """``{name}`` matches one path segment, ``{name:path}`` one or more (slashes included)."""
        pattern = re.sub(r"\{(\w+):path\}", r"(?P<\1>.+)", path)
        regex = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern) + r"\Z")
        self.routes.append(Route(method, regex, operation, action, resource, handler,
                                 method != "GET" if durable is None else durable, also, max_body,
                                 audit_or_fail))

    def body_limit(self, method: str, path: str) -> int:
        """The largest body the route takes (the default for paths no route takes)."""
        for route in self.routes:
            if route.method == method and route.pattern.match(path):
                return route.max_body
        return MAX_BODY

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        allowed = []
        for route in self.routes:
            found = route.pattern.match(path)
            if found:
                if route.method == method:
                    return route, found.groupdict()
                allowed.append(route.method)
        if allowed:
            raise ApiError("MethodNotAllowed", f"{method} is not allowed here; use "
                           f"{' or '.join(sorted(set(allowed)))}.", 405)
        raise ApiError("NoSuchRoute", f"There is no API route {path}.", 404)


#: The most of an unread body dropped, and how long it may take, after an early answer.
DRAIN_LIMIT = 32 * 1024 * 1024
DRAIN_SECONDS = 10.0


class RestApp:
    def __init__(self, router: Router, authenticator: Authenticator, authorizer: Authorizer,
                 recorder: Recorder, executor: ThreadPoolExecutor, body_timeout: float = 60.0) -> None:
        self.body_timeout = body_timeout
        self.router = router
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.recorder = recorder
        self.executor = executor

    async def __call__(self, scope: dict, receive, send) -> None:
        started = time.perf_counter()
        outcome = Outcome(request_id=os.urandom(8).hex().upper(), client_ip=scope.get("client", ("", 0))[0],
                          headers=_headers(scope), raw_query=scope.get("query_string", b"").decode("latin-1"))
        auth = None
        body_read = False
        try:
            unsupported_transfer_coding(outcome.headers)
            limit = self.router.body_limit(scope["method"], scope["path"])
            loop = asyncio.get_running_loop()
            if limit > MAX_BODY:
                # a large body is taken only from a caller whose signature holds (the signed
                # headers carry the body's hash), so strangers cannot pin megabytes each
                auth = await loop.run_in_executor(self.executor, self._authenticate, scope, outcome)
            body, more = await receive_some(receive, limit + 1, idle=self.body_timeout)
            body_read = not more
            outcome.bytes_in = len(body)
            if more or len(body) > limit:
                raise ApiError("EntityTooLarge", f"Request bodies here are at most {limit} bytes.", 413)
            reply = await loop.run_in_executor(self.executor, self._handle, scope, body, outcome, auth)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a JSON error
            reply = self._error(exc, outcome)
        payload = reply.payload()
        # answered before its body was read: the rest is read and dropped if it comes soon
        # (so a client still sending gets the answer, not a reset), else the connection
        # closes; a client waiting for 100-continue sends none, and its next request would
        # be read as this one's body
        if not body_read and not waits_for_continue(outcome.headers) and outcome.error != "RequestTimeout":
            body_read = await drain(receive, DRAIN_LIMIT, min(DRAIN_SECONDS, self.body_timeout))
        closing = [] if body_read else [(b"connection", b"close")]
        await send({"type": "http.response.start", "status": reply.status, "headers": [
            (b"content-type", reply.content_type.encode()), (b"content-length", str(len(payload)).encode()),
            (b"x-amz-request-id", outcome.request_id.encode()), (b"server", b"orgmem"), *closing,
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers)]})
        await send({"type": "http.response.body", "body": payload})
        outcome.status, outcome.bytes_out = reply.status, len(payload)
        if not outcome.recorded:
            self.recorder.record(outcome, time.perf_counter() - started)
        log.info("request", request_id=outcome.request_id, method=scope["method"], path=scope.get("path"),
                 op=outcome.operation, status=reply.status, bytes_in=outcome.bytes_in, bytes_out=len(payload),
                 ms=round((time.perf_counter() - started) * 1000, 2),
                 principal=getattr(outcome.principal, "name", None), client=outcome.client_ip)

    def _authenticate(self, scope: dict, outcome: Outcome):
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        raw_query = scope.get("query_string", b"").decode("latin-1")
        try:
            auth = self.authenticator.authenticate(scope["method"], raw_path, raw_query,
                                                   parse_query(raw_query), outcome.headers)
        except Exception as exc:
            outcome.principal = outcome.principal or getattr(exc, "principal", None)
            raise
        outcome.principal = auth.principal
        return auth

    def _handle(self, scope: dict, body: bytes, outcome: Outcome, auth=None) -> Reply:
        started = time.perf_counter()
        try:
            reply = self._dispatch(scope, body, outcome, auth)
        except Exception as exc:  # noqa: BLE001
            outcome.principal = outcome.principal or getattr(exc, "principal", None)
            reply = self._error(exc, outcome)
        if outcome.durable:
            outcome.status = reply.status
            outcome.bytes_out = len(reply.payload())
            stored = self.recorder.record(outcome, time.perf_counter() - started, durable=True)
            if not stored and outcome.audit_or_fail:
                reply = Reply(503, {"error": {"code": "ServiceUnavailable", "message": (
                    "The audit log cannot record this request right now, so its answer is "
                    "withheld; try again shortly.")}})
        return reply

    def _dispatch(self, scope: dict, body: bytes, outcome: Outcome, auth=None) -> Reply:
        raw_query = scope.get("query_string", b"").decode("latin-1")
        pairs = parse_query(raw_query)
        if auth is None:
            auth = self._authenticate(scope, outcome)
        _check_payload(auth.payload_hash, body)
        outcome.principal = auth.principal
        if (bad := not_utf8(pairs)) is not None:
            raise ApiError("InvalidArgument", f"The query parameter {bad} is not valid UTF-8 once "
                           "percent-decoded.", 400)
        route, params = self.router.match(scope["method"], scope["path"])
        outcome.operation, outcome.action, outcome.durable = route.operation, route.action, route.durable
        outcome.audit_or_fail = route.audit_or_fail
        context = {"aws:sourceip": outcome.client_ip,
                   "aws:securetransport": "true" if scope.get("scheme") == "https" else "false"}
        call = Call(auth.principal, params, dict(pairs), body, outcome.client_ip, outcome.request_id,
                    headers=outcome.headers, context=context)
        outcome.resource = route.resource(call)
        call.permits = lambda action, resource: self._permits(outcome, auth.principal, action, resource,
                                                              context)
        call.denies = lambda action, resource: self._denies(outcome, auth.principal, action, resource,
                                                            context)
        if route.action is None:
            outcome.decision = SELF_DECISION
        elif isinstance(outcome.resource, PerItem):
            outcome.decision = ROOT_DECISION if auth.principal.is_root else PER_ITEM_DECISION
        else:
            outcome.decision = self.authorizer.decide(auth.principal, route.action, outcome.resource,
                                                      context)
        if not outcome.decision.allowed:
            raise ApiError("AccessDenied", denial_message(auth.principal, route.action, outcome.resource,
                                                          outcome.decision), 403)
        for action, resource in route.also(call) if route.also else ():
            decision = self.authorizer.decide(auth.principal, action, resource, context)
            if not decision.allowed:
                outcome.decision, outcome.action, outcome.resource = decision, action, resource
                raise ApiError("AccessDenied", denial_message(auth.principal, action, resource, decision),
                               403)
        try:
            return route.handler(call)
        finally:
            outcome.version = call.version

    def _permits(self, outcome: Outcome, principal: Principal, action: str, resource: str,
                 context: dict) -> bool:
        allowed = self.authorizer.allows(principal, action, resource, context)
        if not allowed:
            outcome.items_denied += 1
        return allowed

    def _denies(self, outcome: Outcome, principal: Principal, action: str, resource: str,
                context: dict) -> bool:
        denied = self.authorizer.decide(principal, action, resource, context).decision == "explicit-deny"
        if denied:
            outcome.items_denied += 1
        return denied

    def _error(self, exc: Exception, outcome: Outcome) -> Reply:
        if isinstance(exc, ApiError):
            code, message, status = exc.code, exc.message, exc.status
        elif isinstance(exc, AuthError):
            code, message, status = exc.code, exc.message, exc.status
        elif (err := from_exception(exc)) is not None:
            code, message, status = err.code, err.message, err.status
        else:
            log.error("internal_error", request_id=outcome.request_id, error=exc.__class__.__name__,
                      trace=traceback.format_exc(limit=8))
            code, status = "InternalError", 500
            message = "We encountered an internal error. Please try again."
        outcome.error = code
        return Reply(status, {"error": {"code": code, "message": message}})


def _check_payload(payload_hash: str, body: bytes) -> None:
    """SigV4 signs the body's hash: a body that does not match it was tampered with."""
    if _HEX64.match(payload_hash):
        if hashlib.sha256(body).hexdigest() != payload_hash:
            raise ApiError("XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header "
                           "does not match what was computed.")
    elif payload_hash.startswith("STREAMING-"):
        raise ApiError("InvalidRequest", "The REST API takes whole bodies, not aws-chunked streams.")


def _headers(scope: dict) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        key = name.decode("latin-1").lower()
        text = value.decode("utf-8", "surrogateescape")
        headers[key] = f"{headers[key]},{text}" if key in headers else text
    return headers


def _validation_message(exc: pydantic.ValidationError) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "body"
        problems.append(f"{where}: {error['msg']}")
    return "The request body is not valid: " + "; ".join(problems) + "."
