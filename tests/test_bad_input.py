"""Bad input gets the right S3 error and writes nothing."""

from __future__ import annotations

import base64
import hashlib
import socket
import time
import urllib.error
import urllib.request
import zlib

import boto3
import pytest
from botocore.config import Config
from rawhttp import EMPTY_SHA256, error_code, head, read_response, request, sign


def _keys(s3, bucket) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def _signed(gateway, method, path, body=b"", headers=None, query=None, secret=None, when=None,
            payload_hash=None, access=None):
    headers = {"host": f"127.0.0.1:{gateway.port}", **(headers or {})}
    if method in ("PUT", "POST"):
        headers.setdefault("content-length", str(len(body)))
    payload = payload_hash or hashlib.sha256(body).hexdigest()
    return sign(method, path, query or {}, headers, payload, access or gateway.access_key,
                secret or gateway.secret_key, when=when)


def test_raw_signer_is_accepted(gateway, s3, bucket):
    """The hand-built requests below fail only for the reason each test names."""
    headers = _signed(gateway, "PUT", f"/{bucket}/ok", b"fine")
    status, _, body = request(gateway.port, "PUT", f"/{bucket}/ok", headers, b"fine")
    assert status == 200, body
    assert _keys(s3, bucket) == ["ok"]


def test_missing_signature(gateway, s3, bucket):
    status, _, body = request(gateway.port, "PUT", f"/{bucket}/anon",
                              {"host": "127.0.0.1", "content-length": "1"}, b"x")
    assert (status, error_code(body)) == (403, "AccessDenied")
    assert _keys(s3, bucket) == []


def test_wrong_secret(gateway, s3, bucket):
    headers = _signed(gateway, "PUT", f"/{bucket}/k", b"x", secret="not-the-secret")
    status, _, body = request(gateway.port, "PUT", f"/{bucket}/k", headers, b"x")
    assert (status, error_code(body)) == (403, "SignatureDoesNotMatch")
    assert b"not-the-secret" not in body and gateway.secret_key.encode() not in body
    assert _keys(s3, bucket) == []


def test_unknown_access_key(gateway, s3, bucket):
    headers = _signed(gateway, "PUT", f"/{bucket}/k", b"x", access="AKUNKNOWN")
    status, _, body = request(gateway.port, "PUT", f"/{bucket}/k", headers, b"x")
    assert (status, error_code(body)) == (403, "InvalidAccessKeyId")


def test_clock_skew(gateway, s3, bucket):
    headers = _signed(gateway, "PUT", f"/{bucket}/k", b"x", when=time.time() - 20 * 60)
    status, _, body = request(gateway.port, "PUT", f"/{bucket}/k", headers, b"x")
    assert (status, error_code(body)) == (403, "RequestTimeTooSkewed")
    assert _keys(s3, bucket) == []


def test_tampered_body_with_signed_payload(gateway, s3, bucket):
    headers = _signed(gateway, "PUT", f"/{bucket}/k", b"original")
    status, _, body = request(gateway.port, "PUT", f"/{bucket}/k", headers, b"tampered")
    assert (status, error_code(body)) == (400, "XAmzContentSHA256Mismatch")
    assert _keys(s3, bucket) == []


def test_malformed_authorization_header(gateway):
    status, _, body = request(gateway.port, "GET", "/", {"host": "127.0.0.1",
                              "authorization": "AWS4-HMAC-SHA256 garbage", "x-amz-date": "x",
                              "x-amz-content-sha256": EMPTY_SHA256})
    assert status == 400 and error_code(body) == "AuthorizationHeaderMalformed"


def test_sigv2_refused(gateway):
    status, _, body = request(gateway.port, "GET", "/", {"host": "127.0.0.1", "authorization": "AWS AK:sig"})
    assert status == 400 and error_code(body) == "InvalidRequest"


def test_expired_presigned_url(s3, bucket):
    s3.put_object(Bucket=bucket, Key="p", Body=b"secret-ish")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p"}, ExpiresIn=1)
    time.sleep(2.1)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url)
    assert err.value.code == 403 and error_code(err.value.read()) == "AccessDenied"


def test_presigned_url_over_seven_days(s3, bucket):
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p"},
                                    ExpiresIn=8 * 24 * 3600)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url)
    assert err.value.code == 400 and error_code(err.value.read()) == "AuthorizationQueryParametersError"


def test_tampered_presigned_url(s3, bucket):
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url.replace("/p?", "/q?"))
    assert err.value.code == 403 and error_code(err.value.read()) == "SignatureDoesNotMatch"


@pytest.mark.parametrize("xml", [b"<not-xml", b"<CompleteMultipartUpload><Part></Part>",
                                 b'<!DOCTYPE x [<!ENTITY a "b">]><CompleteMultipartUpload/>'])
def test_malformed_complete_xml(gateway, s3, bucket, xml):
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    headers = _signed(gateway, "POST", f"/{bucket}/mp", xml, query={"uploadId": uid})
    status, _, body = request(gateway.port, "POST", f"/{bucket}/mp", headers, xml, query={"uploadId": uid})
    assert (status, error_code(body)) == (400, "MalformedXML")
    assert _keys(s3, bucket) == []
    s3.abort_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid)


def test_malformed_delete_xml(gateway, s3, bucket):
    s3.put_object(Bucket=bucket, Key="keep", Body=b"x")
    xml = b"<Delete><Object><Key>keep</Key></Object>"
    headers = _signed(gateway, "POST", f"/{bucket}", xml, query={"delete": ""})
    status, _, body = request(gateway.port, "POST", f"/{bucket}", headers, xml, query={"delete": ""})
    assert (status, error_code(body)) == (400, "MalformedXML")
    assert _keys(s3, bucket) == ["keep"]


def _chunked_trailer_body(payload: bytes, chunk: int = 8192) -> bytes:
    out = b""
    for i in range(0, len(payload), chunk):
        piece = payload[i:i + chunk]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    crc = base64.b64encode(zlib.crc32(payload).to_bytes(4, "big")).decode()
    return out + b"0\r\n" + f"x-amz-checksum-crc32:{crc}\r\n\r\n".encode()


def _chunked_headers(gateway, bucket, key, payload, wire):
    return _signed(gateway, "PUT", f"/{bucket}/{key}", headers={
        "content-length": str(len(wire)), "content-encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(payload)), "x-amz-trailer": "x-amz-checksum-crc32",
        "x-amz-sdk-checksum-algorithm": "CRC32"}, payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER")


def test_aws_chunked_trailer_body_accepted(gateway, s3, bucket):
    payload = b"z" * 50_000
    wire = _chunked_trailer_body(payload)
    headers = _chunked_headers(gateway, bucket, "chunked", payload, wire)
    status, _, body = request(gateway.port, "PUT", f"/{bucket}/chunked", headers, wire)
    assert status == 200, body
    got = s3.get_object(Bucket=bucket, Key="chunked")
    assert got["Body"].read() == payload
    assert "ContentEncoding" not in got  # aws-chunked is never stored


def test_truncated_aws_chunked_body_writes_nothing(gateway, s3, bucket):
    payload = b"y" * 50_000
    wire = _chunked_trailer_body(payload)
    headers = _chunked_headers(gateway, bucket, "trunc", payload, wire)
    status, _, body = request(gateway.port, "PUT", f"/{bucket}/trunc", headers, wire,
                              close_after=len(wire) // 2)
    assert status in (0, 400)
    assert _keys(s3, bucket) == []


def test_malformed_aws_chunked_framing(gateway, s3, bucket):
    payload = b"x" * 100
    wire = b"zz\r\n" + payload + b"\r\n0\r\n\r\n"
    headers = _chunked_headers(gateway, bucket, "bad", payload, wire)
    status, _, body = request(gateway.port, "PUT", f"/{bucket}/bad", headers, wire)
    assert status == 400 and error_code(body) in ("InvalidChunkSizeError", "IncompleteBody")
    assert _keys(s3, bucket) == []


def test_wrong_trailer_checksum(gateway, s3, bucket):
    payload = b"w" * 1000
    wire = _chunked_trailer_body(payload).replace(
        base64.b64encode(zlib.crc32(payload).to_bytes(4, "big")), base64.b64encode(b"\0\0\0\0"))
    headers = _chunked_headers(gateway, bucket, "badcrc", payload, wire)
    status, _, body = request(gateway.port, "PUT", f"/{bucket}/badcrc", headers, wire)
    assert (status, error_code(body)) == (400, "BadDigest")
    assert _keys(s3, bucket) == []


def test_short_body_writes_nothing(gateway, s3, bucket):
    payload = b"q" * 400_000
    headers = _signed(gateway, "PUT", f"/{bucket}/short", payload, payload_hash="UNSIGNED-PAYLOAD")
    request(gateway.port, "PUT", f"/{bucket}/short", headers, payload, close_after=100_000)
    assert _keys(s3, bucket) == []


def test_unknown_method_and_subresource(gateway, s3, bucket):
    headers = _signed(gateway, "PUT", f"/{bucket}/k", b"", query={"tagging": ""})
    status, _, body = request(gateway.port, "PUT", f"/{bucket}/k", headers, b"", query={"tagging": ""})
    assert (status, error_code(body)) == (501, "NotImplemented")
    assert _keys(s3, bucket) == []
    headers = _signed(gateway, "GET", f"/{bucket}", query={"lifecycle": ""})
    status, _, body = request(gateway.port, "GET", f"/{bucket}", headers, query={"lifecycle": ""})
    assert (status, error_code(body)) == (501, "NotImplemented")


def test_x_id_parameter_is_ignored(gateway, s3, bucket):
    """Newer SDKs add ?x-id=PutObject; it only names the operation."""
    headers = _signed(gateway, "PUT", f"/{bucket}/xid", b"v", query={"x-id": "PutObject"})
    status, _, body = request(gateway.port, "PUT", f"/{bucket}/xid", headers, b"v", query={"x-id": "PutObject"})
    assert status == 200, body
    assert _keys(s3, bucket) == ["xid"]


def test_errors_are_xml_with_request_id(gateway, s3, bucket):
    headers = _signed(gateway, "GET", f"/{bucket}/missing")
    status, resp_headers, body = request(gateway.port, "GET", f"/{bucket}/missing", headers)
    assert status == 404 and error_code(body) == "NoSuchKey"
    assert resp_headers["content-type"] == "application/xml"
    assert resp_headers["x-amz-request-id"].encode() in body


def test_virtual_host_style(tmp_path):
    from servers import Gateway

    gw = Gateway(tmp_path / "data", extra_args=["--domain", "s3.localtest"]).start()
    try:
        cfg = Config(s3={"addressing_style": "virtual"}, signature_version="s3v4")
        client = boto3.client("s3", endpoint_url=f"http://s3.localtest:{gw.port}",
                              aws_access_key_id=gw.access_key, aws_secret_access_key=gw.secret_key,
                              region_name="us-east-1", config=cfg)
        # Resolve *.s3.localtest to 127.0.0.1 without touching /etc/hosts.
        import socket
        real = socket.getaddrinfo

        def fake(host, *args, **kwargs):
            if isinstance(host, str) and host.endswith("s3.localtest"):
                host = "127.0.0.1"
            return real(host, *args, **kwargs)

        socket.getaddrinfo = fake
        try:
            client.create_bucket(Bucket="vhost-bucket")
            client.put_object(Bucket="vhost-bucket", Key="dir/k", Body=b"vhost")
            assert client.get_object(Bucket="vhost-bucket", Key="dir/k")["Body"].read() == b"vhost"
            assert [o["Key"] for o in client.list_objects_v2(Bucket="vhost-bucket")["Contents"]] == ["dir/k"]
        finally:
            socket.getaddrinfo = real
        path_client = boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=gw.access_key,
                                   aws_secret_access_key=gw.secret_key, region_name="us-east-1",
                                   config=Config(s3={"addressing_style": "path"}))
        assert path_client.get_object(Bucket="vhost-bucket", Key="dir/k")["Body"].read() == b"vhost"
    finally:
        gw.stop()


def test_bearer_token(gateway, s3, bucket):
    s3.put_object(Bucket=bucket, Key="b", Body=b"bearer")
    req = urllib.request.Request(f"{gateway.endpoint}/{bucket}/b",
                                 headers={"Authorization": f"Bearer {gateway.access_key}:{gateway.secret_key}"})
    with urllib.request.urlopen(req) as resp:
        assert resp.read() == b"bearer"
    bad = urllib.request.Request(f"{gateway.endpoint}/{bucket}/b",
                                 headers={"Authorization": f"Bearer {gateway.access_key}:wrong"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(bad)
    assert err.value.code == 403


def test_health_and_ready(gateway):
    import json
    with urllib.request.urlopen(gateway.endpoint + "/health") as resp:
        assert json.loads(resp.read())["status"] == "ok"
    with urllib.request.urlopen(gateway.endpoint + "/ready") as resp:
        assert json.loads(resp.read())["status"] == "ready"


def test_secret_never_logged(gateway):
    assert gateway.secret_key not in gateway.log()


def _signing_key(secret: str, date: str) -> bytes:
    import hmac as _hmac
    key = ("AWS4" + secret).encode()
    for part in (date, "us-east-1", "s3", "aws4_request"):
        key = _hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _signed_streaming_put(gateway, bucket, key, payload, chunk=65536, tamper=False):
    """STREAMING-AWS4-HMAC-SHA256-PAYLOAD as the AWS SDKs for Java and Go send it over HTTP."""
    import hmac as _hmac
    sizes = [len(payload[i:i + chunk]) for i in range(0, len(payload), chunk)] + [0]
    wire_len = sum(len(f"{s:x};chunk-signature=") + 64 + 2 + s + 2 for s in sizes)
    headers = _signed(gateway, "PUT", f"/{bucket}/{key}", headers={
        "content-length": str(wire_len), "content-encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(payload))},
        payload_hash="STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
    previous = headers["authorization"].rsplit("Signature=", 1)[1]
    amz_date = headers["x-amz-date"]
    scope = f"{amz_date[:8]}/us-east-1/s3/aws4_request"
    signing_key = _signing_key(gateway.secret_key, amz_date[:8])
    wire, offset = b"", 0
    for size in sizes:
        data = payload[offset:offset + size]
        offset += size
        to_sign = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, previous,
                             EMPTY_SHA256, hashlib.sha256(data).hexdigest()])
        previous = _hmac.new(signing_key, to_sign.encode(), hashlib.sha256).hexdigest()
        if tamper and size:
            data = b"X" + data[1:]
        wire += f"{size:x};chunk-signature={previous}\r\n".encode() + data + b"\r\n"
    return request(gateway.port, "PUT", f"/{bucket}/{key}", headers, wire)


def test_signed_streaming_upload(gateway, s3, bucket):
    payload = bytes(range(256)) * 700  # 179,200 bytes: three chunks and a short one
    status, _, body = _signed_streaming_put(gateway, bucket, "streamed", payload)
    assert status == 200, body
    got = s3.get_object(Bucket=bucket, Key="streamed")
    assert got["Body"].read() == payload and "ContentEncoding" not in got


def test_signed_streaming_upload_with_tampered_chunk(gateway, s3, bucket):
    payload = b"a" * 150_000
    status, _, body = _signed_streaming_put(gateway, bucket, "tampered", payload, tamper=True)
    assert (status, error_code(body)) == (403, "SignatureDoesNotMatch")
    assert _keys(s3, bucket) == []


def _put_then_list(gateway, bucket: str, size: int) -> tuple[tuple[int, dict, bytes], tuple[int, dict, bytes] | None]:
    """A PUT of ``size`` bytes to ``bucket`` without Expect: 100-continue, sent whole, then a
    ListBuckets on the same connection (None if the gateway closed it)."""
    body = b"x" * size
    headers = _signed(gateway, "PUT", f"/{bucket}/k", body, payload_hash="UNSIGNED-PAYLOAD")
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=20) as sock:
        sock.sendall(head("PUT", f"/{bucket}/k", headers) + body)
        first = read_response(sock, "PUT")
        if first[1].get("connection") == "close":
            return first, None
        sock.sendall(head("GET", "/", _signed(gateway, "GET", "/")))
        return first, read_response(sock, "GET")


def test_an_early_answer_reaches_a_client_still_sending_its_body(gateway):
    """NoSuchBucket is decided before the body is read. Closing over 6 MiB of unread body
    reset the connection under a client still sending it (httpx saw a ReadError, not the
    404); the gateway now reads the rest of a body of up to 8 MiB first, and the
    connection stays usable."""
    (status, headers, body), after = _put_then_list(gateway, "no-such-bucket-drain", 6 * 1024 * 1024)
    assert status == 404 and error_code(body) == "NoSuchBucket"
    assert headers.get("connection") != "close"
    assert after is not None and after[0] == 200 and b"<ListAllMyBucketsResult" in after[2]


def test_an_early_answer_to_a_body_over_the_drain_limit_closes(gateway):
    """Past the limit the gateway does not read a body it will not store: it answers and
    closes (a client that sends everything anyway may see a reset instead of the answer)."""
    from gateway.s3.server import DRAIN_LIMIT

    headers = _signed(gateway, "PUT", "/no-such-bucket-drain/k", payload_hash="UNSIGNED-PAYLOAD",
                      headers={"content-length": str(DRAIN_LIMIT + 2 * 1024 * 1024)})
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=20) as sock:
        sock.sendall(head("PUT", "/no-such-bucket-drain/k", headers) + b"x" * 1024)
        status, answer, body = read_response(sock, "PUT")  # answered without waiting for the rest
    assert status == 404 and error_code(body) == "NoSuchBucket"
    assert answer.get("connection") == "close"
