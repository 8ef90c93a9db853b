"""Helpers shared by the tests that drive third-party S3 clients (aws cli, minio-py,
rclone, s3fs-fuse) against a real gateway."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

from botocore.exceptions import ClientError

#: Environment variables a client could pick credentials, endpoints or CA bundles
#: up from (AWS_*, and s3fs's AWSACCESSKEYID...); the tests pass everything explicitly.
_LEAKY_PREFIXES = ("AWS", "RCLONE_", "S3FS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
                   "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY",
                   "all_proxy", "NO_PROXY", "no_proxy")


def clean_env(**extra: str) -> dict[str, str]:
    """``os.environ`` without anything that would point a client elsewhere, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKY_PREFIXES)}
    env.update(extra)
    return env


def unique_bucket(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def run(args: list[str], env: dict[str, str], timeout: float = 120, check: bool = True,
        text: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run a client; on an unexpected exit code, fail with everything it printed."""
    proc = subprocess.run([str(a) for a in args], env=env, capture_output=True, text=text,
                          timeout=timeout, check=False, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def keys_of(client, bucket: str, prefix: str = "") -> list[str]:
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(o["Key"] for o in page.get("Contents", []))
    return sorted(keys)


def body_of(client, bucket: str, key: str) -> bytes:
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def bucket_exists(client, bucket: str) -> bool:
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
            return False
        raise
    return True


def remove_bucket(client, bucket: str) -> None:
    """Empty and delete ``bucket`` if it still exists (a test may have purged it)."""
    if not bucket_exists(client, bucket):
        return
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    for up in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        client.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    client.delete_bucket(Bucket=bucket)


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def age_tree(root: Path, seconds: float = 3600) -> None:
    """Move every file's mtime into the past, so that sync tools comparing local mtimes
    with the server's second-resolution LastModified see the upload as newer."""
    import time

    then = time.time() - seconds
    for p in root.rglob("*"):
        if p.is_file():
            os.utime(p, (then, then))


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def is_etag(value: str, parts: int = 0, quoted: bool = True) -> bool:
    """Whether ``value`` has the shape of an S3 ETag: 32 lower-case hex digits, followed by
    "-N" for an object of N parts (``parts``). The gateway seals objects at rest, so the
    digits are opaque (the MD5 of the sealed bytes, as AWS's ETags of SSE-KMS objects are)
    and never the MD5 of the plaintext; only their shape and their stability can be checked."""
    pattern = r"[0-9a-f]{32}" + (f"-{parts}" if parts else "")
    if quoted:
        pattern = f'"{pattern}"'
    return re.fullmatch(pattern, value) is not None


def wait_until(condition, timeout: float = 10.0, step: float = 0.05) -> bool:
    """Call ``condition`` until it is true or ``timeout`` seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return bool(condition())
