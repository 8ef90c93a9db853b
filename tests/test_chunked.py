"""aws-chunked decoding: AWS's published streaming example, boto3's unsigned-trailer
framing, signed trailers, and every way a body can be short, long or forged."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import time
import zlib
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.httpchecksum import AwsChunkedWrapper, Crc32Checksum, CrtCrc64NvmeChecksum

from gateway.s3 import checksums, sigv4
from gateway.s3.chunked import MAX_HEADER_LINE, READ_SIZE, AwsChunkedReader, ChunkedError, streaming_mode
from gateway.s3.sigv4 import AuthError, SigningContext

AK = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
EXAMPLE_NOW = 1369353600.0
SEED = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
CHUNK_SIGNATURES = (
    "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
    "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
    "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
)
STREAMING_HEADERS = {
    "host": "s3.amazonaws.com", "x-amz-date": "20130524T000000Z",
    "x-amz-storage-class": "REDUCED_REDUNDANCY",
    "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    "content-encoding": "aws-chunked", "x-amz-decoded-content-length": "66560",
    "content-length": "66824",
    "authorization": (
        f"AWS4-HMAC-SHA256 Credential={AK}/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
        f"x-amz-decoded-content-length;x-amz-storage-class,Signature={SEED}"),
}
PAYLOAD = b"a" * 66560


def example_body() -> bytes:
    """The exact wire body of AWS's sigv4-streaming PUT example."""
    return (f"10000;chunk-signature={CHUNK_SIGNATURES[0]}\r\n".encode() + b"a" * 65536 + b"\r\n"
            + f"400;chunk-signature={CHUNK_SIGNATURES[1]}\r\n".encode() + b"a" * 1024 + b"\r\n"
            + f"0;chunk-signature={CHUNK_SIGNATURES[2]}\r\n\r\n".encode())


def example_context() -> SigningContext:
    req = sigv4.parse_authorization(STREAMING_HEADERS)
    return sigv4.verify(req, SECRET, "PUT", "/examplebucket/chunkObject.txt", "",
                        STREAMING_HEADERS, EXAMPLE_NOW)


class Trickle:
    """A source that hands out at most ``step`` bytes per read, like a slow socket."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data = memoryview(data)
        self._pos = 0
        self._step = step
        self.reads = 0

    def read(self, n: int = -1) -> bytes:
        self.reads += 1
        size = self._step if n is None or n < 0 else min(n, self._step)
        piece = bytes(self._data[self._pos:self._pos + size])
        self._pos += len(piece)
        return piece


def drain(reader: AwsChunkedReader, size: int) -> bytes:
    out = bytearray()
    while piece := reader.read(size):
        out += piece
    return bytes(out)


def sign_body(chunks: list[bytes], ctx: SigningContext, trailers: dict[str, str] | None = None,
              *, trailer_sig_override: str | None = None) -> bytes:
    """Independent encoder for signed aws-chunked bodies (per the AWS docs)."""
    empty = hashlib.sha256(b"").hexdigest()
    previous = ctx.seed_signature
    out = bytearray()
    for data in [*chunks, b""]:
        to_sign = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", ctx.amz_date, ctx.scope, previous,
                             empty, hashlib.sha256(data).hexdigest()])
        previous = hmac.new(ctx.signing_key, to_sign.encode(), "sha256").hexdigest()
        out += f"{len(data):x};chunk-signature={previous}\r\n".encode() + data
        out += b"\r\n" if data or trailers is None else b""
    if trailers is not None:
        canonical = "".join(f"{k}:{v}\n" for k, v in sorted(trailers.items()))
        to_sign = "\n".join(["AWS4-HMAC-SHA256-TRAILER", ctx.amz_date, ctx.scope, previous,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        signature = hmac.new(ctx.signing_key, to_sign.encode(), "sha256").hexdigest()
        for name, value in trailers.items():
            out += f"{name}:{value}\r\n".encode()
        out += f"x-amz-trailer-signature:{trailer_sig_override or signature}\r\n\r\n".encode()
    return bytes(out)


def unsigned_body(chunks: list[bytes], trailers: dict[str, str], end: bytes = b"\r\n") -> bytes:
    out = bytearray()
    for data in chunks:
        out += f"{len(data):x}\r\n".encode() + data + b"\r\n"
    out += b"0\r\n"
    for name, value in trailers.items():
        out += f"{name}:{value}\r\n".encode()
    return bytes(out + end)


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def fail(reader: AwsChunkedReader, size: int = 4096) -> Exception:
    with pytest.raises((ChunkedError, AuthError)) as err:
        drain(reader, size)
    return err.value


# ----------------------------------------------------------------------------- AWS example

def test_aws_example_body_length_matches_content_length():
    assert len(example_body()) == 66824


@pytest.mark.parametrize("read_size", [1, 7, 4096, 65536, 65537, 10**6])
def test_aws_streaming_example_decodes(read_size):
    reader = AwsChunkedReader(io.BytesIO(example_body()), signing=example_context(),
                              trailer=False, decoded_length=66560)
    assert drain(reader, read_size) == PAYLOAD
    assert reader.decoded_bytes == 66560 and reader.trailers == {}
    assert reader.read(10) == b""


@pytest.mark.parametrize("step", [1, 3, 89, 90, 91, 65536])
def test_aws_streaming_example_over_a_trickling_source(step):
    reader = AwsChunkedReader(Trickle(example_body(), step), signing=example_context(),
                              trailer=False, decoded_length=66560)
    assert drain(reader, 5000) == PAYLOAD


def test_aws_streaming_example_read_all():
    reader = AwsChunkedReader(io.BytesIO(example_body()), signing=example_context(),
                              trailer=False, decoded_length=None)
    assert reader.read() == PAYLOAD


def test_aws_example_seed_signature_is_the_published_one():
    assert example_context().seed_signature == SEED


@pytest.mark.parametrize("offset", [100, 40000, 65600, 66700])
def test_flipped_byte_is_signature_mismatch(offset):
    body = bytearray(example_body())
    assert body[offset:offset + 1] == b"a"
    body[offset] = ord("b")
    reader = AwsChunkedReader(io.BytesIO(bytes(body)), signing=example_context(),
                              trailer=False, decoded_length=66560)
    err = fail(reader)
    assert isinstance(err, AuthError)
    assert (err.code, err.status) == ("SignatureDoesNotMatch", 403)


def test_reordered_signature_fails():
    body = example_body().replace(CHUNK_SIGNATURES[2].encode(), CHUNK_SIGNATURES[1].encode())
    reader = AwsChunkedReader(io.BytesIO(body), signing=example_context(), trailer=False,
                              decoded_length=66560)
    assert fail(reader).code == "SignatureDoesNotMatch"


def test_wrong_seed_fails_first_chunk():
    ctx = example_context()
    bad = SigningContext(ctx.signing_key, ctx.amz_date, ctx.scope, "0" * 64)
    reader = AwsChunkedReader(io.BytesIO(example_body()), signing=bad, trailer=False,
                              decoded_length=None)
    assert fail(reader).code == "SignatureDoesNotMatch"


@pytest.mark.parametrize("cut", [1, 10, 90, 5000, 65626, 65628, 66700, 66750, 66819, 66821])
def test_truncated_body_is_incomplete(cut):
    body = example_body()[:cut]
    reader = AwsChunkedReader(io.BytesIO(body), signing=example_context(), trailer=False,
                              decoded_length=66560)
    err = fail(reader)
    assert (err.code, err.status) == ("IncompleteBody", 400)


def test_missing_final_crlf_is_tolerated():
    reader = AwsChunkedReader(io.BytesIO(example_body()[:-2]), signing=example_context(),
                              trailer=False, decoded_length=66560)
    assert drain(reader, 65536) == PAYLOAD


def test_decoded_length_mismatch():
    for declared in (66559, 66561):
        reader = AwsChunkedReader(io.BytesIO(example_body()), signing=example_context(),
                                  trailer=False, decoded_length=declared)
        assert fail(reader).code == "IncompleteBody"


def test_data_after_the_end_is_rejected():
    reader = AwsChunkedReader(io.BytesIO(example_body() + b"junk"), signing=example_context(),
                              trailer=False, decoded_length=66560)
    assert fail(reader).code == "InvalidRequest"


def test_unverified_bytes_flow_but_eof_raises():
    """Bytes of a forged final chunk may be handed out, but EOF is never reported."""
    body = bytearray(example_body())
    body[66000] = ord("b")
    reader = AwsChunkedReader(io.BytesIO(bytes(body)), signing=example_context(),
                              trailer=False, decoded_length=66560)
    got = reader.read(65536) + reader.read(1024)
    assert len(got) == 66560
    with pytest.raises(AuthError):
        reader.read(1)


# ----------------------------------------------------------------------------- framing errors

def ctx_now() -> SigningContext:
    return SigningContext(sigv4.signing_key(SECRET, "20130524", "us-east-1", "s3"),
                          "20130524T000000Z", "20130524/us-east-1/s3/aws4_request", SEED)


@pytest.mark.parametrize("header", [b"zz;chunk-signature=" + b"0" * 64, b";chunk-signature=x",
                                    b"-1;chunk-signature=" + b"0" * 64, b"0x10;chunk-signature=",
                                    b" 10;chunk-signature=" + b"0" * 64, b"1" * 17 + b";c"])
def test_malformed_hex_size(header):
    reader = AwsChunkedReader(io.BytesIO(header + b"\r\n"), signing=ctx_now(), trailer=False,
                              decoded_length=None)
    err = fail(reader)
    assert (err.code, err.status) == ("InvalidChunkSizeError", 400)


def test_oversize_chunk_header_line():
    body = b"10;chunk-signature=" + b"a" * (MAX_HEADER_LINE + 10) + b"\r\n"
    reader = AwsChunkedReader(io.BytesIO(body), signing=ctx_now(), trailer=False,
                              decoded_length=None)
    assert fail(reader).code == "InvalidRequest"


def test_endless_header_line_is_cut_off_early():
    source = Trickle(b"1" * 10**7, READ_SIZE)
    reader = AwsChunkedReader(source, signing=None, trailer=True, decoded_length=None)
    assert fail(reader).code == "InvalidRequest"
    assert source.reads <= 3


def test_missing_chunk_signature():
    body = b"5\r\nhello\r\n0\r\n\r\n"
    reader = AwsChunkedReader(io.BytesIO(body), signing=ctx_now(), trailer=False,
                              decoded_length=None)
    assert fail(reader).code == "InvalidRequest"


def test_chunk_longer_than_its_size():
    body = sign_body([b"hello"], ctx_now()).replace(b"hello\r\n", b"hello!\r\n")
    reader = AwsChunkedReader(io.BytesIO(body), signing=ctx_now(), trailer=False,
                              decoded_length=None)
    assert fail(reader).code == "InvalidRequest"


def test_bare_lf_rejected():
    reader = AwsChunkedReader(io.BytesIO(b"5\nhello\r\n0\r\n\r\n"), signing=None, trailer=True,
                              decoded_length=None)
    assert fail(reader).code == "InvalidRequest"


def test_chunk_beyond_decoded_length_rejected_before_reading_it():
    body = b"100000\r\n"  # claims 1 MiB
    reader = AwsChunkedReader(io.BytesIO(body), signing=None, trailer=True, decoded_length=10)
    assert fail(reader).code == "IncompleteBody"


def test_unsigned_without_trailer_is_not_a_mode():
    with pytest.raises(ValueError):
        AwsChunkedReader(io.BytesIO(b""), signing=None, trailer=False, decoded_length=None)


def test_empty_source():
    reader = AwsChunkedReader(io.BytesIO(b""), signing=None, trailer=True, decoded_length=None)
    assert fail(reader).code == "IncompleteBody"


def test_streaming_mode():
    assert streaming_mode("STREAMING-AWS4-HMAC-SHA256-PAYLOAD") == (True, False)
    assert streaming_mode("STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER") == (True, True)
    assert streaming_mode("STREAMING-UNSIGNED-PAYLOAD-TRAILER") == (False, True)
    assert streaming_mode("UNSIGNED-PAYLOAD") is None


# ----------------------------------------------------------------------------- signed trailer

def test_signed_trailer_roundtrip():
    data = [b"x" * 8192, b"y" * 100]
    payload = b"".join(data)
    trailers = {"x-amz-checksum-crc32": crc32_b64(payload)}
    body = sign_body(data, ctx_now(), trailers)
    reader = AwsChunkedReader(Trickle(body, 777), signing=ctx_now(), trailer=True,
                              decoded_length=len(payload),
                              declared_trailers=["x-amz-checksum-crc32"])
    assert drain(reader, 1000) == payload
    assert reader.trailers == trailers


def test_signed_trailer_with_several_headers_is_sorted_for_signing():
    trailers = {"x-amz-checksum-sha256": "b", "x-amz-checksum-crc32": "a"}
    body = sign_body([b"data"], ctx_now(), trailers)
    reader = AwsChunkedReader(io.BytesIO(body), signing=ctx_now(), trailer=True,
                              decoded_length=4, declared_trailers=list(trailers))
    assert drain(reader, 100) == b"data"
    assert reader.trailers == trailers


def test_signed_trailer_bad_signature():
    body = sign_body([b"data"], ctx_now(), {"x-amz-checksum-crc32": crc32_b64(b"data")},
                     trailer_sig_override="1" * 64)
    reader = AwsChunkedReader(io.BytesIO(body), signing=ctx_now(), trailer=True,
                              decoded_length=4)
    assert fail(reader).code == "SignatureDoesNotMatch"


def test_signed_trailer_value_tampered():
    body = sign_body([b"data"], ctx_now(), {"x-amz-checksum-crc32": crc32_b64(b"data")})
    body = body.replace(crc32_b64(b"data").encode(), crc32_b64(b"DATA").encode())
    reader = AwsChunkedReader(io.BytesIO(body), signing=ctx_now(), trailer=True,
                              decoded_length=4)
    assert fail(reader).code == "SignatureDoesNotMatch"


def test_signed_trailer_missing_signature():
    body = sign_body([b"data"], ctx_now(), {"x-amz-checksum-crc32": crc32_b64(b"data")})
    body = body[:body.index(b"x-amz-trailer-signature")] + b"\r\n"
    reader = AwsChunkedReader(io.BytesIO(body), signing=ctx_now(), trailer=True,
                              decoded_length=4)
    assert fail(reader).code == "SignatureDoesNotMatch"


# ----------------------------------------------------------------------------- unsigned trailer

def test_unsigned_trailer_crc32():
    payload = b"hello world" * 1000
    body = unsigned_body([payload[:5000], payload[5000:]],
                         {"x-amz-checksum-crc32": crc32_b64(payload)})
    reader = AwsChunkedReader(io.BytesIO(body), signing=None, trailer=True,
                              decoded_length=len(payload),
                              declared_trailers=["x-amz-checksum-crc32"])
    assert drain(reader, 3000) == payload
    assert reader.trailers == {"x-amz-checksum-crc32": crc32_b64(payload)}


def test_unsigned_trailer_without_final_crlf():
    body = unsigned_body([b"abc"], {"x-amz-checksum-crc32": crc32_b64(b"abc")}, end=b"")
    reader = AwsChunkedReader(io.BytesIO(body), signing=None, trailer=True, decoded_length=3,
                              declared_trailers=["x-amz-checksum-crc32"])
    assert drain(reader, 10) == b"abc"
    assert reader.trailers["x-amz-checksum-crc32"] == crc32_b64(b"abc")


def test_blank_line_between_final_chunk_and_trailer_is_tolerated():
    body = unsigned_body([b"abc"], {"x-amz-checksum-crc32": crc32_b64(b"abc")})
    body = body.replace(b"0\r\n", b"0\r\n\r\n", 1)
    reader = AwsChunkedReader(io.BytesIO(body), signing=None, trailer=True, decoded_length=3,
                              declared_trailers=["x-amz-checksum-crc32"])
    assert drain(reader, 10) == b"abc"
    assert reader.trailers == {"x-amz-checksum-crc32": crc32_b64(b"abc")}


def test_no_trailer_at_all_is_accepted_when_none_declared():
    reader = AwsChunkedReader(io.BytesIO(b"3\r\nabc\r\n0\r\n\r\n"), signing=None, trailer=True,
                              decoded_length=3)
    assert drain(reader, 10) == b"abc" and reader.trailers == {}


def test_unsigned_trailer_names_are_lowercased_and_values_trimmed():
    body = unsigned_body([b"abc"], {"X-Amz-Checksum-CRC32": "  " + crc32_b64(b"abc") + " "})
    reader = AwsChunkedReader(io.BytesIO(body), signing=None, trailer=True, decoded_length=3,
                              declared_trailers=["X-Amz-Checksum-CRC32"])
    drain(reader, 10)
    assert reader.trailers == {"x-amz-checksum-crc32": crc32_b64(b"abc")}


def test_a_checksum_trailer_not_declared_is_refused_not_skipped():
    """It could not be computed while the body streamed: skipping it would let any value pass."""
    body = unsigned_body([b"abc"], {"x-amz-checksum-crc32": crc32_b64(b"xyz")})
    for declared in ([], ["x-amz-checksum-crc32c"]):
        reader = AwsChunkedReader(io.BytesIO(body), signing=None, trailer=True, decoded_length=3,
                                  declared_trailers=declared)
        assert fail(reader).code == "MalformedTrailerError"


def test_declared_trailer_missing():
    body = unsigned_body([b"abc"], {})
    reader = AwsChunkedReader(io.BytesIO(body), signing=None, trailer=True, decoded_length=3,
                              declared_trailers=["x-amz-checksum-crc32"])
    assert fail(reader).code == "MalformedTrailerError"


def test_malformed_trailer_line():
    body = unsigned_body([b"abc"], {}, end=b"no-colon-here\r\n\r\n")
    reader = AwsChunkedReader(io.BytesIO(body), signing=None, trailer=True, decoded_length=3)
    assert fail(reader).code == "MalformedTrailerError"


def test_too_many_trailers():
    body = unsigned_body([b"abc"], {f"x-h{i}": "v" for i in range(100)})
    reader = AwsChunkedReader(io.BytesIO(body), signing=None, trailer=True, decoded_length=3)
    assert fail(reader).code == "InvalidRequest"


@pytest.mark.parametrize("checksum_cls,name", [(Crc32Checksum, "x-amz-checksum-crc32"),
                                               (CrtCrc64NvmeChecksum, "x-amz-checksum-crc64nvme")])
def test_botocore_aws_chunked_wrapper_body(checksum_cls, name):
    payload = bytes(range(256)) * 5000
    wrapper = AwsChunkedWrapper(io.BytesIO(payload), checksum_cls=checksum_cls,
                                checksum_name=name, chunk_size=100_000)
    body = wrapper.read()
    reader = AwsChunkedReader(io.BytesIO(body), signing=None, trailer=True,
                              decoded_length=len(payload), declared_trailers=[name])
    algorithm = name.rsplit("-", 1)[1]
    verifying = checksums.VerifyingReader(reader, content_md5=None, algorithms=[algorithm],
                                          expected=lambda: reader.trailers,
                                          expected_size=len(payload))
    assert drain(verifying, 65536) == payload
    assert verifying.checksums[algorithm.upper()] == reader.trailers[name]


def test_botocore_wrapper_with_corrupted_data_fails_checksum():
    payload = b"q" * 3000
    body = bytearray(AwsChunkedWrapper(io.BytesIO(payload), checksum_cls=Crc32Checksum,
                                       checksum_name="x-amz-checksum-crc32").read())
    body[100] = ord("Q")
    reader = AwsChunkedReader(io.BytesIO(bytes(body)), signing=None, trailer=True,
                              decoded_length=len(payload), declared_trailers=["x-amz-checksum-crc32"])
    verifying = checksums.VerifyingReader(reader, content_md5=None, algorithms=["CRC32"],
                                          expected=lambda: reader.trailers, expected_size=None)
    with pytest.raises(checksums.BadDigest) as err:
        drain(verifying, 1000)
    assert err.value.code == "BadDigest"


class _EmptyRaw:
    def stream(self, **_):
        yield b""

    def read(self, *_):
        return b""


def test_real_boto3_put_object_over_https_end_to_end():
    """boto3 over TLS sends STREAMING-UNSIGNED-PAYLOAD-TRAILER; verify and decode it."""
    seen = []

    def hook(request, **_):
        seen.append((request.method, request.url, request.headers, request.body.read()))
        return AWSResponse(request.url, 200, {"ETag": '"e"'}, _EmptyRaw())

    client = boto3.client("s3", endpoint_url="https://localhost:9443", aws_access_key_id=AK,
                          aws_secret_access_key=SECRET, region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}))
    client.meta.events.register("before-send.s3.*", hook)
    payload = b"0123456789" * 30000
    client.put_object(Bucket="b", Key="dir/k ü", Body=payload, ChecksumAlgorithm="CRC32C")
    method, url, raw_headers, body = seen[0]
    headers = {k.lower(): (v.decode("latin-1") if isinstance(v, bytes) else v)
               for k, v in raw_headers.items()}
    parts = urlsplit(url)
    req = sigv4.parse_authorization(headers)
    ctx = sigv4.verify(req, SECRET, method, parts.path, parts.query, headers, time.time())
    signed, trailer = streaming_mode(req.payload_hash)
    assert (signed, trailer) == (False, True)
    reader = AwsChunkedReader(io.BytesIO(body), signing=ctx if signed else None, trailer=trailer,
                              decoded_length=int(headers["x-amz-decoded-content-length"]),
                              declared_trailers=headers["x-amz-trailer"].split(","))
    algorithms, expected = checksums.checksum_request(headers)
    assert algorithms == ["CRC32C"] and expected == {}
    verifying = checksums.VerifyingReader(
        reader, content_md5=None, algorithms=algorithms,
        expected=lambda: {**expected, **reader.trailers}, expected_size=None)
    assert drain(verifying, 1 << 20) == payload
    assert verifying.checksums["CRC32C"] == reader.trailers["x-amz-checksum-crc32c"]


# ----------------------------------------------------------------------------- memory bound

def test_memory_stays_bounded_for_a_huge_chunk():
    """A 16 MiB chunk must stream through without the reader holding it."""
    size = 16 << 20

    class Source:
        def __init__(self):
            self.parts = [f"{size:x}\r\n".encode()]
            self.left = size
            self.tail = [b"\r\n0\r\n\r\n"]
            self.biggest_read = 0

        def read(self, n):
            self.biggest_read = max(self.biggest_read, n)
            if self.parts:
                return self.parts.pop()
            if self.left:
                take = min(n, self.left)
                self.left -= take
                return b"z" * take
            return self.tail.pop() if self.tail else b""

    source = Source()
    reader = AwsChunkedReader(source, signing=None, trailer=True, decoded_length=size)
    total = 0
    while piece := reader.read(READ_SIZE):
        assert len(piece) <= READ_SIZE
        assert len(reader._buf) <= READ_SIZE + MAX_HEADER_LINE  # noqa: SLF001
        total += len(piece)
    assert total == size and source.biggest_read <= READ_SIZE
