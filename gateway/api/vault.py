"""The vault's secrets API (``/v1/vault``).

Thin: parse, name the resource, call :class:`~gateway.secret_store.service.Secrets`, shape the
JSON. Every route is audited durably before it answers (reads too), with the version touched;
when the audit record cannot be stored the answer is withheld (503). Values appear only in the
body of a successful read, never in errors, logs or audit records.

    PUT    /v1/vault/secrets/{path}[?cas=N]       {"value"|"value_base64", "metadata"?}
    GET    /v1/vault/secrets/{path}[?version=N]   the value (text, or base64 for bytes)
    DELETE /v1/vault/secrets/{path}[?versions=1,2] soft delete (the latest by default)
    POST   /v1/vault/undelete/{path}              {"versions": [...]}
    POST   /v1/vault/destroy/{path}               {"versions": [...]}: gone for good
    GET    /v1/vault/metadata/{path}              versions and settings, never values
    PUT    /v1/vault/metadata/{path}              {"max_versions"?, "metadata"?}
    DELETE /v1/vault/metadata/{path}              destroy every version, forget the path
    GET    /v1/vault/secrets/[{prefix}/]          list (note the trailing slash) [?recursive=true]
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ..secret_store.errors import SecretError
from ..secret_store.paths import check_path, check_prefix
from ..secret_store.service import Secrets, check_versions
from .rest import ApiError, Call, Reply, Router

ARN = "arn:orgmem:vault:::"
#: A 64 KiB value as base64 in JSON, plus metadata.
MAX_BODY = 160 * 1024
_NO_STORE = [("cache-control", "no-store")]
_PUT_KEYS = {"value", "value_base64", "metadata"}


def add_routes(r: Router, secrets: Secrets) -> None:
    api = VaultApi(secrets)

    def add(method: str, path: str, operation: str, action: str, resource, handler, **kw) -> None:
        r.add(method, path, operation, action, resource, handler, durable=True, audit_or_fail=True, **kw)

    add("GET", "/v1/vault/secrets/", "ListSecrets", "vault:ListSecrets", api.prefix_arn, api.list)
    add("GET", "/v1/vault/secrets/{prefix:path}/", "ListSecrets", "vault:ListSecrets", api.prefix_arn,
        api.list)
    add("PUT", "/v1/vault/secrets/{path:path}", "PutSecret", "vault:PutSecret", api.path_arn, api.put,
        max_body=MAX_BODY)
    add("GET", "/v1/vault/secrets/{path:path}", "GetSecret", "vault:GetSecret", api.path_arn, api.get)
    add("DELETE", "/v1/vault/secrets/{path:path}", "DeleteSecret", "vault:DeleteSecret", api.path_arn,
        api.delete)
    add("POST", "/v1/vault/undelete/{path:path}", "UndeleteSecret", "vault:DeleteSecret", api.path_arn,
        api.undelete)
    add("POST", "/v1/vault/destroy/{path:path}", "DestroySecret", "vault:DestroySecret", api.path_arn,
        api.destroy)
    add("GET", "/v1/vault/metadata/{path:path}", "GetSecretMetadata", "vault:ListSecrets", api.path_arn,
        api.metadata)
    add("PUT", "/v1/vault/metadata/{path:path}", "PutSecretMetadata", "vault:PutSecret", api.path_arn,
        api.set_metadata, also=api.pruning_needs)
    add("DELETE", "/v1/vault/metadata/{path:path}", "DestroySecretAll", "vault:DestroySecret",
        api.path_arn, api.destroy_all)


class VaultApi:
    def __init__(self, secrets: Secrets) -> None:
        self.secrets = secrets

    # -- resources (checked before authorization, so a bad path is a 400 for everyone) --

    def path_arn(self, call: Call) -> str:
        return ARN + check_path(call.params["path"])

    def prefix_arn(self, call: Call) -> str:
        prefix = call.params.get("prefix")
        prefix = "" if prefix is None else prefix.rstrip("/") + "/"
        call.state["prefix"] = check_prefix(prefix)
        return ARN + prefix

    def pruning_needs(self, call: Call) -> list[tuple[str, str]]:
        """Lowering max_versions destroys the oldest versions: that takes vault:DestroySecret."""
        try:
            body = call.json()
        except ApiError:  # the handler answers the bad body
            return []
        if isinstance(body, dict) and "max_versions" in body:
            return [("vault:DestroySecret", ARN + call.params["path"])]
        return []

    # -- handlers ------------------------------------------------------------------------

    def put(self, call: Call) -> Reply:
        body = _object(call)
        value, custom = _value(body), body.get("metadata")
        cas = _int_query(call, "cas", minimum=0)
        result = self.secrets.put(call.params["path"], value, call.principal.name, cas=cas, custom=custom)
        call.version = result["version"]
        return Reply(data=result)

    def get(self, call: Call) -> Reply:
        call.version = _int_query(call, "version", minimum=1)
        value, info = self.secrets.get(call.params["path"], call.version)
        call.version = info["version"]
        try:
            shown: dict[str, Any] = {"encoding": "text", "value": value.decode("utf-8")}
        except UnicodeDecodeError:
            shown = {"encoding": "base64", "value": base64.b64encode(value).decode("ascii")}
        return Reply(data={"path": info["path"], "version": info["version"], **shown,
                           "metadata": info["metadata"], "created_time": info["created_time"],
                           "created_by": info["created_by"]}, headers=_NO_STORE)

    def delete(self, call: Call) -> Reply:
        versions = _versions_query(call)
        if versions and len(versions) == 1:
            call.version = versions[0]
        self.secrets.delete(call.params["path"], versions)
        return Reply(204)

    def undelete(self, call: Call) -> Reply:
        versions = _versions_body(call)
        call.version = versions[0] if len(versions) == 1 else None
        return Reply(data=self.secrets.undelete(call.params["path"], versions))

    def destroy(self, call: Call) -> Reply:
        versions = _versions_body(call)
        call.version = versions[0] if len(versions) == 1 else None
        return Reply(data=self.secrets.destroy(call.params["path"], versions))

    def metadata(self, call: Call) -> Reply:
        return Reply(data=self.secrets.metadata(call.params["path"]))

    def set_metadata(self, call: Call) -> Reply:
        body = _object(call)
        unknown = set(body) - {"max_versions", "metadata"}
        if unknown:
            raise SecretError("InvalidRequest", f"Unknown field(s) {sorted(unknown)}: metadata takes "
                              "max_versions and metadata.")
        return Reply(data=self.secrets.set_metadata(call.params["path"], body.get("max_versions"),
                                                    body.get("metadata")))

    def destroy_all(self, call: Call) -> Reply:
        self.secrets.destroy_all(call.params["path"])
        return Reply(204)

    def list(self, call: Call) -> Reply:
        recursive = call.query.get("recursive", "false").lower()
        if recursive not in ("true", "false"):
            raise SecretError("InvalidRequest", "recursive is true or false.")
        after = call.query.get("after", "")
        # Granted the prefix, but a Deny may take paths or folders under it (shared/admin/*):
        # those are left out, their names and metadata with them (the cursor too).
        return Reply(data=self.secrets.list(call.state["prefix"], recursive == "true", after,
                                            hidden=lambda name: call.denies("vault:ListSecrets",
                                                                            ARN + name)))


def _object(call: Call) -> dict[str, Any]:
    body = call.json()
    if not isinstance(body, dict):
        raise SecretError("InvalidRequest", "The body is a JSON object.")
    return body


def _value(body: dict[str, Any]) -> bytes:
    """The value as bytes, from exactly one of ``value`` (text) and ``value_base64``."""
    unknown = set(body) - _PUT_KEYS
    if unknown:
        raise SecretError("InvalidRequest", f"Unknown field(s) {sorted(unknown)}: a secret takes value "
                          "or value_base64, and metadata.")
    if ("value" in body) == ("value_base64" in body):
        raise SecretError("InvalidRequest", "Give exactly one of value (text) and value_base64 (bytes).")
    if "value" in body:
        if not isinstance(body["value"], str):
            raise SecretError("InvalidRequest", "value is a string; send bytes as value_base64.")
        value = body["value"].encode("utf-8", "surrogatepass")
    else:
        if not isinstance(body["value_base64"], str):
            raise SecretError("InvalidRequest", "value_base64 is a base64 string.")
        try:
            value = base64.b64decode(body["value_base64"], validate=True)
        except (binascii.Error, ValueError):
            raise SecretError("InvalidRequest", "value_base64 is not valid base64.") from None
    if not value:
        raise SecretError("InvalidRequest", "A secret value cannot be empty.")
    return value


def _int_query(call: Call, name: str, minimum: int) -> int | None:
    text = call.query.get(name)
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or len(text) > 12 or int(text) < minimum:
        raise SecretError("InvalidRequest", f"{name} is a whole number from {minimum}.")
    return int(text)


def _versions_query(call: Call) -> list[int] | None:
    text = call.query.get("versions")
    if text is None:
        return None
    parts = text.split(",")
    if not all(p.isascii() and p.isdigit() and len(p) <= 12 and int(p) >= 1 for p in parts):
        raise SecretError("InvalidRequest", "versions is a comma-separated list of version numbers.")
    return [int(p) for p in parts]


def _versions_body(call: Call) -> list[int]:
    body = _object(call)
    versions = body.get("versions")
    if set(body) != {"versions"} or not isinstance(versions, list) or not versions:
        raise SecretError("InvalidRequest", 'The body names the versions: {"versions": [1, 2]}.')
    check_versions(versions)  # before the audit record takes one
    return versions
