"""The ``skills`` bucket as a read-only store view over the latest version of every skill.

Keys are ``<scope>/<name>/<path>`` with ``<scope>`` one of ``org``, ``teams/<t>``,
``agents/<a>``: the folders a sandbox mounts read-only and loads as Agent Skills. Only the
skills the caller may read are shown. A listing reads each skill's latest manifest once,
so it shows whole versions; a GET resolves the latest manifest once and serves that
version's bytes (immutable, content-addressed), so a range read never mixes versions.
The ETag of a file is the MD5 of its bytes, recorded at push, so it agrees across LIST,
HEAD and GET and with what a client computes.
"""

from __future__ import annotations

import mimetypes
from calendar import timegm
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..store.base import ListEntry, ListPage, NoSuchKey, ObjectInfo, ObjectMeta, ObjectReader, page_of
from .skills import Scope, SkillNotFound, Skills, scope_of_path

BUCKET = "skills"
_MISSING = ("The specified key does not exist: the skills bucket holds <scope>/<name>/<file> of each "
            "skill's latest version, <scope> being org, teams/<team> or agents/<agent>.")


def _ts(text: str) -> float:
    return timegm(datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").timetuple())


def split_key(key: str) -> tuple[Scope, str, str] | None:
    """``teams/t/name/a/b.txt`` -> (team:t, name, a/b.txt); None when the key names no skill file."""
    parts = key.split("/")
    width = 1 if parts[0] == "org" else 2
    if len(parts) < width + 2:
        return None
    scope = scope_of_path("/".join(parts[:width]))
    if scope is None:
        return None
    return scope, parts[width], "/".join(parts[width + 1:])


class SkillsBucket:
    """Just enough of the store protocol for the S3 listing and read handlers."""

    def __init__(self, skills: Skills, may_list: Callable[[Scope, str], bool],
                 may_read: Callable[[Scope, str], bool]) -> None:
        self.skills = skills
        self.may_list = may_list
        self.may_read = may_read

    def _scopes_for(self, prefix: str) -> Scope | None | bool:
        """The one scope a prefix lies within (None: any; False: none)."""
        parts = prefix.split("/")
        if len(parts) >= 2 and parts[0] == "org":
            return Scope("org")
        if len(parts) >= 3 and parts[0] in ("teams", "agents"):
            return scope_of_path("/".join(parts[:2])) or False
        return None

    def _entries(self, prefix: str) -> dict[str, ListEntry]:
        only = self._scopes_for(prefix)
        if only is False:
            return {}
        out: dict[str, ListEntry] = {}
        for manifest in self.skills.latest(self.may_list, only or None):
            base = f"{Scope.parse(manifest['scope']).path}/{manifest['name']}/"
            if not (base.startswith(prefix) or prefix.startswith(base)):
                continue
            created = _ts(manifest["created_at"])
            for f in manifest["files"]:
                key = base + f["path"]
                if key.startswith(prefix):
                    out[key] = ListEntry(key, f["size"], f["md5"], created)
        return out

    def list_objects(self, bucket: str, prefix: str = "", delimiter: str = "", after: str = "",
                     limit: int = 1000) -> ListPage:
        return page_of(self._entries(prefix), prefix, delimiter, after, limit)

    def _find(self, key: str) -> tuple[dict[str, Any], str]:
        found = split_key(key)
        if found is None:
            raise NoSuchKey(_MISSING)
        scope, name, path = found
        if not self.may_read(scope, name):  # the handler answers AccessDenied before this
            raise NoSuchKey(_MISSING)
        try:
            manifest = self.skills.manifest(scope, name)
        except (SkillNotFound, ValueError):
            raise NoSuchKey(_MISSING) from None
        if not any(f["path"] == path for f in manifest["files"]):
            raise NoSuchKey(_MISSING)
        return manifest, path

    def head_object(self, bucket: str, key: str) -> ObjectInfo:
        manifest, path = self._find(key)
        entry = next(f for f in manifest["files"] if f["path"] == path)
        return self._info(manifest, key, entry)

    def open_object(self, bucket: str, key: str, start: int = 0, end: int | None = None) -> ObjectReader:
        manifest, path = self._find(key)
        try:
            entry, reader = self.skills.open_file(manifest, path, start, end)
        except SkillNotFound:
            raise NoSuchKey(_MISSING) from None
        reader.info = self._info(manifest, key, entry)
        return reader

    @staticmethod
    def _info(manifest: dict[str, Any], key: str, entry: dict[str, Any]) -> ObjectInfo:
        content_type = mimetypes.guess_type(entry["path"])[0] or "application/octet-stream"
        if entry["path"].endswith(".md"):
            content_type = "text/markdown; charset=utf-8"
        meta = ObjectMeta(content_type=content_type,
                          user={"skill-version": str(manifest["version"]), "sha256": entry["sha256"]})
        return ObjectInfo(BUCKET, key, entry["size"], entry["md5"], _ts(manifest["created_at"]), meta)
