"""Builds the gateway's ASGI application from a Config: wires store, auth and protocols."""

from __future__ import annotations

import asyncio
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from indexer.writer import BACKGROUND_NICE

from .api import bio as bio_api
from .api import context as context_api
from .api import memory as memory_api
from .api import search as search_api
from .api import skills as skills_api
from .api import traces as traces_api
from .api import vault as vault_api
from .api.admin import PREFIX as ADMIN_PREFIX
from .api.admin import build_router
from .api.rest import RestApp
from .biography.service import Biographies
from .biography.stream import BioStream
from .config import Config
from .context import ContextPacks, teams_of
from .iam.audit import AuditLog
from .iam.audit_stream import AuditStream
from .iam.authn import Authenticator
from .iam.authz import Authorizer
from .iam.identities import IdentityStore
from .iam.principals import RootCredentials
from .indexing import COMMIT_INTERVAL as INDEX_INTERVAL
from .indexing import CONSUMER as INDEXER
from .indexing import SearchIndex
from .log import DurableLog
from .log.lease import TTL as LEASE_TTL
from .log.lease import Lease
from .logs import log
from .mcp.endpoint import McpEndpoint, is_mcp
from .memory.service import Memory
from .memory.skills import Skills
from .metrics import Metrics
from .recorder import Recorder
from .rotation import KeyRotation
from .s3.context import S3Context
from .s3.server import S3App
from .sealing import seal
from .search.entries import Sources
from .search.tokens import AccessTokens
from .secret_store.service import Secrets
from .segments.compactor import CONSUMER as COMPACTOR
from .segments.compactor import Compactor
from .segments.files import SegmentFiles
from .store.base import ObjectStore, StoreError
from .store.local import LocalStore

#: REST routes of the data services (/v1/events ...): "v1" can never be a bucket name.
REST_PREFIX = "/v1/"
#: How often abandoned multipart uploads are looked for.
UPLOAD_SWEEP_SECONDS = 3600
#: How often the identities document is checked for changes made by other gateways.
IDENTITY_REFRESH_SECONDS = 1.0
#: How often the vault's values (redacted from biographies) are checked for changes made by
#: other gateways; this gateway's own writes take effect at once.
SECRET_REFRESH_SECONDS = 5.0


@dataclass
class Gateway:
    """The whole ASGI application: health probes, the S3 protocol, background upkeep."""

    config: Config
    store: ObjectStore
    s3: S3App
    rest: RestApp
    identities: IdentityStore
    audit: AuditLog
    executor: ThreadPoolExecutor
    durable_log: DurableLog
    biographies: Biographies
    search_index: SearchIndex
    secrets: Secrets

    @cached_property
    def compaction_lease(self) -> Lease:
        """Replicas sharing a bucket compact in turn: whoever holds this lease."""
        return Lease(self.store, COMPACTOR, self.durable_log.writer_id,
                     ttl=max(LEASE_TTL, 3.0 * self.config.compact_interval))

    @cached_property
    def compaction_thread(self) -> ThreadPoolExecutor:
        """The thread background compactions run in, below requests in CPU priority: on a
        saturated machine a burst of ingest takes the CPU first, and compaction catches up
        after (as the search index's process does). Its Python is brief (a run's tables are
        made and grouped by Arrow) and it keeps off Arrow's thread pool, whose threads would
        inherit its priority; what it runs long is Arrow and Parquet code that lets go of
        the interpreter lock, so a request thread rarely waits on it for the lock."""
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="orgmem-compactor",
                                  initializer=_background_priority)

    @cached_property
    def mcp(self) -> McpEndpoint:
        """/mcp: the memory as MCP tools, called as the bearer token's principal."""
        return McpEndpoint(self.rest.authenticator, self.rest.recorder, self)

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            path = scope["path"]
            if path in ("/health", "/ready") and scope["method"] in ("GET", "HEAD") \
                    and not scope.get("query_string"):
                await self._probe(path, send)
            elif is_mcp(scope) and not self._creates_bucket(scope) and not self._names_bucket(scope):
                await self.mcp(scope, receive, send)
            elif (path.startswith(ADMIN_PREFIX + "/") or path.startswith(REST_PREFIX)
                  or path == "/metrics" and not self._creates_bucket(scope)) \
                    and not self._names_bucket(scope):
                await self.rest(scope, receive, send)
            else:
                await self.s3(scope, receive, send)

    @staticmethod
    def _creates_bucket(scope: dict) -> bool:
        """``PUT /mcp`` or ``PUT /metrics``: a CreateBucket of a reserved name, which the S3
        layer refuses as such (neither endpoint takes a PUT)."""
        return scope["method"] == "PUT"

    def _names_bucket(self, scope: dict) -> bool:
        """With --domain, BUCKET.domain/metrics is an object key, not the gateway's own path."""
        if not self.s3.domain:
            return False
        host = next((v for k, v in scope["headers"] if k == b"host"), b"").decode("latin-1")
        return self.s3.host_bucket(host) is not None

    async def _probe(self, path: str, send) -> None:
        status, body = 200, {"status": "ok"}
        if path == "/ready":
            try:
                await asyncio.get_running_loop().run_in_executor(self.executor, self.store.check)
                body = {"status": "ready", "store": "reachable"}
            except StoreError as exc:
                status, body = 503, {"status": "unavailable", "store": exc.message}
        data = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    async def _lifespan(self, receive, send) -> None:
        sweeper = None
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.audit.start()
                self.durable_log.start()
                sweeper = asyncio.gather(self._sweep_uploads(), self._flush_logs(),
                                         self._refresh_identities(), self._compact(), self._index(),
                                         self._refresh_secrets())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if sweeper:
                    sweeper.cancel()
                    await asyncio.gather(sweeper, return_exceptions=True)
                await self.mcp.stop()
                self.executor.shutdown(wait=True, cancel_futures=True)
                self.compaction_thread.shutdown(wait=True, cancel_futures=True)
                self.biographies.close()
                self.durable_log.close()
                self._close_index()
                self._release_lease()
                self.audit.close()
                self.store.close()
                log.info("stopped")
                log.flush()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _flush_logs(self) -> None:
        while True:
            await asyncio.sleep(1)
            log.flush()

    async def _refresh_identities(self) -> None:
        """Pick up principals, keys and policies changed by other gateways on the same bucket."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(IDENTITY_REFRESH_SECONDS)
            try:
                await loop.run_in_executor(self.executor, self.identities.refresh)
            except Exception as exc:  # noqa: BLE001 - keep serving with what we have
                log.warning("identities_refresh_failed", error=exc.__class__.__name__)

    async def _refresh_secrets(self) -> None:
        """Keep the redactor's vault values current with other gateways' writes and destroys."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(self.executor, self.secrets.refresh_values)
            except Exception as exc:  # noqa: BLE001 - keep the values we have; retry later
                log.warning("secret_values_refresh_failed", error=exc.__class__.__name__)
            await asyncio.sleep(SECRET_REFRESH_SECONDS)

    async def _index(self) -> None:
        """The search pipeline: read the log, commit, publish snapshots (or follow them)."""
        loop = asyncio.get_running_loop()
        while True:
            backlog = False
            try:
                backlog = await loop.run_in_executor(self.executor, self.search_index.step)
            except Exception as exc:  # noqa: BLE001 - the next step retries
                log.warning("index_step_failed", error=exc.__class__.__name__, detail=str(exc)[:200])
                await asyncio.sleep(1)
            await asyncio.sleep(0 if backlog else INDEX_INTERVAL)

    def _close_index(self) -> None:
        try:
            self.search_index.close()
        except Exception as exc:  # noqa: BLE001 - the next writer catches up from the log
            log.warning("index_close_failed", error=exc.__class__.__name__)

    def _release_lease(self) -> None:
        if self.config.compact_interval:
            try:
                self.compaction_lease.release()
            except StoreError as exc:  # it expires by itself
                log.warning("lease_release_failed", error=exc.__class__.__name__)

    async def _compact(self) -> None:
        """Turn the log into Parquet now and then; queries read the uncompacted tail meanwhile.

        Runs start ``compact_interval`` apart (back to back when one takes longer): counted
        from the end of the last run, a busy gateway's compactor fell 5 s plus a run behind,
        past what the log cache holds, and then read back and decoded what it had just
        written, which made its runs longer still."""
        if not self.config.compact_interval:
            return
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        while True:
            await asyncio.sleep(max(0.0, started + self.config.compact_interval - time.monotonic()))
            started = time.monotonic()
            try:
                if not await loop.run_in_executor(self.executor, self.compaction_lease.acquire):
                    continue  # another replica compacts; queries read the log tail meanwhile
                run_once = self.biographies.compactor.run_once
                result = await loop.run_in_executor(self.compaction_thread, run_once)
                if result.written or result.conflict:
                    log.info("compacted", seconds=round(time.monotonic() - started, 3), **result.to_dict())
            except Exception as exc:  # noqa: BLE001 - the next run retries
                log.warning("compaction_failed", error=exc.__class__.__name__, detail=str(exc)[:200])

    async def _sweep_uploads(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            cutoff = time.time() - self.config.upload_expiry
            try:
                removed = await loop.run_in_executor(self.executor, self.store.expire_uploads, cutoff)
                if removed:
                    log.info("uploads_expired", count=removed)
            except Exception as exc:  # noqa: BLE001 - the sweep must outlive any one failure
                log.warning("upload_sweep_failed", error=exc.__class__.__name__)
            await asyncio.sleep(min(UPLOAD_SWEEP_SECONDS, max(1, self.config.upload_expiry // 4)))


def _background_priority() -> None:
    """Lower the calling thread's CPU priority by BACKGROUND_NICE (on Linux a thread has its own
    nice value; 0 names the calling thread)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, min(19, os.getpriority(os.PRIO_PROCESS, 0) + BACKGROUND_NICE))
    except (AttributeError, OSError):
        pass  # no per-thread priorities here: it runs at the gateway's


def open_store(config: Config) -> ObjectStore:
    if config.backend != "local":
        from .store.s3 import from_config

        upstream = from_config(config, spool_dir=Path(config.data) / "spool")
        upstream.check()  # refuse to start rather than serve 503s from the first request
        upstream.learn_quirks()
        return upstream
    store = LocalStore(Path(config.data) / "store")
    recovery = store.recovery
    if recovery["missing_data_files"]:
        log.error("store_damaged", missing_data_files=recovery["missing_data_files"],
                  hint="objects naming these files will answer 503 until restored from backup")
    if recovery["temp_files_removed"] or recovery["orphan_files_removed"]:
        log.info("store_recovered", temp_files_removed=recovery["temp_files_removed"],
                 orphan_files_removed=recovery["orphan_files_removed"])
    return store


def build(config: Config, access_key: str, secret_key: str) -> Gateway:
    store = seal(open_store(config), config)
    executor = ThreadPoolExecutor(max_workers=config.threads, thread_name_prefix="orgmem")
    identities = IdentityStore(store, RootCredentials(access_key, secret_key))
    authenticator = Authenticator(identities)
    authorizer = Authorizer(identities)
    metrics = Metrics(store.count_uploads)
    durable_log = DurableLog(store, consumers=(COMPACTOR, INDEXER))
    files = SegmentFiles(store)
    compactor = Compactor(durable_log, files, [BioStream(), AuditStream()])
    audit = AuditLog(durable_log, compactor)
    recorder = Recorder(audit, metrics)
    biographies = Biographies(store, durable_log, compactor, files,
                              ingest_processes=config.ingest_process_count)
    memory = Memory(store, durable_log)
    skills = Skills(store, durable_log)
    ctx = S3Context(store=store, region=config.region, biographies=biographies, memory=memory,
                    skills=skills)
    s3 = S3App(ctx, authenticator, executor, authorizer, recorder, domain=config.domain,
               body_timeout=config.body_timeout, inline_io=config.backend == "local",
               keepalive_after=config.copy_keepalive)
    secrets = Secrets(store, store.keys, on_values=biographies.replace_values)
    router = build_router(identities, authorizer, audit, metrics, KeyRotation(store, secrets))
    vault_api.add_routes(router, secrets)
    bio_api.add_routes(router, biographies)
    traces_api.add_routes(router, biographies)
    memory_api.add_routes(router, memory, identities)
    skills_api.add_routes(router, skills)
    search_index = SearchIndex(store, durable_log, Sources(store, memory, skills),
                               AccessTokens(identities, authorizer, store), biographies,
                               durable_log.writer_id, may_write=config.index_writer)
    search_api.add_routes(router, search_index)
    # search=None would rank the pack's memories and skills by word overlap alone
    packs = ContextPacks(biographies, memory, skills, teams_of(identities), search=search_index)
    context_api.add_routes(router, packs)
    rest = RestApp(router, authenticator, authorizer, recorder, executor, body_timeout=config.body_timeout)
    return Gateway(config, store, s3, rest, identities, audit, executor, durable_log, biographies,
                   search_index, secrets)
