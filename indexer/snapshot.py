"""Index snapshots in an object store: publish, restore, collect.

Layout under ``prefix`` (see ``indexer/DESIGN.md``)::

    <prefix>/files/<segment file name>        Tantivy segment files, immutable, shared by snapshots
    <prefix>/manifests/<seq, 12 digits>.json  one per snapshot; the highest is the latest

Files first, manifest last: a manifest only ever names files already stored, and it
is created with ``if_none_match`` on the next sequence number, so of two publishers
racing for the same number exactly one wins (:class:`SnapshotConflict` for the other).
Encryption is the store's business: the gateway passes a sealed store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .schema import SCHEMA_VERSION

FORMAT = 1
#: Bytes per read when streaming a segment file in or out.
CHUNK = 1 << 20
_SEQ_DIGITS = 12
_MANIFEST_RE = re.compile(rf"(\d{{{_SEQ_DIGITS}}})\.json$")
#: Tantivy files that are not part of any segment and are not carried (meta.json is
#: carried inside the manifest; lock files and the managed-files list are local state).
_LOCAL_ONLY = {"meta.json", ".managed.json", ".tantivy-meta.lock", ".tantivy-writer.lock"}


class PreconditionFailed(Exception):
    """A conditional :meth:`BlobStore.put` whose condition did not hold."""


class SnapshotConflict(Exception):
    """Another publisher wrote this snapshot number first (this writer has lost its lease)."""


class SnapshotError(Exception):
    """No usable snapshot: files missing or corrupt, or another format or schema version."""


class Readable(Protocol):
    """A byte stream: ``read(n)`` gives ``b""`` at its end."""

    def read(self, n: int = -1) -> bytes: ...


class BlobStore(Protocol):
    """Object access to a store; keys are plain strings (the adapter adds a bucket).

    Manifests are small and go whole (``get``/``put``); segment files can be gigabytes and
    stream (``open``/``put_stream``), so neither publish nor restore holds one in memory.
    ``put``/``put_stream`` with ``if_none_match=True`` create only when absent; ``put`` with
    ``if_match`` replaces only that version (etag); a failed condition raises
    :class:`PreconditionFailed`. ``get``/``open`` of an absent key give None; ``delete`` of
    an absent key is not an error. ``list`` returns every key under a prefix.
    """

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, data: bytes, if_match: str | None = None, if_none_match: bool = False) -> str: ...

    def open(self, key: str) -> Readable | None: ...

    def put_stream(self, key: str, body: Readable, if_none_match: bool = False) -> str: ...

    def list(self, prefix: str) -> list[str]: ...

    def delete(self, key: str) -> None: ...


class MemoryBlobStore:
    """A :class:`BlobStore` in a dict, for tests and tools."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.objects.get(key)

    def put(self, key: str, data: bytes, if_match: str | None = None, if_none_match: bool = False) -> str:
        current = self.objects.get(key)
        if if_none_match and current is not None:
            raise PreconditionFailed(key)
        if if_match is not None and (current is None or hashlib.md5(current).hexdigest() != if_match):
            raise PreconditionFailed(key)
        self.objects[key] = bytes(data)
        return hashlib.md5(data).hexdigest()

    def open(self, key: str) -> Readable | None:
        data = self.objects.get(key)
        return None if data is None else io.BytesIO(data)

    def put_stream(self, key: str, body: Readable, if_none_match: bool = False) -> str:
        return self.put(key, body.read(), if_none_match=if_none_match)

    def list(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)


def _join(prefix: str, *parts: str) -> str:
    return "/".join([prefix.rstrip("/"), *parts]) if prefix else "/".join(parts)


def _manifest_keys(store: BlobStore, prefix: str) -> list[tuple[int, str]]:
    """``(seq, key)`` of every manifest, oldest first."""
    out = []
    for key in store.list(_join(prefix, "manifests", "")):
        m = _MANIFEST_RE.search(key)
        if m:
            out.append((int(m.group(1)), key))
    return sorted(out)


def _load(store: BlobStore, key: str) -> dict | None:
    data = store.get(key)
    if data is None:
        return None
    try:
        manifest = json.loads(data)
    except ValueError as e:
        raise SnapshotError(f"{key}: not a manifest ({e})") from e
    return manifest if isinstance(manifest, dict) else None


def latest(store: BlobStore, prefix: str) -> dict | None:
    """The newest manifest (with ``seq``, ``checkpoint``, ``created``), or None when there is none."""
    for _, key in reversed(_manifest_keys(store, prefix)):
        manifest = _load(store, key)
        if manifest is not None:
            return manifest
    return None


# -- publish ----------------------------------------------------------------------------


def _segment_files(index_dir: Path, meta: dict) -> list[str]:
    """The files of the segments ``meta`` names: ``<id>.<ext>`` plus the delete file of its opstamp."""
    names = sorted(os.listdir(index_dir))
    wanted = []
    for segment in meta.get("segments", []):
        sid = segment["segment_id"].replace("-", "")
        deletes = segment.get("deletes")
        del_name = f"{sid}.{deletes['opstamp']}.del" if deletes else None
        for name in names:
            if not name.startswith(sid + "."):
                continue
            if name.endswith(".del") and name != del_name:
                continue  # an older delete bitset of this segment
            wanted.append(name)
    return wanted


class _Hashing:
    """A reader passing bytes through while it counts and hashes them."""

    def __init__(self, inner: Readable) -> None:
        self.inner, self.size, self._sha = inner, 0, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        chunk = self.inner.read(n)
        self.size += len(chunk)
        self._sha.update(chunk)
        return chunk

    def drain(self) -> _Hashing:
        while self.read(CHUNK):
            pass
        return self

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()


def _sha256_of(store: BlobStore, key: str) -> str | None:
    stream = store.open(key)
    if stream is None:
        return None
    try:
        return _Hashing(stream).drain().sha256
    finally:
        _close(stream)


def _close(stream: Readable) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        close()


def _upload(store: BlobStore, prefix: str, name: str, path: Path) -> dict:
    """Stream a new segment file to the store; its manifest entry. A same-named object with
    other bytes (only possible when two writers diverged from one snapshot) gets a
    hash-suffixed key."""
    key = _join(prefix, "files", name)
    with open(path, "rb") as fh:
        reader = _Hashing(fh)
        try:
            store.put_stream(key, reader, if_none_match=True)
            return {"name": name, "key": key, "size": reader.size, "sha256": reader.sha256}
        except PreconditionFailed:
            pass
    with open(path, "rb") as fh:
        local = _Hashing(fh).drain()
    entry = {"name": name, "key": key, "size": local.size, "sha256": local.sha256}
    if _sha256_of(store, key) == local.sha256:
        return entry  # an earlier, unfinished publish stored it already
    entry["key"] = _join(prefix, "files", f"{name}.{local.sha256[:16]}")
    with open(path, "rb") as fh:
        try:
            store.put_stream(entry["key"], fh, if_none_match=True)
        except PreconditionFailed:
            pass  # same name and same hash prefix: the same bytes
    return entry


def _holds(path: Path, sha256: str, local: LocalCopy | None) -> bool:
    """Whether the file at ``path`` has the hash ``sha256`` (by ``local``'s record, or hashed)."""
    if local is not None and local.directory == path.parent and path.name in local.sha256:
        return local.sha256[path.name] == sha256
    with open(path, "rb") as fh:
        return _Hashing(fh).drain().sha256 == sha256


def publish(store: BlobStore, prefix: str, index_dir: str | os.PathLike, checkpoint: dict[str, Any],
            attempts: int = 5, local: LocalCopy | None = None, base: int | None = None) -> dict:
    """Publish the last commit of the index in ``index_dir`` as the next snapshot; returns its manifest.

    Call it from the writing process between commits. ``checkpoint`` is what the caller
    needs to resume (e.g. the log position this commit covers). A file the latest
    snapshot already holds is not uploaded again: known to be the same bytes when
    ``local`` (this directory as last restored or published) records the snapshot's
    hash for it, else when hashing it gives that hash. (Name and size alone are not
    enough: two writers that diverged from one snapshot write delete files of the same
    name and size with other contents.) Raises :class:`SnapshotConflict` when another
    publisher took the next number, or, given ``base`` (the snapshot this index was restored
    from or last published, 0 for none), when the latest snapshot is another one: a writer
    that lost its lease while another restored and went on must not publish over it.
    """
    index_dir = Path(index_dir)
    previous = latest(store, prefix)
    prev_seq = int(previous["seq"]) if previous else 0
    if base is not None and prev_seq != base:
        raise SnapshotConflict(f"the latest snapshot under {prefix!r} is {prev_seq}, not {base}, "
                               "which this index was built on")
    known = {}
    if previous and previous.get("schema") == SCHEMA_VERSION:
        known = {(f["name"], f["size"]): f for f in previous.get("files", [])}
    for _ in range(attempts):
        # a background merge may retire segments while we read: start over from the new meta.json
        try:
            meta_text = (index_dir / "meta.json").read_text()
            meta = json.loads(meta_text)
            entries = []
            for name in _segment_files(index_dir, meta):
                size = (index_dir / name).stat().st_size
                reuse = known.get((name, size))
                if reuse is not None and _holds(index_dir / name, reuse["sha256"], local):
                    entries.append(dict(reuse))
                    continue
                entries.append(_upload(store, prefix, name, index_dir / name))
            break
        except FileNotFoundError:
            continue
    else:
        raise SnapshotError(f"{index_dir}: segments kept changing while publishing; try again")
    seq = prev_seq + 1
    manifest = {"format": FORMAT, "schema": SCHEMA_VERSION, "seq": seq, "files": entries,
                "meta": meta, "checkpoint": checkpoint, "created": time.time(),
                "docs": sum(s.get("max_doc", 0) - ((s.get("deletes") or {}).get("num_deleted_docs", 0))
                            for s in meta.get("segments", []))}
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    try:
        store.put(_join(prefix, "manifests", f"{seq:0{_SEQ_DIGITS}d}.json"), body, if_none_match=True)
    except PreconditionFailed as e:
        raise SnapshotConflict(f"snapshot {seq} under {prefix!r} was published by another writer") from e
    return manifest


# -- restore ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalCopy:
    """An index directory this process restored or published, with the SHA-256 of each of
    its files as a manifest named them.

    Segment files are immutable and named by segment id (deletes by opstamp), so a file
    of a newer snapshot with the same name, size and hash is the same bytes: restore
    hard-links it from here instead of fetching and decrypting it again. A follower
    refreshing to the next snapshot then fetches only the segments written or merged
    since, not the whole index.
    """

    directory: Path
    sha256: Mapping[str, str]

    @classmethod
    def of(cls, directory: str | os.PathLike, manifest: Mapping[str, Any]) -> LocalCopy:
        return cls(Path(directory), {f["name"]: f["sha256"] for f in manifest.get("files", [])})


@dataclass(frozen=True)
class Restored:
    """What :func:`restore_latest` restored, and what it cost."""

    manifest: dict
    fetched_files: int = 0
    fetched_bytes: int = 0
    linked_files: int = 0
    linked_bytes: int = 0
    #: the newest snapshot's number when the restore began: the restored one's own, or a
    #: newer one's that could not be restored (damaged, or of a format this version cannot
    #: read). A writer publishes over this one, which :func:`publish` then finds latest.
    newest: int = 0

    @property
    def checkpoint(self) -> dict:
        return self.manifest.get("checkpoint") or {}


def _check_manifest(manifest: dict) -> None:
    if manifest.get("format") != FORMAT:
        raise SnapshotError(f"snapshot format {manifest.get('format')!r}; this version reads {FORMAT}")
    if manifest.get("schema") != SCHEMA_VERSION:
        raise SnapshotError(f"snapshot schema {manifest.get('schema')!r}; this version uses {SCHEMA_VERSION}")


def _link(local: LocalCopy | None, entry: dict, target: Path) -> bool:
    """Hard-link the entry's file from ``local`` when it holds the same bytes; False to fetch."""
    name = entry["name"]
    if local is None or local.sha256.get(name) != entry["sha256"]:
        return False
    source = local.directory / name
    try:
        if source.stat().st_size != entry["size"]:
            return False
        os.link(source, target)
    except OSError:  # gone meanwhile (a merge), another file system: fetch it
        return False
    return True


def _fetch(store: BlobStore, entry: dict, target: Path) -> None:
    """Stream one snapshot file into ``target``, checked against its size and SHA-256."""
    stream = store.open(entry["key"])
    if stream is None:
        raise SnapshotError(f"snapshot file {entry['key']} is missing")
    try:
        reader = _Hashing(stream)
        with open(target, "wb") as out:
            while chunk := reader.read(CHUNK):
                out.write(chunk)
    finally:
        _close(stream)
    if reader.size != entry["size"] or reader.sha256 != entry["sha256"]:
        raise SnapshotError(f"snapshot file {entry['key']} does not match its manifest")


def _restore_one(store: BlobStore, manifest: dict, into: Path, local: LocalCopy | None) -> Restored:
    _check_manifest(manifest)
    counts = {"fetched_files": 0, "fetched_bytes": 0, "linked_files": 0, "linked_bytes": 0}
    for entry in manifest["files"]:
        name = entry["name"]
        if "/" in name or name.startswith(".") or name in _LOCAL_ONLY:
            raise SnapshotError(f"snapshot names an unexpected file {name!r}")
        if _link(local, entry, into / name):
            counts["linked_files"] += 1
            counts["linked_bytes"] += entry["size"]
            continue
        _fetch(store, entry, into / name)
        counts["fetched_files"] += 1
        counts["fetched_bytes"] += entry["size"]
    # meta.json last: until it exists the directory is not an index
    (into / "meta.json").write_text(json.dumps(manifest["meta"], indent=2))
    return Restored(manifest, **counts)


def restore_latest(store: BlobStore, prefix: str, into_dir: str | os.PathLike,
                   local: LocalCopy | None = None) -> Restored | None:
    """Rebuild the latest snapshot's index in ``into_dir`` (absent or empty); None when there
    is no snapshot.

    Files ``local`` holds with the same name and hash are hard-linked from it, the others
    fetched and checked against size and SHA-256. If the newest snapshot cannot be
    restored (a file missing or corrupt) the next older one is tried; :class:`SnapshotError`
    when none can.
    """
    into = Path(into_dir)
    if into.exists() and any(into.iterdir()):
        raise ValueError(f"{into}: not empty; restore into a new directory")
    keys = _manifest_keys(store, prefix)
    if not keys:
        return None
    errors = []
    newest = keys[-1][0]
    for _, key in reversed(keys):
        manifest = _load(store, key)
        if manifest is None:
            continue
        into.mkdir(parents=True, exist_ok=True)
        try:
            return dataclasses.replace(_restore_one(store, manifest, into, local), newest=newest)
        except (SnapshotError, KeyError, TypeError) as e:
            errors.append(f"{key}: {e}")
            shutil.rmtree(into)
    raise SnapshotError("no snapshot could be restored: " + "; ".join(errors))


def restore(store: BlobStore, prefix: str, into_dir: str | os.PathLike) -> dict | None:
    """:func:`restore_latest` from nothing local; returns the snapshot's checkpoint (None: no snapshot)."""
    restored = restore_latest(store, prefix, into_dir)
    return None if restored is None else restored.checkpoint


# -- garbage collection -------------------------------------------------------------------


def collect(store: BlobStore, prefix: str, keep: int = 2) -> list[str]:
    """Delete all but the newest ``keep`` manifests, then every file no kept manifest names.

    Returns the deleted keys. Run it from the publishing process, between publishes:
    a file being uploaded for a manifest not yet written is not named by any manifest.
    """
    if keep < 1:
        raise ValueError("keep: at least 1")
    keys = _manifest_keys(store, prefix)
    kept, old = keys[-keep:], keys[:-keep]
    named: set[str] = set()
    for _, key in kept:
        manifest = _load(store, key)
        if manifest is None:
            return []  # a kept manifest vanished under us: another collector runs; delete nothing
        named.update(f["key"] for f in manifest.get("files", []))
    deleted = []
    for _, key in old:  # manifests first: no manifest ever names a deleted file
        store.delete(key)
        deleted.append(key)
    for key in store.list(_join(prefix, "files", "")):
        if key not in named:
            store.delete(key)
            deleted.append(key)
    return deleted


