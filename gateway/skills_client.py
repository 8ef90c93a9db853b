"""A small client for the gateway's skills API (``/v1/skills``), and the folder <-> files mapping.

It rides on :class:`~gateway.admin_client.AdminClient`'s transport (SigV4 signing, endpoint and
CA-bundle checks, :class:`~gateway.admin_client.AdminError`, exported here as ``SkillsError``).

    skills = SkillsClient(endpoint, access_key, secret_key)
    skills.push("./pdf-tools", scope="team:finance")       # validated here, then on the gateway
    skills.pull("pdf-tools", "./restored", version=2)      # byte for byte, sha256 checked
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .admin_client import AdminError, ServiceClient
from .memory import skill_format as fmt

SkillsError = AdminError
JSON = dict[str, Any]
#: Left out of a pushed folder: version control, caches and OS litter, never part of a skill.
IGNORED = frozenset({".git", ".hg", ".svn", "__pycache__", ".DS_Store", ".pytest_cache", ".mypy_cache",
                     ".ruff_cache", "node_modules", ".venv"})


def read_folder(folder: str | os.PathLike) -> tuple[str, list[JSON]]:
    """The skill name (the folder's name) and its files, validated as the gateway will."""
    root = Path(folder)
    if not root.is_dir():
        raise SkillsError(0, "InvalidSkill", f"{folder}: not a folder")
    name = root.resolve().name
    files: dict[str, bytes] = {}
    executable: dict[str, bool] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED)
        for filename in sorted(filenames):
            if filename in IGNORED:
                continue
            full = Path(dirpath) / filename
            rel = full.relative_to(root).as_posix()
            if full.is_symlink() and not full.resolve().is_relative_to(root.resolve()):
                # a link to ~/.aws/credentials in a cloned skill would publish it to the fleet
                raise SkillsError(0, "InvalidSkill", f"{folder}: {rel} is a symbolic link to a file "
                                  "outside the skill folder; copy the file in if it belongs to the skill")
            try:
                mode = full.stat().st_mode
            except OSError as exc:  # a dangling link, or a file gone meanwhile
                raise SkillsError(0, "InvalidSkill", f"{folder}: cannot read {rel}: "
                                  f"{exc.strerror or exc}") from None
            if not stat.S_ISREG(mode):
                continue
            files[rel] = full.read_bytes()
            executable[rel] = bool(mode & stat.S_IXUSR)
            if sum(len(v) for v in files.values()) > fmt.MAX_TOTAL_BYTES:
                break
    try:
        fmt.check_folder(name, files)
    except fmt.SkillError as exc:
        raise SkillsError(0, "InvalidSkill", f"{folder}: {exc}") from None
    return name, [{"path": p, "content": base64.b64encode(d).decode(), "executable": executable[p]}
                  for p, d in sorted(files.items())]


class SkillsClient(ServiceClient):
    default_timeout = 60

    def _raw(self, method: str, path: str, query: dict | None = None, body: bytes = b"") -> bytes:
        _, _, data = self._transport._request(method, path, query=query, body=body,
                                              content_type="application/json" if body else None)
        return data

    def _json(self, method: str, path: str, query: dict | None = None, payload: Any = None) -> Any:
        body = json.dumps(payload).encode() if payload is not None else b""
        return json.loads(self._raw(method, path, query, body))

    # -- calls ------------------------------------------------------------------

    def publish(self, name: str, files: list[JSON], scope: str | None = None) -> JSON:
        """Send a version's files (``path``, base64 ``content``, ``executable``); its manifest."""
        return self._json("POST", f"/v1/skills/{quote(name, safe='')}/versions", {"scope": scope},
                          {"files": files})

    def push(self, folder: str | os.PathLike, scope: str | None = None) -> JSON:
        name, files = read_folder(folder)
        return self.publish(name, files, scope)

    def list(self, scope: str | None = None, q: str | None = None) -> list[JSON]:
        return self._json("GET", "/v1/skills", {"scope": scope, "q": q})["skills"]

    def manifest(self, name: str, scope: str | None = None, version: int | None = None) -> JSON:
        return self._json("GET", f"/v1/skills/{quote(name, safe='')}", {"scope": scope, "version": version})

    def versions(self, name: str, scope: str | None = None) -> JSON:
        return self._json("GET", f"/v1/skills/{quote(name, safe='')}/versions", {"scope": scope})

    def file(self, name: str, path: str, scope: str | None = None, version: int | None = None) -> bytes:
        return self._raw("GET", f"/v1/skills/{quote(name, safe='')}/file",
                         {"path": path, "scope": scope, "version": version})

    def pull(self, name: str, folder: str | os.PathLike, scope: str | None = None,
             version: int | None = None) -> JSON:
        """Restore a version into ``folder`` (absent or empty), each file's sha256 checked.

        The files are written beside it first and moved into place at the end, so a failed
        pull leaves no half-restored folder."""
        target = Path(folder)
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise SkillsError(0, "FolderNotEmpty", f"{folder}: exists and is not an empty folder")
        manifest = self.manifest(name, scope, version)
        scope, version = manifest["scope"], manifest["version"]
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            for entry in manifest["files"]:
                path = fmt.check_path(entry["path"])
                data = self.file(name, path, scope, version)
                if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    raise SkillsError(0, "ChecksumMismatch", f"{path}: the bytes received do not match "
                                      "the manifest's sha256")
                dest = staging / path
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
                os.chmod(dest, 0o755 if entry.get("executable") else 0o644)
            os.chmod(staging, 0o755)
            if target.exists():
                target.rmdir()
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return manifest
