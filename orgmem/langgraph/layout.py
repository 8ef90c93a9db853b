"""Where the checkpoint saver keeps things in a workspace bucket, and in what form.

::

    langgraph/<thread>/<ns>/checkpoints/<checkpoint_id>                  one checkpoint
    langgraph/<thread>/<ns>/writes/<checkpoint_id>/<task_id>/<idx>       one pending write

``<ns>`` is ``~`` for the root namespace (``""``). Each part is its value with every byte
outside ``A-Z a-z 0-9 _ -`` written ``~XX`` (hex), so thread ids, subgraph namespaces
(``node:task|node:task``) and task ids of any text fit in a key, decode back exactly, and
LangGraph's checkpoint ids (uuid6, which sort in time order) stay as they are. Checkpoints
and writes live under separate prefixes so that finding the latest checkpoint lists only
checkpoints.

Each object is MessagePack (content type :data:`CONTENT_TYPE`, which the search index skips
as binary): a checkpoint holds the thread, namespace, id, parent id and the checkpoint and
its metadata as LangGraph's serializer typed them (``[type, bytes]``); a write holds its
task id, task path, channel, index and typed value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import ormsgpack

FORMAT = 1
CONTENT_TYPE = "application/vnd.orgmem.langgraph+msgpack"
ROOT_NS = "~"
#: the longest object key S3 (and so the gateway) takes, in bytes
MAX_KEY = 1024
_SAFE = re.compile(r"[A-Za-z0-9_-]")
_ESCAPE = re.compile(r"~([0-9A-F]{2})")


class LayoutError(ValueError):
    """A thread id, namespace or checkpoint id that cannot name an object; nothing was written."""


def encode(part: str) -> str:
    out = []
    for ch in part:
        if _SAFE.fullmatch(ch):
            out.append(ch)
        else:
            out.extend(f"~{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def decode(part: str) -> str:
    data = bytearray()
    i = 0
    while i < len(part):
        m = _ESCAPE.match(part, i)
        if m:
            data.append(int(m.group(1), 16))
            i = m.end()
        else:
            data += part[i].encode()
            i += 1
    return data.decode("utf-8")


def _ns(checkpoint_ns: str) -> str:
    return encode(checkpoint_ns) if checkpoint_ns else ROOT_NS


def _ns_back(part: str) -> str:
    return "" if part == ROOT_NS else decode(part)


def _checked(key: str) -> str:
    if len(key.encode()) > MAX_KEY:
        raise LayoutError(f"the object key for this checkpoint would be {len(key.encode())} bytes; "
                          f"keys are at most {MAX_KEY}: use a shorter thread_id or namespace.")
    return key


@dataclass(frozen=True)
class Layout:
    """The keys under ``prefix`` (``langgraph/`` unless chosen otherwise)."""

    prefix: str = "langgraph/"

    def all(self) -> str:
        return self.prefix

    def thread(self, thread_id: str) -> str:
        return f"{self.prefix}{encode(thread_id)}/"

    def checkpoints(self, thread_id: str, checkpoint_ns: str) -> str:
        return f"{self.thread(thread_id)}{_ns(checkpoint_ns)}/checkpoints/"

    def checkpoint(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> str:
        return _checked(self.checkpoints(thread_id, checkpoint_ns) + encode(checkpoint_id))

    def writes(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> str:
        return f"{self.thread(thread_id)}{_ns(checkpoint_ns)}/writes/{encode(checkpoint_id)}/"

    def write(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str, idx: int) -> str:
        return _checked(f"{self.writes(thread_id, checkpoint_ns, checkpoint_id)}{encode(task_id)}/{idx}")

    def parse(self, key: str) -> tuple[str, str, str, str] | None:
        """(kind, thread_id, checkpoint_ns, checkpoint_id) of a key (kind ``checkpoints`` or
        ``writes``); None for anything else under the prefix."""
        if not key.startswith(self.prefix):
            return None
        parts = key[len(self.prefix):].split("/")
        try:
            if len(parts) == 4 and parts[2] == "checkpoints":
                return "checkpoints", decode(parts[0]), _ns_back(parts[1]), decode(parts[3])
            if len(parts) == 6 and parts[2] == "writes":
                return "writes", decode(parts[0]), _ns_back(parts[1]), decode(parts[3])
        except UnicodeDecodeError:
            return None
        return None


# -- records ------------------------------------------------------------------------------


def pack(record: dict[str, Any]) -> bytes:
    return ormsgpack.packb({"format": FORMAT, **record})


def unpack(data: bytes) -> dict[str, Any] | None:
    """A record, or None for bytes that are not one (a stray object under the prefix)."""
    try:
        record = ormsgpack.unpackb(bytes(data))  # FileData is a bytes subclass ormsgpack refuses
    except (ormsgpack.MsgpackDecodeError, ValueError, TypeError):
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return None
    return record


def typed(value: tuple[str, bytes]) -> list:
    return [value[0], bytes(value[1])]


def untyped(value: list) -> tuple[str, bytes]:
    return value[0], value[1]
