"""AWS Signature Version 4 verification for S3: the Authorization header and presigned URLs.

The flow is parse (cheap, no secret needed, tells the caller which access key to look up),
then ``verify`` with the secret.  ``verify`` hands back a ``SigningContext`` that the
aws-chunked decoder needs to check per-chunk signatures.

Canonicalisation follows what S3 does, not the generic SigV4 rules: the path is neither
double-encoded nor dot-normalised, and both path and query are decoded and re-encoded
so that equivalent spellings of one request (``%7E`` vs ``~``) verify alike.  A raw ``+``
in the query string means a space (form encoding, as S3, MinIO and Ceph read it); a ``+``
in the path is a literal plus.  Handlers must read the query the same way the signature
does, so they should use ``parse_query``.

Errors never carry the secret key or the signature we expected.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import quote_from_bytes, unquote_to_bytes

ALGORITHM = "AWS4-HMAC-SHA256"
TERMINATOR = "aws4_request"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
STREAMING_PAYLOAD = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_PAYLOAD_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

MAX_SKEW_SECONDS = 15 * 60
MAX_EXPIRES_SECONDS = 7 * 24 * 3600
MAX_SIGNED_HEADERS_CHARS = 4096

# Values S3 accepts in x-amz-content-sha256 besides a hex digest.  The ECDSA (SigV4a)
# forms are recognised so that they fail as "unsupported", not as "malformed".
_PAYLOAD_KEYWORDS = frozenset({
    UNSIGNED_PAYLOAD, STREAMING_PAYLOAD, STREAMING_PAYLOAD_TRAILER, STREAMING_UNSIGNED_TRAILER,
})
_SIGV4A_PAYLOADS = frozenset({
    "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD", "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD-TRAILER",
})
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_AMZ_DATE = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z")
_SHORT_DATE = re.compile(r"\d{8}")
_SCOPE_PART = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SAFE_PATH = re.compile(rb"[A-Za-z0-9\-._~/]*")
_UNRESERVED = re.compile(rb"[A-Za-z0-9\-._~]*")

_SIGNATURE_MISMATCH = ("The request signature we calculated does not match the signature "
                       "you provided. Check your key and signing method.")
_UNSUPPORTED = ("The authorization mechanism you have provided is not supported. "
                "Please use AWS4-HMAC-SHA256.")
_PRESIGN_PARAMS = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date",
                   "X-Amz-Expires", "X-Amz-SignedHeaders", "X-Amz-Signature")
_PRESIGN_MISSING = ("Query-string authentication version 4 requires the X-Amz-Algorithm, "
                    "X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, "
                    "and X-Amz-Expires parameters.")


class AuthError(Exception):
    """An authentication failure with its S3 error code.

    ``details`` holds extra error-XML fields S3 itself returns (CanonicalRequest,
    StringToSign, SignatureProvided, ...) to help a person debug a client; it never holds
    a secret or the expected signature.
    """

    def __init__(self, code: str, message: str, status: int = 403,
                 details: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.details: dict[str, str] = dict(details or {})


@dataclass(frozen=True)
class SignedRequest:
    """What the client claims, parsed; nothing here has been verified yet."""

    access_key: str
    amz_date: str
    date: str
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str
    payload_hash: str
    presigned: bool
    expires: int | None

    @property
    def scope(self) -> str:
        """The credential scope, e.g. ``20130524/us-east-1/s3/aws4_request``."""
        return f"{self.date}/{self.region}/{self.service}/{TERMINATOR}"


@dataclass(frozen=True)
class SigningContext:
    """What a verified request gives the aws-chunked decoder to check chunk signatures."""

    signing_key: bytes = field(repr=False)  # secret-equivalent: keep it out of logs
    amz_date: str
    scope: str
    seed_signature: str


# --------------------------------------------------------------------------- keys, hmac

@functools.lru_cache(maxsize=4096)
def signing_key(secret_key: str, date: str, region: str, service: str) -> bytes:
    """Derive the per-day signing key; cached because it costs four HMACs per request."""
    key = hmac.digest(("AWS4" + secret_key).encode(), date.encode(), "sha256")
    key = hmac.digest(key, region.encode(), "sha256")
    key = hmac.digest(key, service.encode(), "sha256")
    return hmac.digest(key, TERMINATOR.encode(), "sha256")


def sign(key: bytes, string_to_sign: str) -> str:
    """Hex HMAC-SHA256 of a string to sign."""
    return hmac.digest(key, string_to_sign.encode(), "sha256").hex()


def signatures_match(expected: str, provided: str) -> bool:
    """Constant-time comparison that tolerates junk (non-ASCII) in the provided value."""
    try:
        return hmac.compare_digest(expected.encode("ascii"), provided.encode("ascii"))
    except UnicodeEncodeError:
        return False


# --------------------------------------------------------------------------- canonical form

def _as_bytes(raw: str | bytes) -> bytes:
    """Wire bytes of a path or query.

    A str is taken to be the wire bytes decoded as latin-1 (the ASGI convention), which
    round-trips raw UTF-8 sent unencoded; text outside latin-1 falls back to UTF-8.
    """
    if isinstance(raw, bytes):
        return raw
    try:
        return raw.encode("latin-1")
    except UnicodeEncodeError:
        return raw.encode()


def canonical_uri(raw_path: str | bytes) -> str:
    """S3 canonical URI: decode once, re-encode every byte except unreserved and ``/``.

    Pass the path as it came off the wire: ASGI ``raw_path`` bytes, or a latin-1 str.
    """
    raw = _as_bytes(raw_path) or b"/"
    if _SAFE_PATH.fullmatch(raw):
        return raw.decode("ascii")
    # Segment by segment, so an encoded slash (%2F) stays encoded as the client signed it.
    return "/".join(quote_from_bytes(unquote_to_bytes(seg), safe="") for seg in raw.split(b"/"))


def _query_bytes(component: bytes) -> bytes:
    if b"+" in component:
        component = component.replace(b"+", b" ")
    return unquote_to_bytes(component) if b"%" in component else component


def _split_query(raw_query: str | bytes) -> list[tuple[bytes, bytes]]:
    pairs = []
    for part in _as_bytes(raw_query).split(b"&"):
        if part:
            key, _, value = part.partition(b"=")
            pairs.append((_query_bytes(key), _query_bytes(value)))
    return pairs


def parse_query(raw_query: str | bytes) -> list[tuple[str, str]]:
    """Decode a raw query string exactly as the signature check reads it (``+`` is a space).

    Invalid UTF-8 is kept as surrogate escapes so no two different queries decode alike.
    """
    return [(k.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape"))
            for k, v in _split_query(raw_query)]


def not_utf8(pairs: list[tuple[str, str]]) -> str | None:
    """The name of the first query parameter that is not UTF-8 once percent-decoded (kept
    as surrogate escapes by :func:`parse_query`), or None. Such a value names no key,
    upload or path; it is refused rather than passed on."""
    for name, value in pairs:
        try:
            name.encode("utf-8")
            value.encode("utf-8")
        except UnicodeEncodeError:
            return name.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
    return None


def _canonical_component(raw: bytes) -> str:
    if _UNRESERVED.fullmatch(raw):  # the common case: already canonical
        return raw.decode("ascii")
    return quote_from_bytes(_query_bytes(raw), safe="")


def canonical_query(raw_query: str | bytes, *, exclude: str | None = None) -> str:
    """Canonical query string: decoded pairs, strictly re-encoded, sorted by (key, value)."""
    pairs = []
    for part in _as_bytes(raw_query).split(b"&"):
        if part:
            key, _, value = part.partition(b"=")
            name = _canonical_component(key)
            if name != exclude:
                pairs.append((name, _canonical_component(value)))
    pairs.sort()
    return "&".join(f"{k}={v}" for k, v in pairs)


def _trim(value: str | Sequence[str]) -> str:
    if isinstance(value, str):
        return " ".join(value.split())
    return ",".join(" ".join(v.split()) for v in value)


def canonical_headers(headers: Mapping[str, str | Sequence[str]],
                      signed_headers: Sequence[str]) -> str:
    """``name:value\\n`` per signed header; a missing header signs as empty (and so fails)."""
    return "".join(f"{name}:{_trim(headers.get(name, ''))}\n" for name in signed_headers)


def canonical_request(req: SignedRequest, method: str, raw_path: str | bytes,
                      raw_query: str | bytes, headers: Mapping[str, str | Sequence[str]]) -> str:
    """The SigV4 canonical request for a parsed request."""
    query = canonical_query(raw_query, exclude="X-Amz-Signature" if req.presigned else None)
    return "\n".join((
        method.upper(),
        canonical_uri(raw_path),
        query,
        canonical_headers(headers, req.signed_headers),
        ";".join(req.signed_headers),
        req.payload_hash,
    ))


def string_to_sign(req: SignedRequest, canonical: str) -> str:
    """The SigV4 string to sign for a canonical request."""
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{ALGORITHM}\n{req.amz_date}\n{req.scope}\n{digest}"


# --------------------------------------------------------------------------- parsing

def is_presigned(query: Sequence[tuple[str, str]] | Mapping[str, str]) -> bool:
    """True when the request carries query-string (presigned) authentication."""
    if isinstance(query, Mapping):
        return "X-Amz-Algorithm" in query
    return any(k == "X-Amz-Algorithm" for k, _ in query)


@functools.lru_cache(maxsize=256)
def _epoch(amz_date: str) -> float | None:
    """Seconds since the epoch for a compact ISO 8601 time; cached as requests share them."""
    m = _AMZ_DATE.fullmatch(amz_date)
    if not m:
        return None
    try:
        return datetime(*map(int, m.groups()), tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _request_date(headers: Mapping[str, str]) -> str:
    """x-amz-date, else the Date header converted to the compact ISO 8601 form."""
    amz = headers.get("x-amz-date")
    if amz is not None:
        amz = amz.strip()
        if _epoch(amz) is not None:
            return amz
    elif headers.get("date"):
        try:
            when = parsedate_to_datetime(headers["date"]).astimezone(UTC)
            return when.strftime("%Y%m%dT%H%M%SZ")
        except (TypeError, ValueError, IndexError, OverflowError):
            pass
    raise AuthError("AccessDenied", "AWS authentication requires a valid Date or x-amz-date header")


@functools.lru_cache(maxsize=1024)
def _credential(value: str, error: str, status: int) -> tuple[str, str, str, str]:
    """Split and sanity-check a credential; sizes are capped because results are cached."""
    parts = value.strip().rsplit("/", 4)
    if (len(parts) != 5 or parts[4] != TERMINATOR or not 0 < len(parts[0]) <= 128
            or not _SCOPE_PART.fullmatch(parts[2]) or not _SCOPE_PART.fullmatch(parts[3])):
        raise AuthError(error, "The Credential is mal-formed; expecting "
                        '"<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request".', status)
    if not _SHORT_DATE.fullmatch(parts[1]):
        raise AuthError(error, f"Invalid credential date \"{parts[1]}\". "
                        "This date is not the same as X-Amz-Date.", status)
    return parts[0], parts[1], parts[2], parts[3]


@functools.lru_cache(maxsize=1024)
def _signed_headers(value: str, error: str, status: int) -> tuple[str, ...]:
    if len(value) > MAX_SIGNED_HEADERS_CHARS:
        raise AuthError(error, "SignedHeaders is too long.", status)
    names = tuple(n.strip().lower() for n in value.split(";"))
    if not value.strip() or not all(names):
        raise AuthError(error, "SignedHeaders is empty or malformed.", status)
    if "host" not in names:
        raise AuthError("AccessDenied", "There were headers present in the request which "
                        "were not signed: host")
    return names


def _signature(value: str, error: str, status: int) -> str:
    value = value.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise AuthError(error, "The Signature must be 64 hexadecimal characters.", status)
    return value


def _check_payload_hash(value: str) -> str:
    if value in _PAYLOAD_KEYWORDS:
        return value
    if _HEX64.fullmatch(value):
        return value.lower()
    if value in _SIGV4A_PAYLOADS:
        raise AuthError("NotImplemented", "AWS Signature Version 4A (ECDSA) is not supported; "
                        "use AWS4-HMAC-SHA256.", 501)
    raise AuthError("InvalidArgument", "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, "
                    "STREAMING-UNSIGNED-PAYLOAD-TRAILER, STREAMING-AWS4-HMAC-SHA256-PAYLOAD, "
                    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER or a valid sha256 value.", 400)


def _header_fields(value: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in value.split(","):
        key, sep, val = part.strip().partition("=")
        if sep:
            fields.setdefault(key.strip(), val.strip())
    return fields


def parse_authorization(headers: Mapping[str, str]) -> SignedRequest:
    """Parse ``Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...``.

    ``headers`` maps lowercase names to values.
    """
    malformed = "AuthorizationHeaderMalformed"
    auth = (headers.get("authorization") or "").strip()
    if not auth:
        raise AuthError("AccessDenied", "Access Denied: the request has no Authorization header.")
    algorithm, _, rest = auth.partition(" ")
    if algorithm != ALGORITHM:
        raise AuthError("InvalidRequest", _UNSUPPORTED, 400)
    fields = _header_fields(rest)
    if not {"Credential", "SignedHeaders", "Signature"} <= fields.keys():
        raise AuthError(malformed, "The authorization header is malformed; it requires three "
                        "components: Credential, SignedHeaders, and Signature.", 400)
    access_key, date, region, service = _credential(fields["Credential"], malformed, 400)
    signed = _signed_headers(fields["SignedHeaders"], malformed, 400)
    signature = _signature(fields["Signature"], malformed, 400)
    amz_date = _request_date(headers)
    if amz_date[:8] != date:
        raise AuthError(malformed, f"Invalid credential date \"{date}\". "
                        "This date is not the same as X-Amz-Date.", 400)
    payload = headers.get("x-amz-content-sha256")
    if payload is None:
        if service == "s3":
            raise AuthError("InvalidRequest", "Missing required header for this request: "
                            "x-amz-content-sha256", 400)
        payload = EMPTY_SHA256  # non-S3 services (IAM/STS style) may omit it.
    return SignedRequest(access_key, amz_date, date, region, service, signed, signature,
                         _check_payload_hash(payload.strip()), False, None)


def _query_dict(query: Sequence[tuple[str, str]] | Mapping[str, str]) -> dict[str, str]:
    if isinstance(query, Mapping):
        return dict(query)
    found: dict[str, str] = {}
    for key, value in query:
        found.setdefault(key, value)
    return found


def _expires(value: str) -> int:
    error = "AuthorizationQueryParametersError"
    try:
        expires = int(value.strip())
    except ValueError:
        raise AuthError(error, "X-Amz-Expires should be a number", 400) from None
    if expires <= 0:
        raise AuthError(error, "X-Amz-Expires must be a positive number of seconds", 400)
    if expires > MAX_EXPIRES_SECONDS:
        raise AuthError(error, "X-Amz-Expires must be less than a week (in seconds) that is; "
                        "604800", 400)
    return expires


def _presigned_payload(query: Mapping[str, str], signed: tuple[str, ...],
                       headers: Mapping[str, str] | None) -> str:
    for key, value in query.items():
        if key.lower() == "x-amz-content-sha256":
            return _check_payload_hash(value.strip())
    if headers and "x-amz-content-sha256" in signed and "x-amz-content-sha256" in headers:
        value = _check_payload_hash(headers["x-amz-content-sha256"].strip())
        if value.startswith("STREAMING-"):
            raise AuthError("NotImplemented", "A presigned URL takes the plain body, not aws-chunked "
                            f"({value}); send the bytes as they are.", 501)
        return value  # the body must hash to it, as with a signed header
    return UNSIGNED_PAYLOAD


def parse_presigned(query: Sequence[tuple[str, str]] | Mapping[str, str],
                    headers: Mapping[str, str] | None = None) -> SignedRequest:
    """Parse presigned-URL parameters from decoded query pairs (see ``parse_query``).

    ``headers`` is optional; it is only consulted for a signed x-amz-content-sha256.
    """
    error = "AuthorizationQueryParametersError"
    params = _query_dict(query)
    if params.get("X-Amz-Algorithm") != ALGORITHM:
        if "X-Amz-Algorithm" in params:
            raise AuthError(error, 'X-Amz-Algorithm only supports "AWS4-HMAC-SHA256"', 400)
    if not all(params.get(p) for p in _PRESIGN_PARAMS):
        raise AuthError(error, _PRESIGN_MISSING, 400)
    access_key, date, region, service = _credential(params["X-Amz-Credential"], error, 400)
    signed = _signed_headers(params["X-Amz-SignedHeaders"], error, 400)
    signature = _signature(params["X-Amz-Signature"], error, 400)
    amz_date = params["X-Amz-Date"].strip()
    if _epoch(amz_date) is None:
        raise AuthError(error, "X-Amz-Date must be in the ISO8601 Long Format "
                        '"yyyyMMdd\'T\'HHmmss\'Z\'"', 400)
    if amz_date[:8] != date:
        raise AuthError(error, f"Invalid credential date \"{date}\". "
                        "This date is not the same as X-Amz-Date.", 400)
    expires = _expires(params["X-Amz-Expires"])
    return SignedRequest(access_key, amz_date, date, region, service, signed, signature,
                         _presigned_payload(params, signed, headers), True, expires)


# --------------------------------------------------------------------------- verification

def _check_time(req: SignedRequest, now: float) -> None:
    when = _epoch(req.amz_date)
    if when is None:
        raise AuthError("AccessDenied", "AWS authentication requires a valid Date or "
                        "x-amz-date header")
    if req.presigned:
        if when - now > MAX_SKEW_SECONDS:
            raise AuthError("AccessDenied", "Request is not valid yet")
        if now > when + (req.expires or 0):
            raise AuthError("AccessDenied", "Request has expired",
                            details={"X-Amz-Expires": str(req.expires)})
    elif abs(now - when) > MAX_SKEW_SECONDS:
        server = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
        raise AuthError("RequestTimeTooSkewed", "The difference between the request time and "
                        "the current time is too large.",
                        details={"RequestTime": req.amz_date, "ServerTime": server,
                                 "MaxAllowedSkewMilliseconds": str(MAX_SKEW_SECONDS * 1000)})


def _unsigned_marker(value: object) -> bool:
    """A presigned request may carry ``x-amz-content-sha256: UNSIGNED-PAYLOAD`` unsigned (some
    SDKs add it); any other value must be signed, or a URL signed for one content takes any."""
    return isinstance(value, str) and value.strip() == UNSIGNED_PAYLOAD


def _check_unsigned_amz_headers(req: SignedRequest, headers: Mapping[str, object]) -> None:
    """S3 requires every x-amz-* header to be signed, so a presigned URL cannot be
    repurposed (e.g. turned into a copy with an added x-amz-copy-source)."""
    signed = req.signed_headers
    unsigned = [n for n in headers if n.startswith("x-amz-") and n not in signed
                and not (req.presigned and n == "x-amz-content-sha256" and _unsigned_marker(headers[n]))]
    if unsigned:
        raise AuthError("AccessDenied", "There were headers present in the request which "
                        "were not signed: " + ", ".join(sorted(unsigned)),
                        details={"HeadersNotSigned": ", ".join(sorted(unsigned))})


def verify(req: SignedRequest, secret_key: str, method: str, raw_path: str | bytes,
           raw_query: str | bytes, headers: Mapping[str, str | Sequence[str]],
           now: float) -> SigningContext:
    """Check time window, header coverage and signature; return the chunk-signing context.

    ``raw_path``/``raw_query`` are as sent on the wire (bytes preferred); ``headers`` map
    lowercase names to a value, or to a list of values for a repeated header.
    """
    _check_time(req, now)
    _check_unsigned_amz_headers(req, headers)
    canonical = canonical_request(req, method, raw_path, raw_query, headers)
    to_sign = string_to_sign(req, canonical)
    key = signing_key(secret_key, req.date, req.region, req.service)
    if not signatures_match(sign(key, to_sign), req.signature):
        raise AuthError("SignatureDoesNotMatch", _SIGNATURE_MISMATCH, details={
            "AWSAccessKeyId": req.access_key, "StringToSign": to_sign,
            "SignatureProvided": req.signature, "CanonicalRequest": canonical})
    return SigningContext(key, req.amz_date, req.scope, req.signature)
