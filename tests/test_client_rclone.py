"""rclone (its s3 backend, provider Other) against a real gateway over HTTP."""

from __future__ import annotations

import os
import re
import shutil
import time

import pytest
from clients import (
    body_of,
    bucket_exists,
    clean_env,
    keys_of,
    md5,
    read_tree,
    remove_bucket,
    run,
    unique_bucket,
    write_tree,
)

RCLONE = shutil.which("rclone")
MiB = 1024 * 1024

pytestmark = pytest.mark.skipif(RCLONE is None, reason="rclone is not installed")


@pytest.fixture(scope="module")
def rclone(gateway, tmp_path_factory):
    home = tmp_path_factory.mktemp("rclone")
    conf = home / "rclone.conf"
    conf.write_text(
        "[gw]\n"
        "type = s3\n"
        "provider = Other\n"
        "env_auth = false\n"
        f"access_key_id = {gateway.access_key}\n"
        f"secret_access_key = {gateway.secret_key}\n"
        f"endpoint = {gateway.endpoint}\n"
        "region = us-east-1\n"
        "force_path_style = true\n")
    # rclone fails with LoadCustomCABundleError if AWS_CA_BUNDLE names a bundle it cannot
    # use; clean_env drops it along with every other AWS_* and RCLONE_* variable.
    env = clean_env(HOME=str(home), XDG_CACHE_HOME=str(home / "cache"))

    def call(*args: str, check: bool = True, text: bool = True):
        return run([RCLONE, "--config", conf, "--retries", "1", "--low-level-retries", "1",
                    *args], env, timeout=120, check=check, text=text)

    return call


@pytest.fixture
def rbucket(s3):
    name = unique_bucket("rclone")
    yield name
    remove_bucket(s3, name)


def _files() -> dict[str, bytes]:
    return {
        "readme.txt": b"hello from rclone\n",
        "empty.txt": b"",
        "docs/a.md": b"# a\n" * 200,
        "docs/deep/b.json": b'{"b": 1}',
        "docs/deep/c.bin": os.urandom(300_000),
        "big/large.bin": os.urandom(21 * MiB),  # above the 5M cutoff: 5 parts of 5M
        "odd names/sp ace+plus&amp=eq.txt": b"odd\n",
        "unicode/\u00e9t\u00e9 \u6587\u4ef6.txt": "\u00e9t\u00e9".encode(),
    }


MULTIPART = ("--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M")


def test_copy_sync_check_lsf_cat_delete_purge(rclone, rbucket, s3, tmp_path):
    src = tmp_path / "src"
    files = _files()
    write_tree(src, files)

    # copy creates the bucket if needed and uploads the tree, the big file in parts.
    rclone("copy", src, f"gw:{rbucket}", *MULTIPART)
    assert bucket_exists(s3, rbucket)
    assert keys_of(s3, rbucket) == sorted(files)
    for rel, data in files.items():
        assert body_of(s3, rbucket, rel) == data, rel
    big = s3.head_object(Bucket=rbucket, Key="big/large.bin")
    assert re.fullmatch(r'"[0-9a-f]{32}-5"', big["ETag"]), big["ETag"]
    # rclone keeps the local mtime, and the MD5 of a multipart upload, as metadata.
    assert big["Metadata"]["md5chksum"]
    assert abs(float(big["Metadata"]["mtime"]) - (src / "big/large.bin").stat().st_mtime) < 1
    assert s3.list_multipart_uploads(Bucket=rbucket).get("Uploads", []) == []

    check = rclone("check", src, f"gw:{rbucket}")
    assert check.returncode == 0
    assert "0 differences found" in check.stderr, check.stderr

    # Copying again transfers nothing.
    again = rclone("copy", src, f"gw:{rbucket}", *MULTIPART, "-v")
    assert not re.search(r": Copied \(", again.stderr), again.stderr

    # Change a file (new size), change one in place (same size, new bytes and mtime),
    # only touch one (same bytes, new mtime), delete one and add one; then sync.
    (src / "readme.txt").write_bytes(b"hello from rclone, changed\n")
    same_size = bytes(reversed(files["docs/deep/b.json"]))
    (src / "docs/deep/b.json").write_bytes(same_size)
    later = time.time() + 120
    os.utime(src / "docs/deep/b.json", (later, later))
    os.utime(src / "docs/a.md", (later, later))
    (src / "docs/deep/c.bin").unlink()
    (src / "new/added.txt").parent.mkdir()
    (src / "new/added.txt").write_bytes(b"added\n")
    rclone("sync", src, f"gw:{rbucket}", *MULTIPART)
    expected = read_tree(src)
    assert keys_of(s3, rbucket) == sorted(expected)
    for rel, data in expected.items():
        assert body_of(s3, rbucket, rel) == data, rel
    # A touched file's new mtime is set in place, by a copy onto itself with new metadata.
    meta = s3.head_object(Bucket=rbucket, Key="docs/a.md")["Metadata"]
    assert abs(float(meta["mtime"]) - later) < 1, meta
    meta = s3.head_object(Bucket=rbucket, Key="docs/deep/b.json")["Metadata"]
    assert abs(float(meta["mtime"]) - later) < 1, meta

    check = rclone("check", src, f"gw:{rbucket}")
    assert check.returncode == 0 and "0 differences found" in check.stderr, check.stderr
    # check --download compares the bytes, not only sizes and hashes.
    check = rclone("check", "--download", src, f"gw:{rbucket}")
    assert check.returncode == 0 and "0 differences found" in check.stderr, check.stderr

    # check notices a difference made behind rclone's back.
    s3.put_object(Bucket=rbucket, Key="readme.txt", Body=b"HELLO FROM RCLONE, CHANGED\n")
    check = rclone("check", src, f"gw:{rbucket}", check=False)
    assert check.returncode != 0 and "1 differences found" in check.stderr, check.stderr

    lsf = rclone("lsf", "-R", f"gw:{rbucket}").stdout.splitlines()
    dirs = {line for line in lsf if line.endswith("/")}
    assert sorted(set(lsf) - dirs) == sorted(expected)
    assert dirs == {"big/", "docs/", "docs/deep/", "new/", "odd names/", "unicode/"}
    top = rclone("lsf", f"gw:{rbucket}").stdout.splitlines()
    assert sorted(top) == ["big/", "docs/", "empty.txt", "new/", "odd names/", "readme.txt",
                           "unicode/"]
    sizes = rclone("lsf", "--format", "ps", "--separator", "|", f"gw:{rbucket}/docs/deep")
    assert sizes.stdout.splitlines() == [f"b.json|{len(same_size)}"]
    hashes = rclone("lsf", "--format", "ph", "--hash", "MD5", "--separator", "|", "-R",
                    f"gw:{rbucket}/big").stdout.splitlines()
    assert hashes == [f"large.bin|{md5(files['big/large.bin'])}"]

    cat = rclone("cat", f"gw:{rbucket}/new/added.txt")
    assert cat.stdout == "added\n"
    cat = rclone("cat", "--offset", "100", "--count", "1000", f"gw:{rbucket}/big/large.bin",
                 text=False)
    assert cat.stdout == files["big/large.bin"][100:1100]

    rclone("delete", f"gw:{rbucket}/docs")
    assert not [k for k in keys_of(s3, rbucket) if k.startswith("docs/")]
    assert "readme.txt" in keys_of(s3, rbucket)
    rclone("deletefile", f"gw:{rbucket}/readme.txt")
    assert "readme.txt" not in keys_of(s3, rbucket)

    rclone("purge", f"gw:{rbucket}")
    assert not bucket_exists(s3, rbucket)


def test_copyto_moveto_and_mkdir_rmdir(rclone, rbucket, s3, tmp_path):
    rclone("mkdir", f"gw:{rbucket}")
    assert bucket_exists(s3, rbucket)
    f = tmp_path / "one.txt"
    f.write_bytes(b"one\n")
    rclone("copyto", f, f"gw:{rbucket}/x/one.txt")
    # Server-side copy and move inside the bucket.
    rclone("copyto", f"gw:{rbucket}/x/one.txt", f"gw:{rbucket}/y/copy.txt")
    rclone("moveto", f"gw:{rbucket}/x/one.txt", f"gw:{rbucket}/z/moved.txt")
    assert keys_of(s3, rbucket) == ["y/copy.txt", "z/moved.txt"]
    assert body_of(s3, rbucket, "y/copy.txt") == body_of(s3, rbucket, "z/moved.txt") == b"one\n"
    assert sorted(rclone("lsf", "-R", f"gw:{rbucket}").stdout.splitlines()) == [
        "y/", "y/copy.txt", "z/", "z/moved.txt"]
    rclone("delete", f"gw:{rbucket}")
    rclone("rmdir", f"gw:{rbucket}")
    assert not bucket_exists(s3, rbucket)
