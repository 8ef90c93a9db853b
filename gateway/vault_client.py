"""A small client for the vault secrets API (``/v1/vault``), on AdminClient's transport.

    vault = VaultClient(endpoint, access_key, secret_key)
    vault.put("agents/scout/openai", "sk-...", metadata={"owner": "research"})   # {"path", "version", ...}
    vault.put("agents/scout/openai", "sk-...", cas=3)       # 412 CasMismatch unless version 3 is current
    answer = vault.get("agents/scout/openai")
    text = secret_value(answer)                             # str, or bytes for a base64 value
    vault.list("agents/scout")                              # {"prefix", "secrets": [...], "folders": [...]}

Requests are SigV4-signed like every other client here, so the caller's secret key never
travels. Secret values are only ever in request bodies and in the dicts returned by ``get``:
they are scrubbed from any error this client raises, whatever the gateway answers.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from .admin_client import AdminError, ServiceClient

PREFIX = "/v1/vault"
#: The largest value the gateway accepts (bytes; UTF-8 bytes of a text value).
MAX_VALUE_BYTES = 65536
#: Values shorter than this are not scrubbed from error messages: replacing every "a" in a
#: message would only garble it, and the gateway never echoes a value anyway.
_SCRUB_MIN = 4


def encode_path(path: str) -> str:
    """``path`` with each segment percent-encoded and "/" kept, as the contract asks.

    An empty path or an empty segment is refused here: ``GET /v1/vault/secrets/`` (or a path
    ending in "/") is the *list* route, so a stray slash must never turn a read into a listing.
    The remaining rules (characters, lengths) are the gateway's to enforce.
    """
    if not isinstance(path, str) or not path:
        raise AdminError(0, "InvalidPath", "a secret path must not be empty")
    segments = path.split("/")
    if any(not s for s in segments):
        raise AdminError(0, "InvalidPath", f"{path!r} has an empty segment (a leading, trailing "
                         "or doubled '/')")
    return "/".join(_segment(s) for s in segments)


def _segment(segment: str) -> str:
    """One encoded segment; "." and ".." are encoded so no HTTP layer folds them away and the
    gateway, not a proxy, answers InvalidPath."""
    if segment in (".", ".."):
        return segment.replace(".", "%2E")
    return quote(segment, safe="")


def secret_value(answer: Mapping[str, Any]) -> str | bytes:
    """The value of a ``get`` answer: ``str`` for encoding "text", ``bytes`` for "base64"
    (the gateway uses base64 only for bytes that are not valid UTF-8)."""
    if answer.get("encoding") == "base64":
        try:
            return base64.b64decode(answer["value"], validate=True)
        except (binascii.Error, TypeError, KeyError):
            raise AdminError(0, "InvalidResponse", f"the gateway sent a value of {answer.get('path')} "
                             "that is not valid base64") from None
    value = answer.get("value")
    if not isinstance(value, str):
        raise AdminError(0, "InvalidResponse", f"the gateway sent no text value for {answer.get('path')}")
    return value


def _versions(versions: Iterable[int]) -> list[int]:
    out = [int(v) for v in versions]
    if not out:
        raise AdminError(0, "InvalidRequest", "name at least one version")
    return out


class VaultClient(ServiceClient):
    """Typed calls to /v1/vault, one method per route, returning the parsed JSON."""

    def __repr__(self) -> str:
        return f"VaultClient({self._transport!r})"

    # ------------------------------------------------------------------ transport

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                payload: Any = None) -> tuple[int, bytes]:
        """One signed request through the transport (its TLS, timeout and error handling);
        AdminError on >= 400. ``path`` is under /v1/vault, already encoded."""
        body = json.dumps(payload).encode() if payload is not None else b""
        status, _, data = self._transport._request(
            method, PREFIX + path, query=query, body=body,
            content_type="application/json" if body else None)
        return status, data

    def _json(self, method: str, path: str, **kwargs) -> Any:
        status, data = self.request(method, path, **kwargs)
        if status == 204 or not data.strip():
            return None
        try:
            return json.loads(data)
        except ValueError:
            raise AdminError(status, "InvalidResponse", f"the gateway answered {method} {PREFIX}{path} "
                             f"with something that is not JSON (HTTP {status})") from None

    # ------------------------------------------------------------------ values

    def put(self, path: str, value: str | bytes, metadata: Mapping[str, str] | None = None,
            cas: int | None = None) -> dict:
        """Write a new version: ``str`` is sent as text, ``bytes`` as base64. The gateway stores
        bytes either way, and answers a read as text whenever they are valid UTF-8.

        ``metadata`` replaces the path's custom metadata when given; ``cas=0`` creates only,
        ``cas=N`` writes only while version N is current. Returns path, version, created_*.
        """
        if isinstance(value, str):
            payload: dict[str, Any] = {"value": value}
        elif isinstance(value, (bytes, bytearray, memoryview)):
            payload = {"value_base64": base64.b64encode(bytes(value)).decode("ascii")}
        else:
            raise AdminError(0, "InvalidRequest",
                             f"a secret value is str or bytes, not {type(value).__name__}")
        if metadata is not None:
            payload["metadata"] = dict(metadata)
        try:
            return self._json("PUT", "/secrets/" + encode_path(path),
                              query={"cas": None if cas is None else int(cas)}, payload=payload)
        except AdminError as exc:
            raise _scrubbed(exc, value, payload.get("value_base64")) from None

    def get(self, path: str, version: int | None = None) -> dict:
        """The latest (or the given) version: path, version, encoding, value, metadata, created_*.

        404 NoSuchSecret for a missing or soft-deleted version, 410 SecretDestroyed.
        """
        return self._json("GET", "/secrets/" + encode_path(path),
                          query={"version": None if version is None else int(version)})

    def value(self, path: str, version: int | None = None) -> str | bytes:
        """Just the value: ``str`` for a text secret, ``bytes`` for a binary one."""
        return secret_value(self.get(path, version))

    # ------------------------------------------------------------------ versions

    def delete(self, path: str, versions: Iterable[int] | None = None) -> None:
        """Soft-delete the latest version (or the listed ones); ``undelete`` brings them back."""
        listed = None if versions is None else ",".join(str(v) for v in _versions(versions))
        self._json("DELETE", "/secrets/" + encode_path(path), query={"versions": listed})

    def undelete(self, path: str, versions: Iterable[int]) -> dict:
        """Restore soft-deleted versions; returns the path's metadata."""
        return self._json("POST", "/undelete/" + encode_path(path),
                          payload={"versions": _versions(versions)})

    def destroy(self, path: str, versions: Iterable[int]) -> dict:
        """Destroy versions for good (they can never be read again); returns the metadata."""
        return self._json("POST", "/destroy/" + encode_path(path),
                          payload={"versions": _versions(versions)})

    # ------------------------------------------------------------------ metadata

    def metadata(self, path: str) -> dict:
        """current_version, max_versions, times, custom metadata and the kept versions (oldest first)."""
        return self._json("GET", "/metadata/" + encode_path(path))

    def set_metadata(self, path: str, max_versions: int | None = None,
                     metadata: Mapping[str, str] | None = None) -> dict:
        """Change how many versions are kept and/or replace the custom metadata."""
        payload: dict[str, Any] = {}
        if max_versions is not None:
            payload["max_versions"] = int(max_versions)
        if metadata is not None:
            payload["metadata"] = dict(metadata)
        if not payload:
            raise AdminError(0, "InvalidRequest", "give max_versions, metadata or both")
        return self._json("PUT", "/metadata/" + encode_path(path), payload=payload)

    def destroy_all(self, path: str) -> None:
        """Destroy every version and forget the path."""
        self._json("DELETE", "/metadata/" + encode_path(path))

    def list(self, prefix: str = "", recursive: bool = False) -> dict:
        """``{"prefix", "secrets", "folders"}`` below ``prefix`` (never values).

        ``recursive`` lists every secret below the prefix and no folders. A trailing "/" on
        ``prefix`` is optional: the list route always takes one. When the gateway answers in
        pages (a ``next`` marker, passed back as ``after``), every page is fetched.
        """
        prefix = prefix.rstrip("/")
        path = "/secrets/" + (encode_path(prefix) + "/" if prefix else "")
        answer = self._json("GET", path, query={"recursive": recursive or None})
        while answer.get("next"):  # a long listing comes in pages: follow them to the end
            page = self._json("GET", path, query={"recursive": recursive or None, "after": answer["next"]})
            answer["secrets"] = answer.get("secrets", []) + page.get("secrets", [])
            answer["folders"] = answer.get("folders", []) + page.get("folders", [])
            answer["next"] = page.get("next")
        answer.pop("next", None)
        return answer


def _scrubbed(exc: AdminError, *values: Any) -> AdminError:
    """``exc`` with any of ``values`` replaced by [redacted]: a secret must not reach an error
    message, a log line or a traceback, even if some proxy in front of the gateway echoes it."""
    message = exc.message
    for value in values:
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = bytes(value).decode("utf-8", "ignore")
        if isinstance(value, str) and len(value) >= _SCRUB_MIN and value in message:
            message = message.replace(value, "[redacted]")
    if message == exc.message:
        return exc
    return AdminError(exc.status, exc.code, message)


def secret_field(value: str | bytes, field: str, where: str) -> str:
    """Key ``field`` of a value holding a JSON object, as text (JSON for a non-string item).

    Several credentials often share one secret (``{"user": ..., "password": ...}``); this picks
    one. ``where`` names the secret in errors, which never quote the value or its keys.
    """
    if isinstance(value, bytes):
        raise AdminError(0, "NotAJSONObject", f"{where} is a binary value, so it has no field {field!r}")
    try:
        document = json.loads(value)
    except ValueError:
        raise AdminError(0, "NotAJSONObject", f"the value of {where} is not JSON, so it has no "
                         f"field {field!r}") from None
    if not isinstance(document, dict):
        raise AdminError(0, "NotAJSONObject", f"the value of {where} is JSON but not an object, so it "
                         f"has no field {field!r}")
    if field not in document:
        raise AdminError(0, "NoSuchField", f"the value of {where} has no field {field!r}")
    item = document[field]
    return item if isinstance(item, str) else json.dumps(item)
