"""A small client for the open-memory API (``/v1/memory``), on AdminClient's transport.

    mem = MemoryClient(endpoint, access_key, secret_key)
    doc, etag = mem.put("team:finance", "vendor-payments", {...})
    doc, etag = mem.get("team:finance", "vendor-payments")
    mem.put("team:finance", "vendor-payments", {...}, if_match=etag)   # 412 if someone wrote first
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from .admin_client import AdminError, ServiceClient, _query_string

PREFIX = "/v1/memory"


class MemoryClient(ServiceClient):
    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: bytes = b"", headers: Mapping[str, str] | None = None) -> tuple[int, dict, bytes]:
        """One signed request; AdminError on >= 400. ``path`` is under /v1/memory, already encoded."""
        t = self._transport
        full = t._base_path + PREFIX + path
        raw_query = _query_string(query)
        extra = dict(headers or {})
        if body:
            extra.setdefault("content-type", "application/json")
        signed = t.sign(method, full, raw_query, body, extra)
        conn = t._connection()
        try:
            conn.request(method, full + (f"?{raw_query}" if raw_query else ""),
                         body=body if body or method in ("POST", "PUT") else None, headers=signed)
            resp = conn.getresponse()
            data, status = resp.read(), resp.status
            resp_headers = {k.lower(): v for k, v in resp.getheaders()}
        except (OSError, http.client.HTTPException) as exc:
            raise AdminError(0, "ConnectionError",
                             f"cannot reach the gateway at {t.endpoint}: {exc}") from None
        finally:
            conn.close()
        if status >= 400:
            raise t._error(status, resp_headers, data)
        return status, resp_headers, data

    def _json(self, method: str, path: str, **kwargs) -> tuple[Any, str | None]:
        _, headers, data = self.request(method, path, **kwargs)
        etag = headers.get("etag")
        return (json.loads(data) if data.strip() else None), (etag.strip('"') if etag else None)

    @staticmethod
    def _doc_path(scope: str, doc_id: str) -> str:
        return f"/{quote(scope, safe=':')}/{quote(doc_id, safe='')}"

    @staticmethod
    def _conditions(if_match: str | None, if_none_match: bool = False) -> dict[str, str]:
        out = {}
        if if_match is not None:
            out["if-match"] = f'"{if_match}"'
        if if_none_match:
            out["if-none-match"] = "*"
        return out

    def put(self, scope: str, doc_id: str, doc: Mapping[str, Any] | bytes, *, if_match: str | None = None,
            if_none_match: bool = False) -> tuple[dict, str | None]:
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        return self._json("PUT", self._doc_path(scope, doc_id), body=body,
                          headers=self._conditions(if_match, if_none_match))

    def get(self, scope: str, doc_id: str, *, as_of: str | None = None) -> tuple[dict, str | None]:
        return self._json("GET", self._doc_path(scope, doc_id), query={"as_of": as_of})

    def history(self, scope: str, doc_id: str) -> list[dict]:
        return self._json("GET", self._doc_path(scope, doc_id) + "/history")[0]["versions"]

    def version(self, scope: str, doc_id: str, n: int) -> dict:
        return self._json("GET", self._doc_path(scope, doc_id) + f"/versions/{n}")[0]

    def supersede(self, scope: str, doc_id: str, new: Mapping[str, Any], *,
                  if_match: str | None = None) -> dict:
        return self._json("POST", self._doc_path(scope, doc_id) + "/supersede",
                          body=json.dumps(new).encode(), headers=self._conditions(if_match))[0]

    def retract(self, scope: str, doc_id: str, *, if_match: str | None = None) -> dict:
        return self._json("POST", self._doc_path(scope, doc_id) + "/retract",
                          headers=self._conditions(if_match))[0]

    def list(self, **query: Any) -> list[dict]:
        return self._json("GET", "", query=query)[0]["documents"]

    def for_agent(self, agent: str) -> list[dict]:
        return self._json("GET", f"/for/{quote(agent, safe='')}")[0]["documents"]

    def digest(self, agent: str) -> str:
        return self.request("GET", f"/for/{quote(agent, safe='')}.md")[2].decode()

    def import_document(self, scope: str, doc_id: str, versions: list[dict]) -> dict:
        body = json.dumps({"scope": scope, "id": doc_id, "versions": versions}).encode()
        return self._json("POST", "/import", body=body)[0]
