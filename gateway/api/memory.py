"""The open-memory API (``/v1/memory``).

Thin: parse, check the per-document grants, call :class:`~gateway.memory.service.Memory`,
shape the JSON. Resources are ``arn:orgmem:memory:::org/ID``, ``.../team/T/ID`` and
``.../agent/A/ID``; SCOPE in a path is ``org``, ``team:T`` or ``agent:A``.

    PUT  /v1/memory/{scope}/{id}                 write a version (If-Match / If-None-Match: *)
    GET  /v1/memory/{scope}/{id}[?as_of=T]       the current document (ETag), or as it was at T
    GET  /v1/memory/{scope}/{id}/history         every version, oldest first
    GET  /v1/memory/{scope}/{id}/versions/{n}    one version
    POST /v1/memory/{scope}/{id}/supersede       body: the new document (with its id)
    POST /v1/memory/{scope}/{id}/retract         status retracted, history kept (memory:DeleteDocument)
    GET  /v1/memory?scope=&kind=&tag=&status=&applies_to=&as_of=
    GET  /v1/memory/for/{agent}[.md]             what applies to an agent now; .md: a bounded digest
    POST /v1/memory/import                       {"scope", "id", "versions": [...]}: an export, as is
"""

from __future__ import annotations

import time

from ..iam.audit import parse_since
from ..iam.identities import IdentityStore
from ..iam.model import IdentityError, check_name
from ..memory import digest
from ..memory import documents as d
from ..memory.documents import DocumentError, Scope
from ..memory.service import Memory, Stored
from .rest import ApiError, Call, PerItem, Reply, Router

ARN = "arn:orgmem:memory:::"
#: An import carries one document's versions (each at most MAX_DOCUMENT bytes).
MAX_IMPORT_BODY = 64 * 1024 * 1024
#: Importing writes provenance as exported, i.e. in other principals' names: it needs, besides
#: memory:PutDocument and memory:DeleteDocument on the document, the right to mint keys for any
#: agent (whoever has that can act as anyone already, so it grants nothing new).
IMPORT_GRANT = ("admin:CreateKey", "arn:orgmem:admin:::agent/*")


def arn(scope: Scope, doc_id: str) -> str:
    return f"{ARN}{scope.arn_part}/{doc_id}"


def add_routes(r: Router, memory: Memory, identities: IdentityStore) -> None:
    api = MemoryApi(memory, identities)
    doc = "/v1/memory/{scope}/{id}"
    body_limit = d.MAX_DOCUMENT + 64 * 1024
    r.add("GET", "/v1/memory", "ListDocuments", "memory:ListDocuments", api.list_arn, api.list_documents)
    r.add("GET", "/v1/memory/for/{agent}.md", "GetMemoryDigest", "memory:ListDocuments", api.agent_arn,
          api.digest)
    r.add("GET", "/v1/memory/for/{agent}", "ListMemoryForAgent", "memory:ListDocuments", api.agent_arn,
          api.for_agent)
    r.add("POST", "/v1/memory/import", "ImportDocument", "memory:PutDocument", api.import_arn,
          api.import_document, also=api.import_also, max_body=MAX_IMPORT_BODY)
    r.add("PUT", doc, "PutDocument", "memory:PutDocument", api.doc_arn, api.put, also=api.put_also,
          max_body=body_limit)
    r.add("GET", doc, "GetDocument", "memory:GetDocument", api.doc_arn, api.get)
    r.add("GET", doc + "/history", "GetHistory", "memory:GetHistory", api.doc_arn, api.history)
    r.add("GET", doc + "/versions/{n}", "GetDocumentVersion", "memory:GetHistory", api.doc_arn, api.version)
    r.add("POST", doc + "/supersede", "SupersedeDocument", "memory:PutDocument", api.doc_arn, api.supersede,
          also=api.supersede_also, max_body=body_limit)
    r.add("POST", doc + "/retract", "RetractDocument", "memory:DeleteDocument", api.doc_arn, api.retract)


def _scope(text: str | None) -> Scope:
    try:
        return Scope.parse(text)
    except DocumentError as exc:
        raise ApiError("InvalidArgument", str(exc)) from None


def _id(text: str) -> str:
    try:
        return d.check_id(text)
    except DocumentError as exc:
        raise ApiError("InvalidArgument", str(exc)) from None


#: The first and last second a document time can name (0001-01-01, 9999-12-31 UTC).
FIRST_SECOND, LAST_SECOND = -62135596800, 253402300799


def _time(value: str | None, name: str = "as_of") -> float | None:
    if not value:
        return None
    try:
        seconds = parse_since(value, time.time())
    except ValueError:
        raise ApiError("InvalidArgument", f"{name}: {value!r} is not a time; use RFC 3339 "
                       "(2026-03-02T09:30:00Z), unix seconds, or a duration back from now (7d).") from None
    if not FIRST_SECOND <= seconds <= LAST_SECOND:  # also false for nan
        raise ApiError("InvalidArgument", f"{name}: {value!r} is out of range; times run from "
                       "0001-01-01 to 9999-12-31 UTC.")
    return seconds


def _if_match(call: Call) -> str | None:
    value = call.headers.get("if-match")
    if value is None:
        return None
    return value.strip().removeprefix("W/").strip('"')


def _if_none_match(call: Call) -> bool:
    value = call.headers.get("if-none-match")
    if value is None:
        return False
    if value.strip() != "*":
        raise ApiError("NotImplemented", "If-None-Match on a write accepts only '*'.", 501)
    return True


def _reply(stored: Stored, doc: dict | None = None, status: int = 200) -> Reply:
    headers = [("etag", f'"{stored.etag}"')] if stored.etag else []
    return Reply(status, doc if doc is not None else stored.doc, headers=headers)


class MemoryApi:
    def __init__(self, memory: Memory, identities: IdentityStore) -> None:
        self.memory = memory
        self.identities = identities

    # -- resources --------------------------------------------------------------

    def _where(self, call: Call) -> tuple[Scope, str]:
        return _scope(call.params["scope"]), _id(call.params["id"])

    def doc_arn(self, call: Call) -> str:
        return arn(*self._where(call))

    def _body(self, call: Call) -> dict:
        raw = call.state.get("doc")
        if raw is None:
            try:
                raw = d.parse_json(call.body)
            except DocumentError as exc:
                raise ApiError(exc.code, f"{str(exc).rstrip('.')}; nothing was stored.", exc.status) from None
            call.state["doc"] = raw
        return raw

    def put_also(self, call: Call) -> list[tuple[str, str]]:
        old = self._body(call).get("supersedes")
        if isinstance(old, str) and d.ID_RE.match(old):
            return [("memory:PutDocument", arn(_scope(call.params["scope"]), old))]
        return []

    def supersede_also(self, call: Call) -> list[tuple[str, str]]:
        new = self._body(call).get("id")
        if not isinstance(new, str) or not d.ID_RE.match(new):
            raise ApiError("InvalidDocument", "id: required: the id of the document that supersedes this "
                           "one (1 to 128 lowercase letters, digits and hyphens); nothing was stored.")
        return [("memory:PutDocument", arn(_scope(call.params["scope"]), new))]

    def list_arn(self, call: Call) -> str:
        scope = call.query.get("scope")
        return PerItem(f"{ARN}{_scope(scope).arn_part}/*" if scope else f"{ARN}*")

    def agent_arn(self, call: Call) -> str:
        return f"{ARN}agent/{self._agent(call)}/*"

    def import_arn(self, call: Call) -> str:
        body = self._import_body(call)
        return arn(body[0], body[1])

    def import_also(self, call: Call) -> list[tuple[str, str]]:
        scope, doc_id, _ = self._import_body(call)
        return [("memory:DeleteDocument", arn(scope, doc_id)), IMPORT_GRANT]

    # -- writing ----------------------------------------------------------------

    def _may_read(self, call: Call, *also: str):
        """Per document: ``memory:GetDocument`` and the ``also`` actions (a listing needs
        ``memory:ListDocuments`` on each, an ``as_of`` read ``memory:GetHistory``)."""
        actions = ("memory:GetDocument", *also)
        return lambda scope, doc_id: all(call.permits(a, arn(scope, doc_id)) for a in actions)

    def put(self, call: Call) -> Reply:
        scope, doc_id = self._where(call)
        existed = self.memory.get(scope, doc_id) is not None
        stored = self._saying_nothing_stored(call, lambda: self.memory.put(
            call.principal.name, scope, doc_id, self._body(call), _if_match(call), _if_none_match(call)))
        return _reply(stored, status=200 if existed else 201)

    def supersede(self, call: Call) -> Reply:
        scope, doc_id = self._where(call)
        new, old = self._saying_nothing_stored(call, lambda: self.memory.supersede(
            call.principal.name, scope, doc_id, self._body(call), if_match=_if_match(call)))
        return _reply(new, {"document": new.doc, "superseded": old.doc}, status=201)

    def retract(self, call: Call) -> Reply:
        scope, doc_id = self._where(call)
        return _reply(self.memory.retract(call.principal.name, scope, doc_id, _if_match(call)))

    @staticmethod
    def _saying_nothing_stored(call: Call, action):
        try:
            return action()
        except DocumentError as exc:
            if exc.status in (400, 413):
                raise ApiError(exc.code, f"{str(exc).rstrip('.')}; nothing was stored.", exc.status) from None
            if exc.names is not None and not call.permits("memory:GetDocument", arn(*exc.names)):
                raise ApiError(exc.code, exc.hidden, exc.status) from None
            raise

    # -- reading ----------------------------------------------------------------

    def get(self, call: Call) -> Reply:
        scope, doc_id = self._where(call)
        stored = self.memory.require(scope, doc_id)
        as_of = _time(call.query.get("as_of"))
        if as_of is None:
            return _reply(stored, self.memory.resolved(stored))
        if not call.permits("memory:GetHistory", arn(scope, doc_id)):  # an earlier version is history
            raise ApiError("AccessDenied", f"Reading {scope}/{doc_id} as it was needs memory:GetHistory "
                           f"on {arn(scope, doc_id)}.", 403)
        then = self.memory.in_force(scope, doc_id, stored.doc, as_of)
        if then is None:
            raise ApiError("NoSuchDocument", f"{scope}/{doc_id} was not in force at "
                           f"{d.now_text(as_of)}.", 404)
        return Reply(200, then)

    def history(self, call: Call) -> Reply:
        scope, doc_id = self._where(call)
        return Reply(200, {"scope": str(scope), "id": doc_id, "versions": self.memory.history(scope, doc_id)})

    def version(self, call: Call) -> Reply:
        scope, doc_id = self._where(call)
        n = call.params["n"]
        if not (n.isascii() and n.isdigit()) or int(n) < 1:
            raise ApiError("InvalidArgument", "version: a whole number from 1.")
        current = self.memory.require(scope, doc_id)
        doc = self.memory.version(scope, doc_id, int(n)) if int(n) <= current.version else None
        if doc is None:
            raise ApiError("NoSuchVersion", f"{scope}/{doc_id} has versions 1 to {current.version}.", 404)
        return Reply(200, doc)

    def list_documents(self, call: Call) -> Reply:
        q = call.query
        scopes = [_scope(q["scope"])] if q.get("scope") else None
        kind = q.get("kind") or None
        if kind is not None and kind not in d.KINDS:
            raise ApiError("InvalidArgument", f"kind: use one of {', '.join(d.KINDS)}.")
        status = q.get("status") or "active"
        if status not in (*d.STATUSES, "any"):
            raise ApiError("InvalidArgument", f"status: use one of {', '.join(d.STATUSES)} or any.")
        applies_to = q.get("applies_to") or None
        if applies_to is not None:
            self._checked_agent(applies_to)
        as_of = _time(q.get("as_of"))
        may_read = self._may_read(call, "memory:ListDocuments",
                                  *(("memory:GetHistory",) if as_of is not None else ()))
        docs = self.memory.query(scopes, may_read, kind=kind, tag=q.get("tag") or None,
                                 status=None if status == "any" else status, applies_to=applies_to,
                                 teams_of=self._teams, as_of=as_of)
        return Reply(200, {"documents": docs, "count": len(docs)})

    def _agent(self, call: Call) -> str:
        return self._checked_agent(call.params["agent"])

    @staticmethod
    def _checked_agent(agent: str) -> str:
        try:
            check_name("agent", agent)
        except IdentityError as exc:
            raise ApiError("InvalidArgument", str(exc)) from None
        return agent

    def _teams(self, agent: str) -> tuple[str, ...]:
        try:
            return tuple(self.identities.principal(agent).teams)
        except Exception:  # noqa: BLE001 - an unknown agent belongs to no team
            return ()

    def _applying(self, call: Call) -> tuple[str, tuple[str, ...], list[dict]]:
        agent = self._agent(call)
        teams = self._teams(agent)
        docs = self.memory.for_agent(agent, teams, self._may_read(call, "memory:ListDocuments"))
        return agent, teams, docs

    def for_agent(self, call: Call) -> Reply:
        agent, teams, docs = self._applying(call)
        docs.sort(key=lambda doc: (doc["scope"], doc["id"]))
        return Reply(200, {"agent": agent, "teams": list(teams), "documents": docs, "count": len(docs)})

    def digest(self, call: Call) -> Reply:
        agent, teams, docs = self._applying(call)
        text = digest.render(agent, teams, docs, d.now_text(time.time())[:19] + "Z")
        return Reply(200, raw=text.encode(), content_type="text/markdown; charset=utf-8")

    # -- import -----------------------------------------------------------------

    def _import_body(self, call: Call) -> tuple[Scope, str, list[dict]]:
        found = call.state.get("import")
        if found is None:
            body = call.json()
            versions = body.get("versions") if isinstance(body, dict) else None
            if not isinstance(versions, list) or not versions:
                raise ApiError("InvalidRequest", "An import is {\"scope\", \"id\", \"versions\": [...]}: "
                               "the exported versions of one document.")
            found = (_scope(body.get("scope")), _id(body.get("id")), body["versions"])
            call.state["import"] = found
        return found

    def import_document(self, call: Call) -> Reply:
        scope, doc_id, versions = self._import_body(call)
        for v in versions:
            if not isinstance(v, dict):
                raise ApiError("InvalidDocument", "every version must be a JSON object.")
        written, skipped = self._saying_nothing_stored(
            call, lambda: self.memory.restore(scope, doc_id, versions))
        return Reply(200, {"scope": str(scope), "id": doc_id, "written": written, "skipped": skipped})
