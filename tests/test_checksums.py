"""Upload integrity: digests agree with botocore's, and every mismatch gets S3's code."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import zlib

import awscrt.checksums
import pytest
from botocore.httpchecksum import (
    Crc32Checksum,
    CrtCrc32cChecksum,
    CrtCrc64NvmeChecksum,
    Sha1Checksum,
    Sha256Checksum,
)

from gateway.s3 import checksums
from gateway.s3.checksums import BadDigest, VerifyingReader

BOTOCORE = {"CRC32": Crc32Checksum, "CRC32C": CrtCrc32cChecksum, "SHA1": Sha1Checksum,
            "SHA256": Sha256Checksum, "CRC64NVME": CrtCrc64NvmeChecksum}
DATA = os.urandom(300_000)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def drain(reader, size: int = 65536) -> bytes:
    out = bytearray()
    while piece := reader.read(size):
        out += piece
    return bytes(out)


def reader_for(data: bytes, **kwargs) -> VerifyingReader:
    options = {"content_md5": None, "algorithms": (), "expected": dict, "expected_size": None}
    options.update(kwargs)
    return VerifyingReader(io.BytesIO(data), **options)


# ----------------------------------------------------------------------------- digests

def test_algorithm_list_and_header_names():
    assert checksums.ALGORITHMS == ("CRC32", "CRC32C", "SHA1", "SHA256", "CRC64NVME")
    assert checksums.header_name("CRC32") == "x-amz-checksum-crc32"
    assert checksums.header_name("crc64nvme") == "x-amz-checksum-crc64nvme"


def test_unknown_algorithm_is_invalid_request():
    with pytest.raises(BadDigest) as err:
        checksums.new_hasher("MD4")
    assert (err.value.code, err.value.status) == ("InvalidRequest", 400)


@pytest.mark.parametrize("algorithm,expected", [
    ("CRC32", 0xCBF43926), ("CRC32C", 0xE3069283), ("CRC64NVME", 0xAE8B14860A799888),
])
def test_crc_check_values(algorithm, expected):
    """The standard check value: CRC of the ASCII string "123456789"."""
    hasher = checksums.new_hasher(algorithm)
    hasher.update(b"123456789")
    assert int.from_bytes(hasher.digest(), "big") == expected


@pytest.mark.parametrize("algorithm", checksums.ALGORITHMS)
def test_digests_match_botocore_incrementally(algorithm):
    ours = checksums.new_hasher(algorithm)
    theirs = BOTOCORE[algorithm]()
    for start in range(0, len(DATA), 7919):
        ours.update(DATA[start:start + 7919])
    theirs.update(DATA)
    assert ours.digest() == theirs.digest()
    assert checksums.encode(ours.digest()) == theirs.b64digest()
    assert checksums.checksum(algorithm, DATA) == theirs.b64digest()


@pytest.mark.parametrize("algorithm", checksums.ALGORITHMS)
def test_empty_input_digests(algorithm):
    theirs = BOTOCORE[algorithm]()
    assert checksums.checksum(algorithm, b"") == theirs.b64digest()


def test_decode_validates_length_and_alphabet():
    assert checksums.decode("CRC32", "AAAAAA==") == b"\0\0\0\0"
    for bad in ("AAAA", "AAAAAAAA", "!!!!!!==", "AAAAAA=", ""):
        with pytest.raises(BadDigest) as err:
            checksums.decode("CRC32", bad)
        assert err.value.code == "InvalidRequest"
        assert "x-amz-checksum-crc32" in err.value.message


# ----------------------------------------------------------------------------- reader

def test_reader_passes_bytes_and_reports_digests():
    reader = reader_for(DATA, algorithms=["crc32", "SHA256"], expected_size=len(DATA))
    assert drain(reader, 10_000) == DATA
    assert reader.size == len(DATA)
    assert reader.checksums == {"CRC32": b64(zlib.crc32(DATA).to_bytes(4, "big")),
                                "SHA256": b64(hashlib.sha256(DATA).digest())}
    assert reader.read(5) == b""


def test_reader_read_all():
    reader = reader_for(b"abc", algorithms=["CRC32C"])
    assert reader.read() == b"abc" and reader.read() == b""
    assert reader.checksums == {"CRC32C": b64(awscrt.checksums.crc32c(b"abc").to_bytes(4, "big"))}


def test_content_md5_ok_and_mismatch():
    good = b64(hashlib.md5(DATA).digest())
    drain(reader_for(DATA, content_md5=good))
    with pytest.raises(BadDigest) as err:
        drain(reader_for(DATA + b"x", content_md5=good))
    assert (err.value.code, err.value.status) == ("BadDigest", 400)
    assert "Content-MD5" in err.value.message


@pytest.mark.parametrize("bad", ["not base64!", "AAAA", b64(b"x" * 15), ""])
def test_malformed_content_md5_fails_before_reading(bad):
    source = io.BytesIO(DATA)
    with pytest.raises(BadDigest) as err:
        VerifyingReader(source, content_md5=bad, algorithms=(), expected=dict,
                        expected_size=None)
    assert err.value.code == "InvalidDigest"
    assert source.tell() == 0


@pytest.mark.parametrize("algorithm", checksums.ALGORITHMS)
def test_expected_checksum_ok_and_mismatch(algorithm):
    value = BOTOCORE[algorithm]().handle(DATA)
    reader = reader_for(DATA, algorithms=[algorithm], expected=lambda: {algorithm: value})
    drain(reader)
    assert reader.checksums[algorithm] == value
    reader = reader_for(DATA[:-1], algorithms=[algorithm], expected=lambda: {algorithm: value})
    with pytest.raises(BadDigest) as err:
        drain(reader)
    assert err.value.code == "BadDigest"
    assert err.value.message == (f"The {algorithm} you specified did not match the "
                                 "calculated checksum.")


def test_expected_values_are_read_only_at_eof_and_accept_trailer_names():
    trailers: dict[str, str] = {}
    reader = reader_for(b"hello", algorithms=["CRC32"], expected=lambda: trailers)
    assert reader.read(5) == b"hello"
    trailers["x-amz-checksum-crc32"] = checksums.checksum("CRC32", b"hello")
    assert reader.read(5) == b""
    trailers["x-amz-checksum-crc32"] = checksums.checksum("CRC32", b"HELLO")
    reader = reader_for(b"hello", algorithms=["CRC32"], expected=lambda: trailers)
    with pytest.raises(BadDigest):
        drain(reader)


def test_malformed_expected_value_is_invalid_request():
    reader = reader_for(b"hello", algorithms=["SHA1"], expected=lambda: {"SHA1": "AAAA"})
    with pytest.raises(BadDigest) as err:
        drain(reader)
    assert err.value.code == "InvalidRequest"


def test_expected_value_for_uncomputed_algorithm_is_ignored():
    reader = reader_for(b"hello", algorithms=["CRC32"], expected=lambda: {"SHA1": "AAAA"})
    assert drain(reader) == b"hello"


@pytest.mark.parametrize("data", [b"short", b"a bit too long"])
def test_expected_size_mismatch_is_incomplete_body(data):
    with pytest.raises(BadDigest) as err:
        drain(reader_for(data, expected_size=10), 3)
    assert (err.value.code, err.value.status) == ("IncompleteBody", 400)


def test_content_sha256_check():
    digest = hashlib.sha256(DATA).hexdigest()
    drain(reader_for(DATA, content_sha256=digest))
    drain(reader_for(DATA, content_sha256=digest.upper(), algorithms=["SHA256"]))
    with pytest.raises(BadDigest) as err:
        drain(reader_for(DATA[1:], content_sha256=digest))
    assert err.value.code == "XAmzContentSHA256Mismatch"


def test_errors_repeat_on_further_reads():
    reader = reader_for(b"x", content_md5=b64(hashlib.md5(b"y").digest()))
    for _ in range(2):
        with pytest.raises(BadDigest):
            drain(reader)


def test_short_reads_from_source_are_fine():
    class Trickle:
        def __init__(self, data):
            self.data = data

        def read(self, n=-1):
            piece, self.data = self.data[:3], self.data[3:]
            return piece

    reader = VerifyingReader(Trickle(b"0123456789"), content_md5=None, algorithms=["CRC32"],
                             expected=lambda: {}, expected_size=10)
    assert drain(reader, 100) == b"0123456789"


# ----------------------------------------------------------------------------- request headers

def test_checksum_request_from_header():
    value = checksums.checksum("SHA256", b"x")
    algorithms, expected = checksums.checksum_request({"x-amz-checksum-sha256": value})
    assert (algorithms, expected) == (["SHA256"], {"SHA256": value})


def test_checksum_request_from_trailer_and_sdk_header():
    headers = {"x-amz-trailer": "x-amz-checksum-crc32c", "x-amz-sdk-checksum-algorithm": "CRC32C"}
    assert checksums.checksum_request(headers) == (["CRC32C"], {})


def test_checksum_request_sdk_only_means_compute():
    assert checksums.checksum_request({"x-amz-sdk-checksum-algorithm": "crc64nvme"}) == (
        ["CRC64NVME"], {})


def test_checksum_request_ignores_non_value_headers():
    headers = {"x-amz-checksum-type": "FULL_OBJECT", "x-amz-checksum-algorithm": "CRC32",
               "x-amz-checksum-mode": "ENABLED", "content-md5": "whatever"}
    assert checksums.checksum_request(headers) == ([], {})


@pytest.mark.parametrize("headers", [
    {"x-amz-checksum-md4": "AAAA"},
    {"x-amz-sdk-checksum-algorithm": "XXHASH"},
    {"x-amz-trailer": "x-amz-checksum-blake3"},
    {"x-amz-checksum-crc32": "AAAAAA==", "x-amz-checksum-sha1": b64(b"x" * 20)},
    {"x-amz-checksum-crc32": "AAAAAA==", "x-amz-trailer": "x-amz-checksum-crc32c"},
    {"x-amz-checksum-crc32": "AAAAAA==", "x-amz-sdk-checksum-algorithm": "SHA256"},
    {"x-amz-checksum-crc32": "not-base64"},
])
def test_checksum_request_rejects(headers):
    with pytest.raises(BadDigest) as err:
        checksums.checksum_request(headers)
    assert (err.value.code, err.value.status) == ("InvalidRequest", 400)


# ----------------------------------------------------------------------------- multipart

def test_composite_checksum():
    parts = [DATA[:100_000], DATA[100_000:250_000], DATA[250_000:]]
    for algorithm in checksums.ALGORITHMS:
        digests = [BOTOCORE[algorithm]().handle(p) for p in parts]
        raw = [base64.b64decode(d) for d in digests]
        expected = BOTOCORE[algorithm]()
        expected.update(b"".join(raw))
        assert checksums.composite(algorithm, raw) == f"{expected.b64digest()}-3"


@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "CRC64NVME"])
def test_full_object_crc_equals_crc_of_whole_data(algorithm):
    cuts = [0, 1, 65_536, 200_001, len(DATA)]
    parts = [DATA[a:b] for a, b in zip(cuts, cuts[1:])]
    combined = checksums.full_object(
        algorithm, [(base64.b64decode(checksums.checksum(algorithm, p)), len(p)) for p in parts])
    assert combined == checksums.checksum(algorithm, DATA)


def test_full_object_not_available_for_sha():
    with pytest.raises(BadDigest) as err:
        checksums.full_object("SHA256", [])
    assert err.value.code == "InvalidRequest"
