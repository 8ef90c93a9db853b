"""The exceptions the SDK raises, one class per kind of failure a caller handles differently.

Every failure is an :class:`OrgmemError` carrying the HTTP ``status`` (0 when no answer came,
or when the SDK refused the call before sending it), the gateway's error ``code`` and its
``message``.  Subclasses let a caller catch what it can act on: a missing item, a refusal, a
lost race, bad input, or a gateway that is down.  No message or repr ever holds a secret key
or a secret value: the transport scrubs them before an error is built.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping

__all__ = ["OrgmemError", "NotFound", "AccessDenied", "Conflict", "PreconditionFailed",
           "InvalidRequest", "Unavailable", "error_for", "from_response"]


class OrgmemError(Exception):
    """A failed call: ``status`` (0: no HTTP answer), ``code`` and ``message``."""

    def __init__(self, status: int, code: str, message: str, *, request_id: str | None = None) -> None:
        super().__init__(status, code, message)
        self.status = status
        self.code = code
        self.message = message
        #: the gateway's x-amz-request-id, to find the request in its logs and audit
        self.request_id = request_id

    def __str__(self) -> str:
        where = f" (HTTP {self.status})" if self.status else ""
        return f"{self.code}: {self.message}{where}"

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, "
                f"message={self.message!r})")

    def __reduce__(self):
        return (_rebuild, (type(self), self.status, self.code, self.message, self.request_id))


def _rebuild(cls: type[OrgmemError], status: int, code: str, message: str,
             request_id: str | None) -> OrgmemError:
    return cls(status, code, message, request_id=request_id)


class NotFound(OrgmemError):
    """404 (and 410): the document, secret, object, bucket or route is not there."""


class AccessDenied(OrgmemError):
    """403 (and 401): the caller's policies do not allow this, or its key is wrong or revoked."""


class Conflict(OrgmemError):
    """409: the write clashes with what is stored (a duplicate memory, a bucket that exists)."""


class PreconditionFailed(OrgmemError):
    """412: an ETag (If-Match), create-only (If-None-Match) or check-and-set condition failed:
    someone else wrote first.  Read again and retry."""


class InvalidRequest(OrgmemError):
    """400 or 413: the input was refused (and nothing was stored), or the SDK refused it first."""


class Unavailable(OrgmemError):
    """503 (also 502/504), a timeout or no connection: try again later."""


_BY_STATUS: dict[int, type[OrgmemError]] = {
    400: InvalidRequest, 401: AccessDenied, 403: AccessDenied, 404: NotFound, 409: Conflict,
    410: NotFound, 412: PreconditionFailed, 413: InvalidRequest, 502: Unavailable,
    503: Unavailable, 504: Unavailable,
}


def error_for(status: int) -> type[OrgmemError]:
    """The exception class for an HTTP status."""
    return _BY_STATUS.get(status, OrgmemError)


def _parse_body(body: bytes) -> tuple[str | None, str | None]:
    """(code, message) from a REST JSON error or an S3 XML error; (None, None) otherwise."""
    text = body.strip()
    if text.startswith(b"{"):
        try:
            err = json.loads(text)["error"]
            return str(err["code"]), str(err.get("message") or "")
        except (ValueError, KeyError, TypeError):
            return None, None
    if text.startswith(b"<"):
        try:
            root = ET.fromstring(text)
        except ET.ParseError:
            return None, None
        return root.findtext("Code"), root.findtext("Message") or ""
    return None, None


_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "AccessDenied", 404: "NotFound",
            405: "MethodNotAllowed", 409: "Conflict", 410: "Gone", 412: "PreconditionFailed",
            413: "EntityTooLarge", 416: "InvalidRange", 500: "InternalError", 501: "NotImplemented",
            502: "BadGateway", 503: "ServiceUnavailable", 504: "GatewayTimeout"}


def from_response(status: int, headers: Mapping[str, str], body: bytes,
                  scrub=lambda text: text) -> OrgmemError:
    """The exception for an HTTP error answer; ``scrub`` removes secrets from the message."""
    code, message = _parse_body(body)
    if not code:
        code = _REASONS.get(status, "Error")
        shown = body[:200].decode("utf-8", "replace").strip()
        message = f"HTTP {status}" + (f": {shown}" if shown else "")
    return error_for(status)(status, code, scrub(message or ""), request_id=headers.get("x-amz-request-id"))
