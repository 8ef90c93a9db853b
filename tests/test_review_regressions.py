"""Regression tests for defects found in review: each names what went wrong."""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError
from conftest import make_client
from rawhttp import error_code, head, read_response, request, sign
from servers import Gateway

MIB = 1024 * 1024


def code_of(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


def test_delete_objects_keeps_spaces_in_keys(s3, bucket):
    s3.put_object(Bucket=bucket, Key="report.md", Body=b"keep me")
    s3.put_object(Bucket=bucket, Key=" report.md ", Body=b"delete me")
    res = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": " report.md "}]})
    assert [d["Key"] for d in res["Deleted"]] == [" report.md "]
    assert s3.get_object(Bucket=bucket, Key="report.md")["Body"].read() == b"keep me"


def test_second_identical_upload_cannot_complete_conditionally(s3, bucket):
    data = b"p" * 200_000
    uploads = [s3.create_multipart_upload(Bucket=bucket, Key="same")["UploadId"] for _ in range(2)]
    etags = [s3.upload_part(Bucket=bucket, Key="same", UploadId=u, PartNumber=1, Body=data)["ETag"]
             for u in uploads]
    parts = lambda i: {"Parts": [{"PartNumber": 1, "ETag": etags[i]}]}  # noqa: E731
    s3.complete_multipart_upload(Bucket=bucket, Key="same", UploadId=uploads[0], IfNoneMatch="*",
                                 MultipartUpload=parts(0))
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(Bucket=bucket, Key="same", UploadId=uploads[1], IfNoneMatch="*",
                                     MultipartUpload=parts(1))
    assert code_of(err.value) == "PreconditionFailed"
    # The losing upload is intact and can still complete unconditionally.
    s3.complete_multipart_upload(Bucket=bucket, Key="same", UploadId=uploads[1], MultipartUpload=parts(1))
    assert s3.get_object(Bucket=bucket, Key="same")["Body"].read() == data


def test_get_in_flight_survives_overwrite(s3, bucket):
    body = os.urandom(12 * MIB)
    s3.put_object(Bucket=bucket, Key="moving", Body=body)
    stream = s3.get_object(Bucket=bucket, Key="moving")["Body"]
    first = stream.read(MIB)
    s3.put_object(Bucket=bucket, Key="moving", Body=b"new")
    s3.delete_object(Bucket=bucket, Key="moving")
    rest = stream.read()
    assert first + rest == body


def test_empty_object_suffix_range_is_unsatisfiable(s3, bucket):
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="empty", Range="bytes=-5")
    assert code_of(err.value) == "InvalidRange"


def test_max_keys_zero_is_not_truncated(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"1")
    assert s3.list_objects_v2(Bucket=bucket, MaxKeys=0)["IsTruncated"] is False
    assert s3.list_objects(Bucket=bucket, MaxKeys=0)["IsTruncated"] is False


def test_list_uploads_paging_sees_every_upload(s3, bucket):
    ids = {s3.create_multipart_upload(Bucket=bucket, Key="one-key")["UploadId"] for _ in range(4)}
    seen, kwargs = [], {}
    while True:
        page = s3.list_multipart_uploads(Bucket=bucket, MaxUploads=1, **kwargs)
        seen += [u["UploadId"] for u in page.get("Uploads", [])]
        if not page["IsTruncated"]:
            break
        kwargs = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
    assert sorted(seen) == sorted(ids)


def test_304_carries_validators(s3, bucket):
    etag = s3.put_object(Bucket=bucket, Key="v", Body=b"x")["ETag"]
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="v", IfNoneMatch=etag)
    headers = err.value.response["ResponseMetadata"]["HTTPHeaders"]
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    assert headers["etag"] == etag and "last-modified" in headers


def test_part_number_with_range_is_refused(s3, bucket):
    s3.put_object(Bucket=bucket, Key="pr", Body=b"x" * 10)
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="pr", PartNumber=1, Range="bytes=0-1")
    assert code_of(err.value) == "InvalidRequest"
    assert "PartsCount" not in s3.head_object(Bucket=bucket, Key="pr")


def test_encoded_slash_in_path_verifies(gateway, s3, bucket):
    headers = sign("PUT", f"/{bucket}/a/b", {}, {"host": f"127.0.0.1:{gateway.port}",
                   "content-length": "2"}, "UNSIGNED-PAYLOAD", gateway.access_key, gateway.secret_key)
    # rawhttp signs /a/b; a client that sends a%2Fb must sign a%2Fb: check both disagree.
    status, _, body = _put_raw_path(gateway, f"/{bucket}/a%2Fb", headers, b"hi")
    assert status == 403 and error_code(body) == "SignatureDoesNotMatch"
    import botocore.auth
    import botocore.awsrequest
    import botocore.credentials
    req = botocore.awsrequest.AWSRequest(method="PUT", url=f"{gateway.endpoint}/{bucket}/a%2Fb", data=b"hi")
    botocore.auth.S3SigV4Auth(botocore.credentials.Credentials(gateway.access_key, gateway.secret_key),
                              "s3", "us-east-1").add_auth(req)
    status, _, body = _put_raw_path(gateway, f"/{bucket}/a%2Fb",
                                    {k.lower(): v for k, v in req.headers.items()} |
                                    {"host": f"127.0.0.1:{gateway.port}", "content-length": "2"}, b"hi")
    assert status == 200, body
    assert s3.get_object(Bucket=bucket, Key="a/b")["Body"].read() == b"hi"


def _put_raw_path(gateway, raw_path, headers, body):
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(head("PUT", raw_path, headers) + body)
        return read_response(sock, "PUT")


@pytest.mark.parametrize("case", ["non-ascii-key", "bad-length", "control-char"])
def test_malformed_input_is_4xx_not_500(gateway, s3, bucket, case):
    s3.put_object(Bucket=bucket, Key="m", Body=b"x")
    if case == "non-ascii-key":
        url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "m"})
        bad = url.replace("X-Amz-Credential=", "X-Amz-Credential=%FF", 1)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(bad)
        assert err.value.code in (400, 403)
    elif case == "bad-length":
        headers = sign("PUT", f"/{bucket}/n", {}, {"host": f"127.0.0.1:{gateway.port}", "content-length": "1",
                       "x-amz-decoded-content-length": "abc"}, "UNSIGNED-PAYLOAD",
                       gateway.access_key, gateway.secret_key)
        status, _, body = request(gateway.port, "PUT", f"/{bucket}/n", headers, b"x")
        assert status == 400, body
    else:
        url = s3.generate_presigned_url("get_object", Params={
            "Bucket": bucket, "Key": "m", "ResponseContentType": "text/plain\x01"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url)
        assert err.value.code == 400 and error_code(err.value.read()) == "InvalidArgument"


def test_stalled_upload_times_out_and_frees_its_worker(tmp_path):
    gw = Gateway(tmp_path / "data", extra_args=["--body-timeout", "2"]).start()
    try:
        s3 = make_client(gw)
        s3.create_bucket(Bucket="stall")
        headers = sign("PUT", "/stall/slow", {}, {"host": f"127.0.0.1:{gw.port}",
                       "content-length": str(10 * MIB)}, "UNSIGNED-PAYLOAD", gw.access_key, gw.secret_key)
        sock = socket.create_connection(("127.0.0.1", gw.port))
        sock.sendall(head("PUT", "/stall/slow", headers) + b"x" * 400_000)
        sock.settimeout(15)
        status, _, body = read_response(sock, "PUT")
        sock.close()
        assert (status, error_code(body)) == (400, "RequestTimeout")
        assert s3.list_objects_v2(Bucket="stall")["KeyCount"] == 0
    finally:
        gw.stop()


def test_departed_client_stops_the_stream(gateway, s3, bucket):
    s3.put_object(Bucket=bucket, Key="long", Body=os.urandom(40 * MIB))
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "long"})
    with urllib.request.urlopen(url) as resp:
        resp.read(1024)
    deadline = time.time() + 10
    line = None
    while time.time() < deadline and line is None:
        time.sleep(0.5)
        lines = [l for l in gateway.log().splitlines() if '"op":"GetObject"' in l and f"/{bucket}/long" in l]
        line = lines[-1] if lines else None
    assert line is not None
    import json
    assert json.loads(line)["bytes_out"] < 40 * MIB


def test_header_that_is_not_utf8_is_refused(gateway, s3, bucket):
    """A stored header with invalid UTF-8 is a 400, not an object nobody can read."""
    headers = sign("PUT", f"/{bucket}/badct", {}, {"host": f"127.0.0.1:{gateway.port}", "content-length": "1"},
                   "UNSIGNED-PAYLOAD", gateway.access_key, gateway.secret_key)
    lines = [f"PUT /{bucket}/badct HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()]
    raw = ("\r\n".join(lines) + "\r\n").encode() + b"content-type: text/plain; charset=\xe9\r\n\r\nx"
    # content-type is not signed here, so the signature still matches; the value is what fails.
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(raw)
        status, _, body = read_response(sock, "PUT")
    assert (status, error_code(body)) == (400, "InvalidArgument"), body
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_list_uploads_with_delimiter_pages_to_the_end(s3, bucket):
    for key in ("a/1", "a/2", "a/3", "b"):
        s3.create_multipart_upload(Bucket=bucket, Key=key)
    seen, kwargs = [], {}
    for _ in range(10):
        page = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/", MaxUploads=1, **kwargs)
        seen += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        seen += [u["Key"] for u in page.get("Uploads", [])]
        if not page["IsTruncated"]:
            break
        kwargs = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
    assert seen == ["a/", "b"]


def test_list_uploads_pages_past_a_key_that_ends_at_the_prefix(s3, bucket):
    """A KeyMarker equal to the prefix ("dir/") is an upload's key, not a common prefix
    already returned: paging goes on after it instead of stopping."""
    for key in ("dir/", "dir/", "dir/x", "dir/y", "dir/z/1", "other"):
        s3.create_multipart_upload(Bucket=bucket, Key=key)
    seen, kwargs = [], {}
    for _ in range(10):
        page = s3.list_multipart_uploads(Bucket=bucket, Prefix="dir/", Delimiter="/", MaxUploads=1, **kwargs)
        seen += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        seen += [u["Key"] for u in page.get("Uploads", [])]
        if not page["IsTruncated"]:
            break
        kwargs = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
    assert seen == ["dir/", "dir/", "dir/x", "dir/y", "dir/z/"]


def test_list_uploads_encodes_keys_when_asked(s3, bucket):
    key = "odd key+%/\u00e9\u6587"
    s3.create_multipart_upload(Bucket=bucket, Key=key)
    bodies = []

    def keep(http_response, **_):
        bodies.append(http_response.content)

    s3.meta.events.register("after-call.s3.ListMultipartUploads", keep)
    try:
        page = s3.list_multipart_uploads(Bucket=bucket, EncodingType="url", Prefix="odd ")
        plain = s3.list_multipart_uploads(Bucket=bucket, Prefix="odd ")
    finally:
        s3.meta.events.unregister("after-call.s3.ListMultipartUploads", keep)
    assert page["EncodingType"] == "url" and "EncodingType" not in plain
    assert b"<Key>odd%20key%2B%25/%C3%A9%E6%96%87</Key>" in bodies[0]
    assert b"<Prefix>odd%20</Prefix>" in bodies[0]
    assert plain["Uploads"][0]["Key"] == key


def test_delete_objects_naming_a_version_deletes_nothing(s3, bucket):
    """Versioning is never enabled, so a VersionId other than null names nothing: that key
    is reported as an error and the current object stays (AWS never deletes the current
    version in place of the one named)."""
    for key in ("kept", "gone", "null-version"):
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    result = s3.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": "kept", "VersionId": "3HL4kqtJlcpXroDTDmJ-rmSpXd3dIbrHY"}, {"Key": "gone"},
        {"Key": "null-version", "VersionId": "null"}]})
    assert sorted(d["Key"] for d in result["Deleted"]) == ["gone", "null-version"]
    assert [(e["Key"], e["Code"]) for e in result["Errors"]] == [("kept", "NoSuchVersion")]
    assert s3.get_object(Bucket=bucket, Key="kept")["Body"].read() == b"kept"


def test_one_part_multipart_object_reports_its_part_count(s3, bucket):
    uid = s3.create_multipart_upload(Bucket=bucket, Key="one")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key="one", UploadId=uid, PartNumber=1, Body=b"solo")["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="one", UploadId=uid,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    head = s3.head_object(Bucket=bucket, Key="one", PartNumber=1)
    assert head["PartsCount"] == 1 and head["ContentLength"] == 4
