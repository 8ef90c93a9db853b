"""The synchronous client: typed methods over the gateway's REST and S3 APIs.

    from orgmem import Client

    with Client() as om:                     # ORGMEM_ENDPOINT, ORGMEM_ACCESS_KEY, ORGMEM_SECRET_KEY
        om.log_event("run-42", "note", "started")          # batched in the background
        doc = om.get_memory("org", "release-train")
        om.put_memory("org", "release-train", {**doc, "body": "..."}, if_match=doc.etag)

One client is meant to be shared: its httpx connection pool and its event queue are safe to
use from many threads.  Every request is signed with SigV4, so the secret key never travels.
"""

from __future__ import annotations

import atexit
import functools
import logging
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from . import _events
from ._api import Api, SkillFiles, TimeArg
from ._batcher import Batcher
from ._files import Files
from ._http import Request, Response, Transport, drive
from .errors import OrgmemError
from .models import FileData, Memory

JSON = dict[str, Any]
log = logging.getLogger("orgmem")
#: How long the interpreter's exit waits for logged events to be sent.
EXIT_FLUSH_SECONDS = 10.0


def _flush_at_exit(ref: weakref.ref) -> None:
    client = ref()
    if client is None or client.closed:
        return
    try:
        client.close(timeout=EXIT_FLUSH_SECONDS)
    except OrgmemError as exc:
        log.warning("orgmem: logged events were not all stored at exit: %s", exc)


class Client:
    """A client of one orgmem gateway, as one principal.

    ``endpoint``, ``access_key`` and ``secret_key`` fall back to ORGMEM_ENDPOINT,
    ORGMEM_ACCESS_KEY and ORGMEM_SECRET_KEY (ORGMEM_CA_BUNDLE names a private CA for
    https).  Failures raise :class:`~orgmem.errors.OrgmemError` subclasses.
    """

    def __init__(self, endpoint: str | None = None, access_key: str | None = None,
                 secret_key: str | None = None, *, region: str = "us-east-1", timeout: float = 30,
                 ca_bundle: str | None = None) -> None:
        self._t = Transport(endpoint, access_key, secret_key, region, timeout, ca_bundle)
        self._http = httpx.Client(timeout=timeout, verify=self._t.verify(), follow_redirects=False)
        self._api = Api()
        self._files = Files()
        self._batcher = Batcher(self._send_batch)
        self.closed = False
        self._at_exit = functools.partial(_flush_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    def __repr__(self) -> str:
        return f"Client(endpoint={self._t.endpoint!r}, access_key={self._t.access_key!r})"

    @property
    def endpoint(self) -> str:
        return self._t.endpoint

    @property
    def access_key(self) -> str:
        return self._t.access_key

    # -- lifecycle ----------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Send what is still queued (raising if the gateway refused any of it), then close."""
        if self.closed:
            return
        try:
            self._batcher.close(timeout)
        finally:
            self.closed = True
            atexit.unregister(self._at_exit)
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transport ----------------------------------------------------------------------

    def _send(self, req: Request) -> Response:
        if self.closed:
            raise OrgmemError(0, "ClientClosed", "the client is closed")
        url, headers, body = self._t.prepare(req)
        try:
            answer = self._http.request(req.method, url, headers=headers, content=body or None)
        except httpx.TransportError as exc:
            raise self._t.unreachable(exc) from None
        return self._t.answer(answer.status_code, answer.headers, answer.content)

    def _run(self, op):
        return drive(op, self._send)

    def _send_batch(self, events: list[_events.Pending]) -> list[OrgmemError]:
        return self._run(self._api.send_batch(events))

    # -- identity -----------------------------------------------------------------------

    def whoami(self) -> JSON:
        """The caller: ``{"name", "kind", "teams", "policies", "is_root", ...}``."""
        return self._run(self._api.whoami())

    # -- biographies --------------------------------------------------------------------

    def log_event(self, session: str, kind: str, content: str | None = None, **fields: Any) -> str:
        """Queue an event for the background flusher and return its id at once.

        ``fields`` are the other event fields (role, tool, data, tags, parent_id, seq, agent,
        model, tokens_in, ...).  Events are sent every second or 500 at a time; ``flush()``
        waits for them and raises what the gateway refused.
        """
        event = _events.build_event(session, kind, content, fields)
        self._batcher.add(event)
        return event.event_id

    def flush(self, timeout: float | None = None) -> None:
        """Block until every event logged so far is stored; raise if the gateway refused any."""
        self._batcher.flush(timeout)

    def put_events(self, events: list[Mapping[str, Any]]) -> list[str]:
        """Store a batch now (all or nothing); the event ids, in order."""
        return self._run(self._api.put_events(events))

    def events(self, agent: str | None = None, session: str | None = None,
               kinds: str | Iterable[str] | None = None, since: TimeArg = None, until: TimeArg = None,
               limit: int | None = None) -> list[JSON]:
        """Events of ``agent`` (default: the caller), in time order, or in session order with
        ``session``; all that match, or the first ``limit``.  ``since``/``until`` take RFC 3339,
        unix seconds, a datetime or a duration back from now ("10m", "7d")."""
        return self._run(self._api.events(agent, session, kinds, since, until, limit))

    def sessions(self, agent: str | None = None) -> list[JSON]:
        """The agent's sessions with their times, counts and open questions."""
        return self._run(self._api.sessions(agent))

    # -- open memory --------------------------------------------------------------------

    def get_memory(self, scope: str, id: str, as_of: TimeArg = None) -> Memory:
        """A document (a dict, with ``.etag``); ``as_of`` for the version in force then."""
        return self._run(self._api.get_memory(scope, id, as_of))

    def put_memory(self, scope: str, id: str, doc: Mapping[str, Any], if_match: str | None = None,
                   create_only: bool = False) -> Memory:
        """Write a version.  ``if_match``: only over that ETag (else PreconditionFailed);
        ``create_only``: only if the document does not exist yet."""
        return self._run(self._api.put_memory(scope, id, doc, if_match, create_only))

    def supersede_memory(self, scope: str, id: str, new_doc: Mapping[str, Any],
                         if_match: str | None = None) -> Memory:
        """Replace a document by ``new_doc`` (which names its own ``id``); the new document."""
        return self._run(self._api.supersede_memory(scope, id, new_doc, if_match))

    def retract_memory(self, scope: str, id: str, if_match: str | None = None) -> Memory:
        """Mark a document retracted (its history is kept)."""
        return self._run(self._api.retract_memory(scope, id, if_match))

    def memory_history(self, scope: str, id: str) -> list[JSON]:
        """Every version of a document, oldest first."""
        return self._run(self._api.memory_history(scope, id))

    def list_memory(self, scope: str | None = None, kind: str | None = None, tag: str | None = None,
                    status: str | None = None, applies_to: str | None = None,
                    as_of: TimeArg = None) -> list[JSON]:
        """Documents the caller may read (status ``active`` unless given; ``any`` for all)."""
        return self._run(self._api.list_memory(scope, kind, tag, status, applies_to, as_of))

    def memory_for(self, agent: str | None = None) -> list[JSON]:
        """Every document in force that applies to ``agent`` (default: the caller)."""
        return self._run(self._api.memory_for(agent))

    def digest(self, agent: str | None = None) -> str:
        """The agent's MEMORY.md-style digest (Markdown, at most 16 KiB)."""
        return self._run(self._api.digest(agent))

    # -- search and context -------------------------------------------------------------

    def search(self, q: str, type: str | Iterable[str] | None = None, agent: str | None = None,
               session: str | None = None, scope: str | None = None, kind: str | None = None,
               since: TimeArg = None, until: TimeArg = None, limit: int = 10, offset: int = 0, *,
               status: str | None = None, tag: str | None = None, bucket: str | None = None) -> JSON:
        """Full-text search over what the caller may read: ``{"hits", "count", "took_ms", ...}``."""
        return self._run(self._api.search(q, type, agent, session, scope, kind, since, until,
                                                limit, offset, status, tag, bucket))

    def context(self, agent: str | None = None, session: str | None = None, query: str | None = None,
                budget_tokens: int = 2000) -> JSON:
        """A context pack for ``agent`` (default: the caller) within ``budget_tokens``."""
        return self._run(self._api.context(agent, session, query, budget_tokens))

    # -- vault --------------------------------------------------------------------------

    def get_secret(self, path: str, version: int | None = None) -> str | bytes:
        """A secret's value: ``str`` for text, ``bytes`` for binary values."""
        return self._run(self._api.get_secret(path, version))

    def put_secret(self, path: str, value: str | bytes, cas: int | None = None,
                   metadata: Mapping[str, str] | None = None) -> int:
        """Write a new version; its number.  ``cas=0`` creates only; ``cas=N`` writes only while
        version N is current (else PreconditionFailed)."""
        return self._run(self._api.put_secret(path, value, cas, metadata))

    def delete_secret(self, path: str) -> None:
        """Soft-delete the latest version (it can be undeleted with the CLI)."""
        return self._run(self._api.delete_secret(path))

    def list_secrets(self, prefix: str = "") -> list[JSON]:
        """Every secret below ``prefix`` (path, current_version, metadata, ...; never values)."""
        return self._run(self._api.list_secrets(prefix))

    # -- skills -------------------------------------------------------------------------

    def list_skills(self, scope: str | None = None, q: str | None = None) -> list[JSON]:
        """The latest version of every skill the caller may list (``q``: words to match)."""
        return self._run(self._api.list_skills(scope, q))

    def get_skill(self, scope: str | None, name: str, version: int | None = None) -> JSON:
        """A skill version's manifest; ``scope=None`` looks in the caller's own, teams', org's."""
        return self._run(self._api.get_skill(scope, name, version))

    def get_skill_file(self, scope: str | None, name: str, path: str,
                             version: int | None = None) -> bytes:
        """One file of a skill version."""
        return self._run(self._api.get_skill_file(scope, name, path, version))

    def put_skill(self, scope: str | None, name: str, files: SkillFiles,
                        executable: Iterable[str] = ()) -> JSON:
        """Publish a version from ``{path: content}`` (``executable`` names the runnable ones) or
        from a skill folder on disk; ``scope=None`` is the caller's own.  The new manifest."""
        return self._run(self._api.put_skill(scope, name, files, executable))

    # -- workspace files (S3) -----------------------------------------------------------

    def read_file(self, bucket: str, key: str) -> FileData:
        """An object's bytes (with ``.etag`` and ``.content_type``)."""
        return self._run(self._files.read_file(bucket, key))

    def write_file(self, bucket: str, key: str, data: bytes | str, content_type: str | None = None, *,
                   if_match: str | None = None, create_only: bool = False) -> str:
        """Store an object; its ETag.  ``if_match``/``create_only`` make the write conditional."""
        return self._run(self._files.write_file(bucket, key, data, content_type, if_match, create_only))

    def copy_file(self, src_bucket: str, src_key: str, dst_bucket: str, dst_key: str, *,
                  create_only: bool = False) -> str:
        """Copy an object on the gateway; the copy's ETag."""
        return self._run(self._files.copy_file(src_bucket, src_key, dst_bucket, dst_key, create_only))

    def delete_file(self, bucket: str, key: str) -> None:
        """Delete an object (no error if it was not there, as in S3)."""
        return self._run(self._files.delete_file(bucket, key))

    def list_files(self, bucket: str, prefix: str = "", delimiter: str | None = None) -> list[JSON]:
        """Objects under ``prefix``: ``{"key", "size", "etag", "last_modified"}``."""
        return self._run(self._files.list_files(bucket, prefix, delimiter))

    def create_bucket(self, bucket: str) -> bool:
        """Create a bucket; False when the caller already has it."""
        return self._run(self._files.create_bucket(bucket))

    def bucket_exists(self, bucket: str) -> bool:
        return self._run(self._files.bucket_exists(bucket))
