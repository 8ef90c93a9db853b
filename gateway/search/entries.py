"""From log records and from the sources themselves to index entries.

Each function returns what to do to the index for one item: ``("upsert", Entry)``,
``("add", Entry)`` for an event whose id no other record holds (``BioRecord.fresh``: the
index may skip deleting an earlier copy) or ``("delete", source_ref)``, or None when the
item is not indexed. Every change is re-read from its source (the notice only says *what*
changed), so replaying a stretch of the log, or reading a newer version than the notice
named, gives the same index.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from indexer import (
    Entry,
    event_entry,
    file_entry,
    file_ref,
    memory_entry,
    memory_ref,
    skill_entry,
    skill_ref,
    skip_reason,
)

from ..log import BioRecord, DocChanged, Record
from ..memory import documents as d
from ..memory.documents import DocumentError
from ..memory.documents import Scope as MemoryScope
from ..memory.service import CURRENT, Memory, split_current_key
from ..memory.skill_format import SKILL_FILE, parse_front_matter
from ..memory.skills import SkillError, SkillNotFound, Skills, scope_of_path
from ..store.base import NoSuchBucket, NoSuchKey, ObjectStore
from .tokens import (
    ROOT_TOKEN,
    event_token,
    file_token,
    is_workspace_bucket,
    memory_token,
    resource_of,
    skill_token,
)

Change = tuple[str, "Entry | str"]


@dataclass
class Sources:
    """Where entries are read from."""

    store: ObjectStore
    memory: Memory
    skills: Skills

    # -- one log record -------------------------------------------------------------

    def from_record(self, record: Record) -> Change | None:
        if isinstance(record, BioRecord):
            return ("add" if record.fresh else "upsert", event_of(record.event))
        if isinstance(record, DocChanged):
            if record.doc_type == "memory":
                return self.memory_change(record.ref)
            if record.doc_type == "skill":
                return self.skill_change(record.ref)
            if record.doc_type == "events" and record.op == "delete":
                agent, _, day = record.ref.partition("/")  # a day retention removed
                return ("expire", (agent, day)) if agent and day else None
            if record.doc_type == "file":
                bucket, _, key = record.ref.partition("/")
                if not key or not is_workspace_bucket(bucket):
                    return None
                if record.op == "delete":
                    return self._file_deleted(bucket, key)
                return self.file_change(bucket, key, record.by or "")
        return None

    # -- memory -------------------------------------------------------------------------

    def memory_change(self, ref: str) -> Change | None:
        path, _, doc_id = ref.rpartition("/")
        try:
            scope = MemoryScope.from_path(path)
        except DocumentError:
            return None
        stored = self.memory.get(scope, doc_id)
        if stored is None:
            return ("delete", memory_ref(str(scope), doc_id))
        return ("upsert", memory_of(str(scope), self.memory.resolved(stored)))

    # -- skills -------------------------------------------------------------------------

    def skill_change(self, ref: str) -> Change | None:
        path, _, name = ref.rpartition("/")
        scope = scope_of_path(path)
        if scope is None:
            return None
        try:
            manifest = self.skills.manifest(scope, name)
        except SkillNotFound:
            return ("delete", skill_ref(str(scope), name))
        except SkillError:
            return None
        return ("upsert", self.skill_of(manifest))

    def skill_of(self, manifest: dict) -> Entry:
        scope = manifest["scope"]
        try:
            _, raw = self.skills.read_file(manifest, SKILL_FILE)
            _, body = parse_front_matter(raw)
        except (SkillNotFound, SkillError, ValueError):
            body = ""
        front = manifest.get("front_matter") or {}
        others = [f["path"] for f in manifest.get("files", []) if f.get("path") != SKILL_FILE]
        if others:
            body = f"{body}\n\nFiles: {' '.join(others)}"
        return skill_entry(scope, manifest["name"], description=manifest.get("description", ""), body=body,
                           time=_iso_time(manifest.get("created_at")),
                           tags=_skill_tags(front),
                           access=[skill_token(scope), ROOT_TOKEN],
                           resource=resource_of("skill", scope=scope, name=manifest["name"]))

    # -- workspace files -------------------------------------------------------------------

    def _file_deleted(self, bucket: str, key: str) -> Change | None:
        """A delete notice, applied perhaps after the notice of a later write through
        another gateway (each gateway's log is applied in turn, not by time): the entry
        goes only if the object is still gone; if it is back, its own notice indexes it."""
        try:
            self.store.head_object(bucket, key)
        except (NoSuchKey, NoSuchBucket):
            return ("delete", file_ref(bucket, key))
        return None

    def file_change(self, bucket: str, key: str, by: str = "") -> Change | None:
        ref = file_ref(bucket, key)
        try:
            info = self.store.head_object(bucket, key)
            if skip_reason(key, info.meta.content_type, info.size, b"") is not None:
                return ("delete", ref)  # binary or too large now: whatever was indexed goes
            reader = self.store.open_object(bucket, key)
            try:
                chunks = []
                while chunk := reader.read(1 << 20):
                    chunks.append(chunk)
            finally:
                reader.close()
        except (NoSuchKey, NoSuchBucket):
            return ("delete", ref)
        entry = file_entry(bucket, key, b"".join(chunks), time=info.last_modified,
                           content_type=info.meta.content_type, agent=by,
                           access=[file_token(bucket), ROOT_TOKEN], resource=resource_of("file", source=ref))
        return ("upsert", entry) if entry is not None else ("delete", ref)

    # -- everything, for a rebuild ---------------------------------------------------------

    def all_memory(self) -> Iterator[Entry]:
        for key, _ in self.memory._list(CURRENT):
            where = split_current_key(key)
            if where is None:
                continue
            stored = self.memory.get(*where)
            if stored is not None:
                yield memory_of(str(where[0]), self.memory.resolved(stored))

    def all_skills(self) -> Iterator[Entry]:
        for scope in self.skills.scopes():
            for name in self.skills.names(scope):
                try:
                    yield self.skill_of(self.skills.manifest(scope, name))
                except (SkillNotFound, SkillError):
                    continue

    def all_files(self) -> Iterator[Entry]:
        for b in self.store.list_buckets():
            if not is_workspace_bucket(b.name):
                continue
            after = ""
            while True:
                page = self.store.list_objects(b.name, prefix="", after=after, limit=1000)
                for e in page.entries:
                    if skip_reason(e.key, None, e.size, b"") in ("too-large", "binary-type"):
                        continue
                    change = self.file_change(b.name, e.key)
                    if change is not None and change[0] == "upsert":
                        yield change[1]  # type: ignore[misc]
                if not page.is_truncated or not page.next_marker:
                    break
                after = page.next_marker


def event_of(event: dict) -> Entry:
    """A biography event's entry (``event``: the log record dict)."""
    parts = [event.get("content") or ""]
    for name in ("tool", "artifact_uri", "data"):
        value = event.get(name)
        if value:
            parts.append(str(value))
    body = "\n".join(p for p in parts if p)
    content = event.get("content") or ""
    title = None
    if not content and event.get("artifact_uri"):
        title = f"{event.get('kind', 'event')}: {event['artifact_uri']}"
    return event_entry(event["agent"], event["event_id"], kind=event.get("kind", ""), content=body,
                       time=event["ts"] / 1_000_000, session=event.get("session") or "", title=title,
                       tags=[t for t in event.get("tags") or [] if isinstance(t, str)],
                       access=[event_token(event["agent"]), ROOT_TOKEN],
                       resource=resource_of("event", agent=event["agent"], session=event.get("session", "")))


def memory_of(scope: str, doc: dict) -> Entry:
    try:
        when = d.parse_time(doc.get("updated_at"), "updated_at")
    except DocumentError:
        when = None
    return memory_entry(scope, doc["id"], kind=doc.get("kind", ""), title=doc.get("title", ""),
                        body=doc.get("body", ""), time=when, status=doc.get("status", "active"),
                        tags=doc.get("tags") or [], rationale=doc.get("rationale") or "",
                        agent=doc.get("decided_by") or doc.get("updated_by") or "",
                        access=[memory_token(scope), ROOT_TOKEN],
                        resource=resource_of("memory", scope=scope, name=doc["id"]))


def _iso_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return d.parse_time(text)
    except DocumentError:
        return None


def _skill_tags(front: dict) -> list[str]:
    meta = front.get("metadata")
    tags = meta.get("tags") if isinstance(meta, dict) else None
    return [t for t in tags if isinstance(t, str) and t] if isinstance(tags, list) else []
