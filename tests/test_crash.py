"""A gateway killed mid-upload leaves the old object (or none), and no temp files."""

from __future__ import annotations

import os
import socket
import time

from conftest import make_client
from rawhttp import sign
from servers import Gateway


def _start_slow_upload(gw: Gateway, bucket: str, key: str, total: int) -> socket.socket:
    headers = sign("PUT", f"/{bucket}/{key}", {}, {"host": f"127.0.0.1:{gw.port}",
                   "content-length": str(total)}, "UNSIGNED-PAYLOAD", gw.access_key, gw.secret_key)
    sock = socket.create_connection(("127.0.0.1", gw.port))
    head = f"PUT /{bucket}/{key} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(head.encode() + b"\r\n")
    return sock


def _files_under(path) -> list[str]:
    return [os.path.join(d, n) for d, _, names in os.walk(path) for n in names]


def test_sigkill_during_large_upload(tmp_path):
    gw = Gateway(tmp_path / "data").start()
    try:
        s3 = make_client(gw)
        s3.create_bucket(Bucket="crash")
        s3.put_object(Bucket="crash", Key="replaced", Body=b"old version")
        total = 512 * 1024 * 1024
        socks = [_start_slow_upload(gw, "crash", key, total) for key in ("replaced", "fresh")]
        chunk = os.urandom(1024 * 1024)
        for _ in range(64):  # 64 MiB into each, then the gateway dies
            for sock in socks:
                sock.sendall(chunk)
        uid = s3.create_multipart_upload(Bucket="crash", Key="parts")["UploadId"]
        s3.upload_part(Bucket="crash", Key="parts", UploadId=uid, PartNumber=1, Body=b"p" * 6 * 1024 * 1024)
        time.sleep(0.3)
        tmp_dir = tmp_path / "data" / "store" / "tmp"
        assert _files_under(tmp_dir), "the uploads should be in flight in tmp/"
        gw.kill()
        for sock in socks:
            sock.close()
        gw.start()
        s3 = make_client(gw)
        assert s3.get_object(Bucket="crash", Key="replaced")["Body"].read() == b"old version"
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="crash").get("Contents", [])]
        assert keys == ["replaced"]
        assert _files_under(tmp_dir) == []
        assert '"event":"store_recovered"' in gw.log()
        # The in-progress multipart upload survives a restart and completes.
        parts = s3.list_parts(Bucket="crash", Key="parts", UploadId=uid)["Parts"]
        s3.complete_multipart_upload(Bucket="crash", Key="parts", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": parts[0]["ETag"]}]})
        assert s3.head_object(Bucket="crash", Key="parts")["ContentLength"] == 6 * 1024 * 1024
        # Only data the index refers to remains on disk: one file for the completed upload.
        assert len(_files_under(tmp_path / "data" / "store" / "objects")) == 0
        assert len(_files_under(tmp_path / "data" / "store" / "parts")) == 1
    finally:
        gw.stop()


def test_graceful_sigterm(tmp_path):
    gw = Gateway(tmp_path / "data").start()
    make_client(gw).create_bucket(Bucket="term")
    assert gw.stop() == 0
    assert '"event":"stopped"' in gw.log()


def test_root_credentials_generated_once(tmp_path):
    gw = Gateway(tmp_path / "data", access_key="", secret_key="").start()
    try:
        first = gw.log()
        assert "secret key:" in first
        creds = tmp_path / "data" / ".orgmem" / "root-credentials.json"
        assert oct(creds.stat().st_mode & 0o777) == "0o600"
        import json
        stored = json.loads(creds.read_text())
        # The secret appears once on the terminal, never in a JSON log line.
        assert all(stored["secret_key"] not in line for line in first.splitlines() if line.startswith("{"))
    finally:
        gw.stop()
    gw.start()
    try:
        assert gw.log().count("secret key:") == 1
        gw.access_key, gw.secret_key = stored["access_key"], stored["secret_key"]
        make_client(gw).list_buckets()
    finally:
        gw.stop()
