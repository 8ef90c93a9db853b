"""The AWS CLI (v1, run as a subprocess) against a real gateway, over HTTP and HTTPS."""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from clients import (
    age_tree,
    body_of,
    clean_env,
    is_etag,
    keys_of,
    md5,
    read_tree,
    remove_bucket,
    run,
    unique_bucket,
    write_tree,
)
from conftest import make_client

AWS = Path(sys.executable).parent / "aws"


@dataclass
class Cli:
    """The aws cli bound to one gateway, with a private config and credentials."""

    endpoint: str
    env: dict[str, str]
    ca: str | None
    client: object  # a boto3 client for the same gateway, to check what the cli did
    cwd: Path  # the cli prints local paths relative to its working directory

    def __call__(self, *args: str, check: bool = True, timeout: float = 120, **kwargs):
        extra = ["--endpoint-url", self.endpoint]
        if self.ca:
            extra += ["--ca-bundle", self.ca]
        return run([AWS, *args, *extra], self.env, timeout=timeout, check=check, cwd=self.cwd,
                   **kwargs)


@pytest.fixture(scope="module", params=["http", "https"])
def cli(request, gateway, tls_gateway, tls_files, tmp_path_factory):
    # Both gateways are named, not looked up with getfixturevalue(): so pytest parametrizes
    # this fixture over their backends, and tears it (and the bucket made with it) down
    # before the gateway it talks to when the backend changes.
    if request.param == "http":
        gw, ca = gateway, None
    else:
        gw, ca = tls_gateway, tls_files["ca"]
    home = tmp_path_factory.mktemp(f"aws-{request.param}")
    config, creds = home / "config", home / "credentials"
    # Path-style requests, and no user config, profile or CA bundle from the environment.
    config.write_text("[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n")
    creds.write_text("")
    env = clean_env(AWS_ACCESS_KEY_ID=gw.access_key, AWS_SECRET_ACCESS_KEY=gw.secret_key,
                    AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=str(config),
                    AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_EC2_METADATA_DISABLED="true",
                    AWS_PAGER="", HOME=str(home))
    client = make_client(gw, ca)
    yield Cli(gw.endpoint, env, ca, client, home)
    # An idle keep-alive TLS connection would hold up the gateway's shutdown.
    client.close()


@pytest.fixture(scope="module")
def cli_bucket(cli):
    """A bucket made with ``aws s3 mb`` (one per scheme); emptied and deleted afterwards."""
    name = unique_bucket("awscli")
    out = cli("s3", "mb", f"s3://{name}")
    assert out.stdout.strip() == f"make_bucket: {name}"
    assert name in [b["Name"] for b in cli.client.list_buckets()["Buckets"]]
    yield name
    remove_bucket(cli.client, name)


@pytest.fixture
def work(cli, tmp_path):
    """Run the cli in this test's tmp dir: it prints local paths relative to it."""
    cli.cwd = tmp_path
    return tmp_path


def test_cp_round_trip(cli, cli_bucket, work):
    data = os.urandom(40 * 1024 * 1024)
    (work / "big.bin").write_bytes(data)

    up = cli("s3", "cp", "big.bin", f"s3://{cli_bucket}/cp/big.bin", "--no-progress")
    assert up.stdout.strip() == f"upload: ./big.bin to s3://{cli_bucket}/cp/big.bin"
    head = cli.client.head_object(Bucket=cli_bucket, Key="cp/big.bin")
    assert head["ContentLength"] == len(data)
    # 40 MiB is above the cli's 8 MiB multipart threshold: the ETag says how many parts.
    assert re.fullmatch(r'"[0-9a-f]{32}-5"', head["ETag"]), head["ETag"]
    # The cli asks for CRC32 checksums by default: a composite one over the five parts.
    checked = cli.client.head_object(Bucket=cli_bucket, Key="cp/big.bin", ChecksumMode="ENABLED")
    assert checked["ChecksumCRC32"].endswith("-5"), checked
    assert checked["ChecksumType"] == "COMPOSITE"

    # A server-side copy above the threshold, with a checksum: UploadPartCopy per part.
    cli("s3", "cp", f"s3://{cli_bucket}/cp/big.bin", f"s3://{cli_bucket}/cp/big-copy.bin",
        "--checksum-algorithm", "CRC32", "--no-progress")
    copied = cli.client.head_object(Bucket=cli_bucket, Key="cp/big-copy.bin", ChecksumMode="ENABLED")
    assert copied["ContentLength"] == len(data) and copied["ChecksumCRC32"]

    down = cli("s3", "cp", f"s3://{cli_bucket}/cp/big.bin", "big.back", "--no-progress")
    assert down.stdout.strip() == f"download: s3://{cli_bucket}/cp/big.bin to ./big.back"
    assert (work / "big.back").read_bytes() == data

    # A small file with a content type, and stdin (an upload of unknown length) and stdout.
    (work / "small.txt").write_bytes(b"hello from the aws cli\n")
    cli("s3", "cp", "small.txt", f"s3://{cli_bucket}/cp/small.txt", "--content-type", "text/plain")
    small = cli.client.head_object(Bucket=cli_bucket, Key="cp/small.txt", ChecksumMode="ENABLED")
    assert small["ContentType"] == "text/plain"
    crc = zlib.crc32(b"hello from the aws cli\n").to_bytes(4, "big")
    assert small["ChecksumCRC32"] == base64.b64encode(crc).decode()
    cli("s3", "cp", "-", f"s3://{cli_bucket}/cp/from-stdin.txt", input="piped\n")
    assert body_of(cli.client, cli_bucket, "cp/from-stdin.txt") == b"piped\n"
    assert cli("s3", "cp", f"s3://{cli_bucket}/cp/small.txt", "-").stdout == "hello from the aws cli\n"


def _tree(root: Path) -> dict[str, bytes]:
    files = {
        "top.txt": b"top level\n",
        "empty.txt": b"",
        "a/one.txt": b"one\n" * 100,
        "a/b/two.bin": os.urandom(70_000),
        "a/b/c/three.bin": os.urandom(9 * 1024 * 1024),  # multipart (8 MB threshold)
        "name with spaces/and+plus&amp.txt": b"odd names\n",
        "unicode/\u00e9t\u00e9-\u6587\u4ef6.txt": "\u00e9t\u00e9".encode(),
    }
    write_tree(root, files)
    # `s3 sync` uploads when the local mtime is newer than LastModified; keep the
    # local files older than the upload so the second sync is certainly a no-op.
    age_tree(root)
    return files


def test_sync_ls_rm(cli, cli_bucket, work):
    files = _tree(work / "tree")
    dest = f"s3://{cli_bucket}/tree"

    first = cli("s3", "sync", "tree", dest, "--no-progress")
    uploaded = [line for line in first.stdout.splitlines() if line.startswith("upload:")]
    assert len(uploaded) == len(files), first.stdout
    assert keys_of(cli.client, cli_bucket, "tree/") == sorted(f"tree/{k}" for k in files)
    for rel, data in files.items():
        assert body_of(cli.client, cli_bucket, f"tree/{rel}") == data, rel

    second = cli("s3", "sync", "tree", dest, "--no-progress")
    assert not [line for line in second.stdout.splitlines() if "upload:" in line], second.stdout

    # A changed file and a deleted one: sync --delete uploads one and deletes the other.
    (work / "tree" / "top.txt").write_bytes(b"top level, changed\n")
    (work / "tree" / "a" / "one.txt").unlink()
    third = cli("s3", "sync", "tree", dest, "--delete", "--no-progress")
    assert sorted(third.stdout.splitlines()) == [
        f"delete: {dest}/a/one.txt", f"upload: tree/top.txt to {dest}/top.txt"], third.stdout
    files["top.txt"] = b"top level, changed\n"
    del files["a/one.txt"]

    # Syncing back down into an empty directory reproduces the tree byte for byte.
    cli("s3", "sync", dest, "down", "--no-progress")
    assert read_tree(work / "down") == files

    # ls of the service lists the bucket; ls of a prefix shows common prefixes and objects.
    assert re.search(rf"^\S+ \S+ {cli_bucket}$", cli("s3", "ls").stdout, re.MULTILINE)
    top = [line.strip() for line in cli("s3", "ls", f"{dest}/").stdout.splitlines()]
    assert {"PRE a/", "PRE name with spaces/", "PRE unicode/"} <= set(top), top
    assert any(re.fullmatch(r"\S+ \S+\s+19 top\.txt", line) for line in top), top
    assert any(re.fullmatch(r"\S+ \S+\s+0 empty\.txt", line) for line in top), top
    assert len(top) == 5, top

    listed = cli("s3", "ls", f"{dest}/", "--recursive").stdout.splitlines()
    sizes = {line.split(None, 3)[3]: int(line.split(None, 3)[2]) for line in listed}
    assert sizes == {f"tree/{k}": len(v) for k, v in files.items()}

    rm = cli("s3", "rm", f"{dest}/a", "--recursive")
    assert sorted(rm.stdout.splitlines()) == [f"delete: {dest}/a/b/c/three.bin",
                                              f"delete: {dest}/a/b/two.bin"]
    assert keys_of(cli.client, cli_bucket, "tree/") == sorted(
        f"tree/{k}" for k in files if not k.startswith("a/"))
    rm = cli("s3", "rm", f"{dest}/", "--recursive")
    assert len(rm.stdout.splitlines()) == len(files) - 2
    assert keys_of(cli.client, cli_bucket, "tree/") == []


def test_s3api_put_and_head_object_with_metadata(cli, cli_bucket, work):
    body = work / "doc.json"
    body.write_bytes(b'{"hello": "world"}')
    put = json.loads(cli("s3api", "put-object", "--bucket", cli_bucket, "--key", "meta/doc.json",
                         "--body", "doc.json", "--content-type", "application/json",
                         "--cache-control", "max-age=60", "--content-disposition",
                         "attachment; filename=doc.json",
                         "--metadata", "Color=blue,owner=team-a").stdout)
    etag = put["ETag"]
    # Sealed at rest: an opaque ETag (the sealed bytes' MD5), as for SSE-KMS objects on AWS.
    assert is_etag(etag) and etag != f'"{md5(body.read_bytes())}"', etag
    assert put["ServerSideEncryption"] == "aws:kms"

    head = json.loads(cli("s3api", "head-object", "--bucket", cli_bucket,
                          "--key", "meta/doc.json").stdout)
    assert head["ETag"] == etag and head["ServerSideEncryption"] == "aws:kms"
    listed = json.loads(cli("s3api", "list-objects-v2", "--bucket", cli_bucket,
                            "--prefix", "meta/").stdout)
    assert [(o["Key"], o["ETag"]) for o in listed["Contents"]] == [("meta/doc.json", etag)]
    assert head["ContentLength"] == len(body.read_bytes())
    assert head["ContentType"] == "application/json"
    assert head["CacheControl"] == "max-age=60"
    assert head["ContentDisposition"] == "attachment; filename=doc.json"
    # S3 lower-cases user metadata names.
    assert head["Metadata"] == {"color": "blue", "owner": "team-a"}
    assert body_of(cli.client, cli_bucket, "meta/doc.json") == body.read_bytes()

    missing = cli("s3api", "head-object", "--bucket", cli_bucket, "--key", "meta/nope", check=False)
    assert missing.returncode != 0 and "404" in missing.stderr


def test_tls_gateway_stops_promptly_with_an_idle_client(tmp_path, tls_files):
    """SDKs (boto3, the cli's botocore) keep idle keep-alive connections open. Over HTTP a
    SIGTERM closes them at once; over HTTPS closing a TLS transport waits for the peer's
    close_notify, which an idle client never sends, so the gateway hangs for uvicorn's
    graceful-shutdown timeout (30 s) before exiting."""
    import time

    from servers import Gateway

    gw = Gateway(tmp_path / "data", tls=(tls_files["cert"], tls_files["key"])).start()
    client = make_client(gw, tls_files["ca"])
    try:
        client.list_buckets()  # leaves one idle keep-alive TLS connection in the pool
        started = time.monotonic()
        code = gw.stop(timeout=5)
        elapsed = time.monotonic() - started
    finally:
        gw.kill()
        client.close()
    assert code == 0 and elapsed < 5, f"exit code {code} after {elapsed:.1f}s"
