"""The index's working directories: plaintext Tantivy files under the temp directory.

The sealed snapshots in the store are the index's only lasting form; a gateway works on a
plaintext copy in a fresh temp directory and removes it when it swaps or stops. A gateway
that is killed cannot, so each directory has an owner file beside it (``<dir>.owner``:
the process id and its start time) and every gateway, when it opens its index, removes
the directories whose owner is gone. Only directories of this user are touched.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

PREFIX = "orgmem-index-"
OWNER_SUFFIX = ".owner"
#: A directory without an owner file (made by an older version, or being made right now)
#: is removed only when it has not changed for this long.
UNOWNED_GRACE = 3600.0


def new() -> Path:
    """A fresh, empty working directory (mode 0700), recorded as this process's.

    The owner file is written before the directory exists, so a gateway killed at any
    moment never leaves a directory without an owner (which would wait out the grace)."""
    root = Path(tempfile.gettempdir())
    while True:
        directory = root / (PREFIX + secrets.token_hex(8))
        try:
            fd = os.open(_owner_file(directory), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(_identity(os.getpid()))
        os.mkdir(directory, 0o700)
        return directory


def remove(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    _owner_file(directory).unlink(missing_ok=True)


def sweep(root: str | os.PathLike | None = None) -> int:
    """Remove the working directories whose gateway process is gone; how many."""
    removed = 0
    for directory in Path(root or tempfile.gettempdir()).glob(PREFIX + "*"):
        if directory.name.endswith(OWNER_SUFFIX):
            _drop_if_stray(directory)
            continue
        if directory.is_symlink() or not directory.is_dir():
            continue
        try:
            if directory.stat().st_uid != os.getuid() or not _orphaned(directory):
                continue
        except OSError:
            continue  # removed meanwhile by its owner
        remove(directory)
        removed += 1
    return removed


def _drop_if_stray(owner: Path) -> None:
    """An owner file whose directory was never made (its gateway killed in between)."""
    directory = owner.with_name(owner.name[: -len(OWNER_SUFFIX)])
    try:
        if not directory.exists() and owner.stat().st_uid == os.getuid() and _orphaned(directory):
            owner.unlink(missing_ok=True)
    except OSError:
        pass


def _orphaned(directory: Path) -> bool:
    try:
        pid_text, _, started = _owner_file(directory).read_text().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return time.time() - directory.stat().st_mtime > UNOWNED_GRACE
    return _identity(pid) != f"{pid} {started}"


def _owner_file(directory: Path) -> Path:
    return directory.with_name(directory.name + OWNER_SUFFIX)


def _identity(pid: int) -> str:
    """``pid start-time``; the start time tells a reused pid from the original process.
    A process that is gone has no start time (an empty one)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return f"{pid} {fh.read().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        pass
    try:  # no /proc: whether the pid exists at all
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"{pid} "
    except PermissionError:
        pass
    return f"{pid} ?"
