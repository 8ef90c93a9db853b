"""Authentication shared by the S3 protocol and the REST API.

Three ways to prove an identity, checked in this order: a presigned URL, a
SigV4 Authorization header, and ``Authorization: Bearer <access>:<secret>`` for
simple REST clients. The result names the principal; what it may do is for
the policy engine that follows (the identities issue).

Sandbox credentials expire by themselves: their expiry travels on the Principal
and is compared with this clock at every request, so an expired key is refused
(``ExpiredToken``) the moment it expires, whatever the identities document says.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..s3 import sigv4
from ..s3.sigv4 import AuthError, SigningContext
from .model import iso
from .principals import CredentialStore, Principal

UNSIGNED = "UNSIGNED-PAYLOAD"
#: Seconds between re-reads of the identities prompted by an unknown access key.
MISS_REFRESH = 0.2


@dataclass(frozen=True)
class Authenticated:
    principal: Principal
    #: how the body is protected: a hex SHA-256, UNSIGNED-PAYLOAD or a STREAMING-* mode
    payload_hash: str
    signing: SigningContext | None


class Authenticator:
    def __init__(self, credentials: CredentialStore, clock: Callable[[], float] = time.time) -> None:
        self._credentials = credentials
        self._clock = clock
        self._last_miss_refresh = 0.0
        self._miss_lock = threading.Lock()

    def authenticate(self, method: str, raw_path: str, raw_query: str,
                     query: Sequence[tuple[str, str]], headers: Mapping[str, str]) -> Authenticated:
        authorization = headers.get("authorization", "")
        if sigv4.is_presigned(query):
            if authorization:
                raise AuthError("InvalidArgument", "Only one auth mechanism allowed; only the "
                                "X-Amz-Algorithm query parameter or the Authorization header may be "
                                "specified.", 400)
            return self._sigv4(sigv4.parse_presigned(query, headers), method, raw_path, raw_query, headers)
        if authorization.startswith("AWS4-HMAC-SHA256"):
            return self._sigv4(sigv4.parse_authorization(headers), method, raw_path, raw_query, headers)
        if authorization.startswith("Bearer "):
            return self._bearer(authorization[len("Bearer "):].strip())
        if authorization.startswith("AWS "):
            raise AuthError("InvalidRequest", "Signature Version 2 is not supported; sign requests "
                            "with AWS Signature Version 4.", 400)
        if "X-Amz-Credential" in dict(query) or "Signature" in dict(query):
            raise AuthError("AuthorizationQueryParametersError", "Query-string authentication must "
                            "use AWS Signature Version 4 (X-Amz-Algorithm=AWS4-HMAC-SHA256).", 400)
        raise AuthError("AccessDenied", "Anonymous access is not allowed: sign the request with "
                        "an access key.")

    def _lookup(self, access_key: str) -> tuple[Principal, str]:
        found = self._credentials.lookup(access_key)
        if found is None and self._refresh_on_miss():
            found = self._credentials.lookup(access_key)
        if found is None:
            raise AuthError("InvalidAccessKeyId", "The AWS Access Key Id you provided does not "
                            "exist in our records.")
        return found

    def _refresh_on_miss(self) -> bool:
        """An unknown key may be one another gateway has just issued: re-read the identities
        if they changed, at most every MISS_REFRESH seconds, so unknown keys cannot make each
        request a round trip to the store. True when something new was loaded."""
        refresh = getattr(self._credentials, "refresh", None)
        if refresh is None:
            return False
        with self._miss_lock:
            now = time.monotonic()
            if now - self._last_miss_refresh < MISS_REFRESH:
                return False
            self._last_miss_refresh = now
        try:
            return bool(refresh())
        except Exception:  # noqa: BLE001 - the store is down: answer with what we know
            return False

    def _sigv4(self, signed: sigv4.SignedRequest, method: str, raw_path: str, raw_query: str,
               headers: Mapping[str, str]) -> Authenticated:
        principal, secret = self._lookup(signed.access_key)
        context = sigv4.verify(signed, secret, method, raw_path, raw_query, headers, self._clock())
        self._check_usable(principal)
        return Authenticated(principal, signed.payload_hash, context)

    def _bearer(self, token: str) -> Authenticated:
        access_key, sep, secret = token.partition(":")
        if not sep or not access_key or not secret:
            raise AuthError("InvalidRequest", "A bearer token has the form <access_key>:<secret_key>.", 400)
        principal, expected = self._lookup(access_key)
        if not hmac.compare_digest(secret.encode("utf-8", "surrogateescape"), expected.encode()):
            raise AuthError("SignatureDoesNotMatch", "The secret key in the bearer token is not "
                            "the one for this access key.")
        self._check_usable(principal)
        return Authenticated(principal, UNSIGNED, None)

    def _check_usable(self, principal: Principal) -> None:
        """Checked after the signature, so only the key's holder learns why it is refused."""
        _check_unexpired(principal, self._clock())
        _check_enabled(principal)


def _refuse(principal: Principal, code: str, message: str) -> None:
    error = AuthError(code, message)
    error.principal = principal  # the audit record names who was refused
    raise error


def _check_unexpired(principal: Principal, now: float) -> None:
    """Sandbox credentials past their expiry; the message says what to do, and never the secret."""
    if principal.expires_at is not None and now >= principal.expires_at:
        _refuse(principal, "ExpiredToken", f"The access key {principal.access_key} expired at "
                f"{iso(principal.expires_at)}; ask for new sandbox credentials.")


def _check_enabled(principal: Principal) -> None:
    if principal.disabled:
        _refuse(principal, "AccessDenied", f"The principal {principal.name} is disabled; an "
                "administrator can enable it again.")
