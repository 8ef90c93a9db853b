"""After each request, S3 or REST: one audit record and the metrics.

Both protocols fill in an ``Outcome`` as the request goes (who, which action
on what, the decision, the status and bytes); ``Recorder.record`` turns it
into an audit record, durable before the response for changes, buffered for
reads, and counts it in the metrics.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from .iam.audit import AuditLog, AuditRecord, scrub_user_agent
from .iam.authz import reason as decision_reason
from .iam.policy import Decision
from .iam.principals import Principal
from .log.records import printable
from .metrics import Metrics

#: The access key ID a failed request claimed (never the secret: a bearer token's
#: secret follows the colon and is not captured).
_CREDENTIAL = re.compile(r"Credential=([A-Za-z0-9]{1,128})/")
_BEARER = re.compile(r"Bearer\s+([A-Za-z0-9]{1,128}):")
_QUERY_CREDENTIAL = re.compile(r"(?:^|&)X-Amz-Credential=([A-Za-z0-9]{1,128})(?:%2F|/)")


@dataclass
class Outcome:
    request_id: str
    client_ip: str
    headers: dict[str, str] = field(repr=False, default_factory=dict)
    raw_query: str = ""
    principal: Principal | None = None
    operation: str | None = None
    action: str | None = None
    resource: str | None = None
    decision: Decision | None = None
    status: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    error: str | None = None
    #: items refused inside a per-item operation (DeleteObjects keys, ListBuckets buckets)
    items_denied: int = 0
    #: changes (deletes, admin and IAM changes) are audited durably before the response
    durable: bool = False
    #: withhold the answer (503) when its audit record cannot be made durable (the vault)
    audit_or_fail: bool = False
    #: the secret version the request read or wrote, for the audit record
    version: int | None = None
    recorded: bool = False


DENIED = "AccessDenied"


class Recorder:
    def __init__(self, audit: AuditLog, metrics: Metrics) -> None:
        self.audit = audit
        self.metrics = metrics

    def record(self, outcome: Outcome, seconds: float, durable: bool = False) -> bool:
        """Audit and count one request; False when a durable record could not be stored."""
        outcome.recorded = True
        # a refusal made inside the operation (a per-item check, a sandbox key's limits) comes
        # after a route check that allowed: it is a denial all the same
        allowed = outcome.decision is not None and outcome.decision.allowed and outcome.error != DENIED
        record = AuditRecord(
            time=time.time(), request_id=outcome.request_id,
            principal=outcome.principal.name if outcome.principal else None,
            access_key=outcome.principal.access_key if outcome.principal else _text(claimed_key(outcome)),
            action=outcome.action, resource=_text(outcome.resource), operation=outcome.operation,
            decision="allow" if allowed else "deny", reason=_reason(outcome),
            status=outcome.status, bytes_in=outcome.bytes_in, bytes_out=outcome.bytes_out,
            remote_addr=outcome.client_ip,
            user_agent=_text(scrub_user_agent(outcome.headers.get("user-agent"))),
            error=outcome.error,
            version=outcome.version if type(outcome.version) is int else None)
        stored = self.audit.record_durable(record) if durable else True
        if not durable:
            self.audit.record(record)
        self.metrics.observe(outcome.operation or "Unknown", outcome.status, seconds,
                             outcome.bytes_in, outcome.bytes_out,
                             denied=outcome.decision is not None and not allowed)
        return stored


def _text(value: str | None) -> str | None:
    """Client-sent text as the audit keeps it: a stray non-UTF-8 byte spelled out."""
    return printable(value) if isinstance(value, str) else value


def claimed_key(outcome: Outcome) -> str | None:
    """The access key ID a request named, when authentication failed."""
    authorization = outcome.headers.get("authorization", "")
    found = _CREDENTIAL.search(authorization) or _BEARER.match(authorization) \
        or _QUERY_CREDENTIAL.search(outcome.raw_query)
    return found.group(1) if found else None


def _reason(outcome: Outcome) -> str:
    if outcome.decision is not None:
        reason = decision_reason(outcome.decision, outcome.items_denied)
        if outcome.decision.allowed and outcome.error == DENIED:
            reason += "; then refused by the operation (AccessDenied)"
        return reason
    if outcome.principal is None or outcome.principal.disabled or outcome.error == "ExpiredToken":
        return f"authentication: {outcome.error or 'failed'}"
    return f"rejected before authorization: {outcome.error or 'invalid request'}"
