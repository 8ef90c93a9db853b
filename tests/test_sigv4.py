"""SigV4 verification: AWS's published vectors, cross-checks against botocore, the real
boto3 client and awscrt, and the failure modes a gateway must get right."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from urllib.parse import quote, unquote_to_bytes, urlsplit

import boto3
import pytest
from awscrt import auth as crt_auth
from awscrt import http as crt_http
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.utils import percent_encode_sequence

from gateway.s3 import sigv4
from gateway.s3.sigv4 import AuthError

AK = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
EXAMPLE_NOW = 1369353600.0  # 2013-05-24T00:00:00Z, the time of every AWS example
EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
HOST = "examplebucket.s3.amazonaws.com"


def aws_auth(signed: str, signature: str, sep: str = ",") -> str:
    return (f"AWS4-HMAC-SHA256 Credential={AK}/20130524/us-east-1/s3/aws4_request{sep}"
            f"SignedHeaders={signed}{sep}Signature={signature}")


def verify_headers(method, path, query, headers, *, secret=SECRET, now=EXAMPLE_NOW):
    req = sigv4.parse_authorization(headers)
    return sigv4.verify(req, secret, method, path, query, headers, now)


def verify_url(method, url, headers=None, *, secret=SECRET, now=None):
    parts = urlsplit(url)
    headers = dict(headers or {})
    headers.setdefault("host", parts.netloc)
    req = sigv4.parse_presigned(sigv4.parse_query(parts.query), headers)
    return sigv4.verify(req, secret, method, parts.path, parts.query, headers,
                        time.time() if now is None else now)


# ----------------------------------------------------------------------------- AWS vectors

GET_OBJECT = {
    "host": HOST, "range": "bytes=0-9", "x-amz-content-sha256": EMPTY,
    "x-amz-date": "20130524T000000Z",
    "authorization": aws_auth("host;range;x-amz-content-sha256;x-amz-date",
                              "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"),
}
PUT_OBJECT = {
    "host": HOST, "date": "Fri, 24 May 2013 00:00:00 GMT", "x-amz-date": "20130524T000000Z",
    "x-amz-storage-class": "REDUCED_REDUNDANCY",
    "x-amz-content-sha256": "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072",
    "authorization": aws_auth("date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class",
                              "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"),
}
GET_LIFECYCLE = {
    "host": HOST, "x-amz-content-sha256": EMPTY, "x-amz-date": "20130524T000000Z",
    "authorization": aws_auth("host;x-amz-content-sha256;x-amz-date",
                              "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"),
}
LIST_OBJECTS = {
    "host": HOST, "x-amz-content-sha256": EMPTY, "x-amz-date": "20130524T000000Z",
    "authorization": aws_auth("host;x-amz-content-sha256;x-amz-date",
                              "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
}
PRESIGNED_QUERY = (
    "X-Amz-Algorithm=AWS4-HMAC-SHA256"
    "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
    "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
    "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404")
STREAMING_PUT = {
    "host": "s3.amazonaws.com", "x-amz-date": "20130524T000000Z",
    "x-amz-storage-class": "REDUCED_REDUNDANCY",
    "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    "content-encoding": "aws-chunked", "x-amz-decoded-content-length": "66560",
    "content-length": "66824",
    "authorization": aws_auth("content-encoding;content-length;host;x-amz-content-sha256;"
                              "x-amz-date;x-amz-decoded-content-length;x-amz-storage-class",
                              "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"),
}


def test_aws_get_object_example():
    ctx = verify_headers("GET", "/test.txt", "", GET_OBJECT)
    assert ctx.scope == "20130524/us-east-1/s3/aws4_request"
    assert ctx.amz_date == "20130524T000000Z"
    assert ctx.seed_signature.startswith("f0e8bdb8")
    assert ctx.signing_key == sigv4.signing_key(SECRET, "20130524", "us-east-1", "s3")


def test_aws_get_object_canonical_request_matches_docs():
    req = sigv4.parse_authorization(GET_OBJECT)
    canonical = sigv4.canonical_request(req, "GET", "/test.txt", "", GET_OBJECT)
    assert canonical == (
        "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
        f"x-amz-content-sha256:{EMPTY}\nx-amz-date:20130524T000000Z\n\n"
        f"host;range;x-amz-content-sha256;x-amz-date\n{EMPTY}")
    assert sigv4.string_to_sign(req, canonical).endswith(
        "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972")


def test_aws_put_object_example_encodes_dollar():
    verify_headers("PUT", "/test$file.text", "", PUT_OBJECT)
    verify_headers("PUT", "/test%24file.text", "", PUT_OBJECT)  # same key, other spelling
    assert sigv4.canonical_uri("/test$file.text") == "/test%24file.text"


def test_aws_get_lifecycle_example_valueless_query_param():
    verify_headers("GET", "/", "lifecycle", GET_LIFECYCLE)
    verify_headers("GET", "/", "lifecycle=", GET_LIFECYCLE)


def test_aws_list_objects_example_sorts_query():
    verify_headers("GET", "/", "max-keys=2&prefix=J", LIST_OBJECTS)
    verify_headers("GET", "/", "prefix=J&max-keys=2", LIST_OBJECTS)


def test_aws_presigned_get_example():
    pairs = sigv4.parse_query(PRESIGNED_QUERY)
    assert sigv4.is_presigned(pairs)
    req = sigv4.parse_presigned(pairs)
    assert (req.access_key, req.expires, req.payload_hash, req.presigned) == (
        AK, 86400, "UNSIGNED-PAYLOAD", True)
    ctx = sigv4.verify(req, SECRET, "GET", "/test.txt", PRESIGNED_QUERY, {"host": HOST},
                       EXAMPLE_NOW + 3600)
    assert ctx.seed_signature.startswith("aeeed9bb")


def test_aws_streaming_seed_signature():
    req = sigv4.parse_authorization(STREAMING_PUT)
    assert req.payload_hash == "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    ctx = sigv4.verify(req, SECRET, "PUT", "/examplebucket/chunkObject.txt", "",
                       STREAMING_PUT, EXAMPLE_NOW)
    assert ctx.seed_signature == \
        "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"


@pytest.mark.parametrize("sep", [",", ", ", " ,  "])
def test_authorization_header_spacing_tolerated(sep):
    headers = dict(GET_OBJECT, authorization=aws_auth(
        "host;range;x-amz-content-sha256;x-amz-date",
        "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41", sep))
    verify_headers("GET", "/test.txt", "", headers)


def test_header_values_are_trimmed_and_collapsed():
    headers = dict(GET_OBJECT, range="   bytes=0-9  ")
    verify_headers("GET", "/test.txt", "", headers)
    headers = dict(GET_OBJECT, range=["bytes=0-9"])  # list form for repeated headers
    verify_headers("GET", "/test.txt", "", headers)


def test_bytes_path_and_query_accepted():
    verify_headers("GET", b"/", b"prefix=J&max-keys=2", LIST_OBJECTS)


# ----------------------------------------------------------------------------- botocore

def creds(secret=SECRET):
    return Credentials(AK, secret)


def s3_url(key: str, params: dict | None = None, host: str = "localhost:9000") -> str:
    """The URL botocore's S3 serializer would send: key quoted with safe '/~'."""
    url = f"http://{host}/bucket/{quote(key.encode(), safe='/~')}"
    if params:
        url += "?" + percent_encode_sequence(params)
    return url


def botocore_signed(method: str, url: str, headers=None, body=b"", region="us-east-1"):
    request = AWSRequest(method=method, url=url, headers=dict(headers or {}), data=body)
    S3SigV4Auth(creds(), "s3", region).add_auth(request)
    prepared = request.prepare()
    parts = urlsplit(prepared.url)
    lowered = {k.lower(): (v.decode("latin-1") if isinstance(v, bytes) else v)
               for k, v in prepared.headers.items()}
    lowered.setdefault("host", parts.netloc)
    return parts.path, parts.query, lowered


def botocore_presigned(method: str, url: str, headers=None, expires=3600, region="us-east-1"):
    request = AWSRequest(method=method, url=url, headers=dict(headers or {}))
    S3SigV4QueryAuth(creds(), "s3", region, expires=expires).add_auth(request)
    return request.prepare().url


KEYS = [
    "simple.txt", "dir/sub/key.bin", "with space.txt", "two  spaces", "unicode-ключ-日本.txt",
    "tilde~key", "plus+key", "eq=key&amp", "percent%25literal", "star*paren(1)!'",
    "a//double//slash", "dot/./seg/../x", "trailing/", "emoji-🙂", "colon:semi;comma,",
    "hash#q?mark", "[brackets]{braces}|pipe^caret`", "\ttab",
]
PARAMS = [
    None,
    {"prefix": "a b+c", "delimiter": "/"},
    {"list-type": "2", "start-after": "ключ=~ +/", "max-keys": "10"},
    {"uploads": ""},
    {"response-content-disposition": 'attachment; filename="x y.txt"', "versionId": "v+/="},
    {"tagging": "", "a": "~-_.", "b": "%2B"},
]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("params", PARAMS)
def test_botocore_header_auth_roundtrip(key, params):
    path, query, headers = botocore_signed("GET", s3_url(key, params))
    ctx = verify_headers("GET", path, query, headers, now=time.time())
    assert ctx.seed_signature == headers["authorization"].rsplit("=", 1)[1]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("params", PARAMS)
def test_botocore_presigned_roundtrip(key, params):
    verify_url("GET", botocore_presigned("GET", s3_url(key, params)))


def test_botocore_put_with_body_meta_and_date_header():
    body = b"hello"
    path, query, headers = botocore_signed(
        "PUT", s3_url("k.txt"), {"x-amz-meta-Owner": "  Jane   Doe ", "Content-Type": "text/plain",
                                 "Date": "now"}, body)
    assert "x-amz-date" not in headers  # botocore used the Date header instead
    req = sigv4.parse_authorization(headers)
    assert req.payload_hash == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    sigv4.verify(req, SECRET, "PUT", path, query, headers, time.time())


def test_botocore_other_region_and_uppercase_method_name():
    path, query, headers = botocore_signed("DELETE", s3_url("x"), region="eu-west-3")
    ctx = verify_headers("delete", path, query, headers, now=time.time())
    assert ctx.scope.endswith("/eu-west-3/s3/aws4_request")


def test_botocore_presigned_put_with_signed_metadata_header():
    url = botocore_presigned("PUT", s3_url("up.bin"), {"x-amz-meta-a": "b"})
    verify_url("PUT", url, {"x-amz-meta-a": "b"})
    with pytest.raises(AuthError) as err:
        verify_url("PUT", url, {"x-amz-meta-a": "tampered"})
    assert err.value.code == "SignatureDoesNotMatch"


# ----------------------------------------------------------------------------- real boto3

class _EmptyRaw:
    def stream(self, **_):
        yield b""

    def read(self, *_):
        return b""


def capture(operation: str, endpoint: str = "http://localhost:9000", **kwargs):
    """Run a real boto3 call, capture the signed request instead of sending it."""
    seen = []

    def hook(request, **_):
        body = request.body.read() if hasattr(request.body, "read") else request.body
        seen.append((request.method, request.url, request.headers, body))
        return AWSResponse(request.url, 200, {"ETag": '"e"'}, _EmptyRaw())

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=AK,
                          aws_secret_access_key=SECRET, region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
    client.meta.events.register("before-send.s3.*", hook)
    getattr(client, operation)(**kwargs)
    method, url, raw_headers, body = seen[0]
    headers = {k.lower(): (v.decode("latin-1") if isinstance(v, bytes) else v)
               for k, v in raw_headers.items()}
    parts = urlsplit(url)
    return method, parts.path, parts.query, headers, body


@pytest.mark.parametrize("operation,kwargs", [
    ("put_object", {"Bucket": "b", "Key": "dir/ключ +=~.txt", "Body": b"x" * 100,
                    "Metadata": {"note": "a  b"}, "ContentType": "text/plain"}),
    ("get_object", {"Bucket": "b", "Key": "a b/c+d", "Range": "bytes=0-1"}),
    ("list_objects_v2", {"Bucket": "b", "Prefix": "a b+c/ü", "StartAfter": "~x=y&z"}),
    ("delete_objects", {"Bucket": "b", "Delete": {"Objects": [{"Key": "a"}]}}),
    ("create_multipart_upload", {"Bucket": "b", "Key": "m p"}),
])
def test_real_boto3_requests_verify(operation, kwargs):
    method, path, query, headers, _ = capture(operation, **kwargs)
    verify_headers(method, path, query, headers, now=time.time())


def test_real_boto3_https_trailer_put_verifies():
    method, path, query, headers, body = capture(
        "put_object", endpoint="https://localhost:9443", Bucket="b", Key="k", Body=b"z" * 10)
    req = sigv4.parse_authorization(headers)
    assert req.payload_hash == sigv4.STREAMING_UNSIGNED_TRAILER
    verify_headers(method, path, query, headers, now=time.time())


@pytest.mark.parametrize("key", ["plain", "sp ace/ü+=~", "a%2Fb"])
def test_real_boto3_presigned_url(key):
    client = boto3.client("s3", endpoint_url="http://localhost:9000", aws_access_key_id=AK,
                          aws_secret_access_key=SECRET, region_name="us-east-1",
                          config=Config(signature_version="s3v4",
                                        s3={"addressing_style": "path"}))
    url = client.generate_presigned_url("get_object", ExpiresIn=600, Params={
        "Bucket": "b", "Key": key, "ResponseContentDisposition": 'inline; filename="a b.txt"'})
    verify_url("GET", url)
    put = client.generate_presigned_url("put_object", Params={"Bucket": "b", "Key": key})
    verify_url("PUT", put)


# ----------------------------------------------------------------------------- awscrt

def crt_sign(method: str, path: str, headers: dict, presign: bool):
    request = crt_http.HttpRequest(method, path, crt_http.HttpHeaders(list(headers.items())))
    config = crt_auth.AwsSigningConfig(
        algorithm=crt_auth.AwsSigningAlgorithm.V4,
        signature_type=(crt_auth.AwsSignatureType.HTTP_REQUEST_QUERY_PARAMS if presign
                        else crt_auth.AwsSignatureType.HTTP_REQUEST_HEADERS),
        credentials_provider=crt_auth.AwsCredentialsProvider.new_static(AK, SECRET),
        region="us-west-2", service="s3", use_double_uri_encode=False,
        should_normalize_uri_path=False,
        signed_body_value=(crt_auth.AwsSignedBodyValue.UNSIGNED_PAYLOAD if presign
                           else crt_auth.AwsSignedBodyValue.EMPTY_SHA256),
        signed_body_header_type=(crt_auth.AwsSignedBodyHeaderType.NONE if presign
                                 else crt_auth.AwsSignedBodyHeaderType.X_AMZ_CONTENT_SHA_256),
        expiration_in_seconds=900 if presign else None)
    crt_auth.aws_sign_request(request, config).result(timeout=10)
    return request.path, {k.lower(): v for k, v in request.headers}


@pytest.mark.parametrize("presign", [False, True])
@pytest.mark.parametrize("path", ["/b/simple", "/b/sp%20ace/%C3%BC%2B~", "/b/a?prefix=x%20y&z="])
def test_awscrt_signatures_verify(path, presign):
    signed_path, headers = crt_sign("GET", path, {"host": "h:1", "x-amz-meta-k": "v"}, presign)
    raw_path, _, raw_query = signed_path.partition("?")
    if presign:
        req = sigv4.parse_presigned(sigv4.parse_query(raw_query), headers)
    else:
        req = sigv4.parse_authorization(headers)
    sigv4.verify(req, SECRET, "GET", raw_path, raw_query, headers, time.time())


# ----------------------------------------------------------------------------- canonical forms

@pytest.mark.parametrize("raw,canonical", [
    ("/", "/"), ("", "/"), ("/a b", "/a%20b"), ("/a%20b", "/a%20b"), ("/a+b", "/a%2Bb"),
    ("/%7Euser", "/~user"), ("/a%2fb", "/a%2Fb"), ("/./a/../b", "/./a/../b"),
    ("/caf%c3%a9", "/caf%C3%A9"), (b"/caf\xc3\xa9", "/caf%C3%A9"),
    ("/caf\xc3\xa9", "/caf%C3%A9"),  # raw UTF-8 on the wire, decoded latin-1 (ASGI style)
    ("/\u65e5", "/%E6%97%A5"),  # beyond latin-1: taken as text, encoded UTF-8
    ("/bad%zz", "/bad%25zz"), ("/a//b/", "/a//b/"), ("/*()!'", "/%2A%28%29%21%27"),
])
def test_canonical_uri(raw, canonical):
    assert sigv4.canonical_uri(raw) == canonical


@pytest.mark.parametrize("raw,canonical", [
    ("", ""), ("b=2&a=1", "a=1&b=2"), ("a=2&a=1", "a=1&a=2"), ("acl", "acl="),
    ("a=x+y", "a=x%20y"), ("a=x%2By", "a=x%2By"), ("a=x%20y", "a=x%20y"),
    ("k=/~._-", "k=%2F~._-"), ("k=%7e", "k=~"), ("k=%c3%bc", "k=%C3%BC"),
    ("k=a=b", "k=a%3Db"), ("&&a=1&", "a=1"), ("B=1&a=1", "B=1&a=1"),
])
def test_canonical_query(raw, canonical):
    assert sigv4.canonical_query(raw) == canonical


def test_parse_query_decodes_plus_as_space():
    assert sigv4.parse_query("prefix=a+b%2Bc&acl&x=%C3%BC") == [
        ("prefix", "a b+c"), ("acl", ""), ("x", "ü")]
    assert sigv4.parse_query(b"x=\xc3\xbc") == sigv4.parse_query("x=\xc3\xbc") == [("x", "ü")]


def test_raw_utf8_path_from_asgi_verifies():
    """A client that puts raw UTF-8 in the request line signs the percent-encoded form."""
    path, query, headers = botocore_signed("GET", s3_url("ключ"))
    wire = unquote_to_bytes(path)
    verify_headers("GET", wire, query, headers, now=time.time())
    verify_headers("GET", wire.decode("latin-1"), query, headers, now=time.time())


def test_canonical_query_excludes_signature_only_for_presigned():
    assert sigv4.canonical_query("a=1&X-Amz-Signature=f", exclude="X-Amz-Signature") == "a=1"


# ----------------------------------------------------------------------------- failures

def code_of(fn, *args, **kwargs) -> AuthError:
    with pytest.raises(AuthError) as err:
        fn(*args, **kwargs)
    return err.value


def test_wrong_secret_is_signature_mismatch_without_leaking():
    err = code_of(verify_headers, "GET", "/test.txt", "", GET_OBJECT, secret="other-secret")
    assert (err.code, err.status) == ("SignatureDoesNotMatch", 403)
    expected = "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    everything = str(err) + err.message + repr(err.details)
    assert "other-secret" not in everything and SECRET not in everything
    sig = sigv4.sign(sigv4.signing_key("other-secret", "20130524", "us-east-1", "s3"),
                     err.details["StringToSign"])
    assert sig not in everything  # the signature we computed is never disclosed
    assert expected == err.details["SignatureProvided"]
    assert err.details["CanonicalRequest"].startswith("GET\n/test.txt\n")


@pytest.mark.parametrize("method,path,query,change", [
    ("PUT", "/test.txt", "", {}),
    ("GET", "/test.tx", "", {}),
    ("GET", "/test.txt", "x=1", {}),
    ("GET", "/test.txt", "", {"range": "bytes=0-10"}),
    ("GET", "/test.txt", "", {"host": "evil.example.com"}),
])
def test_tampering_is_detected(method, path, query, change):
    err = code_of(verify_headers, method, path, query, dict(GET_OBJECT, **change))
    assert err.code == "SignatureDoesNotMatch"


def test_missing_signed_header_fails():
    headers = dict(GET_OBJECT)
    del headers["range"]
    assert code_of(verify_headers, "GET", "/test.txt", "", headers).code == \
        "SignatureDoesNotMatch"


def test_plus_in_query_is_a_space_not_a_literal_plus():
    path, query, headers = botocore_signed("GET", s3_url("k", {"prefix": "a b"}))
    assert "a%20b" in query
    verify_headers("GET", path, query.replace("%20", "+"), headers, now=time.time())
    err = code_of(verify_headers, "GET", path, query.replace("%20", "%2B"), headers,
                  now=time.time())
    assert err.code == "SignatureDoesNotMatch"


def test_unsigned_amz_header_rejected():
    err = code_of(verify_headers, "GET", "/test.txt", "", dict(GET_OBJECT, **{
        "x-amz-copy-source": "/other/secret-object"}))
    assert err.code == "AccessDenied" and "x-amz-copy-source" in err.message


def test_unsigned_amz_header_rejected_on_presigned_url():
    url = botocore_presigned("PUT", s3_url("k"))
    err = code_of(verify_url, "PUT", url, {"x-amz-copy-source": "b/other"})
    assert err.code == "AccessDenied"
    verify_url("PUT", url, {"content-type": "x/y", "x-amz-content-sha256": "UNSIGNED-PAYLOAD"})


def test_host_must_be_signed():
    headers = dict(GET_OBJECT, authorization=aws_auth("range;x-amz-date", "0" * 64))
    assert code_of(sigv4.parse_authorization, headers).code == "AccessDenied"


@pytest.mark.parametrize("offset,ok", [(-901, False), (-899, True), (899, True), (901, False)])
def test_clock_skew(offset, ok):
    if ok:
        verify_headers("GET", "/test.txt", "", GET_OBJECT, now=EXAMPLE_NOW - offset)
    else:
        err = code_of(verify_headers, "GET", "/test.txt", "", GET_OBJECT,
                      now=EXAMPLE_NOW - offset)
        assert (err.code, err.status) == ("RequestTimeTooSkewed", 403)
        assert err.details["RequestTime"] == "20130524T000000Z"


def test_presigned_expiry_window():
    req = sigv4.parse_presigned(sigv4.parse_query(PRESIGNED_QUERY))
    args = (SECRET, "GET", "/test.txt", PRESIGNED_QUERY, {"host": HOST})
    sigv4.verify(req, *args, EXAMPLE_NOW + 86400)
    assert code_of(sigv4.verify, req, *args, EXAMPLE_NOW + 86401).message == "Request has expired"
    sigv4.verify(req, *args, EXAMPLE_NOW - 899)
    err = code_of(sigv4.verify, req, *args, EXAMPLE_NOW - 901)
    assert err.code == "AccessDenied"


def test_presigned_wrong_secret():
    req = sigv4.parse_presigned(sigv4.parse_query(PRESIGNED_QUERY))
    err = code_of(sigv4.verify, req, "bad", "GET", "/test.txt", PRESIGNED_QUERY,
                  {"host": HOST}, EXAMPLE_NOW)
    assert err.code == "SignatureDoesNotMatch"


@pytest.mark.parametrize("expires,message", [
    ("604801", "X-Amz-Expires must be less than a week (in seconds) that is; 604800"),
    ("0", "positive"), ("-5", "positive"), ("soon", "number"),
])
def test_presigned_expires_bounds(expires, message):
    query = PRESIGNED_QUERY.replace("X-Amz-Expires=86400", f"X-Amz-Expires={expires}")
    err = code_of(sigv4.parse_presigned, sigv4.parse_query(query))
    assert (err.code, err.status) == ("AuthorizationQueryParametersError", 400)
    assert message in err.message


def test_presigned_max_expires_accepted():
    query = PRESIGNED_QUERY.replace("X-Amz-Expires=86400", "X-Amz-Expires=604800")
    assert sigv4.parse_presigned(sigv4.parse_query(query)).expires == 604800


@pytest.mark.parametrize("drop", ["X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
                                  "X-Amz-SignedHeaders", "X-Amz-Signature"])
def test_presigned_missing_parameter(drop):
    pairs = [p for p in sigv4.parse_query(PRESIGNED_QUERY) if p[0] != drop]
    err = code_of(sigv4.parse_presigned, pairs)
    assert err.code == "AuthorizationQueryParametersError"


def test_presigned_wrong_algorithm_and_credential_date():
    bad = PRESIGNED_QUERY.replace("AWS4-HMAC-SHA256", "AWS4-HMAC-SHA1", 1)
    assert code_of(sigv4.parse_presigned, sigv4.parse_query(bad)).code == \
        "AuthorizationQueryParametersError"
    bad = PRESIGNED_QUERY.replace("X-Amz-Date=20130524", "X-Amz-Date=20130525")
    assert "not the same as X-Amz-Date" in code_of(
        sigv4.parse_presigned, sigv4.parse_query(bad)).message


def test_presigned_content_sha256_from_query():
    pairs = sigv4.parse_query(PRESIGNED_QUERY + "&X-Amz-Content-Sha256=" + EMPTY)
    assert sigv4.parse_presigned(pairs).payload_hash == EMPTY
    assert not sigv4.is_presigned([("a", "b")])


@pytest.mark.parametrize("auth,code,status", [
    ("AWS AKIAIOSFODNN7EXAMPLE:frJIUN8DYpKDtOLCwo//yllqDzg=", "InvalidRequest", 400),
    ("AWS4-ECDSA-P256-SHA256 Credential=x", "InvalidRequest", 400),
    ("AWS4-HMAC-SHA256 Credential=AK/20130524/us-east-1/s3/aws4_request",
     "AuthorizationHeaderMalformed", 400),
    (aws_auth("host", "0" * 64).replace("aws4_request", "aws5_request"),
     "AuthorizationHeaderMalformed", 400),
    (aws_auth("host", "0" * 64).replace("/20130524/", "/2013-05-24/"),
     "AuthorizationHeaderMalformed", 400),
    (aws_auth("host", "0" * 64).replace("/20130524/", "/20130523/"),
     "AuthorizationHeaderMalformed", 400),
    (aws_auth("host", "xyz"), "AuthorizationHeaderMalformed", 400),
    ("", "AccessDenied", 403),
])
def test_malformed_authorization(auth, code, status):
    err = code_of(sigv4.parse_authorization, dict(GET_OBJECT, authorization=auth))
    assert (err.code, err.status) == (code, status)


def test_missing_content_sha256_for_s3():
    headers = {k: v for k, v in GET_OBJECT.items() if k != "x-amz-content-sha256"}
    err = code_of(sigv4.parse_authorization, headers)
    assert (err.code, err.status) == ("InvalidRequest", 400)
    assert "x-amz-content-sha256" in err.message


@pytest.mark.parametrize("value,code", [
    ("nothex", "InvalidArgument"), ("abc", "InvalidArgument"),
    ("STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD", "NotImplemented"),
])
def test_bad_content_sha256_value(value, code):
    err = code_of(sigv4.parse_authorization, dict(GET_OBJECT, **{"x-amz-content-sha256": value}))
    assert err.code == code


@pytest.mark.parametrize("payload", ["UNSIGNED-PAYLOAD", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
                                     "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
                                     "STREAMING-UNSIGNED-PAYLOAD-TRAILER", EMPTY.upper()])
def test_accepted_payload_hash_forms(payload):
    req = sigv4.parse_authorization(dict(GET_OBJECT, **{"x-amz-content-sha256": payload}))
    assert req.payload_hash in (payload, payload.lower())


def test_date_header_is_used_when_x_amz_date_absent():
    headers = {k: v for k, v in PUT_OBJECT.items() if k != "x-amz-date"}
    req = sigv4.parse_authorization(headers)
    assert req.amz_date == "20130524T000000Z"


@pytest.mark.parametrize("headers", [
    {"x-amz-date": "2013-05-24T00:00:00Z"}, {"x-amz-date": "20131324T000000Z"},
    {"date": "not a date"}, {},
])
def test_missing_or_bad_date(headers):
    base = {k: v for k, v in GET_OBJECT.items() if k not in ("x-amz-date", "date")}
    err = code_of(sigv4.parse_authorization, dict(base, **headers))
    assert err.code == "AccessDenied"


def test_signing_key_is_cached_and_hidden_from_repr():
    sigv4.signing_key.cache_clear()
    for _ in range(3):
        verify_headers("GET", "/test.txt", "", GET_OBJECT)
    info = sigv4.signing_key.cache_info()
    assert (info.misses, info.hits) == (1, 2)
    ctx = verify_headers("GET", "/test.txt", "", GET_OBJECT)
    assert ctx.signing_key.hex() not in repr(ctx) and str(ctx.signing_key) not in repr(ctx)


def test_non_s3_service_may_omit_content_sha256():
    request = AWSRequest(method="POST", url="http://localhost:9000/", data=b"Action=ListUsers",
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
    SigV4Auth(creds(), "iam", "us-east-1").add_auth(request)
    prepared = request.prepare()
    headers = {k.lower(): (v.decode() if isinstance(v, bytes) else v)
               for k, v in prepared.headers.items()}
    headers.setdefault("host", "localhost:9000")
    req = sigv4.parse_authorization(headers)
    assert req.service == "iam"
    assert req.payload_hash == EMPTY  # right for a bodiless request only
    # Outside S3 the caller supplies the body hash (it has the body, the parser does not).
    req = dataclasses.replace(req, payload_hash=hashlib.sha256(b"Action=ListUsers").hexdigest())
    sigv4.verify(req, SECRET, "POST", "/", "", headers, time.time())
