"""The transport-neutral half of every call: what to send, how to sign it, how to read the answer.

Operations (``_api``, ``_files``, ``_events``) are generators that *yield* :class:`Request`
(or :class:`Sleep`) values and receive :class:`Response` values back, raising or catching
:class:`~orgmem.errors.OrgmemError` like ordinary code.  The sync and async clients each
drive them with their own httpx client, so every method is written once and the two
clients cannot drift apart.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from . import _sigv4
from .errors import OrgmemError, Unavailable, from_response

T = TypeVar("T")


@dataclass(frozen=True)
class Request:
    """One call: ``path`` is the wire path (already encoded), ``query`` a mapping to encode."""

    method: str
    path: str
    query: Mapping[str, Any] | None = None
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Sleep:
    """Wait before the next request (a retry's backoff)."""

    seconds: float


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]  # lowercase names
    body: bytes

    def json(self) -> Any:
        if not self.body.strip():
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            raise OrgmemError(self.status, "InvalidResponse",
                              f"the gateway answered HTTP {self.status} with something that is not JSON") \
                from None

    @property
    def etag(self) -> str | None:
        value = self.headers.get("etag")
        return value.strip().removeprefix("W/").strip('"') if value else None


#: What an operation is: a generator of requests (and sleeps) that returns its result.
Op = Generator["Request | Sleep", Any, T]


def json_body(payload: Any) -> tuple[bytes, dict[str, str]]:
    return json.dumps(payload, ensure_ascii=False).encode("utf-8"), {"content-type": "application/json"}


# --------------------------------------------------------------------------- configuration

def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value.strip() if value and value.strip() else None


class Transport:
    """Endpoint, keys and TLS settings; turns a Request into a signed (url, headers, body)
    and an answer into a Response or the right exception."""

    def __init__(self, endpoint: str | None, access_key: str | None, secret_key: str | None,
                 region: str, timeout: float, ca_bundle: str | None) -> None:
        endpoint = endpoint or _env("ORGMEM_ENDPOINT")
        if not endpoint:
            raise OrgmemError(0, "NoEndpoint", "no gateway endpoint: pass endpoint= or set ORGMEM_ENDPOINT "
                              "(for example http://127.0.0.1:9000)")
        if bool(access_key) != bool(secret_key):
            raise OrgmemError(0, "NoCredentials", "access_key and secret_key must be given together")
        access_key = access_key or _env("ORGMEM_ACCESS_KEY")
        secret_key = secret_key or _env("ORGMEM_SECRET_KEY")
        if not access_key or not secret_key:
            missing = " and ".join(n for n, v in (("ORGMEM_ACCESS_KEY", access_key),
                                                  ("ORGMEM_SECRET_KEY", secret_key)) if not v)
            raise OrgmemError(0, "NoCredentials", f"no credentials: pass access_key= and secret_key= "
                              f"or set {missing}")
        parts = urlsplit(endpoint.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OrgmemError(0, "InvalidEndpoint",
                              f"the endpoint must be an http:// or https:// URL, not {endpoint!r}")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise OrgmemError(0, "InvalidEndpoint", "the endpoint is a plain URL: no user, password, "
                              "query or fragment (keys go in ORGMEM_ACCESS_KEY / ORGMEM_SECRET_KEY)")
        try:
            parts.port  # noqa: B018 - validates the port
        except ValueError:
            raise OrgmemError(0, "InvalidEndpoint",
                              f"the endpoint has an invalid port: {endpoint!r}") from None
        self.host = parts.netloc
        self.base_url = f"{parts.scheme}://{parts.netloc}"
        self.base_path = parts.path.rstrip("/")
        self.endpoint = self.base_url + self.base_path
        self.signer = _sigv4.Signer(access_key, secret_key, region)
        self.timeout = timeout
        self.ca_bundle = ca_bundle or _env("ORGMEM_CA_BUNDLE")

    @property
    def access_key(self) -> str:
        return self.signer.access_key

    def verify(self) -> Any:
        """httpx's ``verify``: the CA bundle when one is set, else the system's."""
        if not self.ca_bundle:
            return True
        import ssl

        try:
            return ssl.create_default_context(cafile=self.ca_bundle)
        except (OSError, ssl.SSLError) as exc:
            raise OrgmemError(0, "InvalidCABundle", f"cannot use the CA bundle {self.ca_bundle}: {exc}") \
                from None

    def prepare(self, req: Request) -> tuple[str, dict[str, str], bytes]:
        path = self.base_path + req.path
        query = _sigv4.encode_query(req.query)
        headers = self.signer.sign(req.method, self.host, path, query, req.headers,
                                   _sigv4.payload_hash(req.body))
        return self.base_url + path + (f"?{query}" if query else ""), headers, req.body

    def answer(self, status: int, headers: Mapping[str, str], body: bytes) -> Response:
        headers = {k.lower(): v for k, v in headers.items()}
        if status >= 400:
            raise from_response(status, headers, body, self.signer.scrub)
        return Response(status, headers, body)

    def unreachable(self, exc: Exception) -> Unavailable:
        """A transport failure (httpx's exceptions) as Unavailable, with a readable cause."""
        kind = type(exc).__name__
        code = "Timeout" if "Timeout" in kind else "ConnectionError"
        detail = self.signer.scrub(str(exc)) or kind
        return Unavailable(0, code, f"cannot reach the gateway at {self.endpoint}: {detail}")


def drive(op: Op[T], send) -> T:
    """Run an operation synchronously: ``send(request)`` returns a Response or raises."""
    import time

    try:
        step = next(op)
        while True:
            try:
                if isinstance(step, Sleep):
                    time.sleep(step.seconds)
                    result = None
                else:
                    result = send(step)
            except OrgmemError as exc:
                step = op.throw(exc)
            else:
                step = op.send(result)
    except StopIteration as stop:
        return stop.value


async def adrive(op: Op[T], send) -> T:
    """Run an operation on an event loop: ``await send(request)`` returns a Response or raises."""
    import asyncio

    try:
        step = next(op)
        while True:
            try:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                    result = None
                else:
                    result = await send(step)
            except OrgmemError as exc:
                step = op.throw(exc)
            else:
                step = op.send(result)
    except StopIteration as stop:
        return stop.value
