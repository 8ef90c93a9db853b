"""A small client for the gateway's admin REST API (/admin/v1), over the standard library.

Every request is signed with AWS Signature Version 4 (service ``s3``) using the very
helpers the gateway verifies with (``gateway.s3.sigv4``), so signer and verifier cannot
drift apart.  The secret key is only ever used to derive the signing key: it is never sent,
and it appears in no exception text and no repr.

    client = from_env()                       # ORGMEM_ENDPOINT, ORGMEM_ACCESS_KEY, ...
    creds = client.create_agent("scout", teams=["research"])
    client.attach_policy("readonly", agent="scout")
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import ssl
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

from .s3 import sigv4

DEFAULT_ENDPOINT = "http://127.0.0.1:9000"
DEFAULT_REGION = "us-east-1"
API_PREFIX = "/admin/v1"
SERVICE = "s3"

JSON = dict[str, Any]


class AdminError(Exception):
    """A failed admin call: the HTTP status (0 when no response came), an error code and a message.

    The code and message come from the gateway's JSON error body when there is one.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"AdminError(status={self.status!r}, code={self.code!r}, message={self.message!r})"


def _env(name: str, env: Mapping[str, str]) -> str | None:
    value = env.get(name)
    return value if value else None


def from_env(endpoint: str | None = None, access_key: str | None = None, secret_key: str | None = None,
             *, ca_file: str | None = None, region: str | None = None, timeout: float = 30,
             env: Mapping[str, str] | None = None) -> AdminClient:
    """An AdminClient configured from arguments, falling back to the environment.

    endpoint: ``endpoint`` > ORGMEM_ENDPOINT > http://127.0.0.1:9000.
    keys: the arguments > ORGMEM_ACCESS_KEY/ORGMEM_SECRET_KEY > ORGMEM_ROOT_ACCESS_KEY/
    ORGMEM_ROOT_SECRET_KEY; a pair is never mixed from two sources.
    ca_file: ``ca_file`` > ORGMEM_CA_BUNDLE.  region: ``region`` > ORGMEM_REGION > us-east-1.
    Raises AdminError (status 0, code ``NoCredentials``) when no complete key pair is set.
    """
    env = os.environ if env is None else env
    endpoint = endpoint or _env("ORGMEM_ENDPOINT", env) or DEFAULT_ENDPOINT
    if access_key or secret_key:
        if not (access_key and secret_key):
            raise AdminError(0, "NoCredentials", "an access key and a secret key must be given together")
    else:
        for access_name, secret_name in (("ORGMEM_ACCESS_KEY", "ORGMEM_SECRET_KEY"),
                                         ("ORGMEM_ROOT_ACCESS_KEY", "ORGMEM_ROOT_SECRET_KEY")):
            access_key, secret_key = _env(access_name, env), _env(secret_name, env)
            if access_key or secret_key:
                if not (access_key and secret_key):
                    missing = secret_name if access_key else access_name
                    raise AdminError(0, "NoCredentials", f"{missing} is not set "
                                     f"({access_name} and {secret_name} go together)")
                break
        else:
            raise AdminError(0, "NoCredentials", "no credentials: set ORGMEM_ACCESS_KEY and "
                             "ORGMEM_SECRET_KEY (or ORGMEM_ROOT_ACCESS_KEY and ORGMEM_ROOT_SECRET_KEY)")
    return AdminClient(endpoint, access_key, secret_key,
                       region=region or _env("ORGMEM_REGION", env) or DEFAULT_REGION,
                       timeout=timeout, ca_file=ca_file or _env("ORGMEM_CA_BUNDLE", env))


def _segment(value: str) -> str:
    """One percent-encoded path segment; dot segments are encoded so no proxy folds them."""
    if not isinstance(value, str) or not value:
        raise AdminError(0, "InvalidRequest", "names in the request path must not be empty")
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe="")


def _query_string(query: Mapping[str, str | int | bool | None] | None) -> str:
    if not query:
        return ""
    parts = []
    for key, value in query.items():
        if value is None or value is False:
            continue
        text = "true" if value is True else str(value)
        parts.append(f"{quote(key, safe='')}={quote(text, safe='')}")
    return "&".join(parts)


def _policy_object(document: bytes | str | Mapping[str, Any]) -> Any:
    """An inline policy as JSON to embed in a request body; text that is not JSON is refused
    here, since it cannot travel inside the body (the gateway checks everything else)."""
    if isinstance(document, Mapping):
        return dict(document)
    try:
        return json.loads(document)
    except ValueError as exc:
        raise AdminError(0, "MalformedPolicyDocument", f"the policy is not valid JSON: {exc}") from None


class AdminClient:
    """Typed calls to /admin/v1, one method per route, returning the parsed JSON."""

    def __init__(self, endpoint: str, access_key: str, secret_key: str, region: str = DEFAULT_REGION,
                 timeout: float = 30, ca_file: str | None = None) -> None:
        parts = urlsplit(endpoint.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AdminError(0, "InvalidEndpoint",
                             f"the endpoint must be an http:// or https:// URL, not {endpoint!r}")
        if parts.username or parts.password:
            raise AdminError(0, "InvalidEndpoint", "the endpoint must not carry credentials; "
                             "use ORGMEM_ACCESS_KEY and ORGMEM_SECRET_KEY")
        if parts.query or parts.fragment:
            raise AdminError(0, "InvalidEndpoint", "the endpoint must not have a query or fragment")
        try:
            parts.port  # noqa: B018 - validates the port
        except ValueError:
            raise AdminError(0, "InvalidEndpoint",
                             f"the endpoint has an invalid port: {endpoint!r}") from None
        self.endpoint = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self._scheme = parts.scheme
        self._netloc = parts.netloc
        self._base_path = parts.path.rstrip("/")
        self.access_key = access_key
        self.__secret = secret_key
        self.region = region
        self.timeout = timeout
        self.ca_file = ca_file
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            try:
                self._ssl = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise AdminError(0, "InvalidCABundle",
                                 f"cannot use the CA bundle {ca_file}: {exc}") from None

    def __repr__(self) -> str:
        return (f"AdminClient(endpoint={self.endpoint!r}, access_key={self.access_key!r}, "
                f"region={self.region!r})")

    # ------------------------------------------------------------------ signing and transport

    def sign(self, method: str, path: str, query: str = "", body: bytes = b"",
             headers: Mapping[str, str] | None = None, now: float | None = None) -> dict[str, str]:
        """The headers of a SigV4-signed request (lowercase names), ``host`` included.

        ``path`` and ``query`` are the exact (already percent-encoded) strings sent on the wire.
        """
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
        payload_hash = hashlib.sha256(body).hexdigest()
        out = {k.lower(): v for k, v in (headers or {}).items()}
        out.update({"host": self._netloc, "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash})
        signed = tuple(sorted(out))
        req = sigv4.SignedRequest(self.access_key, amz_date, amz_date[:8], self.region, SERVICE, signed,
                                  "", payload_hash, False, None)
        canonical = sigv4.canonical_request(req, method, path, query, out)
        key = sigv4.signing_key(self.__secret, req.date, req.region, req.service)
        signature = sigv4.sign(key, sigv4.string_to_sign(req, canonical))
        out["authorization"] = (f"{sigv4.ALGORITHM} Credential={self.access_key}/{req.scope}, "
                                f"SignedHeaders={';'.join(signed)}, Signature={signature}")
        return out

    def _connection(self) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._netloc, timeout=self.timeout, context=self._ssl)
        return http.client.HTTPConnection(self._netloc, timeout=self.timeout)

    def _scrub(self, text: str) -> str:
        return text.replace(self.__secret, "[redacted]") if self.__secret else text

    def _request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                 body: bytes = b"", content_type: str | None = None) -> tuple[int, dict[str, str], bytes]:
        """Send one signed request; ``path`` is already encoded.  Raises AdminError on >= 400."""
        path = self._base_path + path
        raw_query = _query_string(query)
        headers = self.sign(method, path, raw_query, body,
                            {"content-type": content_type} if content_type else None)
        url = path + (f"?{raw_query}" if raw_query else "")
        conn = self._connection()
        try:
            conn.request(method, url, body=body if body or method in ("POST", "PUT") else None,
                         headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            status = resp.status
            resp_headers = {k.lower(): v for k, v in resp.getheaders()}
        except ssl.SSLError as exc:
            hint = "" if self.ca_file else " (for a private CA, set ORGMEM_CA_BUNDLE or --ca-bundle)"
            raise AdminError(0, "TLSError", self._scrub(
                f"cannot reach the gateway at {self.endpoint}: {exc}{hint}")) from None
        except TimeoutError:
            raise AdminError(0, "Timeout", f"cannot reach the gateway at {self.endpoint}: no answer "
                             f"within {self.timeout:g} seconds") from None
        except (OSError, http.client.HTTPException) as exc:
            raise AdminError(0, "ConnectionError", self._scrub(
                f"cannot reach the gateway at {self.endpoint}: {exc}")) from None
        finally:
            conn.close()
        if status >= 400:
            raise self._error(status, resp_headers, data)
        return status, resp_headers, data

    def _error(self, status: int, headers: Mapping[str, str], data: bytes) -> AdminError:
        code, message = None, None
        try:
            err = json.loads(data)["error"]
            code, message = str(err["code"]), str(err.get("message") or "")
        except (ValueError, KeyError, TypeError):
            try:  # an S3 XML error, e.g. from a gateway without the admin API
                root = ET.fromstring(data)
                code, message = root.findtext("Code"), root.findtext("Message") or ""
            except ET.ParseError:
                pass
        if not code:
            reason = http.client.responses.get(status, "Error")
            text = data.decode("utf-8", "replace").strip()
            code = re.sub(r"[^A-Za-z]", "", reason) or "Error"
            message = f"HTTP {status} {reason}" + (f": {text[:200]}" if text else "")
        return AdminError(status, code, self._scrub(message or ""))

    def _call(self, method: str, *segments: str, query: Mapping[str, Any] | None = None,
              payload: Any = None, raw: bytes | None = None) -> Any:
        path = API_PREFIX + "".join("/" + _segment(s) for s in segments)
        body, content_type = b"", None
        if raw is not None:
            body, content_type = raw, "application/json"
        elif payload is not None:
            body, content_type = json.dumps(payload).encode(), "application/json"
        status, _, data = self._request(method, path, query=query, body=body, content_type=content_type)
        if status == 204 or not data.strip():
            return None
        try:
            return json.loads(data)
        except ValueError:
            raise AdminError(status, "InvalidResponse", f"the gateway answered {method} {path} with "
                             f"something that is not JSON (HTTP {status})") from None

    # ------------------------------------------------------------------ identity

    def whoami(self) -> JSON:
        """``{"name", "kind", "teams", "policies", "is_root"}`` of the caller."""
        return self._call("GET", "whoami")

    # ------------------------------------------------------------------ agents

    def create_agent(self, name: str, *, kind: str = "agent", teams: Sequence[str] = (),
                     policies: Sequence[str] | None = None) -> JSON:
        """Create an agent; returns Credentials (name, access_key, secret_key) and ``agent``.

        ``policies=None`` lets the gateway attach its default (agent-default).
        """
        payload: JSON = {"name": name, "kind": kind, "teams": list(teams)}
        if policies is not None:
            payload["policies"] = list(policies)
        return self._call("POST", "agents", payload=payload)

    def list_agents(self) -> list[JSON]:
        return self._call("GET", "agents")["agents"]

    def get_agent(self, name: str) -> JSON:
        return self._call("GET", "agents", name)

    def disable_agent(self, name: str) -> JSON:
        return self._call("POST", "agents", name, "disable")

    def enable_agent(self, name: str) -> JSON:
        return self._call("POST", "agents", name, "enable")

    def delete_agent(self, name: str) -> None:
        self._call("DELETE", "agents", name)

    # ------------------------------------------------------------------ keys

    def create_key(self, name: str) -> JSON:
        """A new access key for agent ``name``; returns Credentials (the secret is shown once)."""
        return self._call("POST", "agents", name, "keys")

    def rotate_key(self, name: str, access_key: str | None = None, grace_seconds: int = 0) -> JSON:
        """Replace a key; Credentials + ``replaced`` + ``old_key_expires_at``.

        The old key keeps working for ``grace_seconds`` (0: revoked now).
        """
        payload: JSON = {"grace_seconds": int(grace_seconds)}
        if access_key:
            payload["access_key"] = access_key
        return self._call("POST", "agents", name, "keys", "rotate", payload=payload)

    def revoke_key(self, access_key: str) -> None:
        """Revoke a key now: a lasting one or sandbox credentials."""
        self._call("DELETE", "keys", access_key)

    def sandbox_credentials(self, agent: str, ttl_seconds: int, *, policy: str | None = None,
                            policy_document: bytes | str | Mapping[str, Any] | None = None) -> JSON:
        """Temporary keys of ``agent`` that expire after ``ttl_seconds`` (1 second to 7 days).

        They may do what the agent may do, narrowed by the named ``policy`` or an inline
        ``policy_document`` if given.  Returns ``{"agent", "access_key", "secret_key",
        "expires", "expires_at", "policy", "inline_policy"}``; the secret is shown once.
        """
        payload: JSON = {"ttl_seconds": ttl_seconds, "policy": policy}
        if policy_document is not None:
            payload["policy_document"] = _policy_object(policy_document)
        return self._call("POST", "agents", agent, "sandbox-credentials", payload=payload)

    # ------------------------------------------------------------------ teams

    def create_team(self, name: str, policies: Sequence[str] = ()) -> JSON:
        return self._call("POST", "teams", payload={"name": name, "policies": list(policies)})

    def list_teams(self) -> list[JSON]:
        return self._call("GET", "teams")["teams"]

    def get_team(self, name: str) -> JSON:
        return self._call("GET", "teams", name)

    def delete_team(self, name: str) -> None:
        self._call("DELETE", "teams", name)

    def add_member(self, team: str, agent: str) -> JSON:
        return self._call("PUT", "teams", team, "members", agent)

    def remove_member(self, team: str, agent: str) -> JSON:
        return self._call("DELETE", "teams", team, "members", agent)

    # ------------------------------------------------------------------ policies

    def put_policy(self, name: str, document: bytes | str | Mapping[str, Any]) -> JSON:
        """Create or replace a policy.  Bytes and text are sent as they are: the gateway validates."""
        if isinstance(document, Mapping):
            raw = json.dumps(document).encode()
        elif isinstance(document, str):
            raw = document.encode()
        else:
            raw = bytes(document)
        return self._call("PUT", "policies", name, raw=raw)

    def list_policies(self) -> list[JSON]:
        return self._call("GET", "policies")["policies"]

    def get_policy(self, name: str) -> JSON:
        return self._call("GET", "policies", name)

    def delete_policy(self, name: str) -> None:
        self._call("DELETE", "policies", name)

    @staticmethod
    def _target(agent: str | None, team: str | None) -> JSON:
        if bool(agent) == bool(team):
            raise AdminError(0, "InvalidRequest", "name exactly one of agent or team")
        return {"agent": agent} if agent else {"team": team}

    def attach_policy(self, name: str, *, agent: str | None = None, team: str | None = None) -> JSON:
        return self._call("POST", "policies", name, "attach", payload=self._target(agent, team))

    def detach_policy(self, name: str, *, agent: str | None = None, team: str | None = None) -> JSON:
        return self._call("POST", "policies", name, "detach", payload=self._target(agent, team))

    def simulate(self, principal: str, action: str, resource: str,
                 context: Mapping[str, str] | None = None) -> JSON:
        """Would ``principal`` be allowed ``action`` on ``resource``?  See the deciding statement."""
        payload: JSON = {"principal": principal, "action": action, "resource": resource}
        if context:
            payload["context"] = dict(context)
        return self._call("POST", "policies", "simulate", payload=payload)

    # ------------------------------------------------------------------ audit

    def audit_retention(self) -> JSON:
        """``{"days": N or None}``: how long audit records are kept (None: forever)."""
        return self._call("GET", "audit", "retention")

    def set_audit_retention(self, days: int | None) -> JSON:
        return self._call("PUT", "audit", "retention", payload={"days": days})

    def audit(self, *, since: str | None = None, principal: str | None = None, denied: bool = False,
              limit: int | None = None, after: str | None = None) -> JSON:
        """``{"records": [...], "cursor": str}``, oldest first; pass ``cursor`` back as ``after``
        (with the same ``principal`` and ``denied``) for only the records not returned yet."""
        return self._call("GET", "audit", query={"since": since, "principal": principal,
                                                 "denied": denied or None, "limit": limit,
                                                 "after": after})


class ServiceClient:
    """The base of the typed clients of one API (biographies, memory, skills, the vault): they
    sign and send with an :class:`AdminClient`, built from an endpoint and keys, or shared with
    :meth:`over` (the CLI builds one AdminClient from its options and hands it around)."""

    #: seconds a call may wait for its answer, unless the caller says otherwise
    default_timeout: float = 30

    def __init__(self, endpoint: str, access_key: str, secret_key: str, region: str = DEFAULT_REGION,
                 timeout: float | None = None, ca_file: str | None = None) -> None:
        self._transport = AdminClient(endpoint, access_key, secret_key, region=region,
                                      timeout=self.default_timeout if timeout is None else timeout,
                                      ca_file=ca_file)

    @classmethod
    def over(cls, transport: AdminClient):
        """A client sharing ``transport``'s endpoint, keys and TLS settings."""
        client = cls.__new__(cls)
        client._transport = transport
        return client
