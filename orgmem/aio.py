"""The asyncio client: the same methods as :class:`~orgmem.Client`, as coroutines.

    from orgmem import AsyncClient

    async with AsyncClient() as om:
        await om.log_event("run-42", "note", "started")    # queued; a task sends it
        hits = await om.search("release train", type="memory")

The operations are the sync client's own (``_api``, ``_files``), driven over
``httpx.AsyncClient``; one client is safe to share between tasks of its event loop.  The
background flusher is a task on the loop of the first ``log_event``: close the client
(``await om.close()`` or ``async with``) so it sends what is queued.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from . import _events
from ._abatcher import AsyncBatcher
from ._api import Api, SkillFiles, TimeArg
from ._files import Files
from ._http import Request, Response, Transport, adrive
from .errors import OrgmemError
from .models import FileData, Memory

JSON = dict[str, Any]


class AsyncClient:
    """An asyncio client of one orgmem gateway, as one principal (see :class:`orgmem.Client`)."""

    def __init__(self, endpoint: str | None = None, access_key: str | None = None,
                 secret_key: str | None = None, *, region: str = "us-east-1", timeout: float = 30,
                 ca_bundle: str | None = None, transport: httpx.AsyncBaseTransport | None = None) -> None:
        """``transport`` replaces the network (e.g. ``httpx.ASGITransport`` for a gateway in the
        same process); requests are signed and checked exactly as over TCP."""
        self._t = Transport(endpoint, access_key, secret_key, region, timeout, ca_bundle)
        if transport is not None:
            self._http = httpx.AsyncClient(timeout=timeout, transport=transport, trust_env=False,
                                           follow_redirects=False)
        else:
            self._http = httpx.AsyncClient(timeout=timeout, verify=self._t.verify(), follow_redirects=False)
        self._api = Api()
        self._files = Files()
        self._batcher = AsyncBatcher(self._send_batch)
        self.closed = False

    def __repr__(self) -> str:
        return f"AsyncClient(endpoint={self._t.endpoint!r}, access_key={self._t.access_key!r})"

    @property
    def endpoint(self) -> str:
        return self._t.endpoint

    @property
    def access_key(self) -> str:
        return self._t.access_key

    # -- lifecycle ----------------------------------------------------------------------

    async def close(self, timeout: float | None = None) -> None:
        """Send what is still queued (raising if the gateway refused any of it), then close."""
        if self.closed:
            return
        try:
            await self._batcher.close(timeout)
        finally:
            self.closed = True
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- transport ----------------------------------------------------------------------

    async def _send(self, req: Request) -> Response:
        if self.closed:
            raise OrgmemError(0, "ClientClosed", "the client is closed")
        url, headers, body = self._t.prepare(req)
        try:
            answer = await self._http.request(req.method, url, headers=headers, content=body or None)
        except httpx.TransportError as exc:
            raise self._t.unreachable(exc) from None
        return self._t.answer(answer.status_code, answer.headers, answer.content)

    async def _run(self, op):
        return await adrive(op, self._send)

    async def _send_batch(self, events: list[_events.Pending]) -> list[OrgmemError]:
        return await self._run(self._api.send_batch(events))

    # -- identity -----------------------------------------------------------------------

    async def whoami(self) -> JSON:
        """The caller: ``{"name", "kind", "teams", "policies", "is_root", ...}``."""
        return await self._run(self._api.whoami())

    # -- biographies --------------------------------------------------------------------

    async def log_event(self, session: str, kind: str, content: str | None = None, **fields: Any) -> str:
        """Queue an event for the background flusher and return its id at once.

        ``fields`` are the other event fields (role, tool, data, tags, parent_id, seq, agent,
        model, tokens_in, ...).  Events are sent every second or 500 at a time; ``flush()``
        waits for them and raises what the gateway refused.
        """
        event = _events.build_event(session, kind, content, fields)
        await self._batcher.add(event)
        return event.event_id

    async def flush(self, timeout: float | None = None) -> None:
        """Block until every event logged so far is stored; raise if the gateway refused any."""
        await self._batcher.flush(timeout)

    async def put_events(self, events: list[Mapping[str, Any]]) -> list[str]:
        """Store a batch now (all or nothing); the event ids, in order."""
        return await self._run(self._api.put_events(events))

    async def events(self, agent: str | None = None, session: str | None = None,
               kinds: str | Iterable[str] | None = None, since: TimeArg = None, until: TimeArg = None,
               limit: int | None = None) -> list[JSON]:
        """Events of ``agent`` (default: the caller), in time order, or in session order with
        ``session``; all that match, or the first ``limit``.  ``since``/``until`` take RFC 3339,
        unix seconds, a datetime or a duration back from now ("10m", "7d")."""
        return await self._run(self._api.events(agent, session, kinds, since, until, limit))

    async def sessions(self, agent: str | None = None) -> list[JSON]:
        """The agent's sessions with their times, counts and open questions."""
        return await self._run(self._api.sessions(agent))

    # -- open memory --------------------------------------------------------------------

    async def get_memory(self, scope: str, id: str, as_of: TimeArg = None) -> Memory:
        """A document (a dict, with ``.etag``); ``as_of`` for the version in force then."""
        return await self._run(self._api.get_memory(scope, id, as_of))

    async def put_memory(self, scope: str, id: str, doc: Mapping[str, Any], if_match: str | None = None,
                   create_only: bool = False) -> Memory:
        """Write a version.  ``if_match``: only over that ETag (else PreconditionFailed);
        ``create_only``: only if the document does not exist yet."""
        return await self._run(self._api.put_memory(scope, id, doc, if_match, create_only))

    async def supersede_memory(self, scope: str, id: str, new_doc: Mapping[str, Any],
                         if_match: str | None = None) -> Memory:
        """Replace a document by ``new_doc`` (which names its own ``id``); the new document."""
        return await self._run(self._api.supersede_memory(scope, id, new_doc, if_match))

    async def retract_memory(self, scope: str, id: str, if_match: str | None = None) -> Memory:
        """Mark a document retracted (its history is kept)."""
        return await self._run(self._api.retract_memory(scope, id, if_match))

    async def memory_history(self, scope: str, id: str) -> list[JSON]:
        """Every version of a document, oldest first."""
        return await self._run(self._api.memory_history(scope, id))

    async def list_memory(self, scope: str | None = None, kind: str | None = None, tag: str | None = None,
                    status: str | None = None, applies_to: str | None = None,
                    as_of: TimeArg = None) -> list[JSON]:
        """Documents the caller may read (status ``active`` unless given; ``any`` for all)."""
        return await self._run(self._api.list_memory(scope, kind, tag, status, applies_to, as_of))

    async def memory_for(self, agent: str | None = None) -> list[JSON]:
        """Every document in force that applies to ``agent`` (default: the caller)."""
        return await self._run(self._api.memory_for(agent))

    async def digest(self, agent: str | None = None) -> str:
        """The agent's MEMORY.md-style digest (Markdown, at most 16 KiB)."""
        return await self._run(self._api.digest(agent))

    # -- search and context -------------------------------------------------------------

    async def search(self, q: str, type: str | Iterable[str] | None = None, agent: str | None = None,
               session: str | None = None, scope: str | None = None, kind: str | None = None,
               since: TimeArg = None, until: TimeArg = None, limit: int = 10, offset: int = 0, *,
               status: str | None = None, tag: str | None = None, bucket: str | None = None) -> JSON:
        """Full-text search over what the caller may read: ``{"hits", "count", "took_ms", ...}``."""
        return await self._run(self._api.search(q, type, agent, session, scope, kind, since, until,
                                                limit, offset, status, tag, bucket))

    async def context(self, agent: str | None = None, session: str | None = None, query: str | None = None,
                budget_tokens: int = 2000) -> JSON:
        """A context pack for ``agent`` (default: the caller) within ``budget_tokens``."""
        return await self._run(self._api.context(agent, session, query, budget_tokens))

    # -- vault --------------------------------------------------------------------------

    async def get_secret(self, path: str, version: int | None = None) -> str | bytes:
        """A secret's value: ``str`` for text, ``bytes`` for binary values."""
        return await self._run(self._api.get_secret(path, version))

    async def put_secret(self, path: str, value: str | bytes, cas: int | None = None,
                   metadata: Mapping[str, str] | None = None) -> int:
        """Write a new version; its number.  ``cas=0`` creates only; ``cas=N`` writes only while
        version N is current (else PreconditionFailed)."""
        return await self._run(self._api.put_secret(path, value, cas, metadata))

    async def delete_secret(self, path: str) -> None:
        """Soft-delete the latest version (it can be undeleted with the CLI)."""
        return await self._run(self._api.delete_secret(path))

    async def list_secrets(self, prefix: str = "") -> list[JSON]:
        """Every secret below ``prefix`` (path, current_version, metadata, ...; never values)."""
        return await self._run(self._api.list_secrets(prefix))

    # -- skills -------------------------------------------------------------------------

    async def list_skills(self, scope: str | None = None, q: str | None = None) -> list[JSON]:
        """The latest version of every skill the caller may list (``q``: words to match)."""
        return await self._run(self._api.list_skills(scope, q))

    async def get_skill(self, scope: str | None, name: str, version: int | None = None) -> JSON:
        """A skill version's manifest; ``scope=None`` looks in the caller's own, teams', org's."""
        return await self._run(self._api.get_skill(scope, name, version))

    async def get_skill_file(self, scope: str | None, name: str, path: str,
                                   version: int | None = None) -> bytes:
        """One file of a skill version."""
        return await self._run(self._api.get_skill_file(scope, name, path, version))

    async def put_skill(self, scope: str | None, name: str, files: SkillFiles,
                              executable: Iterable[str] = ()) -> JSON:
        """Publish a version from ``{path: content}`` (``executable`` names the runnable ones) or
        from a skill folder on disk; ``scope=None`` is the caller's own.  The new manifest."""
        return await self._run(self._api.put_skill(scope, name, files, executable))

    # -- workspace files (S3) -----------------------------------------------------------

    async def read_file(self, bucket: str, key: str) -> FileData:
        """An object's bytes (with ``.etag`` and ``.content_type``)."""
        return await self._run(self._files.read_file(bucket, key))

    async def write_file(self, bucket: str, key: str, data: bytes | str, content_type: str | None = None, *,
                   if_match: str | None = None, create_only: bool = False) -> str:
        """Store an object; its ETag.  ``if_match``/``create_only`` make the write conditional."""
        return await self._run(self._files.write_file(bucket, key, data, content_type, if_match, create_only))

    async def copy_file(self, src_bucket: str, src_key: str, dst_bucket: str, dst_key: str, *,
                  create_only: bool = False) -> str:
        """Copy an object on the gateway; the copy's ETag."""
        return await self._run(self._files.copy_file(src_bucket, src_key, dst_bucket, dst_key, create_only))

    async def delete_file(self, bucket: str, key: str) -> None:
        """Delete an object (no error if it was not there, as in S3)."""
        return await self._run(self._files.delete_file(bucket, key))

    async def list_files(self, bucket: str, prefix: str = "", delimiter: str | None = None) -> list[JSON]:
        """Objects under ``prefix``: ``{"key", "size", "etag", "last_modified"}``."""
        return await self._run(self._files.list_files(bucket, prefix, delimiter))

    async def create_bucket(self, bucket: str) -> bool:
        """Create a bucket; False when the caller already has it."""
        return await self._run(self._files.create_bucket(bucket))

    async def bucket_exists(self, bucket: str) -> bool:
        return await self._run(self._files.bucket_exists(bucket))
