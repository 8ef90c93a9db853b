"""s3fs-fuse: a bucket of the gateway mounted as a file system, checked with boto3."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from clients import body_of, clean_env, keys_of, remove_bucket, unique_bucket

S3FS = shutil.which("s3fs")
MiB = 1024 * 1024

pytestmark = [
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="/dev/fuse is absent: no FUSE here"),
    pytest.mark.skipif(S3FS is None, reason="s3fs (s3fs-fuse) is not installed"),
]


@dataclass
class Mount:
    path: Path
    bucket: str
    log: Path


def s3fs_options(endpoint: str, passwd: Path) -> str:
    return ",".join([
        f"url={endpoint}",
        "use_path_request_style",  # http://host:port/bucket/key
        f"passwd_file={passwd}",
        "endpoint=us-east-1",  # the SigV4 region
        "sigv4",  # SigV4 only: never fall back to SigV2
        "multipart_size=5",  # MB: a 12 MiB file is uploaded in parts
        "stat_cache_expire=1",
        "retries=1",
        "dbglevel=info",
    ])


def _unmount(path: Path, proc: subprocess.Popen) -> None:
    """Unmount, whatever it takes; never leave the mount behind."""
    for attempt in range(5):
        if not os.path.ismount(path):
            break
        if subprocess.run(["fusermount", "-u", str(path)], capture_output=True, check=False).returncode == 0:
            break
        time.sleep(0.2 * (attempt + 1))  # busy: let open handles close
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    if os.path.ismount(path):  # a stale mount whose daemon is gone
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@pytest.fixture(scope="module")
def mount(gateway, s3, tmp_path_factory):
    home = tmp_path_factory.mktemp("s3fs")
    bucket = unique_bucket("s3fs")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="pre/existing.txt", Body=b"made with boto3\n")
    passwd = home / "passwd"
    passwd.write_text(f"{gateway.access_key}:{gateway.secret_key}\n")
    os.chmod(passwd, 0o600)  # s3fs refuses a passwd file others can read
    mnt = home / "mnt"
    mnt.mkdir()
    log = home / "s3fs.log"
    with open(log, "wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen([S3FS, bucket, str(mnt), "-f", "-o",
                                 s3fs_options(gateway.endpoint, passwd)],
                                env=clean_env(HOME=str(home)), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 20
        while not os.path.ismount(mnt):
            if proc.poll() is not None:
                pytest.fail(f"s3fs exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
            if time.time() > deadline:
                pytest.fail(f"s3fs did not mount in 20s:\n{log.read_text(errors='replace')}")
            time.sleep(0.05)
        yield Mount(mnt, bucket, log)
    finally:
        _unmount(mnt, proc)
        assert not os.path.ismount(mnt), "the s3fs mount was left behind"
        remove_bucket(s3, bucket)


def test_existing_objects_are_visible(mount, s3):
    assert "pre" in os.listdir(mount.path)
    assert os.path.isdir(mount.path / "pre")
    assert os.listdir(mount.path / "pre") == ["existing.txt"]
    assert (mount.path / "pre" / "existing.txt").read_bytes() == b"made with boto3\n"
    assert os.path.getsize(mount.path / "pre" / "existing.txt") == len(b"made with boto3\n")

    # An object put behind the mount's back shows up in the next listing.
    s3.put_object(Bucket=mount.bucket, Key="pre/later.txt", Body=b"later\n")
    assert sorted(os.listdir(mount.path / "pre")) == ["existing.txt", "later.txt"]
    assert (mount.path / "pre" / "later.txt").read_bytes() == b"later\n"


def test_write_read_append_overwrite(mount, s3):
    d = mount.path / "files"
    d.mkdir()
    f = d / "note.txt"
    f.write_bytes(b"first line\n")
    assert body_of(s3, mount.bucket, "files/note.txt") == b"first line\n"
    assert f.read_bytes() == b"first line\n"

    with open(f, "ab") as fh:
        fh.write(b"second line\n")
    assert body_of(s3, mount.bucket, "files/note.txt") == b"first line\nsecond line\n"
    assert f.read_bytes() == b"first line\nsecond line\n"
    assert os.path.getsize(f) == len(b"first line\nsecond line\n")

    # Overwriting with something shorter truncates the object.
    f.write_bytes(b"short\n")
    assert body_of(s3, mount.bucket, "files/note.txt") == b"short\n"

    # Odd names map to the same keys.
    odd = d / "sp ace+plus&amp=\u00e9t\u00e9.txt"
    odd.write_bytes(b"odd\n")
    assert body_of(s3, mount.bucket, "files/sp ace+plus&amp=\u00e9t\u00e9.txt") == b"odd\n"
    assert sorted(os.listdir(d)) == sorted(["note.txt", odd.name])

    assert keys_of(s3, mount.bucket, "files/") == sorted(
        ["files/", "files/note.txt", f"files/{odd.name}"])


def test_large_file_is_uploaded_in_parts(mount, s3):
    data = os.urandom(12 * MiB)
    f = mount.path / "big.bin"
    f.write_bytes(data)
    head = s3.head_object(Bucket=mount.bucket, Key="big.bin")
    assert head["ContentLength"] == len(data)
    assert re.fullmatch(r'"[0-9a-f]{32}-\d+"', head["ETag"]), head["ETag"]  # multipart
    assert body_of(s3, mount.bucket, "big.bin") == data
    assert f.read_bytes() == data
    with open(f, "rb") as fh:  # a read in the middle: a ranged GET
        fh.seek(7 * MiB + 3)
        assert fh.read(100) == data[7 * MiB + 3: 7 * MiB + 103]
    os.remove(f)
    assert "big.bin" not in keys_of(s3, mount.bucket)


def test_mkdir_rename_remove(mount, s3):
    d = mount.path / "tree"
    os.mkdir(d)
    assert "tree/" in keys_of(s3, mount.bucket, "tree")  # a directory marker object
    os.makedirs(d / "sub" / "deeper")
    (d / "sub" / "a.txt").write_bytes(b"a\n")
    (d / "b.txt").write_bytes(b"b\n")
    assert keys_of(s3, mount.bucket, "tree/") == [
        "tree/", "tree/b.txt", "tree/sub/", "tree/sub/a.txt", "tree/sub/deeper/"]
    assert sorted(os.listdir(d)) == ["b.txt", "sub"]

    # Renaming a file is a server-side copy and a delete.
    os.rename(d / "b.txt", d / "sub" / "b-moved.txt")
    assert "tree/b.txt" not in keys_of(s3, mount.bucket, "tree/")
    assert body_of(s3, mount.bucket, "tree/sub/b-moved.txt") == b"b\n"

    # Renaming a directory moves every object beneath it.
    os.rename(d / "sub", d / "renamed")
    assert keys_of(s3, mount.bucket, "tree/") == [
        "tree/", "tree/renamed/", "tree/renamed/a.txt", "tree/renamed/b-moved.txt",
        "tree/renamed/deeper/"]
    assert body_of(s3, mount.bucket, "tree/renamed/a.txt") == b"a\n"
    assert sorted(os.listdir(d / "renamed")) == ["a.txt", "b-moved.txt", "deeper"]

    os.remove(d / "renamed" / "a.txt")
    assert "tree/renamed/a.txt" not in keys_of(s3, mount.bucket, "tree/")
    with pytest.raises(OSError):
        os.rmdir(d / "renamed")  # not empty
    shutil.rmtree(d)
    assert keys_of(s3, mount.bucket, "tree") == []
    assert not d.exists()


def test_chmod_and_utime(mount, s3):
    f = mount.path / "attrs.txt"
    f.write_bytes(b"attributes\n")
    os.chmod(f, 0o640)
    meta = s3.head_object(Bucket=mount.bucket, Key="attrs.txt")["Metadata"]
    assert int(meta["mode"]) == stat.S_IFREG | 0o640
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o640

    os.utime(f, (1_000_000_000, 1_000_000_000))
    head = s3.head_object(Bucket=mount.bucket, Key="attrs.txt")
    assert head["Metadata"]["mtime"] == "1000000000"
    assert int(head["Metadata"]["mode"]) == stat.S_IFREG | 0o640  # kept by the metadata copy
    assert os.stat(f).st_mtime == 1_000_000_000
    # Metadata changes are copies onto the object itself: the bytes are untouched.
    assert body_of(s3, mount.bucket, "attrs.txt") == b"attributes\n"
    assert f.read_bytes() == b"attributes\n"
