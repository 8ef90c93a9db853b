"""The search API: ``GET /v1/search``, ``GET /v1/index/status``, ``POST /v1/index/rebuild``.

Thin: read the parameters, call :class:`~gateway.indexing.SearchIndex`, shape the JSON.
Access control is the index's business (the caller's grants become an access-token
clause of the query, and each hit is checked again), so the route itself is decided
per item: a caller without ``search:Query`` on a type simply finds nothing of it.

    GET  /v1/search?q=&type=&agent=&session=&scope=&kind=&status=&tag=&bucket=&since=&until=&limit=&offset=
    GET  /v1/index/status                 checkpoint, lag, snapshot age, holder, rebuild progress
    POST /v1/index/rebuild                rebuild from the sources (the index writer only)
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from indexer import QueryError

from ..iam.audit import parse_since
from ..indexing import IndexNotReady, NotIndexWriter, SearchFailed, SearchIndex
from .rest import ApiError, Call, PerItem, Reply, Router

ARN = "arn:orgmem:search:::"
DEFAULT_LIMIT = 10
#: query parameter -> filter name (lists are comma-separated)
FILTERS = {"type": "type", "agent": "agent", "session": "session", "scope": "scope", "kind": "kind",
           "status": "status", "tag": "tags", "bucket": "bucket", "key": "key"}


def add_routes(r: Router, index: SearchIndex) -> None:
    api = SearchApi(index)
    r.add("GET", "/v1/search", "Search", "search:Query", lambda c: PerItem(ARN + "*"), api.search)
    r.add("GET", "/v1/index/status", "GetIndexStatus", "search:GetIndexStatus", lambda c: ARN + "index",
          api.status)
    r.add("POST", "/v1/index/rebuild", "RebuildIndex", "search:RebuildIndex", lambda c: ARN + "index",
          api.rebuild, durable=True)


def _int(value: str | None, name: str, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ApiError("InvalidArgument", f"{name}: expected a whole number, not {value[:40]!r}.") from None


def _time(value: str | None, name: str) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromtimestamp(parse_since(value, time.time()), UTC)
    except (ValueError, OverflowError, OSError):
        raise ApiError("InvalidArgument", f"{name}: {value[:60]!r} is not a time; use RFC 3339, unix "
                       "seconds or a duration back from now such as 10m or 7d.") from None


class SearchApi:
    def __init__(self, index: SearchIndex) -> None:
        self.index = index

    def search(self, call: Call) -> Reply:
        if not self.index.tokens.types(call.principal, call.context):
            raise ApiError("AccessDenied", f"User: {call.principal.name} is not authorized to perform: "
                           f"search:Query on any of {ARN}event, memory, skill or file.", 403)
        q = call.query
        filters: dict = {}
        for param, name in FILTERS.items():
            value = q.get(param)
            if value:
                values = [v.strip() for v in value.split(",") if v.strip()]
                filters[name] = values[0] if len(values) == 1 else values
        filters["since"] = _time(q.get("since"), "since")
        filters["until"] = _time(q.get("until"), "until")
        try:
            result = self.index.search(call.principal, q.get("q", ""), filters,
                                       _int(q.get("limit"), "limit", DEFAULT_LIMIT),
                                       _int(q.get("offset"), "offset", 0), call.context)
        except QueryError as exc:
            raise ApiError("InvalidQuery", str(exc)) from None
        except IndexNotReady as exc:
            raise ApiError("IndexNotReady", str(exc), 503) from None
        except SearchFailed as exc:
            raise ApiError("SearchFailed", str(exc), 503) from None
        return Reply(200, result)

    def status(self, call: Call) -> Reply:
        return Reply(200, self.index.status())

    def rebuild(self, call: Call) -> Reply:
        try:
            return Reply(202, self.index.request_rebuild())
        except NotIndexWriter as exc:
            raise ApiError("NotIndexWriter", str(exc), 409) from None
