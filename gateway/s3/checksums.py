"""Upload integrity: Content-MD5, x-amz-checksum-* and x-amz-content-sha256 checks.

``VerifyingReader`` sits between the (decoded) request body and the store and hashes the
bytes as they pass, so one pass over the data yields the ETag (MD5), the stored checksums
and the verdict.  Expected checksum values may only be known at EOF (aws-chunked
trailers), hence the ``expected`` callable.

Digests are raw big-endian bytes exactly as S3 and the SDKs produce them; on the wire
they are base64.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from awscrt import checksums as _crt

from ..store.base import Readable
from .errors import S3Error

ALGORITHMS = ("CRC32", "CRC32C", "SHA1", "SHA256", "CRC64NVME")
HEADER_PREFIX = "x-amz-checksum-"
SDK_ALGORITHM_HEADER = "x-amz-sdk-checksum-algorithm"
DIGEST_SIZES = {"CRC32": 4, "CRC32C": 4, "SHA1": 20, "SHA256": 32, "CRC64NVME": 8}
# x-amz-checksum-* request headers that carry no checksum value.
_NON_VALUE_HEADERS = frozenset({"x-amz-checksum-algorithm", "x-amz-checksum-type",
                                "x-amz-checksum-mode"})
_CRC_FUNCTIONS = {"CRC32": zlib.crc32, "CRC32C": _crt.crc32c, "CRC64NVME": _crt.crc64nvme}
_CRC_COMBINE = {"CRC32": _crt.combine_crc32, "CRC32C": _crt.combine_crc32c,
                "CRC64NVME": _crt.combine_crc64nvme}
_SHA = {"SHA1": "sha1", "SHA256": "sha256"}


class Hasher(Protocol):
    """The incremental-hash interface shared by hashlib objects and the CRC wrapper."""

    def update(self, data: bytes, /) -> None: ...

    def digest(self) -> bytes: ...


class BadDigest(S3Error):
    """An integrity failure with its S3 error code (BadDigest, InvalidDigest, ...)."""


class _Crc:
    """Incremental CRC with the digest S3 uses: the register as big-endian bytes."""

    __slots__ = ("_function", "_size", "_value")

    def __init__(self, function: Callable[[bytes, int], int], size: int) -> None:
        self._function = function
        self._size = size
        self._value = 0

    def update(self, data: bytes) -> None:
        self._value = self._function(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(self._size, "big")


def normalize(algorithm: str) -> str:
    """Canonical upper-case algorithm name; InvalidRequest for anything unsupported."""
    name = algorithm.strip().upper()
    if name not in DIGEST_SIZES:
        raise BadDigest("InvalidRequest", f"Checksum algorithm {algorithm.strip()!r} is not "
                        f"supported; use one of {', '.join(ALGORITHMS)}.")
    return name


def header_name(algorithm: str) -> str:
    """``CRC32`` -> ``x-amz-checksum-crc32``."""
    return HEADER_PREFIX + normalize(algorithm).lower()


def new_hasher(algorithm: str) -> Hasher:
    """A fresh incremental hasher for a checksum algorithm."""
    name = normalize(algorithm)
    if name in _SHA:
        return hashlib.new(_SHA[name])
    return _Crc(_CRC_FUNCTIONS[name], DIGEST_SIZES[name])


def encode(digest: bytes) -> str:
    """Base64, as S3 sends checksums and Content-MD5."""
    return base64.b64encode(digest).decode("ascii")


def decode(algorithm: str, value: str) -> bytes:
    """Strictly decode a base64 checksum value; InvalidRequest when malformed."""
    name = normalize(algorithm)
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != DIGEST_SIZES[name]:
        raise BadDigest("InvalidRequest", f"Value for {HEADER_PREFIX}{name.lower()} header "
                        "is invalid.")
    return raw


def checksum(algorithm: str, data: bytes) -> str:
    """One-shot base64 checksum of ``data``."""
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return encode(hasher.digest())


# --------------------------------------------------------------------------- request

def _declared_trailers(headers: Mapping[str, str]) -> list[str]:
    value = headers.get("x-amz-trailer", "")
    return [n.strip().lower() for n in value.split(",") if n.strip()]


def checksum_request(headers: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """Which checksum algorithms to compute and which values are expected up front.

    Sources: one ``x-amz-checksum-<alg>`` header (value known now), an
    ``x-amz-checksum-<alg>`` name in x-amz-trailer (value arrives at EOF) and
    x-amz-sdk-checksum-algorithm (compute and store).  ``headers`` has lowercase names.
    Raises InvalidRequest for unknown algorithms, malformed values, several checksums
    or an SDK algorithm that contradicts the checksum sent.
    """
    expected: dict[str, str] = {}
    for name, value in headers.items():
        if name.startswith(HEADER_PREFIX) and name not in _NON_VALUE_HEADERS:
            algorithm = normalize(name[len(HEADER_PREFIX):])
            decode(algorithm, value)
            expected[algorithm] = value.strip()
    trailed = [normalize(n[len(HEADER_PREFIX):]) for n in _declared_trailers(headers)
               if n.startswith(HEADER_PREFIX)]
    named = set(expected) | set(trailed)
    if len(named) > 1:
        raise BadDigest("InvalidRequest", "Expecting a single x-amz-checksum- header. "
                        "Multiple checksum Types are not allowed.")
    sdk = headers.get(SDK_ALGORITHM_HEADER)
    if sdk is not None:
        sdk_name = normalize(sdk)
        if named and sdk_name not in named:
            raise BadDigest("InvalidRequest", f"Value for {SDK_ALGORITHM_HEADER} header is "
                            f"invalid: it says {sdk_name} but the checksum sent is "
                            f"{next(iter(named))}.")
        named.add(sdk_name)
    return sorted(named), expected


# --------------------------------------------------------------------------- reader

def _md5_digest(content_md5: str | None) -> bytes | None:
    if content_md5 is None:
        return None
    try:
        raw = base64.b64decode(content_md5.strip(), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 16:
        raise BadDigest("InvalidDigest", "The Content-MD5 you specified was invalid.")
    return raw


def _sha256_digest(content_sha256: str | None) -> bytes | None:
    if content_sha256 is None:
        return None
    try:
        raw = bytes.fromhex(content_sha256.strip())
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise BadDigest("InvalidArgument", "x-amz-content-sha256 must be a valid sha256 value.")
    return raw


def _by_algorithm(values: Mapping[str, str]) -> dict[str, str]:
    """Accept both ``CRC32`` and ``x-amz-checksum-crc32`` keys (trailers use the latter)."""
    out: dict[str, str] = {}
    for key, value in values.items():
        name = key.lower()
        if name.startswith(HEADER_PREFIX):
            name = name[len(HEADER_PREFIX):]
        out[name.upper()] = value
    return out


class VerifyingReader:
    """Pass bytes through while computing the named checksums (and MD5 when Content-MD5 is given).

    The store computes the ETag's MD5 itself, so MD5 is hashed here only to
    check a Content-MD5 header: hashing every upload twice would halve PUT speed.

    At EOF it checks, in order: the byte count against ``expected_size``
    (IncompleteBody), Content-MD5 (BadDigest; malformed -> InvalidDigest, raised at
    construction), ``content_sha256`` (a signed x-amz-content-sha256 hex digest ->
    XAmzContentSHA256Mismatch) and each expected checksum (BadDigest; malformed ->
    InvalidRequest).  After a clean EOF ``size`` and ``checksums``
    (algorithm -> base64) are valid.  Checksum algorithms that are in ``algorithms`` but
    have no expected value are computed and reported, not checked.
    """

    def __init__(self, source: Readable, *, content_md5: str | None,
                 algorithms: Iterable[str], expected: Callable[[], Mapping[str, str]],
                 expected_size: int | None, content_sha256: str | None = None) -> None:
        self._source = source
        self._md5_expected = _md5_digest(content_md5)
        self._sha256_expected = _sha256_digest(content_sha256)
        self._expected = expected
        self._expected_size = expected_size
        self._md5 = hashlib.md5() if self._md5_expected is not None else None
        self._hashers = {name: new_hasher(name) for name in dict.fromkeys(
            normalize(a) for a in algorithms)}
        if self._sha256_expected is not None and "SHA256" not in self._hashers:
            self._sha256 = hashlib.sha256()
        else:
            self._sha256 = None
        self._updates = [h.update for h in self._hashers.values()]
        if self._md5 is not None:
            self._updates.append(self._md5.update)
        if self._sha256 is not None:
            self._updates.append(self._sha256.update)
        self._done = False
        self.size = 0
        self.checksums: dict[str, str] = {}

    def read(self, n: int = -1) -> bytes:
        """Bytes from the source; integrity is checked when the source reports EOF."""
        if self._done:
            return b""
        data = self._source.read(n)
        if data:
            for update in self._updates:
                update(data)
            self.size += len(data)
            if self._expected_size is not None and self.size > self._expected_size:
                raise BadDigest("IncompleteBody", "The request body is longer than the "
                                "Content-Length HTTP header says.")
            return data
        if n != 0:
            self._finish()
        return b""

    def _finish(self) -> None:
        self._check_size()
        md5 = self._md5.digest() if self._md5 is not None else b""
        if self._md5_expected is not None and md5 != self._md5_expected:
            raise BadDigest("BadDigest", "The Content-MD5 you specified did not match what "
                            "we received.")
        digests = {name: h.digest() for name, h in self._hashers.items()}
        self._check_sha256(digests)
        self._check_expected(digests)
        self.checksums = {name: encode(d) for name, d in digests.items()}
        self._done = True

    def _check_size(self) -> None:
        if self._expected_size is not None and self.size != self._expected_size:
            raise BadDigest("IncompleteBody", "You did not provide the number of bytes "
                            "specified by the Content-Length HTTP header.")

    def _check_sha256(self, digests: Mapping[str, bytes]) -> None:
        if self._sha256_expected is None:
            return
        actual = self._sha256.digest() if self._sha256 is not None else digests["SHA256"]
        if actual != self._sha256_expected:
            raise BadDigest("XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' "
                            "header does not match what was computed.")

    def _check_expected(self, digests: Mapping[str, bytes]) -> None:
        for name, value in _by_algorithm(self._expected()).items():
            if name not in digests:
                continue
            if decode(name, value) != digests[name]:
                raise BadDigest("BadDigest", f"The {name} you specified did not match the "
                                "calculated checksum.")


# --------------------------------------------------------------------------- multipart

def composite(algorithm: str, part_digests: Sequence[bytes]) -> str:
    """COMPOSITE multipart checksum: the checksum of the concatenated part digests, "-N"."""
    hasher = new_hasher(algorithm)
    for digest in part_digests:
        hasher.update(digest)
    return f"{encode(hasher.digest())}-{len(part_digests)}"


def full_object(algorithm: str, parts: Sequence[tuple[bytes, int]]) -> str:
    """FULL_OBJECT multipart checksum for CRC algorithms from (part digest, part size).

    CRCs combine without rereading the data, which is how S3 offers whole-object CRCs for
    multipart uploads.
    """
    name = normalize(algorithm)
    if name not in _CRC_COMBINE:
        raise BadDigest("InvalidRequest", f"The FULL_OBJECT checksum type is not supported "
                        f"for {name}; use COMPOSITE.")
    combine = _CRC_COMBINE[name]
    value = 0
    for digest, size in parts:
        value = combine(value, int.from_bytes(digest, "big"), size)
    return encode(value.to_bytes(DIGEST_SIZES[name], "big"))
