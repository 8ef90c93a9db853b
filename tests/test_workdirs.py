"""Working copies of the index left by killed gateways are removed by the next one."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from servers import Gateway

from gateway.search import workdirs


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sweep_removes_only_directories_whose_owner_is_gone(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = workdirs.new()
    (mine / "segment.idx").write_bytes(b"plaintext")
    orphan = workdirs.new()
    (orphan / "segment.idx").write_bytes(b"plaintext")
    (tmp_path / (orphan.name + workdirs.OWNER_SUFFIX)).write_text(f"{_dead_pid()} 12345")
    reused = workdirs.new()  # our pid, but another start time: a reused pid
    (tmp_path / (reused.name + workdirs.OWNER_SUFFIX)).write_text(f"{os.getpid()} 1")
    fresh_unowned = tmp_path / "orgmem-index-fresh"
    fresh_unowned.mkdir()
    old_unowned = tmp_path / "orgmem-index-old"
    old_unowned.mkdir()
    past = time.time() - workdirs.UNOWNED_GRACE - 60
    os.utime(old_unowned, (past, past))
    unrelated = tmp_path / "something-else"
    unrelated.mkdir()
    stray_owner = tmp_path / (workdirs.PREFIX + "never-made" + workdirs.OWNER_SUFFIX)
    stray_owner.write_text(f"{_dead_pid()} 12345")  # killed between owner file and mkdir
    making_owner = tmp_path / (workdirs.PREFIX + "being-made" + workdirs.OWNER_SUFFIX)
    making_owner.write_text(workdirs._identity(os.getpid()))

    assert workdirs.sweep() == 3
    assert mine.is_dir() and fresh_unowned.is_dir() and unrelated.is_dir()
    assert not orphan.exists() and not reused.exists() and not old_unowned.exists()
    assert not (tmp_path / (orphan.name + workdirs.OWNER_SUFFIX)).exists()
    assert not stray_owner.exists() and making_owner.exists()
    workdirs.remove(mine)
    assert not mine.exists() and not (tmp_path / (mine.name + workdirs.OWNER_SUFFIX)).exists()


def _workdirs(root) -> list:
    return sorted(p for p in root.glob(workdirs.PREFIX + "*") if p.is_dir())


def _until(probe, deadline: float = 30.0):
    end = time.time() + deadline
    while time.time() < end:
        if probe():
            return True
        time.sleep(0.1)
    return probe()


def test_a_killed_gateways_plaintext_index_is_removed_by_the_next(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    gw = Gateway(tmp_path / "data", env={"TMPDIR": str(tmp)}).start()
    try:
        assert _until(lambda: _workdirs(tmp)), "the gateway works on an index copy under TMPDIR"
    finally:
        gw.kill()
    left = _workdirs(tmp)
    assert left, "a killed gateway cannot remove its copy"
    gw.start()
    try:
        assert _until(lambda: not any(p.exists() for p in left))
        assert _until(lambda: len(_workdirs(tmp)) == 1)  # its own
    finally:
        gw.stop()
    assert _workdirs(tmp) == []  # a clean stop removes its own
