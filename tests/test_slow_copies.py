"""Copies that run long: answered 200 at once and kept alive with spaces, as S3 does, so a
client's read timeout never cuts a copy that is still running.

The gateway here waits only a millisecond (ORGMEM_COPY_KEEPALIVE) before it answers, so
copies of tens of MiB run long enough to show the whole exchange."""

from __future__ import annotations

import http.client
import os

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from rawhttp import EMPTY_SHA256, sign
from servers import Gateway
from test_sealing import _stored_files

BUCKET = "sealed"  # the bucket _stored_files looks in
BIG = 48 * 2**20
DECLARATION = b'<?xml version="1.0" encoding="UTF-8"?>\n'


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("slow-copies") / "data",
                      env={"ORGMEM_COPY_KEEPALIVE": "0.001"}).start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def s3(gw):
    # one attempt and a short read timeout: a silent copy of this size would not survive it
    s3 = boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=gw.access_key,
                      aws_secret_access_key=gw.secret_key, region_name="us-east-1",
                      config=Config(s3={"addressing_style": "path"}, read_timeout=2,
                                    retries={"max_attempts": 1, "mode": "standard"}))
    s3.create_bucket(Bucket=BUCKET)
    return s3


@pytest.fixture(scope="module")
def source(s3):
    body = os.urandom(BIG)
    s3.put_object(Bucket=BUCKET, Key="source", Body=body)
    return body


def _raw(gw, method: str, path: str, query: dict[str, str], headers: dict[str, str]):
    """A signed request over http.client (which reads chunked answers); status, headers, body."""
    headers = sign(method, path, query, {"host": f"127.0.0.1:{gw.port}", **headers}, EMPTY_SHA256,
                   gw.access_key, gw.secret_key)
    target = path + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        conn.request(method, target, headers=headers)
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def test_a_long_copy_is_answered_at_once_and_kept_alive_until_its_result(gw, s3, source):
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key="assembled")["UploadId"]
    status, headers, body = _raw(gw, "PUT", f"/{BUCKET}/assembled",
                                 {"partNumber": "1", "uploadId": upload},
                                 {"x-amz-copy-source": f"/{BUCKET}/source"})
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    assert headers["x-amz-server-side-encryption"] == "aws:kms"
    # the declaration first (nothing may precede it), spaces while the copy ran, then the result
    assert body.startswith(DECLARATION + b" ")
    assert body[len(DECLARATION):].lstrip(b" ").startswith(b"<CopyPartResult")
    part = body.split(b"<ETag>")[1].split(b"</ETag>")[0].decode()
    s3.complete_multipart_upload(Bucket=BUCKET, Key="assembled", UploadId=upload,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part}]})
    assert s3.get_object(Bucket=BUCKET, Key="assembled")["Body"].read() == source


def test_sdks_read_a_kept_alive_answer_as_the_result(s3, source):
    copied = s3.copy_object(Bucket=BUCKET, Key="copy", CopySource=f"{BUCKET}/source",
                            MetadataDirective="REPLACE", Metadata={"note": "kept alive"})
    assert copied["CopyObjectResult"]["ETag"] and copied["ServerSideEncryption"] == "aws:kms"
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key="parts")["UploadId"]
    half = BIG // 2
    etags = [s3.upload_part_copy(Bucket=BUCKET, Key="parts", UploadId=upload, PartNumber=n + 1,
                                 CopySource=f"{BUCKET}/source",
                                 CopySourceRange=f"bytes={n * half}-{(n + 1) * half - 1}")
             ["CopyPartResult"]["ETag"] for n in range(2)]
    done = s3.complete_multipart_upload(Bucket=BUCKET, Key="parts", UploadId=upload, MultipartUpload={
        "Parts": [{"PartNumber": n + 1, "ETag": etag} for n, etag in enumerate(etags)]})
    assert done["ETag"].endswith('-2"')
    for key in ("copy", "parts"):
        assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == source
    assert s3.head_object(Bucket=BUCKET, Key="copy")["Metadata"] == {"note": "kept alive"}


def test_a_copy_that_fails_after_its_answer_began_says_so_in_it(gw, s3):
    """The source is damaged near its end: the copy finds out only after the 200 went out,
    and the error comes in that 200's body; the SDK raises it, and no part is written."""
    s3.put_object(Bucket=BUCKET, Key="damaged", Body=os.urandom(BIG))
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key="from-damaged")["UploadId"]
    gw.stop()
    try:
        (stored,), _ = _stored_files(gw.data, "damaged")
        with open(stored, "r+b") as fh:
            fh.seek(BIG - 100_000)
            byte = fh.read(1)
            fh.seek(BIG - 100_000)
            fh.write(bytes([byte[0] ^ 0x01]))
    finally:
        gw.start()
    status, headers, body = _raw(gw, "PUT", f"/{BUCKET}/from-damaged",
                                 {"partNumber": "1", "uploadId": upload},
                                 {"x-amz-copy-source": f"/{BUCKET}/damaged"})
    assert status == 200 and body.startswith(DECLARATION)
    error = body[len(DECLARATION):].lstrip(b" ")
    assert error.startswith(b"<Error><Code>InternalError</Code>")
    with pytest.raises(ClientError) as info:
        s3.upload_part_copy(Bucket=BUCKET, Key="from-damaged", UploadId=upload, PartNumber=1,
                            CopySource=f"{BUCKET}/damaged")
    assert info.value.response["Error"]["Code"] == "InternalError"
    assert s3.list_parts(Bucket=BUCKET, Key="from-damaged", UploadId=upload).get("Parts", []) == []


def test_a_complete_in_the_biographies_bucket_is_refused_plainly(s3):
    """A Complete there ingests the upload: a bad event is a 400 the client does not retry
    (inside a kept-alive 200 the SDK would retry it, and the retry find the upload gone)."""
    upload = s3.create_multipart_upload(Bucket="biographies", Key="bad.ndjson")["UploadId"]
    part = s3.upload_part(Bucket="biographies", Key="bad.ndjson", UploadId=upload, PartNumber=1,
                          Body=b'{"session": "s", "kind": "nope"}\n')["ETag"]
    with pytest.raises(ClientError) as refused:
        s3.complete_multipart_upload(Bucket="biographies", Key="bad.ndjson", UploadId=upload,
                                     MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part}]})
    assert refused.value.response["Error"]["Code"] == "InvalidArgument"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
