"""A LangGraph ``BaseStore`` over open memory: long-term memory shared through the gateway.

Every item is one open-memory document (see :mod:`.namespaces` for the mapping), so items
get what every memory document gets: versions and history, provenance, access control by
scope, full-text search, and a place in the org's memory that people can read.

    store = OrgmemStore(orgmem.Client())
    store.put(("memories", "u1"), "diet", {"text": "vegetarian"})     # the caller's own scope
    store.put(("team", "support", "faq"), "refunds", {"text": "..."})  # team:support
    store.search(("memories", "u1"), query="food preferences")

A batch checks every operation before anything is sent: a bad namespace, key, value or
filter raises (``InvalidNamespaceError``, :class:`InvalidValueError`) and nothing is
written. Within a batch, reads see the store as it was before the batch's writes, and of
several writes to one item the last wins, as in LangGraph's own stores. ``delete``
retracts the document (its history stays). ``search`` with a ``query`` ranks with the
gateway's full-text index, which follows writes within about a second; without a query it
lists, newest first. TTLs are not supported, and ``index`` is ignored: every item is
indexed for full-text search.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from ..errors import Conflict, NotFound
from . import namespaces as ns
from ._driver import Call, Driver, call, maybe
from .namespaces import InvalidValueError, Namespace

#: search hits asked of the gateway per page (its maximum is 1000)
SEARCH_PAGE = 100
#: the gateway pages search results at most this deep
MAX_SEARCH_OFFSET = 10_000


class OrgmemStore(BaseStore):
    """LangGraph long-term memory in orgmem open memory.

    ``client`` is an ``orgmem.Client`` (for the sync API), ``async_client`` an
    ``orgmem.AsyncClient`` (for the async API; without one, the async API runs the sync
    client's calls in worker threads). ``kind`` is the memory kind of new documents and
    ``tags`` extra tags (besides ``langgraph``). ``agent`` is whose agent scope holds
    namespaces that do not name a scope (default: the caller's, from whoami).
    """

    supports_ttl = False

    def __init__(self, client: Any = None, *, async_client: Any = None, kind: str = "fact",
                 tags: Iterable[str] = (), agent: str | None = None) -> None:
        if kind not in ns.KINDS:
            raise ValueError(f"kind: {kind!r} is not a memory kind; use one of {', '.join(ns.KINDS)}.")
        self.kind = kind
        self.tags = tuple(t for t in tags if t != ns.TAG)
        if agent is not None and not ns.NAME_RE.match(agent):
            raise ValueError(f"agent: {agent!r} is not an agent name.")
        self._me = agent
        self._io = Driver(client, async_client)

    # -- the two abstract methods ---------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return self._io.run(self._batch(list(ops)))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await self._io.arun(self._batch(list(ops)))

    def close(self) -> None:
        """Stop the worker threads (the clients are the caller's to close)."""
        self._io.close()

    def __enter__(self) -> OrgmemStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one batch ------------------------------------------------------------------------

    def _batch(self, ops: list[Op]):
        """Check every op, read (gets together), then write (all together, the last of
        several writes to one item winning)."""
        if not ops:
            return []
        me = yield from self._whoami()
        plans = [self._plan(op, me) for op in ops]  # everything checked before anything is sent
        results: list[Result] = [None] * len(ops)
        listings: dict[str | None, list[dict]] = {}
        gets = [(i, p) for i, p in enumerate(plans) if isinstance(ops[i], GetOp)]
        if gets:
            docs = yield [maybe("get_memory", p["scope"], p["id"]) for _, p in gets]
            for (i, p), doc in zip(gets, docs, strict=True):
                results[i] = self._found(doc, p)
        for i, op in enumerate(ops):
            if isinstance(op, SearchOp):
                results[i] = yield from self._search(op, plans[i], me, listings)
            elif isinstance(op, ListNamespacesOp):
                results[i] = yield from self._namespaces(op, plans[i], me, listings)
        writes = {(p["scope"], p["id"]): p for op, p in zip(ops, plans, strict=True) if isinstance(op, PutOp)}
        if writes:
            yield [self._write(p) for p in writes.values()]
        return results

    def _whoami(self):
        if self._me is None:
            me = yield call("whoami")
            name = (me or {}).get("name")
            if not name:
                raise InvalidValueError("whoami did not name the caller; pass agent= to OrgmemStore.")
            self._me = name
        return self._me

    # -- checking -------------------------------------------------------------------------

    def _plan(self, op: Op, me: str) -> dict:
        if isinstance(op, GetOp):
            return self._where(ns.check_labels(op.namespace), ns.check_key(op.key), me)
        if isinstance(op, PutOp):
            return self._plan_put(op, me)
        if isinstance(op, SearchOp):
            return self._plan_search(op, me)
        if isinstance(op, ListNamespacesOp):
            return self._plan_list(op, me)
        raise InvalidValueError(f"unknown operation {type(op).__name__}; a store batch takes GetOp, "
                                "PutOp, SearchOp and ListNamespacesOp.")

    @staticmethod
    def _where(namespace: Namespace, key: str, me: str) -> dict:
        if not namespace:
            raise InvalidNamespaceError("namespace: cannot be empty.")
        canon = ns.canonical(namespace, me)
        return {"namespace": namespace, "key": key, "canon": canon, "scope": ns.scope_of(canon),
                "id": ns.doc_id(canon, key)}

    def _plan_put(self, op: PutOp, me: str) -> dict:
        namespace = ns.check_labels(op.namespace)
        if namespace and namespace[0] == "langgraph":
            raise InvalidNamespaceError(f"namespace {namespace!r}: the root label 'langgraph' is "
                                        "reserved by LangGraph.")
        plan = self._where(namespace, ns.check_key(op.key), me)
        if op.ttl is not None:
            raise NotImplementedError("TTL is not supported by OrgmemStore (memory documents keep "
                                      "their history); put with ttl=None.")
        if op.value is not None:
            value = ns.check_value(op.value)
            plan["doc"] = ns.document(plan["canon"], plan["key"], value, self.kind, self.tags)
        return plan

    @staticmethod
    def _plan_search(op: SearchOp, me: str) -> dict:
        prefix = ns.check_labels(op.namespace_prefix, "namespace_prefix")
        for name in ("limit", "offset"):
            value = getattr(op, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidValueError(f"{name}: a whole number from 0, not {value!r}.")
        if op.query is not None and not isinstance(op.query, str):
            raise InvalidValueError(f"query: a string, not {type(op.query).__name__}.")
        return {"prefix": prefix, "scope": ns.prefix_scope(prefix, me),
                "filter": ns.check_filter(op.filter)}

    @staticmethod
    def _plan_list(op: ListNamespacesOp, me: str) -> dict:
        conditions = tuple(ns.check_condition(c) for c in op.match_conditions or ())
        for name in ("limit", "offset"):
            value = getattr(op, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidValueError(f"{name}: a whole number from 0, not {value!r}.")
        depth = op.max_depth
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
            raise InvalidValueError(f"max_depth: a whole number from 1, not {depth!r}.")
        prefix = next((tuple(c.path) for c in conditions if c.match_type == "prefix"), ())
        return {"prefix": prefix, "scope": ns.prefix_scope(prefix, me)}

    # -- reading --------------------------------------------------------------------------

    @staticmethod
    def _found(doc: dict | None, plan: dict):
        if doc is None or doc.get("status") != "active":
            return None
        decoded = ns.decode(doc)
        if decoded is None or decoded[:2] != (plan["canon"], plan["key"]):
            return None
        return ns.item(doc, plan["namespace"], plan["key"], decoded[2])

    def _listing(self, scope: str | None, listings: dict):
        """The caller's active store documents in ``scope`` (all it may read when None),
        listed once per batch."""
        if scope not in listings:
            listings[scope] = (yield call("list_memory", scope=scope, tag=ns.TAG)) or []
        return listings[scope]

    def _visible(self, docs: list[dict], me: str, absolute: bool):
        """(document, namespace as shown, key, value) of each store document."""
        for doc in docs:
            decoded = ns.decode(doc)
            if decoded is not None and doc.get("status") == "active":
                canon, key, value = decoded
                yield doc, ns.present(canon, me, absolute), key, value

    def _search(self, op: SearchOp, plan: dict, me: str, listings: dict):
        if op.query:
            return (yield from self._ranked(op, plan, me))
        prefix, absolute = plan["prefix"], ns.is_absolute(plan["prefix"])
        docs = yield from self._listing(plan["scope"], listings)
        rows = [(doc, shown, key, value) for doc, shown, key, value in self._visible(docs, me, absolute)
                if shown[:len(prefix)] == prefix and ns.passes(value, plan["filter"])]
        rows.sort(key=lambda row: row[0].get("updated_at") or "", reverse=True)
        return [_hit(doc, shown, key, value, None)
                for doc, shown, key, value in rows[op.offset:op.offset + op.limit]]

    def _ranked(self, op: SearchOp, plan: dict, me: str):
        """Full-text ranked: the gateway's hits, read whole, kept when under the prefix and
        matching the filter, until offset + limit are found or the hits run out."""
        prefix, absolute = plan["prefix"], ns.is_absolute(plan["prefix"])
        want, found, seen, offset = op.offset + op.limit, [], set(), 0
        while len(found) < want and offset < MAX_SEARCH_OFFSET:
            answer = yield call("search", op.query, type="memory", scope=plan["scope"], tag=ns.TAG,
                                status="active", limit=SEARCH_PAGE, offset=offset)
            hits = [h for h in answer.get("hits", []) if (h.get("scope"), h.get("id")) not in seen]
            seen.update((h.get("scope"), h.get("id")) for h in hits)
            docs = yield [maybe("get_memory", h["scope"], h["id"]) for h in hits]
            for hit, doc in zip(hits, docs, strict=True):
                for _, shown, key, value in self._visible([doc] if doc else [], me, absolute):
                    if shown[:len(prefix)] == prefix and ns.passes(value, plan["filter"]):
                        found.append(_hit(doc, shown, key, value, hit.get("score")))
            offset += SEARCH_PAGE
            if offset >= int(answer.get("count") or 0):
                break
        return found[op.offset:want]

    def _namespaces(self, op: ListNamespacesOp, plan: dict, me: str, listings: dict):
        absolute = ns.is_absolute(plan["prefix"])
        docs = yield from self._listing(plan["scope"], listings)
        conditions = tuple(op.match_conditions or ())
        found = {shown for _, shown, _, _ in self._visible(docs, me, absolute)
                 if all(ns.matches(shown, c) for c in conditions)}
        if op.max_depth is not None:
            found = {shown[:op.max_depth] for shown in found}
        return sorted(found)[op.offset:op.offset + op.limit]

    # -- writing --------------------------------------------------------------------------

    @staticmethod
    def _write(plan: dict) -> Call:
        if "doc" in plan:
            return call("put_memory", plan["scope"], plan["id"], plan["doc"])
        # a delete retracts; an item that is absent or already retracted is simply gone
        return Call("retract_memory", (plan["scope"], plan["id"]), {}, tolerate=(NotFound, Conflict))


def _hit(doc: dict, namespace: Namespace, key: str, value: dict, score: float | None) -> SearchItem:
    item = ns.item(doc, namespace, key, value)
    return SearchItem(namespace=item.namespace, key=key, value=value, created_at=item.created_at,
                      updated_at=item.updated_at, score=score)
