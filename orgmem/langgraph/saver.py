"""A LangGraph checkpointer that keeps threads in the gateway, so any machine can resume them.

    saver = OrgmemSaver(orgmem.Client())
    graph = builder.compile(checkpointer=saver)
    graph.invoke(inputs, {"configurable": {"thread_id": "ticket-4711"}})   # here ...
    graph.invoke(Command(resume="yes"), {"configurable": {"thread_id": "ticket-4711"}})  # ... or anywhere

Checkpoints and pending writes are objects in a workspace bucket (by default the caller's
own, ``agent-<name>``, created on first write), laid out as :mod:`.layout` says, and
serialized with the saver's ``serde`` (LangGraph's JsonPlusSerializer unless given; pass an
``EncryptedSerializer`` to encrypt on the client too — the gateway seals everything at
rest anyway). Every checkpoint is stored whole, so any one can be read without its parents.

Writes are idempotent as LangGraph expects: a task's regular write at an index is kept
once (a create-only PUT), its special writes (error, interrupt, resume) are replaced.
Everything a call stores is serialized and checked first, so a value the serializer cannot
take, or a thread id too long for a key, raises before anything is written.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)

from ..errors import NotFound, PreconditionFailed
from ._driver import Call, Driver, Emit, call, maybe
from .layout import CONTENT_TYPE, Layout, LayoutError, pack, typed, unpack, untyped
from .namespaces import NAME_RE

#: checkpoints read at once while listing
LIST_CHUNK = 16


class OrgmemSaver(BaseCheckpointSaver[int]):
    """LangGraph checkpoints and pending writes in an orgmem workspace bucket.

    ``client`` is an ``orgmem.Client`` (sync API), ``async_client`` an ``orgmem.AsyncClient``
    (async API; without one, the async API runs the sync client's calls in worker threads).
    ``bucket`` defaults to the caller's workspace ``agent-<name>``; ``prefix`` to ``langgraph/``.
    """

    def __init__(self, client: Any = None, *, async_client: Any = None, bucket: str | None = None,
                 prefix: str = "langgraph/", serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        if not isinstance(prefix, str) or (prefix and not prefix.endswith("/")) or prefix.startswith("/"):
            raise ValueError(f"prefix: {prefix!r} must be empty or a relative path ending in '/'.")
        self.bucket = bucket
        self.layout = Layout(prefix)
        self._io = Driver(client, async_client)
        self._bucket_ready = False

    def close(self) -> None:
        """Stop the worker threads (the clients are the caller's to close)."""
        self._io.close()

    def __enter__(self) -> OrgmemSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the sync API ---------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._io.run(self._get_tuple(config))

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        return self._io.iterate(self._list(config, filter, before, limit))

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        return self._io.run(self._put(config, checkpoint, metadata))

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        self._io.run(self._put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._io.run(self._delete_thread(thread_id))

    # -- the async API --------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._io.arun(self._get_tuple(config))

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        async for found in self._io.aiterate(self._list(config, filter, before, limit)):
            yield found

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        return await self._io.arun(self._put(config, checkpoint, metadata))

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        await self._io.arun(self._put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._io.arun(self._delete_thread(thread_id))

    # -- where ----------------------------------------------------------------------------

    def _bucket(self):
        if self.bucket is None:
            me = (yield call("whoami")) or {}
            name = me.get("name")
            if not isinstance(name, str) or not NAME_RE.match(name):
                raise LayoutError("cannot name the caller's workspace bucket from whoami; pass bucket=.")
            self.bucket = f"agent-{name}"
        return self.bucket

    def _writable(self):
        bucket = yield from self._bucket()
        if not self._bucket_ready:
            yield call("create_bucket", bucket)  # False (no error) when the caller has it already
            self._bucket_ready = True
        return bucket

    def _listing(self, prefix: str):
        """Keys under ``prefix``; none when the bucket does not exist yet."""
        bucket = yield from self._bucket()
        found = yield maybe("list_files", bucket, prefix)
        return [entry["key"] for entry in found or [] if "key" in entry]

    # -- reading --------------------------------------------------------------------------

    def _get_tuple(self, config: RunnableConfig):
        thread_id, checkpoint_ns, checkpoint_id = _where(config)
        if checkpoint_id is None:
            keys = yield from self._listing(self.layout.checkpoints(thread_id, checkpoint_ns))
            ids = [parsed[3] for parsed in map(self.layout.parse, keys)
                   if parsed and parsed[0] == "checkpoints"]
            if not ids:
                return None
            checkpoint_id = max(ids)
        bucket = yield from self._bucket()
        key = self.layout.checkpoint(thread_id, checkpoint_ns, checkpoint_id)
        data = yield maybe("read_file", bucket, key)
        record = unpack(data) if data is not None else None
        if record is None:
            return None
        write_keys = yield from self._listing(self.layout.writes(thread_id, checkpoint_ns, checkpoint_id))
        writes = yield from self._read_writes(bucket, write_keys)
        return self._tuple(record, writes)

    def _read_writes(self, bucket: str, keys: list[str]):
        """The pending writes at ``keys``, in the order LangGraph applies them."""
        if not keys:
            return []
        found = yield [maybe("read_file", bucket, key) for key in keys]
        records = [r for r in (unpack(data) for data in found if data is not None) if r is not None]
        records.sort(key=lambda r: writes_sort_key(r.get("task_path", ""), r["task_id"], r["idx"]))
        return [(r["task_id"], r["channel"], self.serde.loads_typed(untyped(r["value"]))) for r in records]

    def _tuple(self, record: dict, writes: list) -> CheckpointTuple:
        where = {"thread_id": record["thread_id"], "checkpoint_ns": record["checkpoint_ns"]}
        parent = record.get("parent_checkpoint_id")
        return CheckpointTuple(
            config={"configurable": {**where, "checkpoint_id": record["checkpoint_id"]}},
            checkpoint=self.serde.loads_typed(untyped(record["checkpoint"])),
            metadata=self.serde.loads_typed(untyped(record["metadata"])),
            parent_config={"configurable": {**where, "checkpoint_id": parent}} if parent else None,
            pending_writes=writes,
        )

    def _list(self, config: RunnableConfig | None, flt: dict[str, Any] | None,
              before: RunnableConfig | None, limit: int | None):
        """Checkpoints newest first (by id), the same thread's and namespace's if ``config``
        names them, matching every ``filter`` metadata key, older than ``before``."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit: a whole number from 0 or None, not {limit!r}.")
        if flt is not None and not isinstance(flt, dict):
            raise ValueError(f"filter: a dict of metadata keys and values, not {type(flt).__name__}.")
        thread_id = checkpoint_ns = only_id = None
        if config is not None:
            thread_id, checkpoint_ns, only_id = _where(config, ns_given=True)
        before_id = get_checkpoint_id(before) if before else None
        keys = yield from self._listing(self.layout.thread(thread_id) if thread_id is not None
                                        else self.layout.all())
        checkpoints, writes = self._group(keys)
        wanted = sorted((k for k in checkpoints
                         if (checkpoint_ns is None or k[1] == checkpoint_ns)
                         and (only_id is None or k[2] == only_id)
                         and (before_id is None or k[2] < before_id)),
                        key=lambda k: k[2], reverse=True)
        left = limit
        bucket = yield from self._bucket()
        for start in range(0, len(wanted), LIST_CHUNK):
            chunk = wanted[start:start + LIST_CHUNK]
            found = yield [maybe("read_file", bucket, checkpoints[k]) for k in chunk]
            for k, data in zip(chunk, found, strict=True):
                record = unpack(data) if data is not None else None
                if record is None or not self._passes(record, flt):
                    continue
                if left is not None and left <= 0:
                    return
                pending = yield from self._read_writes(bucket, writes.get(k, []))
                yield Emit(self._tuple(record, pending))
                if left is not None:
                    left -= 1

    def _group(self, keys: list[str]) -> tuple[dict, dict]:
        """Checkpoint keys by (thread, ns, id), and write keys by the same."""
        checkpoints: dict[tuple[str, str, str], str] = {}
        writes: dict[tuple[str, str, str], list[str]] = {}
        for key in keys:
            parsed = self.layout.parse(key)
            if parsed is None:
                continue
            kind, where = parsed[0], parsed[1:]
            if kind == "checkpoints":
                checkpoints[where] = key
            else:
                writes.setdefault(where, []).append(key)
        return checkpoints, writes

    def _passes(self, record: dict, flt: dict[str, Any] | None) -> bool:
        if not flt:
            return True
        metadata = self.serde.loads_typed(untyped(record["metadata"]))
        return all(metadata.get(k) == v for k, v in flt.items())

    # -- writing --------------------------------------------------------------------------

    def _put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata):
        thread_id, checkpoint_ns, parent_id = _where(config)
        checkpoint_id = checkpoint.get("id") if isinstance(checkpoint, dict) else None
        if not isinstance(checkpoint_id, str) or not checkpoint_id:
            raise ValueError("checkpoint: has no id (a non-empty string); nothing was stored.")
        key = self.layout.checkpoint(thread_id, checkpoint_ns, checkpoint_id)
        data = pack({"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
                     "checkpoint_id": checkpoint_id, "parent_checkpoint_id": parent_id,
                     "checkpoint": typed(self.serde.dumps_typed(checkpoint)),
                     "metadata": typed(self.serde.dumps_typed(get_checkpoint_metadata(config, metadata)))})
        bucket = yield from self._writable()
        yield call("write_file", bucket, key, data, CONTENT_TYPE)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
                                 "checkpoint_id": checkpoint_id}}

    def _put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                    task_path: str):
        thread_id, checkpoint_ns, checkpoint_id = _where(config)
        if checkpoint_id is None:
            raise ValueError("config: put_writes needs configurable.checkpoint_id (the checkpoint the "
                             "writes belong to); nothing was stored.")
        if not isinstance(task_id, str) or not task_id:
            raise ValueError("task_id: a non-empty string; nothing was stored.")
        objects = []
        for i, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, i)
            key = self.layout.write(thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
            objects.append((key, idx, pack({"task_id": task_id, "task_path": task_path or "",
                                            "channel": channel, "idx": idx,
                                            "value": typed(self.serde.dumps_typed(value))})))
        if not objects:
            return None
        # several writes to one special channel in one call (a node's interrupts resumed in
        # turn): the last one is kept, as LangGraph's own savers keep it; sent at once, any
        # of them could land last
        objects = list({key: (key, idx, data) for key, idx, data in objects}.values())
        bucket = yield from self._writable()
        # a regular write is kept once (a retried task writes the same again): create-only;
        # special writes (error, interrupt, resume) replace the last one
        yield [Call("write_file", (bucket, key, data, CONTENT_TYPE), {"create_only": idx >= 0},
                    tolerate=(PreconditionFailed,)) for key, idx, data in objects]
        return None

    def _delete_thread(self, thread_id: str):
        thread_id = _thread(thread_id)
        keys = yield from self._listing(self.layout.thread(thread_id))
        if keys:
            bucket = yield from self._bucket()
            yield [Call("delete_file", (bucket, key), {}, tolerate=(NotFound,)) for key in keys]
        return None


def _thread(value: Any) -> str:
    if value is None or isinstance(value, bool) or (isinstance(value, str) and not value):
        raise ValueError("config: configurable.thread_id is required (a non-empty string); "
                         "nothing was stored.")
    return str(value)


def _where(config: RunnableConfig, ns_given: bool = False) -> tuple[str, Any, str | None]:
    """(thread_id, checkpoint_ns, checkpoint_id) of a config; with ``ns_given`` the namespace
    is None unless the config names one (a listing then spans all of the thread's)."""
    configurable = (config or {}).get("configurable") if isinstance(config, dict) else None
    if not isinstance(configurable, dict):
        raise ValueError("config: must be {'configurable': {'thread_id': ...}}; nothing was stored.")
    thread_id = _thread(configurable.get("thread_id"))
    checkpoint_ns = configurable.get("checkpoint_ns", None if ns_given else "")
    if checkpoint_ns is not None and not isinstance(checkpoint_ns, str):
        raise ValueError(f"config: checkpoint_ns must be a string, not {type(checkpoint_ns).__name__}.")
    checkpoint_id = configurable.get("checkpoint_id") or None
    if checkpoint_id is not None and not isinstance(checkpoint_id, str):
        raise ValueError(f"config: checkpoint_id must be a string, not {type(checkpoint_id).__name__}.")
    return thread_id, checkpoint_ns, checkpoint_id
