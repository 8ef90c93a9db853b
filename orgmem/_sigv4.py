"""AWS Signature Version 4 signing, as the orgmem gateway verifies it (service ``s3``).

Written here with the standard library so the SDK needs nothing of the server: the
canonical forms follow ``gateway/s3/sigv4.py`` rule for rule (S3's rules, not the generic
SigV4 ones): the path is decoded once and every byte but the unreserved ones and ``/`` is
re-encoded, segment by segment, without dot-normalisation; the query is decoded (a raw
``+`` is a space) and strictly re-encoded, sorted by (key, value).  The SDK sends paths and
queries already in that form, so what is signed is what travels.

The secret key only derives the signing key; it never leaves this object and is not in
its repr.  SigV4 rather than a bearer token, so no secret crosses the wire.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from urllib.parse import quote, quote_from_bytes, unquote_to_bytes

ALGORITHM = "AWS4-HMAC-SHA256"
TERMINATOR = "aws4_request"
SERVICE = "s3"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

_SAFE_PATH = re.compile(rb"[A-Za-z0-9\-._~/]*")
_UNRESERVED = re.compile(rb"[A-Za-z0-9\-._~]*")


def payload_hash(body: bytes) -> str:
    """The hex SHA-256 of a request body, as x-amz-content-sha256 carries it."""
    return hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256


# --------------------------------------------------------------------------- wire encoding

def encode_segment(segment: str) -> str:
    """One path segment as sent: everything but unreserved characters percent-encoded.

    ``.`` and ``..`` are encoded too, so no HTTP library folds them away on the way.
    """
    if segment in (".", ".."):
        return segment.replace(".", "%2E")
    return quote(segment, safe="")


def encode_query(params: Mapping[str, object] | None) -> str:
    """A query string from a mapping: ``None`` and ``False`` left out, ``True`` as "true",
    lists joined by commas, every key and value strictly percent-encoded."""
    parts = []
    for key, value in (params or {}).items():
        if value is None or value is False:
            continue
        if value is True:
            text = "true"
        elif isinstance(value, (list, tuple, set, frozenset)):
            text = ",".join(str(v) for v in value)
        else:
            text = str(value)
        parts.append(f"{quote(key, safe='')}={quote(text, safe='')}")
    return "&".join(parts)


# --------------------------------------------------------------------------- canonical form

def canonical_uri(raw_path: str) -> str:
    """S3's canonical URI of a wire path: decoded once, strictly re-encoded, ``/`` kept."""
    raw = raw_path.encode("utf-8") or b"/"
    if _SAFE_PATH.fullmatch(raw):
        return raw.decode("ascii")
    return "/".join(quote_from_bytes(unquote_to_bytes(seg), safe="") for seg in raw.split(b"/"))


def _component(raw: bytes) -> str:
    if _UNRESERVED.fullmatch(raw):
        return raw.decode("ascii")
    if b"+" in raw:
        raw = raw.replace(b"+", b" ")
    return quote_from_bytes(unquote_to_bytes(raw), safe="")


def canonical_query(raw_query: str) -> str:
    """The canonical query string: decoded pairs, strictly re-encoded, sorted."""
    pairs = []
    for part in raw_query.encode("utf-8").split(b"&"):
        if part:
            key, _, value = part.partition(b"=")
            pairs.append((_component(key), _component(value)))
    pairs.sort()
    return "&".join(f"{k}={v}" for k, v in pairs)


def _trim(value: str) -> str:
    return " ".join(value.split())


# --------------------------------------------------------------------------- the signer

class Signer:
    """Signs requests for one access key; keeps the secret to itself."""

    __slots__ = ("access_key", "region", "service", "_secret", "_keys")

    def __init__(self, access_key: str, secret_key: str, region: str = "us-east-1",
                 service: str = SERVICE) -> None:
        self.access_key = access_key
        self.region = region
        self.service = service
        self._secret = secret_key
        self._keys: dict[str, bytes] = {}

    def __repr__(self) -> str:
        return f"Signer(access_key={self.access_key!r}, region={self.region!r})"

    def scrub(self, text: str) -> str:
        """``text`` with the secret key replaced, for any message that might reach a person."""
        return text.replace(self._secret, "[redacted]") if self._secret else text

    def _signing_key(self, date: str) -> bytes:
        key = self._keys.get(date)
        if key is None:
            key = hmac.digest(("AWS4" + self._secret).encode(), date.encode(), "sha256")
            for part in (self.region, self.service, TERMINATOR):
                key = hmac.digest(key, part.encode(), "sha256")
            self._keys = {date: key}  # one day's key; a new day replaces it
        return key

    def sign(self, method: str, host: str, raw_path: str, raw_query: str = "",
             headers: Mapping[str, str] | None = None, body_hash: str = EMPTY_SHA256,
             now: float | None = None) -> dict[str, str]:
        """The request's headers, signed: ``host``, ``x-amz-date``, ``x-amz-content-sha256``,
        ``authorization`` and every header given (all of them signed, lowercase names)."""
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
        out = {k.lower(): str(v) for k, v in (headers or {}).items()}
        out.update({"host": host, "x-amz-date": amz_date, "x-amz-content-sha256": body_hash})
        signed = sorted(out)
        canonical = "\n".join((
            method.upper(), canonical_uri(raw_path), canonical_query(raw_query),
            "".join(f"{name}:{_trim(out[name])}\n" for name in signed),
            ";".join(signed), body_hash))
        scope = f"{amz_date[:8]}/{self.region}/{self.service}/{TERMINATOR}"
        to_sign = "\n".join((ALGORITHM, amz_date, scope,
                             hashlib.sha256(canonical.encode("utf-8")).hexdigest()))
        signature = hmac.digest(self._signing_key(amz_date[:8]), to_sign.encode(), "sha256").hex()
        out["authorization"] = (f"{ALGORITHM} Credential={self.access_key}/{scope}, "
                                f"SignedHeaders={';'.join(signed)}, Signature={signature}")
        return out
