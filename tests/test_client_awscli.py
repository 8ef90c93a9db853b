"""The AWS CLI (v1, run as a subprocess) against a real gateway, over HTTP and HTTPS."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from clients import (age_tree, body_of, clean_env, keys_of, md5, read_tree, remove_bucket, run,
                     unique_bucket, write_tree)
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


@pytest.fixture(params=["http", "https"])
def cli(request, tmp_path):
    if request.param == "http":
        gw, ca = request.getfixturevalue("gateway"), None
    else:
        gw, ca = request.getfixturevalue("tls_gateway"), request.getfixturevalue("tls_files")["ca"]
    home = tmp_path / "aws-home"
    home.mkdir()
    config, creds = home / "config", home / "credentials"
    # Path-style requests, and no user config, profile or CA bundle from the environment.
    config.write_text("[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n")
    creds.write_text("")
    env = clean_env(AWS_ACCESS_KEY_ID=gw.access_key, AWS_SECRET_ACCESS_KEY=gw.secret_key,
                    AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=str(config),
                    AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_EC2_METADATA_DISABLED="true",
                    AWS_PAGER="", HOME=str(home))
    return Cli(gw.endpoint, env, ca, make_client(gw, ca), tmp_path)


@pytest.fixture
def cli_bucket(cli):
    """A bucket made with ``aws s3 mb``; emptied and deleted with boto3 afterwards."""
    name = unique_bucket("awscli")
    out = cli("s3", "mb", f"s3://{name}")
    assert out.stdout.strip() == f"make_bucket: {name}"
    assert name in [b["Name"] for b in cli.client.list_buckets()["Buckets"]]
    yield name
    remove_bucket(cli.client, name)


def test_mb_existing_bucket_fails(cli, cli_bucket):
    out = cli("s3", "mb", f"s3://{cli_bucket}", check=False)
    assert out.returncode != 0
    assert "BucketAlreadyOwnedByYou" in out.stderr


def test_cp_large_file_round_trip(cli, cli_bucket, tmp_path):
    data = os.urandom(40 * 1024 * 1024)
    src, back = tmp_path / "big.bin", tmp_path / "big.back"
    src.write_bytes(data)

    up = cli("s3", "cp", src, f"s3://{cli_bucket}/dir/big.bin", "--no-progress")
    assert up.stdout.strip() == f"upload: ./big.bin to s3://{cli_bucket}/dir/big.bin"
    head = cli.client.head_object(Bucket=cli_bucket, Key="dir/big.bin")
    assert head["ContentLength"] == len(data)
    # 40 MB is above the cli's 8 MB multipart threshold: the ETag says how many parts.
    assert re.fullmatch(r'"[0-9a-f]{32}-5"', head["ETag"]), head["ETag"]

    down = cli("s3", "cp", f"s3://{cli_bucket}/dir/big.bin", back, "--no-progress")
    assert down.stdout.strip() == f"download: s3://{cli_bucket}/dir/big.bin to ./big.back"
    assert back.read_bytes() == data


def test_cp_small_file_and_stdin_stdout(cli, cli_bucket, tmp_path):
    src = tmp_path / "small.txt"
    src.write_bytes(b"hello from the aws cli\n")
    cli("s3", "cp", src, f"s3://{cli_bucket}/small.txt", "--content-type", "text/plain")
    head = cli.client.head_object(Bucket=cli_bucket, Key="small.txt")
    assert head["ContentType"] == "text/plain"
    assert body_of(cli.client, cli_bucket, "small.txt") == src.read_bytes()

    out = cli("s3", "cp", f"s3://{cli_bucket}/small.txt", "-")
    assert out.stdout == "hello from the aws cli\n"

    # `-` uploads stdin as a streaming (unknown length) upload.
    cli("s3", "cp", "-", f"s3://{cli_bucket}/from-stdin.txt", input="piped\n")
    assert body_of(cli.client, cli_bucket, "from-stdin.txt") == b"piped\n"


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


def test_sync_twice_then_ls_and_rm(cli, cli_bucket, tmp_path):
    src = tmp_path / "tree"
    files = _tree(src)

    first = cli("s3", "sync", src, f"s3://{cli_bucket}/tree", "--no-progress")
    uploaded = [line for line in first.stdout.splitlines() if line.startswith("upload:")]
    assert len(uploaded) == len(files), first.stdout
    assert keys_of(cli.client, cli_bucket) == sorted(f"tree/{k}" for k in files)
    for rel, data in files.items():
        assert body_of(cli.client, cli_bucket, f"tree/{rel}") == data, rel

    second = cli("s3", "sync", src, f"s3://{cli_bucket}/tree", "--no-progress")
    assert not [line for line in second.stdout.splitlines() if "upload:" in line], second.stdout

    # sync back down into an empty directory reproduces the tree byte for byte.
    dst = tmp_path / "down"
    cli("s3", "sync", f"s3://{cli_bucket}/tree", dst, "--no-progress")
    assert read_tree(dst) == files

    # a changed file and a deleted file: sync --delete uploads one and deletes one.
    (src / "top.txt").write_bytes(b"top level, changed\n")
    (src / "a" / "one.txt").unlink()
    third = cli("s3", "sync", src, f"s3://{cli_bucket}/tree", "--delete", "--no-progress")
    lines = sorted(third.stdout.splitlines())
    assert lines == [f"delete: s3://{cli_bucket}/tree/a/one.txt",
                     f"upload: tree/top.txt to s3://{cli_bucket}/tree/top.txt"], third.stdout
    assert body_of(cli.client, cli_bucket, "tree/top.txt") == b"top level, changed\n"
    assert "tree/a/one.txt" not in keys_of(cli.client, cli_bucket)

    # ls of the service lists the bucket; ls of a prefix shows common prefixes and objects.
    assert re.search(rf"^\S+ \S+ {cli_bucket}$", cli("s3", "ls").stdout, re.M)
    top = cli("s3", "ls", f"s3://{cli_bucket}/tree/").stdout.splitlines()
    assert "PRE a/" in [line.strip() for line in top]
    assert "PRE name with spaces/" in [line.strip() for line in top]
    assert any(re.fullmatch(r"\S+ \S+\s+19 top\.txt", line) for line in top), top
    assert any(re.fullmatch(r"\S+ \S+\s+0 empty\.txt", line) for line in top), top

    listed = cli("s3", "ls", f"s3://{cli_bucket}/", "--recursive").stdout.splitlines()
    sizes = {line.split(None, 3)[3]: int(line.split(None, 3)[2]) for line in listed}
    expected = {f"tree/{k}": len(v) for k, v in files.items() if k != "a/one.txt"}
    expected["tree/top.txt"] = len(b"top level, changed\n")
    assert sizes == expected

    rm = cli("s3", "rm", f"s3://{cli_bucket}/tree/a", "--recursive")
    assert sorted(rm.stdout.splitlines()) == [f"delete: s3://{cli_bucket}/tree/a/b/c/three.bin",
                                              f"delete: s3://{cli_bucket}/tree/a/b/two.bin"]
    assert not [k for k in keys_of(cli.client, cli_bucket) if k.startswith("tree/a/")]
    cli("s3", "rm", f"s3://{cli_bucket}/", "--recursive")
    assert keys_of(cli.client, cli_bucket) == []

    # rb removes the (now empty) bucket; the fixture copes with it being gone.
    assert cli("s3", "rb", f"s3://{cli_bucket}").stdout.strip() == f"remove_bucket: {cli_bucket}"
    assert cli_bucket not in [b["Name"] for b in cli.client.list_buckets()["Buckets"]]


def test_s3api_put_and_head_object_with_metadata(cli, cli_bucket, tmp_path):
    body = tmp_path / "doc.json"
    body.write_bytes(b'{"hello": "world"}')
    put = json.loads(cli("s3api", "put-object", "--bucket", cli_bucket, "--key", "meta/doc.json",
                         "--body", body, "--content-type", "application/json",
                         "--cache-control", "max-age=60", "--content-disposition",
                         "attachment; filename=doc.json",
                         "--metadata", "Color=blue,owner=team-a").stdout)
    etag = put["ETag"]
    assert etag == f'"{md5(body.read_bytes())}"'

    head = json.loads(cli("s3api", "head-object", "--bucket", cli_bucket,
                          "--key", "meta/doc.json").stdout)
    assert head["ETag"] == etag
    assert head["ContentLength"] == len(body.read_bytes())
    assert head["ContentType"] == "application/json"
    assert head["CacheControl"] == "max-age=60"
    assert head["ContentDisposition"] == "attachment; filename=doc.json"
    # S3 lower-cases user metadata names.
    assert head["Metadata"] == {"color": "blue", "owner": "team-a"}

    missing = cli("s3api", "head-object", "--bucket", cli_bucket, "--key", "nope", check=False)
    assert missing.returncode != 0 and "404" in missing.stderr

    got = tmp_path / "got.json"
    out = json.loads(cli("s3api", "get-object", "--bucket", cli_bucket, "--key", "meta/doc.json",
                         got).stdout)
    assert out["Metadata"] == {"color": "blue", "owner": "team-a"}
    assert got.read_bytes() == body.read_bytes()

    # copy-object with a metadata REPLACE, as `aws s3 cp --metadata-directive` does.
    cli("s3api", "copy-object", "--bucket", cli_bucket, "--key", "meta/copy.json",
        "--copy-source", f"{cli_bucket}/meta/doc.json", "--metadata-directive", "REPLACE",
        "--metadata", "color=red", "--content-type", "text/plain")
    copy = json.loads(cli("s3api", "head-object", "--bucket", cli_bucket,
                          "--key", "meta/copy.json").stdout)
    assert copy["Metadata"] == {"color": "red"} and copy["ContentType"] == "text/plain"
    assert copy["ETag"] == etag

    listed = json.loads(cli("s3api", "list-objects-v2", "--bucket", cli_bucket,
                            "--prefix", "meta/").stdout)
    assert [o["Key"] for o in listed["Contents"]] == ["meta/copy.json", "meta/doc.json"]
