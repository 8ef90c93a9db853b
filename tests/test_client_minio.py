"""minio-py (the MinIO Python SDK) against a real gateway over HTTP."""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
from clients import body_of, is_etag, keys_of, md5, remove_bucket, unique_bucket
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import S3Error

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def mc(gateway):
    host = urlsplit(gateway.endpoint).netloc
    return Minio(host, access_key=gateway.access_key, secret_key=gateway.secret_key,
                 secure=False, region="us-east-1")


@pytest.fixture
def mbucket(mc, s3):
    name = unique_bucket("minio")
    mc.make_bucket(name)
    assert mc.bucket_exists(name)
    yield name
    remove_bucket(s3, name)


def test_bucket_exists_and_list_buckets(mc, mbucket):
    assert mbucket in [b.name for b in mc.list_buckets()]
    assert not mc.bucket_exists(unique_bucket("missing"))
    with pytest.raises(S3Error) as err:
        mc.make_bucket(mbucket)
    assert err.value.code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists")


def test_put_get_stat_object(mc, mbucket, s3):
    data = b"hello from minio-py\n" * 50
    result = mc.put_object(mbucket, "docs/hello.txt", io.BytesIO(data), len(data),
                           content_type="text/plain", metadata={"Color": "blue", "x-amz-meta-owner": "a"})
    # Sealed at rest: an opaque ETag (the sealed bytes' MD5), not the MD5 of the data.
    assert is_etag(result.etag, quoted=False) and result.etag != md5(data), result.etag
    assert body_of(s3, mbucket, "docs/hello.txt") == data

    resp = mc.get_object(mbucket, "docs/hello.txt")
    try:
        assert resp.read() == data
        assert resp.headers["Content-Type"] == "text/plain"
    finally:
        resp.close()
        resp.release_conn()

    ranged = mc.get_object(mbucket, "docs/hello.txt", offset=6, length=4)
    try:
        assert ranged.status == 206 and ranged.read() == data[6:10]
    finally:
        ranged.close()
        ranged.release_conn()

    stat = mc.stat_object(mbucket, "docs/hello.txt")
    assert stat.size == len(data)
    assert stat.etag == result.etag
    assert stat.content_type == "text/plain"
    assert stat.last_modified is not None
    assert stat.metadata["x-amz-meta-color"] == "blue"
    assert stat.metadata["x-amz-meta-owner"] == "a"
    assert s3.head_object(Bucket=mbucket, Key="docs/hello.txt")["Metadata"] == {
        "color": "blue", "owner": "a"}

    with pytest.raises(S3Error) as err:
        mc.stat_object(mbucket, "docs/missing.txt")
    assert err.value.code == "NoSuchKey"
    with pytest.raises(S3Error) as err:
        mc.get_object(mbucket, "docs/missing.txt")
    assert err.value.code == "NoSuchKey"


def test_put_object_unknown_length(mc, mbucket, s3):
    """length=-1 makes minio-py upload in parts of part_size, however long the stream is."""
    data = os.urandom(6 * MiB)
    mc.put_object(mbucket, "stream.bin", io.BytesIO(data), -1, part_size=5 * MiB)
    head = s3.head_object(Bucket=mbucket, Key="stream.bin")
    assert head["ContentLength"] == len(data)
    assert re.fullmatch(r'"[0-9a-f]{32}-2"', head["ETag"]), head["ETag"]
    assert body_of(s3, mbucket, "stream.bin") == data


def test_list_objects(mc, mbucket):
    keys = ["a.txt", "dir/b.txt", "dir/c.txt", "dir/sub/d.txt", "e/f.txt", "z.txt"]
    etags = {key: mc.put_object(mbucket, key, io.BytesIO(key.encode()), len(key)).etag
             for key in keys}

    # Not recursive: objects, then the common prefixes (as S3 returns them in one page).
    flat = {o.object_name: o for o in mc.list_objects(mbucket)}
    assert sorted(flat) == ["a.txt", "dir/", "e/", "z.txt"]
    assert {name for name, o in flat.items() if o.is_dir} == {"dir/", "e/"}
    assert flat["a.txt"].size == len("a.txt") and flat["a.txt"].etag == etags["a.txt"]
    assert all(is_etag(e, quoted=False) for e in etags.values()) and len(set(etags.values())) == len(keys)
    assert {o.object_name: o.etag for o in mc.list_objects(mbucket, recursive=True)} == etags

    assert sorted(o.object_name for o in mc.list_objects(mbucket, recursive=True)) == keys
    assert sorted(o.object_name for o in mc.list_objects(mbucket, prefix="dir/")) == [
        "dir/b.txt", "dir/c.txt", "dir/sub/"]
    assert [o.object_name for o in mc.list_objects(mbucket, prefix="dir/", recursive=True)] == [
        "dir/b.txt", "dir/c.txt", "dir/sub/d.txt"]
    assert [o.object_name for o in mc.list_objects(mbucket, start_after="dir/c.txt",
                                                   recursive=True)] == ["dir/sub/d.txt", "e/f.txt", "z.txt"]
    # ListObjects V1, as older servers need.
    assert sorted(o.object_name for o in mc.list_objects(mbucket, recursive=True,
                                                         use_api_v1=True)) == keys


@pytest.mark.parametrize("v1", [False, True], ids=["v2", "v1"])
def test_list_objects_pages(mc, mbucket, s3, gateway, v1):
    """Listings longer than a page: minio-py follows continuation tokens (V2) or markers
    (V1). list_objects always asks for pages of 1000, so this drives the generator behind
    it, ``_list_objects``, with max_keys=7."""
    keys = [f"many/{i:03d}" for i in range(23)] + [f"many/sub{i}/x" for i in range(3)]
    for key in keys:
        s3.put_object(Bucket=mbucket, Key=key, Body=b"")
    log_before = gateway.log().count(f'"path":"/{mbucket}","op":"ListObjects')

    listed = [o.object_name for o in mc._list_objects(mbucket, prefix="many/", delimiter=None,
                                                      use_api_v1=v1, max_keys=7)]
    assert listed == keys
    listed = [o.object_name for o in mc._list_objects(mbucket, prefix="many/", delimiter="/",
                                                      use_api_v1=v1, max_keys=7)]
    assert sorted(listed) == keys[:23] + [f"many/sub{i}/" for i in range(3)]

    # 26 entries in pages of 7 is 4 requests per listing (the log is flushed every second).
    deadline = time.time() + 5
    while time.time() < deadline:
        requests = gateway.log().count(f'"path":"/{mbucket}","op":"ListObjects') - log_before
        if requests >= 8:
            break
        time.sleep(0.2)
    assert requests == 8


def test_remove_object_and_objects(mc, mbucket, s3):
    keys = [f"rm/{i}.txt" for i in range(5)]
    for key in keys:
        mc.put_object(mbucket, key, io.BytesIO(b"x"), 1)

    mc.remove_object(mbucket, "rm/0.txt")
    assert keys_of(s3, mbucket) == keys[1:]
    mc.remove_object(mbucket, "rm/never-existed.txt")  # deleting a missing key succeeds

    errors = list(mc.remove_objects(mbucket, [DeleteObject(k) for k in keys[1:4]]))
    assert errors == []
    assert keys_of(s3, mbucket) == ["rm/4.txt"]

    # remove_objects of everything a listing returns, the SDK's documented idiom.
    to_delete = (DeleteObject(o.object_name) for o in mc.list_objects(mbucket, recursive=True))
    assert list(mc.remove_objects(mbucket, to_delete)) == []
    assert keys_of(s3, mbucket) == []


def test_fput_fget_multipart(mc, mbucket, s3, tmp_path):
    data = os.urandom(12 * MiB)
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    src.write_bytes(data)

    result = mc.fput_object(mbucket, "big/file.bin", str(src), part_size=5 * MiB,
                            metadata={"purpose": "multipart"})
    # 12 MiB in 5 MiB parts is three parts; the ETag is the multipart form.
    assert re.fullmatch(r"[0-9a-f]{32}-3", result.etag), result.etag
    head = s3.head_object(Bucket=mbucket, Key="big/file.bin")
    assert head["ContentLength"] == len(data) and head["ETag"] == f'"{result.etag}"'
    assert head["Metadata"] == {"purpose": "multipart"}
    assert s3.list_multipart_uploads(Bucket=mbucket).get("Uploads", []) == []

    mc.fget_object(mbucket, "big/file.bin", str(dst))
    assert dst.read_bytes() == data
    assert mc.stat_object(mbucket, "big/file.bin").size == len(data)


def test_presigned_get_object(mc, mbucket, gateway):
    data = b"presigned body\n"
    mc.put_object(mbucket, "share/file name+1.txt", io.BytesIO(data), len(data),
                  content_type="text/plain")

    url = mc.presigned_get_object(mbucket, "share/file name+1.txt", expires=dt.timedelta(minutes=5))
    assert url.startswith(gateway.endpoint + f"/{mbucket}/share/")
    assert "X-Amz-Signature=" in url
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        assert resp.read() == data
        assert resp.headers["Content-Type"] == "text/plain"

    # response-* overrides are part of the signed query.
    url = mc.presigned_get_object(mbucket, "share/file name+1.txt", expires=dt.timedelta(minutes=5),
                                  response_headers={"response-content-type": "application/x-test"})
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.headers["Content-Type"] == "application/x-test"

    # Tampering with the signed URL is refused.
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url.replace("share/", "share/x"), timeout=10)
    assert err.value.code == 403
    assert b"SignatureDoesNotMatch" in err.value.read()

    # presigned PUT works too, with a plain HTTP client.
    put_url = mc.presigned_put_object(mbucket, "share/uploaded.txt", expires=dt.timedelta(minutes=5))
    req = urllib.request.Request(put_url, data=b"uploaded via presigned put", method="PUT")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
    got = mc.get_object(mbucket, "share/uploaded.txt")
    try:
        assert got.read() == b"uploaded via presigned put"
    finally:
        got.close()
        got.release_conn()
