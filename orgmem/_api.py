"""The REST operations (``/v1/...`` and ``/admin/v1/whoami``), written once for both clients.

Each method is a generator of requests that returns the typed result (see ``_http``).  The
routes and bodies are those of ``gateway/api/{bio,memory,skills,search,context,vault,admin}.py``.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import _events
from ._http import Op, Request, json_body
from ._sigv4 import encode_segment
from .errors import InvalidRequest, OrgmemError
from .models import Memory

JSON = dict[str, Any]
#: Events per page when reading (the API's maximum).
EVENTS_PAGE = 1000
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

TimeArg = str | int | float | datetime | None
#: Skill files: ``{path: content}`` or a skill folder on disk.
SkillFiles = Mapping[str, bytes | str] | str | os.PathLike


def _time(value: TimeArg, pin: bool = False) -> str | None:
    """A time as the API reads one: RFC 3339, unix seconds or a duration back from now.

    ``pin`` turns a duration into an absolute time once, so every page of a listing
    answers the same question.
    """
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidRequest(0, "InvalidArgument", "a time is a string, a number or a datetime")
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, (int, float)):
        return repr(float(value)) if isinstance(value, float) else str(value)
    found = _DURATION.fullmatch(value) if pin else None
    if found:
        back = float(found.group(1)) * _SECONDS[found.group(2)]
        return _time(datetime.fromtimestamp(time.time() - back, UTC))
    return str(value)


def _whole(value: int | None, name: str, low: int = 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidRequest(0, "InvalidArgument", f"{name}: a whole number from {low}")
    return value


def _name(value: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(0, "InvalidArgument", f"{what}: a non-empty string is required")
    return encode_segment(value)


def _conditions(if_match: str | None, create_only: bool) -> dict[str, str]:
    if if_match is not None and create_only:
        raise InvalidRequest(0, "InvalidArgument", "if_match and create_only exclude each other")
    out = {}
    if if_match is not None:
        out["if-match"] = f'"{str(if_match).strip(chr(34))}"'
    if create_only:
        out["if-none-match"] = "*"
    return out


def secret_path(path: str) -> str:
    """A vault path on the wire: each segment encoded, no empty segment (a trailing "/" would
    turn a read into a listing)."""
    if not isinstance(path, str) or not path:
        raise InvalidRequest(0, "InvalidPath", "a secret path must not be empty")
    segments = path.split("/")
    if any(not s for s in segments):
        raise InvalidRequest(0, "InvalidPath", f"{path!r} has an empty segment (a leading, trailing "
                             "or doubled '/')")
    return "/".join(encode_segment(s) for s in segments)


def skill_files(files: SkillFiles,
                executable: Iterable[str]) -> list[JSON]:
    """The push body's files from a mapping (path -> content) or a skill folder on disk."""
    run = set(executable)
    if isinstance(files, (str, os.PathLike)):
        root = Path(files)
        if not root.is_dir():
            raise InvalidRequest(0, "InvalidSkill", f"{root} is not a folder")
        found = {}
        for item in sorted(root.rglob("*")):
            if item.is_file():
                rel = item.relative_to(root).as_posix()
                found[rel] = item.read_bytes()
                if item.stat().st_mode & 0o111:
                    run.add(rel)
        files = found
    out = []
    for path, content in files.items():
        data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        out.append({"path": path, "content": base64.b64encode(data).decode("ascii"),
                    "executable": path in run})
    return out


class Api:
    """REST operations; ``me`` caches the caller's name (whoami) for the defaults that need it."""

    def __init__(self) -> None:
        self._me: str | None = None

    # -- identity ---------------------------------------------------------------------

    def whoami(self) -> Op[JSON]:
        me = (yield Request("GET", "/admin/v1/whoami")).json()
        self._me = me.get("name")
        return me

    def me(self) -> Op[str]:
        if self._me is None:
            yield from self.whoami()
        return self._me

    # -- biographies ------------------------------------------------------------------

    def put_events(self, events: list[Mapping[str, Any]]) -> Op[list[str]]:
        events = list(events)
        if not events:
            return []
        body = _events.event_lines(events)
        answer = yield Request("POST", "/v1/events", body=body, headers={"content-type": "application/json"})
        return answer.json()["event_ids"]

    def send_batch(self, events: list[_events.Pending]) -> Op[list[OrgmemError]]:
        return (yield from _events.send_batch(events))

    def events(self, agent: str | None = None, session: str | None = None,
               kinds: str | Iterable[str] | None = None, since: TimeArg = None, until: TimeArg = None,
               limit: int | None = None) -> Op[list[JSON]]:
        limit = _whole(limit, "limit")
        if kinds is not None and not isinstance(kinds, str):
            kinds = ",".join(kinds)
        query: JSON = {"agent": agent or None, "session": session or None, "kind": kinds or None,
                       "since": _time(since, pin=True), "until": _time(until, pin=True)}
        out: list[JSON] = []
        cursor = None
        while True:
            page = EVENTS_PAGE if limit is None else min(EVENTS_PAGE, limit - len(out))
            answer = (yield Request("GET", "/v1/events", {**query, "limit": page, "cursor": cursor})).json()
            out.extend(answer["events"])
            cursor = answer.get("next_cursor")
            if not cursor or (limit is not None and len(out) >= limit):
                return out

    def sessions(self, agent: str | None = None) -> Op[list[JSON]]:
        return (yield Request("GET", "/v1/sessions", {"agent": agent or None})).json()["sessions"]

    # -- open memory ------------------------------------------------------------------

    @staticmethod
    def _doc(scope: str, doc_id: str, tail: str = "") -> str:
        return f"/v1/memory/{_name(scope, 'scope')}/{_name(doc_id, 'id')}{tail}"

    def get_memory(self, scope: str, doc_id: str, as_of: TimeArg = None) -> Op[Memory]:
        answer = yield Request("GET", self._doc(scope, doc_id), {"as_of": _time(as_of)})
        return Memory(answer.json(), answer.etag)

    def put_memory(self, scope: str, doc_id: str, doc: Mapping[str, Any], if_match: str | None = None,
                   create_only: bool = False) -> Op[Memory]:
        if not isinstance(doc, Mapping):
            raise InvalidRequest(0, "InvalidDocument", "a memory document is a dict")
        body, headers = json_body(dict(doc))
        answer = yield Request("PUT", self._doc(scope, doc_id), body=body,
                               headers={**headers, **_conditions(if_match, create_only)})
        return Memory(answer.json(), answer.etag)

    def supersede_memory(self, scope: str, doc_id: str, new_doc: Mapping[str, Any],
                         if_match: str | None = None) -> Op[Memory]:
        if not isinstance(new_doc, Mapping):
            raise InvalidRequest(0, "InvalidDocument", "a memory document is a dict")
        body, headers = json_body(dict(new_doc))
        answer = yield Request("POST", self._doc(scope, doc_id, "/supersede"), body=body,
                               headers={**headers, **_conditions(if_match, False)})
        return Memory(answer.json()["document"], answer.etag)

    def retract_memory(self, scope: str, doc_id: str, if_match: str | None = None) -> Op[Memory]:
        answer = yield Request("POST", self._doc(scope, doc_id, "/retract"),
                               headers=_conditions(if_match, False))
        return Memory(answer.json(), answer.etag)

    def memory_history(self, scope: str, doc_id: str) -> Op[list[JSON]]:
        return (yield Request("GET", self._doc(scope, doc_id, "/history"))).json()["versions"]

    def list_memory(self, scope: str | None = None, kind: str | None = None, tag: str | None = None,
                    status: str | None = None, applies_to: str | None = None,
                    as_of: TimeArg = None) -> Op[list[JSON]]:
        query = {"scope": scope, "kind": kind, "tag": tag, "status": status, "applies_to": applies_to,
                 "as_of": _time(as_of)}
        return (yield Request("GET", "/v1/memory", query)).json()["documents"]

    def memory_for(self, agent: str | None = None) -> Op[list[JSON]]:
        agent = agent or (yield from self.me())
        return (yield Request("GET", f"/v1/memory/for/{_name(agent, 'agent')}")).json()["documents"]

    def digest(self, agent: str | None = None) -> Op[str]:
        agent = agent or (yield from self.me())
        answer = yield Request("GET", f"/v1/memory/for/{_name(agent, 'agent')}.md")
        return answer.body.decode("utf-8")

    # -- search and context -----------------------------------------------------------

    def search(self, q: str, type: str | Iterable[str] | None = None, agent: str | None = None,
               session: str | None = None, scope: str | None = None, kind: str | None = None,
               since: TimeArg = None, until: TimeArg = None, limit: int = 10, offset: int = 0,
               status: str | None = None, tag: str | None = None, bucket: str | None = None) -> Op[JSON]:
        if not isinstance(q, str):
            raise InvalidRequest(0, "InvalidQuery", "q: the query is a string ('*' matches everything)")
        query = {"q": q, "type": type, "agent": agent, "session": session, "scope": scope, "kind": kind,
                 "status": status, "tag": tag, "bucket": bucket, "since": _time(since),
                 "until": _time(until), "limit": limit, "offset": offset}
        return (yield Request("GET", "/v1/search", query)).json()

    def context(self, agent: str | None = None, session: str | None = None, query: str | None = None,
                budget_tokens: int = 2000) -> Op[JSON]:
        agent = agent or (yield from self.me())
        payload: JSON = {"agent": agent, "budget_tokens": budget_tokens}
        if session is not None:
            payload["session"] = session
        if query is not None:
            payload["query"] = query
        body, headers = json_body(payload)
        return (yield Request("POST", "/v1/context", body=body, headers=headers)).json()

    # -- vault ------------------------------------------------------------------------

    def get_secret(self, path: str, version: int | None = None) -> Op[str | bytes]:
        answer = (yield Request("GET", "/v1/vault/secrets/" + secret_path(path),
                                {"version": _whole(version, "version")})).json()
        if answer.get("encoding") == "base64":
            try:
                return base64.b64decode(answer["value"], validate=True)
            except (binascii.Error, TypeError, KeyError):
                raise OrgmemError(200, "InvalidResponse", f"the value of {path} is not valid base64") \
                    from None
        return answer["value"]

    def put_secret(self, path: str, value: str | bytes, cas: int | None = None,
                   metadata: Mapping[str, str] | None = None) -> Op[int]:
        if isinstance(value, str):
            payload: JSON = {"value": value}
        elif isinstance(value, (bytes, bytearray, memoryview)):
            payload = {"value_base64": base64.b64encode(bytes(value)).decode("ascii")}
        else:
            raise InvalidRequest(0, "InvalidRequest", f"a secret is str or bytes, not {type(value).__name__}")
        if metadata is not None:
            payload["metadata"] = dict(metadata)
        body, headers = json_body(payload)
        try:
            answer = yield Request("PUT", "/v1/vault/secrets/" + secret_path(path),
                                   {"cas": _whole(cas, "cas", 0)}, body=body, headers=headers)
        except OrgmemError as exc:
            raise _scrubbed(exc, value, payload.get("value_base64")) from None
        return answer.json()["version"]

    def delete_secret(self, path: str) -> Op[None]:
        yield Request("DELETE", "/v1/vault/secrets/" + secret_path(path))

    def list_secrets(self, prefix: str = "") -> Op[list[JSON]]:
        prefix = prefix.strip("/")
        path = "/v1/vault/secrets/" + (secret_path(prefix) + "/" if prefix else "")
        out: list[JSON] = []
        after = None
        while True:
            answer = (yield Request("GET", path, {"recursive": True, "after": after})).json()
            out.extend(answer.get("secrets", []))
            after = answer.get("next")
            if not after:
                return out

    # -- skills -----------------------------------------------------------------------

    def list_skills(self, scope: str | None = None, q: str | None = None) -> Op[list[JSON]]:
        return (yield Request("GET", "/v1/skills", {"scope": scope, "q": q})).json()["skills"]

    def get_skill(self, scope: str | None, name: str, version: int | None = None) -> Op[JSON]:
        query = {"scope": scope, "version": _whole(version, "version")}
        return (yield Request("GET", f"/v1/skills/{_name(name, 'name')}", query)).json()

    def get_skill_file(self, scope: str | None, name: str, path: str,
                       version: int | None = None) -> Op[bytes]:
        query = {"path": path, "scope": scope, "version": _whole(version, "version")}
        return (yield Request("GET", f"/v1/skills/{_name(name, 'name')}/file", query)).body

    def put_skill(self, scope: str | None, name: str, files: SkillFiles,
                  executable: Iterable[str] = ()) -> Op[JSON]:
        body, headers = json_body({"files": skill_files(files, executable)})
        answer = yield Request("POST", f"/v1/skills/{_name(name, 'name')}/versions", {"scope": scope},
                               body=body, headers=headers)
        return answer.json()


def _scrubbed(exc: OrgmemError, *values: Any) -> OrgmemError:
    """``exc`` without any of ``values`` in its message (a secret must reach no error)."""
    message = exc.message
    for value in values:
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = bytes(value).decode("utf-8", "ignore")
        if isinstance(value, str) and len(value) >= 4 and value in message:
            message = message.replace(value, "[redacted]")
    if message == exc.message:
        return exc
    return type(exc)(exc.status, exc.code, message, request_id=exc.request_id)
