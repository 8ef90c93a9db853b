"""Skills: Agent Skills folders, versioned per scope, published whole.

Handlers (REST and the read-only ``skills`` S3 bucket) call this; it knows nothing of HTTP.

Layout in the internal bucket, per skill (``SCOPE`` is ``org``, ``teams/<t>`` or ``agents/<a>``)::

    skills/SCOPE/NAME/blobs/<sha256>             a file's bytes, named by their hash
    skills/SCOPE/NAME/versions/v000001.json      a version's manifest

A push writes the files first (content-addressed, so versions share unchanged files and
two concurrent pushes never overwrite each other's), then the manifest, created with
``If-None-Match: *``. The manifest is the commit: until it exists nobody sees the version,
and once it does every file it names is there, so readers never see half a version. Of
two pushes racing for version n exactly one creates ``v<n>.json``; the other takes n+1.
The latest version is the highest manifest; manifests never change, so they are cached.
"""

from __future__ import annotations

import base64
import hashlib
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from ..iam.model import IdentityError
from ..iam.model import check_name as check_principal_name
from ..log import DocChanged, DurableLog
from ..store.base import (
    INTERNAL_BUCKET,
    NoSuchKey,
    ObjectReader,
    ObjectStore,
    PreconditionFailed,
    WriteCondition,
)
from ..store.objects import read_object, write_object
from .skill_format import SkillError, check_folder, check_name

FORMAT = 1
ROOT = "skills/"
ARN = "arn:orgmem:skills:::"
#: Versions are numbered v000001 ... v999999 (zero-padded so listings sort by number).
MAX_VERSION = 999_999
#: Attempts at taking the next version number while other pushes keep taking it.
PUBLISH_ATTEMPTS = 50
MANIFEST_CACHE = 4096
_VERSION_KEY = re.compile(r"^v(\d{6})\.json\Z")


class SkillNotFound(LookupError):
    """No such skill, version or file (or none the caller may read)."""


@dataclass(frozen=True)
class Scope:
    """Where a skill lives: ``org``, ``team:<name>`` or ``agent:<name>``."""

    kind: str  # "org", "team" or "agent"
    owner: str | None = None

    @classmethod
    def parse(cls, text: str) -> Scope:
        kind, sep, owner = text.partition(":")
        if text == "org":
            return cls("org")
        if sep and kind in ("team", "agent"):
            try:
                check_principal_name(kind, owner)
            except IdentityError as exc:
                raise SkillError(f"scope: {exc}") from None
            return cls(kind, owner)
        raise SkillError(f"scope: {text[:80]!r} is not a scope; use org, team:<name> or agent:<name>.")

    def __str__(self) -> str:
        return "org" if self.kind == "org" else f"{self.kind}:{self.owner}"

    @property
    def path(self) -> str:
        """The scope's folder in the skills bucket: ``org``, ``teams/<t>``, ``agents/<a>``."""
        return "org" if self.kind == "org" else f"{self.kind}s/{self.owner}"

    def arn(self, name: str) -> str:
        """``arn:orgmem:skills:::org/NAME``, ``.../team/T/NAME``, ``.../agent/A/NAME``."""
        where = "org" if self.kind == "org" else f"{self.kind}/{self.owner}"
        return f"{ARN}{where}/{name}"


def scope_of_path(folder: str) -> Scope | None:
    """The scope of a bucket folder (``org``, ``teams/t``, ``agents/a``); None when it names none."""
    if folder == "org":
        return Scope("org")
    kind, _, owner = folder.partition("/")
    if kind in ("teams", "agents") and owner and "/" not in owner:
        try:
            return Scope.parse(f"{kind[:-1]}:{owner}")
        except SkillError:
            return None
    return None


def _skill_prefix(scope: Scope, name: str) -> str:
    return f"{ROOT}{scope.path}/{name}/"


def _blob_key(scope: Scope, name: str, sha256: str) -> str:
    return f"{_skill_prefix(scope, name)}blobs/{sha256}"


def _manifest_key(scope: Scope, name: str, version: int) -> str:
    return f"{_skill_prefix(scope, name)}versions/v{version:06d}.json"


def _now_iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def summary(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What belongs in a model's context: the listing row of one skill."""
    return {"scope": manifest["scope"], "name": manifest["name"], "description": manifest["description"],
            "version": manifest["version"], "author": manifest["author"],
            "created_at": manifest["created_at"]}


@dataclass(frozen=True)
class FileIn:
    path: str
    data: bytes
    executable: bool = False


class Skills:
    def __init__(self, store: ObjectStore, log: DurableLog) -> None:
        self.store = store
        self.log = log
        self._manifests: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    # -- publishing -------------------------------------------------------------

    def publish(self, scope: Scope, name: str, files: list[FileIn], author: str) -> dict[str, Any]:
        """Validate and store ``files`` as the next version; returns its manifest once durable.

        Raises :class:`SkillError` (nothing stored) for a skill that breaks the format."""
        by_path: dict[str, bytes] = {}
        for f in files:
            if f.path in by_path:
                raise SkillError(f"files: {f.path!r} is given twice.")
            by_path[f.path] = f.data
        front = check_folder(name, by_path)
        entries = []
        for f in sorted(files, key=lambda f: f.path):
            sha = hashlib.sha256(f.data).hexdigest()
            entries.append({"path": f.path, "size": len(f.data), "sha256": sha,
                            "md5": hashlib.md5(f.data, usedforsecurity=False).hexdigest(),
                            "executable": bool(f.executable)})
            self._put_blob(scope, name, sha, f.data)
        for _ in range(PUBLISH_ATTEMPTS):
            version = (self.latest_version(scope, name) or 0) + 1
            if version > MAX_VERSION:
                raise SkillError(f"{name}: has reached the last version number ({MAX_VERSION}).")
            now = time.time()
            manifest = {
                "format": FORMAT, "scope": str(scope), "name": name, "version": version,
                "description": front["description"], "front_matter": front, "author": author,
                "created_at": _now_iso(now), "size": sum(e["size"] for e in entries),
                "files": entries,
            }
            body = orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
            key = _manifest_key(scope, name, version)
            try:
                info = write_object(self.store, INTERNAL_BUCKET, key, body, "application/json",
                                    WriteCondition(if_none_match=True))
            except PreconditionFailed:
                continue  # another push took this number: take the next
            self._remember(key, manifest)
            self.log.append([DocChanged("skill", f"{scope.path}/{name}", "put", now, version,
                                        info.etag, author)])
            return manifest
        raise PreconditionFailed(f"{name}: other pushes kept taking the next version; try again.")

    def _put_blob(self, scope: Scope, name: str, sha: str, data: bytes) -> None:
        try:
            write_object(self.store, INTERNAL_BUCKET, _blob_key(scope, name, sha), data,
                         condition=WriteCondition(if_none_match=True))
        except PreconditionFailed:
            pass  # the same bytes are already stored (an earlier version, or a concurrent push)

    # -- reading ----------------------------------------------------------------

    def versions(self, scope: Scope, name: str) -> list[int]:
        """Every published version of a skill, oldest first (empty when there is none)."""
        check_name(name)
        prefix = _skill_prefix(scope, name) + "versions/"
        out: list[int] = []
        after = ""
        while True:
            page = self.store.list_objects(INTERNAL_BUCKET, prefix, "/", after, 1000)
            for entry in page.entries:
                found = _VERSION_KEY.match(entry.key[len(prefix):])
                if found:
                    out.append(int(found.group(1)))
            if not page.is_truncated or not page.next_marker:
                return out
            after = page.next_marker

    def latest_version(self, scope: Scope, name: str) -> int | None:
        found = self.versions(scope, name)
        return found[-1] if found else None

    def manifest(self, scope: Scope, name: str, version: int | None = None) -> dict[str, Any]:
        """A version's manifest (the latest when ``version`` is None); raises SkillNotFound."""
        if version is None:
            version = self.latest_version(scope, name)
            if version is None:
                raise SkillNotFound(f"There is no skill {name!r} in scope {scope}.")
        else:
            check_name(name)
        key = _manifest_key(scope, name, version)
        with self._lock:
            cached = self._manifests.get(key)
            if cached is not None:
                self._manifests.move_to_end(key)
                return cached
        found = read_object(self.store, INTERNAL_BUCKET, key)
        if found is None:
            raise SkillNotFound(f"Skill {name!r} in scope {scope} has no version {version}.")
        manifest = orjson.loads(found[0])
        self._remember(key, manifest)
        return manifest

    def _remember(self, key: str, manifest: dict[str, Any]) -> None:
        with self._lock:
            self._manifests[key] = manifest
            while len(self._manifests) > MANIFEST_CACHE:
                self._manifests.popitem(last=False)

    def resolve(self, name: str, scopes: list[Scope], may_read: Callable[[Scope], bool],
                version: int | None = None) -> dict[str, Any]:
        """The skill ``name`` in the first of ``scopes`` that has it and the caller may read."""
        for scope in scopes:
            if self.latest_version(scope, name) is not None and may_read(scope):
                return self.manifest(scope, name, version)
        raise SkillNotFound(f"There is no skill {name!r} you may read in "
                            f"{', '.join(str(s) for s in scopes) or 'any scope'}.")

    def open_file(self, manifest: Mapping[str, Any], path: str, start: int = 0,
                  end: int | None = None) -> tuple[dict[str, Any], ObjectReader]:
        """A file of a version: its manifest entry and a reader over (part of) its bytes."""
        entry = next((e for e in manifest["files"] if e["path"] == path), None)
        if entry is None:
            raise SkillNotFound(f"Version {manifest['version']} of skill {manifest['name']!r} has no "
                                f"file {path!r}.")
        scope = Scope.parse(manifest["scope"])
        try:
            reader = self.store.open_object(INTERNAL_BUCKET, _blob_key(scope, manifest["name"],
                                                                       entry["sha256"]), start, end)
        except NoSuchKey:
            raise SkillNotFound(f"The bytes of {path!r} are missing from the store.") from None
        return entry, reader

    def read_file(self, manifest: Mapping[str, Any], path: str) -> tuple[dict[str, Any], bytes]:
        entry, reader = self.open_file(manifest, path)
        try:
            chunks = []
            while chunk := reader.read(1 << 20):
                chunks.append(chunk)
        finally:
            reader.close()
        return entry, b"".join(chunks)

    # -- listing ----------------------------------------------------------------

    def scopes(self, only: Scope | None = None) -> Iterator[Scope]:
        """The scopes that hold at least one skill (or just ``only``)."""
        if only is not None:
            yield only
            return
        yield Scope("org")
        for kind in ("teams", "agents"):
            for folder in self._folders(f"{ROOT}{kind}/"):
                scope = scope_of_path(f"{kind}/{folder}")
                if scope is not None:
                    yield scope

    def names(self, scope: Scope) -> list[str]:
        return [n for n in self._folders(f"{ROOT}{scope.path}/") if _valid_name(n)]

    def _folders(self, prefix: str) -> Iterator[str]:
        after = ""
        while True:
            page = self.store.list_objects(INTERNAL_BUCKET, prefix, "/", after, 1000)
            for common in page.common_prefixes:
                yield common[len(prefix):-1]
            if not page.is_truncated or not page.next_marker:
                return
            after = page.next_marker

    def latest(self, may_list: Callable[[Scope, str], bool], scope: Scope | None = None
               ) -> Iterator[dict[str, Any]]:
        """The latest manifest of every skill the caller may list, scope by scope."""
        for s in self.scopes(scope):
            for name in self.names(s):
                if not may_list(s, name):
                    continue
                try:
                    yield self.manifest(s, name)
                except SkillNotFound:
                    continue  # a push whose files are stored but whose manifest is not (yet)

    def search(self, may_list: Callable[[Scope, str], bool], scope: Scope | None = None,
               q: str | None = None) -> list[dict[str, Any]]:
        """Listing rows: every word of ``q`` must appear in the name or description."""
        words = (q or "").lower().split()
        rows = []
        for manifest in self.latest(may_list, scope):
            text = f"{manifest['name']} {manifest['description']}".lower()
            if all(w in text for w in words):
                rows.append(summary(manifest))
        return rows


def _valid_name(name: str) -> bool:
    try:
        check_name(name)
    except SkillError:
        return False
    return True


def decode_files(files: list[Mapping[str, Any]]) -> list[FileIn]:
    """The REST body's files (``path``, base64 ``content``, ``executable``) as bytes."""
    out = []
    for f in files:
        try:
            data = base64.b64decode(f["content"], validate=True)
        except (ValueError, TypeError):
            raise SkillError(f"files: the content of {str(f.get('path'))[:120]!r} is not valid "
                             "base64.") from None
        out.append(FileIn(f["path"], data, bool(f.get("executable", False))))
    return out
