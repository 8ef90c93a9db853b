"""A small client for the gateway's biography API (``/v1/events``, ``/v1/sessions``, ``/v1/bio/...``).

It rides on :class:`~gateway.admin_client.AdminClient`'s transport: the same SigV4 signing
(the gateway's own helpers), the same endpoint and CA-bundle checks, the same error type
(:class:`~gateway.admin_client.AdminError`, exported here as ``BioError``) and the same care
never to show the secret key.

    bio = from_env()                              # ORGMEM_ENDPOINT, ORGMEM_ACCESS_KEY, ...
    bio.put_events([{"session": "s1", "kind": "note", "content": "hello"}])
    for event in bio.iter_events(agent="scout", kinds=["question", "answer"], since="1h"):
        print(event["ts"], event["content"])
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from . import admin_client
from .admin_client import AdminError, ServiceClient

BioError = AdminError

JSON = dict[str, Any]
#: Events per page when following cursors (the API's maximum).
PAGE = 1000

#: A duration back from now, as the gateway reads one ("90s", "10m", "1.5h", "7d").
_DURATION = re.compile(r"\d+(?:\.\d+)?\s*[smhd]")

TimeArg = str | int | float | datetime | None


def _time(value: TimeArg) -> str | None:
    """``since``/``until`` as the API reads them: RFC 3339, unix seconds or a duration ("10m")."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, bool):
        raise BioError(0, "InvalidArgument", "a time must be a string, a number or a datetime")
    if isinstance(value, (int, float)):
        return repr(float(value)) if isinstance(value, float) else str(value)
    return str(value)


def _kinds(kinds: str | Iterable[str] | None) -> str | None:
    if kinds is None:
        return None
    if isinstance(kinds, str):
        return kinds or None
    joined = ",".join(k for k in kinds if k)
    return joined or None


class BioClient(ServiceClient):
    """Typed calls to the biography API, returning the parsed JSON.

    Build one from an endpoint and keys, or with :meth:`over` from an AdminClient that is
    already configured (the CLI does this).  Errors are raised as :class:`BioError`.
    """

    @property
    def endpoint(self) -> str:
        return self._transport.endpoint

    @property
    def access_key(self) -> str:
        return self._transport.access_key

    def __repr__(self) -> str:
        return f"BioClient(endpoint={self.endpoint!r}, access_key={self.access_key!r})"

    # ------------------------------------------------------------------ transport

    def _call(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
              body: bytes = b"", content_type: str | None = None) -> Any:
        status, _, data = self._transport._request(method, path, query=query, body=body,
                                                   content_type=content_type)
        if status == 204 or not data.strip():
            return None
        try:
            return json.loads(data)
        except ValueError:
            raise BioError(status, "InvalidResponse", f"the gateway answered {method} {path} with "
                           f"something that is not JSON (HTTP {status})") from None

    # ------------------------------------------------------------------ events

    def put_events(self, events: list[Mapping[str, Any]] | bytes) -> JSON:
        """Append a batch (all or nothing); ``{"event_ids": [...], "count": n}``.

        ``events`` is a list of event dicts (sent as a JSON array) or a ready body: a JSON
        array or NDJSON, as bytes.  An invalid event raises BioError ``InvalidEvent`` naming
        its line and field.
        """
        if isinstance(events, (bytes, bytearray, memoryview)):
            body = bytes(events)
            first = body.lstrip()[:1]
            content_type = "application/json" if first == b"[" else "application/x-ndjson"
        else:
            body = json.dumps(list(events)).encode()
            content_type = "application/json"
        return self._call("POST", "/v1/events", body=body, content_type=content_type)

    def events(self, agent: str | None = None, session: str | None = None,
               kinds: str | Iterable[str] | None = None, since: TimeArg = None, until: TimeArg = None,
               limit: int | None = None, cursor: str | None = None) -> JSON:
        """One page: ``{"events": [...], "next_cursor": str | None}``.

        ``agent`` defaults to the caller.  Pages are in time order, or in session order
        (``seq``, then time) when ``session`` is given.  ``since`` is inclusive and ``until``
        exclusive; both take RFC 3339, unix seconds, a duration back from now ("10m",
        "7d") or a datetime.
        """
        query = {"agent": agent or None, "session": session or None, "kind": _kinds(kinds),
                 "since": _time(since), "until": _time(until),
                 "limit": None if limit is None else int(limit), "cursor": cursor or None}
        return self._call("GET", "/v1/events", query=query)

    def iter_events(self, agent: str | None = None, session: str | None = None,
                    kinds: str | Iterable[str] | None = None, since: TimeArg = None,
                    until: TimeArg = None, page_size: int = PAGE) -> Iterator[JSON]:
        """Every matching event, following ``next_cursor`` page by page.

        A relative ``since``/``until`` ("10m") is pinned to an absolute time once, before
        the first page, so every page answers the same question.
        """
        since, until = _pinned(since), _pinned(until)
        cursor = None
        while True:
            page = self.events(agent, session, kinds, since, until, page_size, cursor)
            yield from page.get("events") or []
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def sessions(self, agent: str | None = None) -> JSON:
        """``{"agent", "sessions": [{session, first_ts, last_ts, events, kinds, open_questions}]}``,
        most recently active first."""
        return self._call("GET", "/v1/sessions", query={"agent": agent or None})

    # ------------------------------------------------------------------ upkeep

    def compact(self) -> JSON:
        """Compact now; returns when committed (records, segments_written, ...)."""
        return self._call("POST", "/v1/bio/compact", body=b"")

    def retention(self, agent: str | None = None) -> JSON:
        """``{"default_days": int | None, "agents": {name: days}}``; None keeps forever.

        ``agent`` only changes which grant is checked (``AGENT/*`` instead of ``*``)."""
        return self._call("GET", "/v1/bio/retention", query={"agent": agent or None})

    def set_retention(self, days: int | None, agent: str | None = None, reset: bool = False) -> JSON:
        """Set the default retention (``agent=None``) or one agent's; returns the settings.

        ``days=None`` keeps forever; ``reset=True`` drops the agent's own setting so the
        default applies to it again.
        """
        payload: dict[str, Any] = {"agent": agent, "days": None if days is None else int(days)}
        if reset:
            payload["reset"] = True
        return self._call("PUT", "/v1/bio/retention", body=json.dumps(payload).encode(),
                          content_type="application/json")


def _pinned(value: TimeArg) -> TimeArg:
    """A duration ("10m") as the absolute time it means now; anything else unchanged."""
    if isinstance(value, str) and _DURATION.fullmatch(value.strip()):
        from .iam.audit import parse_since

        return datetime.fromtimestamp(parse_since(value, time.time()), UTC)
    return value


def from_env(endpoint: str | None = None, access_key: str | None = None, secret_key: str | None = None,
             *, ca_file: str | None = None, region: str | None = None, timeout: float = 30,
             env: Mapping[str, str] | None = None) -> BioClient:
    """A BioClient configured like :func:`gateway.admin_client.from_env` (same variables)."""
    return BioClient.over(admin_client.from_env(endpoint, access_key, secret_key, ca_file=ca_file,
                                                region=region, timeout=timeout, env=env))
