"""The open-memory service: versioned documents with compare-and-swap writes.

Handlers (REST, the ``memory`` S3 bucket, import/export) call this; it knows nothing of
HTTP or of policies (callers pass ``may_read`` filters).

Storage, in the internal bucket (``SCOPE`` is ``org``, ``teams/<t>`` or ``agents/<a>``)::

    memory/versions/SCOPE/ID/00000001.json   every version, immutable (written If-None-Match)
    memory/current/SCOPE/ID.json             a copy of the newest complete version (If-Match swap)
    memory/claims/SCOPE/<sha256>.json        who holds a normalized title+body (duplicates)

A write reads ``current`` (version n), writes version n+1 with If-None-Match (of two
writers exactly one gets n+1; the other gets 412 when it asked with If-Match, else retries
on top), then swaps ``current`` with If-Match. A writer that dies between the two leaves
version n+1 with ``current`` at n: the next writer rolls ``current`` forward to it first,
so no acknowledged version is lost and ``current`` never goes back. The ETag clients see
is the stored ``current`` object's. See ``gateway/memory/DESIGN.md``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import orjson

from ..log import DocChanged, DurableLog
from ..store.base import INTERNAL_BUCKET, ObjectStore, PreconditionFailed, WriteCondition
from ..store.objects import read_object, swap_condition, write_object
from . import documents as d
from .documents import DocumentError, Scope

PREFIX = "memory/"
CURRENT = PREFIX + "current/"
VERSIONS = PREFIX + "versions/"
CLAIMS = PREFIX + "claims/"
#: A duplicate claim whose document has not been written yet is honoured this long (seconds):
#: its writer is between claiming and writing. After that it is stale and may be taken over.
CLAIM_GRACE = 60.0
ATTEMPTS = 8
#: Immutable version documents kept in memory.
VERSION_CACHE = 4096

ReadFilter = Callable[[Scope, str], bool]


@dataclass
class Stored:
    """A document as stored: its parsed fields, its bytes and the ETag of ``current``."""

    scope: Scope
    id: str
    doc: dict
    data: bytes
    etag: str | None

    @property
    def version(self) -> int:
        return int(self.doc["version"])

    @property
    def ref(self) -> str:
        return f"{self.scope.arn_part}/{self.id}"


def current_key(scope: Scope, doc_id: str) -> str:
    return f"{CURRENT}{scope.path}/{doc_id}.json"


def version_key(scope: Scope, doc_id: str, n: int) -> str:
    return f"{VERSIONS}{scope.path}/{doc_id}/{n:08d}.json"


def claim_key(scope: Scope, fingerprint: str) -> str:
    return f"{CLAIMS}{scope.path}/{fingerprint}.json"


def split_current_key(key: str) -> tuple[Scope, str] | None:
    """``memory/current/teams/x/ID.json`` -> (team:x, ID); None for anything else."""
    if not key.startswith(CURRENT) or not key.endswith(".json"):
        return None
    path, _, name = key[len(CURRENT):-len(".json")].rpartition("/")
    try:
        return Scope.from_path(path), d.check_id(name)
    except DocumentError:
        return None


def _conflict(message: str, names: tuple[Scope, str] | None = None, hidden: str | None = None
              ) -> DocumentError:
    """A 409; one naming another document says ``hidden`` instead to a caller that may not
    read that document (see :class:`DocumentError`)."""
    return DocumentError(message, "Conflict", 409, names, hidden)


def _precondition(message: str) -> DocumentError:
    return DocumentError(message, "PreconditionFailed", 412)


def _busy() -> DocumentError:
    return DocumentError("The document kept changing while it was written; try again.", "SlowDown", 503)


class Memory:
    def __init__(self, store: ObjectStore, log: DurableLog | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.log = log
        self.clock = clock
        self._versions: OrderedDict[str, dict] = OrderedDict()
        self._current: dict[str, tuple[str, dict]] = {}
        self._lock = threading.Lock()

    # -- reading --------------------------------------------------------------------------

    def get(self, scope: Scope, doc_id: str) -> Stored | None:
        found = read_object(self.store, INTERNAL_BUCKET, current_key(scope, doc_id))
        if found is None:
            return None
        data, info = found
        return Stored(scope, doc_id, orjson.loads(data), data, info.etag)

    def require(self, scope: Scope, doc_id: str) -> Stored:
        stored = self.get(scope, doc_id)
        if stored is None:
            raise DocumentError(f"There is no memory document {scope}/{doc_id}.", "NoSuchDocument", 404)
        return stored

    def resolved(self, stored: Stored) -> dict:
        """The document as readers see it (a half-finished supersession counted as done)."""
        return self._resolve(stored.scope, stored.doc,
                             lambda s, i: (g.doc if (g := self.get(s, i)) else None))

    def version(self, scope: Scope, doc_id: str, n: int) -> dict | None:
        key = version_key(scope, doc_id, n)
        with self._lock:
            cached = self._versions.get(key)
            if cached is not None:
                self._versions.move_to_end(key)
                return cached
        found = read_object(self.store, INTERNAL_BUCKET, key)
        if found is None:
            return None
        doc = orjson.loads(found[0])
        with self._lock:
            self._versions[key] = doc
            while len(self._versions) > VERSION_CACHE:
                self._versions.popitem(last=False)
        return doc

    def history(self, scope: Scope, doc_id: str) -> list[dict]:
        """Every committed version, oldest first (a version a dead writer left beyond
        ``current`` is not committed until the next write rolls it forward)."""
        stored = self.require(scope, doc_id)
        out = []
        for n in range(1, stored.version + 1):
            doc = self.version(scope, doc_id, n)
            if doc is not None:
                out.append(doc)
        return out

    def _current_docs(self, scopes: Iterable[Scope] | None) -> list[tuple[Scope, str, dict, str]]:
        """(scope, id, doc, etag) of every current document of ``scopes`` (all when None)."""
        prefixes = [CURRENT] if scopes is None else [f"{CURRENT}{s.path}/" for s in scopes]
        out = []
        for prefix in prefixes:
            for key, etag in self._list(prefix):
                where = split_current_key(key)
                if where is None:
                    continue
                if scopes is not None and key.count("/") != prefix.count("/"):
                    continue  # org/ never holds a nested path, but be exact
                doc = self._cached_current(key, etag)
                if doc is not None:
                    out.append((where[0], where[1], doc, etag))
        return out

    def _list(self, prefix: str) -> Iterator[tuple[str, str]]:
        after = ""
        while True:
            page = self.store.list_objects(INTERNAL_BUCKET, prefix=prefix, after=after, limit=1000)
            for entry in page.entries:
                yield entry.key, entry.etag
            if not page.is_truncated or not page.next_marker:
                return
            after = page.next_marker

    def _cached_current(self, key: str, etag: str) -> dict | None:
        with self._lock:
            cached = self._current.get(key)
        if cached is not None and cached[0] == etag:
            return cached[1]
        found = read_object(self.store, INTERNAL_BUCKET, key)
        if found is None:
            return None
        doc = orjson.loads(found[0])
        with self._lock:
            self._current[key] = (found[1].etag, doc)
        return doc

    def listing(self, scopes: Iterable[Scope] | None, may_read: ReadFilter) -> list[Stored]:
        """Current documents (as stored, for the S3 view) the caller may read."""
        return [Stored(s, i, doc, b"", etag) for s, i, doc, etag in self._current_docs(scopes)
                if may_read(s, i)]

    def query(self, scopes: Iterable[Scope] | None, may_read: ReadFilter, *, kind: str | None = None,
              tag: str | None = None, status: str | None = "active", applies_to: str | None = None,
              teams_of: Callable[[str], tuple[str, ...]] | None = None,
              as_of: float | None = None) -> list[dict]:
        """Documents matching the filters. Without ``as_of``: current documents of ``status``
        (None: any). With ``as_of``: the documents in force at that time, each as it was then."""
        rows = [(s, i, doc) for s, i, doc, _ in self._current_docs(scopes) if may_read(s, i)]
        by_ref = {(s, i): doc for s, i, doc in rows}
        if as_of is None:
            docs = [self._resolve(s, doc, lambda sc, di: by_ref.get((sc, di))) for s, _, doc in rows]
            if status is not None:
                docs = [doc for doc in docs if doc["status"] == status]
        else:
            docs = []
            for s, i, doc in rows:
                then = self.in_force(s, i, doc, as_of)
                if then is not None and (status is None or status == "active" or then["status"] == status):
                    docs.append(then)
        if kind:
            docs = [doc for doc in docs if doc["kind"] == kind]
        if tag:
            docs = [doc for doc in docs if tag in doc.get("tags", [])]
        if applies_to:
            teams = teams_of(applies_to) if teams_of else ()
            docs = [doc for doc in docs if d.applies(doc, applies_to, teams)]
        return sorted(docs, key=lambda doc: (doc["scope"], doc["id"]))

    def for_agent(self, agent: str, teams: tuple[str, ...], may_read: ReadFilter,
                  now: float | None = None) -> list[dict]:
        """Every document in force now that applies to ``agent``: its own, its teams', the org's."""
        scopes = [Scope("org"), *(Scope("team", t) for t in teams), Scope("agent", agent)]
        ts = self.clock() if now is None else now
        rows = [(s, i, doc) for s, i, doc, _ in self._current_docs(scopes) if may_read(s, i)]
        out = []
        for s, i, doc in rows:
            then = self.in_force(s, i, doc, ts)
            if then is not None and d.applies(then, agent, teams):
                out.append(then)
        return out

    # -- change over time ------------------------------------------------------------------

    def at(self, scope: Scope, doc_id: str, current: dict, ts: float) -> dict | None:
        """The version that was current at ``ts`` (by when it was written), or None."""
        if d.parse_time(current["updated_at"]) <= ts:
            return current
        for n in range(int(current["version"]) - 1, 0, -1):
            doc = self.version(scope, doc_id, n)
            if doc is not None and d.parse_time(doc["updated_at"]) <= ts:
                return doc
        return None

    def in_force(self, scope: Scope, doc_id: str, current: dict, ts: float) -> dict | None:
        """The document as it was at ``ts`` if it was in force then: written by then, not
        retracted, and ``ts`` inside its validity window (a superseded version's ends
        where its successor's begins, so exactly one of the two is in force)."""
        then = self.at(scope, doc_id, current, ts)
        if then is None:
            return None

        def lookup(s: Scope, i: str) -> dict | None:
            cur = self.get(s, i)
            return self.at(s, i, cur.doc, ts) if cur is not None else None

        then = self._resolve(scope, then, lookup)
        if then["status"] == "retracted" or not d.valid_at(then, ts):
            return None
        return then

    @staticmethod
    def _resolve(scope: Scope, doc: dict, lookup: Callable[[Scope, str], dict | None]) -> dict:
        """A supersession is marked on the old document first (``superseded_by`` while still
        active), then the new one is written naming it in ``supersedes``, then the old one is
        marked superseded. Readers count the old one superseded as soon as the new one
        exists, so there is no moment in which both or neither are active."""
        successor = doc.get("superseded_by")
        if doc.get("status") != "active" or not successor:
            return doc
        new = lookup(scope, successor)
        if new is None or new.get("supersedes") != doc["id"]:
            return doc  # the supersession did not get as far as writing the new document
        return {**doc, "status": "superseded", "valid_until": _ended(doc, new.get("valid_from"))}

    # -- writing ---------------------------------------------------------------------------

    def put(self, by: str, scope: Scope, doc_id: str, body: bytes | dict, if_match: str | None = None,
            if_none_match: bool = False) -> Stored:
        """Create or replace a document (a new version). A body with ``supersedes`` supersedes."""
        d.check_id(doc_id)
        raw = d.parse_json(body) if isinstance(body, bytes) else body
        draft = d.validate(raw, scope, doc_id)
        target = draft.fields["supersedes"]
        if target:
            cur = self.get(scope, doc_id)
            if cur is None or cur.doc.get("supersedes") != target:  # a new supersession
                return self.supersede(by, scope, target, {**raw, "id": doc_id}, new_if_match=if_match,
                                      new_if_none_match=if_none_match)[0]
        return self._commit(scope, doc_id, by, lambda cur, now: self._updated(by, draft, cur, now),
                            if_match, if_none_match, claim=True)

    def _updated(self, by: str, draft: d.Draft, cur: Stored | None, now: float,
                 supersedes: str | None = None) -> dict:
        d.check_echoed(draft, cur.doc if cur else None)
        f = draft.fields
        if f["status"] not in (None, "active") and (cur is None or f["status"] != cur.doc["status"]):
            raise DocumentError(f"status: {f['status']!r} is set by superseding or retracting "
                                "(POST .../supersede, POST .../retract, or DELETE through S3), "
                                "not by a write.")
        if cur is not None:
            seen = self.resolved(cur)
            if seen["status"] == "superseded":
                raise _conflict(f"{cur.scope}/{cur.id} was superseded by {seen['superseded_by']}; "
                                "write that document instead.", (cur.scope, seen["superseded_by"]),
                                f"{cur.scope}/{cur.id} was superseded (by a document you may not "
                                "read); nothing was stored.")
        stamp = d.now_text(now)
        prior = cur.doc if cur is not None else {}
        valid_from = f["valid_from"] or prior.get("valid_from") or stamp
        if f["valid_until"] and d.parse_time(f["valid_until"]) <= d.parse_time(valid_from):
            raise DocumentError(f"valid_until: must be later than valid_from ({valid_from}"
                                f"{'' if f['valid_from'] else ', which defaults to now'}).")
        return {
            **f,
            "format": d.FORMAT,
            "decided_by": f["decided_by"] or by,
            "decided_at": f["decided_at"] or stamp,
            "valid_from": valid_from,
            "status": "active",
            "supersedes": supersedes or f["supersedes"] or prior.get("supersedes"),
            "superseded_by": None,
            "created_at": prior.get("created_at") or stamp,
            "created_by": prior.get("created_by") or by,
            "updated_at": stamp,
            "updated_by": by,
        }

    def supersede(self, by: str, scope: Scope, old_id: str, body: bytes | dict,
                  if_match: str | None = None, new_if_match: str | None = None,
                  new_if_none_match: bool = False) -> tuple[Stored, Stored]:
        """Replace ``old_id`` by the document in ``body`` (its ``id``, same scope).

        Three compare-and-swap writes, ordered so readers always see exactly one active:
        the old one gets ``superseded_by`` (still active), the new one is written active with
        ``supersedes``, the old one is marked superseded with ``valid_until``."""
        raw = d.parse_json(body) if isinstance(body, bytes) else dict(body)
        new_id = raw.get("id")
        if new_id is None:
            raise DocumentError("id: required: the id of the document that supersedes this one.")
        d.check_id(new_id)
        if raw.get("supersedes") not in (None, old_id):
            raise DocumentError(f"supersedes: the document says {raw['supersedes']!r} but supersedes "
                                f"{old_id!r} here.")
        raw["supersedes"] = old_id
        draft = d.validate(raw, scope, new_id)
        old = self.require(scope, old_id)
        seen = self.resolved(old)
        if seen["status"] != "active":
            raise _conflict(f"{scope}/{old_id} is {seen['status']}: only an active document can be "
                            "superseded.")
        if if_match is not None and old.etag != if_match:
            raise _precondition(f"If-Match: {scope}/{old_id} has changed (its ETag is now "
                                f"\"{old.etag}\").")
        now = self.clock()
        if not draft.fields["valid_from"]:
            draft.fields["valid_from"] = d.now_text(now)
        self._check_successor(by, draft, scope, new_id, old_id, now, new_if_match, new_if_none_match)

        def mark(cur: Stored | None, _now: float) -> dict:
            if cur is None or self.resolved(cur)["status"] != "active":
                raise _conflict(f"{scope}/{old_id} stopped being active while it was superseded.")
            pending = cur.doc.get("superseded_by")
            if pending and pending != new_id and _now - d.parse_time(cur.doc["updated_at"]) < CLAIM_GRACE:
                # another supersession is between its mark and its new document: two racing
                # supersessions must not leave two active successors (a dead one's mark expires)
                raise _conflict(f"{scope}/{old_id} is being superseded by {scope}/{pending}; "
                                "read it again once that is done.", (scope, pending),
                                f"{scope}/{old_id} is being superseded; read it again once that is done.")
            return {**cur.doc, "superseded_by": new_id, "updated_at": d.now_text(_now), "updated_by": by}

        pending = self._commit(scope, old_id, by, mark, old.etag if if_match else None, False)
        try:
            new = self._commit(scope, new_id, by,
                               lambda cur, _now: self._updated(by, draft, cur, _now, supersedes=old_id),
                               new_if_match, new_if_none_match, claim=True, claim_from=old_id)
        except Exception:
            try:  # undo the mark so the old one does not point at a document that never came
                self._commit(scope, old_id, by, lambda cur, _now: {
                    **cur.doc, "superseded_by": None, "updated_at": d.now_text(_now), "updated_by": by},
                    pending.etag, False)
            except Exception:  # noqa: BLE001 - readers ignore a mark whose successor is absent
                pass
            raise
        until = new.doc.get("valid_from") or draft.fields["valid_from"]

        def close(cur: Stored | None, _now: float) -> dict:
            assert cur is not None
            return {**cur.doc, "status": "superseded", "superseded_by": new_id,
                    "valid_until": _ended(cur.doc, until),
                    "updated_at": d.now_text(_now), "updated_by": by}

        done = self._commit(scope, old_id, by, close, None, False)
        return new, done

    def _check_successor(self, by: str, draft: d.Draft, scope: Scope, new_id: str, old_id: str,
                         now: float, if_match: str | None, if_none_match: bool) -> None:
        """Refuse up front (400, 409, 412) what writing the new document would refuse, before
        the old one is marked: a refused supersession leaves the old document untouched (its
        ETag too, so a corrected retry with the same If-Match works). A writer racing past
        this check is still caught by the write itself, and the mark is undone."""
        cur = self.get(scope, new_id)
        if if_none_match and cur is not None:
            raise _precondition(f"If-None-Match: {scope}/{new_id} already exists.")
        if if_match is not None and (cur is None or cur.etag != if_match):
            raise _precondition(f"If-Match: {scope}/{new_id} " + (
                "does not exist." if cur is None else f"has changed (its ETag is now \"{cur.etag}\")."))
        doc = self._updated(by, draft, cur, now, supersedes=old_id)
        fingerprint = d.fingerprint(doc)
        if cur is not None and cur.doc.get("status") == "active" and d.fingerprint(cur.doc) == fingerprint:
            return
        found = read_object(self.store, INTERNAL_BUCKET, claim_key(scope, fingerprint))
        if found is not None:
            holder = orjson.loads(found[0])
            if holder["id"] not in (new_id, old_id):
                self._check_holder(scope, fingerprint, holder)

    def retract(self, by: str, scope: Scope, doc_id: str, if_match: str | None = None) -> Stored:
        """Mark a document retracted (a new version; the history stays)."""
        def retracted(cur: Stored | None, now: float) -> dict:
            if cur is None:
                raise DocumentError(f"There is no memory document {scope}/{doc_id}.", "NoSuchDocument", 404)
            status = self.resolved(cur)["status"]
            if status != "active":
                raise _conflict(f"{scope}/{doc_id} is already {status}.")
            return {**cur.doc, "status": "retracted", "updated_at": d.now_text(now), "updated_by": by}

        return self._commit(scope, doc_id, by, retracted, if_match, False)

    # -- the compare-and-swap core ----------------------------------------------------------

    def _commit(self, scope: Scope, doc_id: str, by: str,
                build: Callable[[Stored | None, float], dict], if_match: str | None,
                if_none_match: bool, claim: bool = False, claim_from: str | None = None) -> Stored:
        for _ in range(ATTEMPTS):
            cur = self._rolled_forward(scope, doc_id)
            if if_none_match and cur is not None:
                raise _precondition(f"If-None-Match: {scope}/{doc_id} already exists.")
            if if_match is not None and (cur is None or cur.etag != if_match):
                raise _precondition(f"If-Match: {scope}/{doc_id} " + (
                    "does not exist." if cur is None else f"has changed (its ETag is now \"{cur.etag}\")."))
            now = self.clock()
            doc = build(cur, now)
            n = (cur.version if cur is not None else 0) + 1
            doc["version"] = n
            data = d.render(doc)
            if claim and not (cur is not None and cur.doc.get("status") == "active"
                              and d.fingerprint(cur.doc) == d.fingerprint(doc)):
                self._claim(scope, d.fingerprint(doc), doc_id, n, claim_from)
            try:
                write_object(self.store, INTERNAL_BUCKET, version_key(scope, doc_id, n), data,
                             "application/json", WriteCondition(if_none_match=True))
            except PreconditionFailed:
                if if_match is not None or if_none_match:
                    raise _precondition(f"{scope}/{doc_id} was changed by another writer.") from None
                continue  # another writer took version n; write on top of it
            etag = self._swap(scope, doc_id, cur, data, n)
            self._changed(scope, doc_id, n, etag, by, now)
            return Stored(scope, doc_id, orjson.loads(data), data, etag)
        raise _busy()

    def _swap(self, scope: Scope, doc_id: str, cur: Stored | None, data: bytes, n: int) -> str | None:
        """Make version n current. Should another writer have rolled ``current`` forward to
        it meanwhile, the version is committed all the same."""
        try:
            info = write_object(self.store, INTERNAL_BUCKET, current_key(scope, doc_id), data,
                                "application/json", swap_condition(cur.etag if cur else None))
            return info.etag
        except PreconditionFailed:
            now = self.get(scope, doc_id)
            if now is not None and now.version >= n:
                return now.etag if now.version == n else None
            raise _busy() from None

    def _rolled_forward(self, scope: Scope, doc_id: str) -> Stored | None:
        """``current``, after completing any version a writer wrote but did not make current."""
        cur = self.get(scope, doc_id)
        for _ in range(ATTEMPTS):
            n = (cur.version if cur is not None else 0) + 1
            found = read_object(self.store, INTERNAL_BUCKET, version_key(scope, doc_id, n))
            if found is None:
                return cur
            data = found[0]
            try:
                info = write_object(self.store, INTERNAL_BUCKET, current_key(scope, doc_id), data,
                                    "application/json", swap_condition(cur.etag if cur else None))
            except PreconditionFailed:
                cur = self.get(scope, doc_id)
                continue
            doc = orjson.loads(data)
            self._changed(scope, doc_id, n, info.etag, doc.get("updated_by"), self.clock())
            cur = Stored(scope, doc_id, doc, data, info.etag)
        raise _busy()

    def _changed(self, scope: Scope, doc_id: str, n: int, etag: str | None, by: str | None,
                 now: float) -> None:
        if self.log is not None:
            # named like the S3 key (scope path), as skills' notices are
            self.log.append([DocChanged("memory", f"{scope.path}/{doc_id}", "put", now, n, etag, by)])

    # -- duplicates -------------------------------------------------------------------------

    def _claim(self, scope: Scope, fingerprint: str, doc_id: str, n: int, replaces: str | None) -> None:
        """Hold ``fingerprint`` for ``doc_id`` in ``scope``, or 409 naming the active holder.

        A claim is created with If-None-Match and taken over with If-Match, so two writers of
        the same text never both succeed. A claim whose holder no longer has that text active
        (changed, retracted, superseded, or a write that failed) is stale and is taken over;
        one younger than CLAIM_GRACE whose holder has not reached the claimed version yet is
        a write in flight and is honoured."""
        key = claim_key(scope, fingerprint)
        mine = orjson.dumps({"id": doc_id, "version": n, "at": self.clock()})
        for _ in range(ATTEMPTS):
            found = read_object(self.store, INTERNAL_BUCKET, key)
            try:
                if found is None:
                    write_object(self.store, INTERNAL_BUCKET, key, mine, "application/json",
                                 WriteCondition(if_none_match=True))
                    return
                holder = orjson.loads(found[0])
                if holder["id"] != doc_id and holder["id"] != replaces:
                    self._check_holder(scope, fingerprint, holder)
                if holder["id"] == doc_id and int(holder["version"]) >= n:
                    return
                write_object(self.store, INTERNAL_BUCKET, key, mine, "application/json",
                             WriteCondition(if_match=found[1].etag))
                return
            except PreconditionFailed:
                continue
        raise _busy()

    def _check_holder(self, scope: Scope, fingerprint: str, holder: dict) -> None:
        """Raise 409 unless the claim ``holder`` is stale."""
        other = self.get(scope, holder["id"])
        if other is None or other.version < int(holder["version"]):
            if self.clock() - float(holder["at"]) < CLAIM_GRACE:
                raise _conflict(f"A document with the same title and body is being written as "
                                f"{scope}/{holder['id']}; update that one instead.", (scope, holder["id"]),
                                "A document you may not read in this scope has this title and body; "
                                "nothing was stored.")
            return
        seen = self.resolved(other)
        if seen["status"] == "active" and d.fingerprint(seen) == fingerprint:
            raise _conflict(f"duplicate of {scope}/{holder['id']}: an active document in {scope} already "
                            "has this title and body; update or supersede it instead.", (scope, holder["id"]),
                            "A document you may not read in this scope already has this title and body; "
                            "nothing was stored.")

    # -- import -----------------------------------------------------------------------------

    def restore(self, scope: Scope, doc_id: str, versions: list[dict]) -> tuple[int, int]:
        """Store exported versions as they were (provenance included); returns (written, skipped).

        Versions already present with the same content are skipped, so an interrupted import
        can be run again; a different version n already present is a 409."""
        d.check_id(doc_id)
        for v in versions:
            if not isinstance(v.get("version"), int) or isinstance(v.get("version"), bool):
                raise DocumentError(f"{scope}/{doc_id}: every exported version needs a whole-number "
                                    f"version, not {v.get('version')!r}.")
        versions = sorted(versions, key=lambda v: v["version"])
        for i, v in enumerate(versions, 1):
            if v.get("version") != i:
                raise DocumentError(f"{scope}/{doc_id}: versions must run 1, 2, 3...; version {i} "
                                    f"is {'missing' if v.get('version', 0) > i else 'repeated'}.")
            if v.get("id") != doc_id or v.get("scope") != str(scope):
                raise DocumentError(f"{scope}/{doc_id}: version {i} names {v.get('scope')}/{v.get('id')}.")
            check_imported(v)
        written = skipped = 0
        cur = self._rolled_forward(scope, doc_id)
        for v in versions:
            data = d.render(v)
            key = version_key(scope, doc_id, v["version"])
            try:
                write_object(self.store, INTERNAL_BUCKET, key, data, "application/json",
                             WriteCondition(if_none_match=True))
                written += 1
            except PreconditionFailed:
                existing = self.version(scope, doc_id, v["version"])
                if existing is None or d.render(existing) != data:
                    raise _conflict(f"{scope}/{doc_id} version {v['version']} already exists here with "
                                    "different content; import into an empty deployment or scope.") from None
                skipped += 1
        last = versions[-1]
        if cur is None or cur.version < last["version"]:
            etag = self._swap(scope, doc_id, cur, d.render(last), last["version"])
            if last.get("status") == "active":
                try:
                    self._claim(scope, d.fingerprint(last), doc_id, last["version"], None)
                except DocumentError:
                    pass  # two imported active duplicates: kept as exported
            self._changed(scope, doc_id, last["version"], etag, last.get("updated_by"), self.clock())
        return written, skipped


def check_imported(doc: dict) -> None:
    """An exported version: every field present, of the right type."""
    missing = [f for f in d.FIELDS if f not in doc]
    extra = sorted(set(doc) - set(d.FIELDS))
    if missing or extra:
        raise DocumentError(f"an exported version must have exactly the document fields; "
                            f"missing {missing}, unknown {extra}.")
    scope = Scope.parse(doc["scope"])
    writable = {k: doc[k] for k in d.WRITABLE}
    d.validate(writable, scope, doc["id"])
    for name in ("created_at", "updated_at"):
        d.parse_time(doc[name], name)
    if doc["status"] not in d.STATUSES or not isinstance(doc["version"], int):
        raise DocumentError("status or version of an exported version is not valid.")


def _ended(doc: dict, successor_from: str | None) -> str | None:
    """When a superseded document stops being in force: at its own end or when its successor
    starts, whichever is earlier (never both in force), and never before it began (a
    successor that starts first leaves it a window of nothing). Compared as times: imported
    documents may keep other spellings of them."""
    ends = [t for t in (doc.get("valid_until"), successor_from) if t]
    if not ends:
        return None
    end = min(ends, key=d.parse_time)
    began = doc.get("valid_from")
    return max(end, began, key=d.parse_time) if began else end
