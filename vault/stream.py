"""The sealed object format (``vault/FORMAT.md``): AES-256-GCM chunks under a per-object data key.

Two layouts share one chunk construction:

- **single** (one PUT): a 32-byte header, then 64 KiB plaintext chunks, the last one shorter (an
  empty object has one empty chunk). ``sealed = 32 + p + 16 * max(1, ceil(p / 65536))``.
- **part** (one multipart part, sealed on its own as it arrives, its plaintext size known up
  front): a 32-byte header, then exactly 256 chunks of ``max(1, ceil(p / 256))`` bytes (trailing
  chunks short or empty). Every part costs a fixed 4128 bytes, so a listing derives an N-part
  object's plaintext size from its sealed size and the ``-N`` of its ETag alone.

Chunk ``i`` of a header ``H`` (part number ``n``, 0 for single objects) is
``AES-256-GCM(dek, nonce = seed XOR (0^32 || u64be(i)), plaintext, aad = H || u32be(n) || u64be(i)
|| u8(final))``. The header sits in every chunk's AAD, the index and final flag bind order and
completeness, the part number binds a part to its place.

Readers are streaming with bounded memory (a couple of chunks): :class:`SealingReader` turns a
plaintext ``Readable`` into sealed bytes, :class:`OpeningReader` decrypts a plaintext range,
fetching only the ciphertext ranges whose chunks it needs. Neither ever returns a byte that has
not been authenticated; every failure is an :class:`IntegrityError`.

Both read their source in runs of whole chunks (up to ``RUN`` plaintext bytes) at once, and
iterate (``for piece in reader``) over whole chunks without copying, which is the fastest way
to stream them.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import IntegrityError, SealedSizeError, SizeMismatch, VaultError

__all__ = [
    "CHUNK", "FORMAT_VERSION", "HEADER", "KIND_PART", "KIND_SINGLE", "MAGIC", "MAX_PART_NUMBER",
    "PART_CHUNKS", "PART_OVERHEAD", "TAG", "IntegrityError", "Layout", "OpeningReader", "PartSpan",
    "Readable", "SealedSizeError", "SealingReader", "SizeMismatch", "VaultError",
    "multipart_plain_size", "new_data_key", "open_bytes", "open_metadata", "parse_header",
    "part_header_plain_size", "part_plain_size", "part_sealed_size", "plain_size", "seal_bytes",
    "seal_metadata", "sealed_size",
]

MAGIC = b"OMSL"
FORMAT_VERSION = 1
KIND_SINGLE = 1
KIND_PART = 2
HEADER = 32
TAG = 16
CHUNK_LOG2 = 16
CHUNK = 1 << CHUNK_LOG2
PART_CHUNKS = 256
PART_OVERHEAD = HEADER + TAG * PART_CHUNKS  # 4128
#: S3's largest part number; part numbers in headers are 1..MAX_PART_NUMBER.
MAX_PART_NUMBER = 10000
KEY_SIZE = 32

_SEALED_CHUNK = CHUNK + TAG
# magic, version, kind, chunk_log2, reserved, seed, 12 reserved bytes
_SINGLE_HEADER = struct.Struct(">4sBBBB12s12s")
# magic, version, kind, reserved u16, seed, part number, plaintext size
_PART_HEADER = struct.Struct(">4sBBH12sIQ")
_PART_NUMBER = struct.Struct(">I")
_INDEX = struct.Struct(">QB")  # chunk index, final flag
_ZERO12 = bytes(12)
#: Ciphertext a reader fetches and throws away rather than opening a second backend range.
MERGE_GAP = 256 * 1024
#: Plaintext an opening reader reads from the backend (and decrypts, and returns) at once:
#: whole chunks, at least one.
RUN = 1 << 20


class Readable(Protocol):
    """Anything with ``read(n)`` returning ``b""`` at end of stream."""

    def read(self, n: int = -1) -> bytes: ...


def new_data_key() -> bytes:
    """A fresh random 256-bit data key (one per object; a multipart upload's parts share one)."""
    return AESGCM.generate_key(bit_length=256)


# -- size arithmetic ------------------------------------------------------------------------


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def sealed_size(plain: int) -> int:
    """Sealed size of a single-layout object of ``plain`` bytes."""
    if plain < 0:
        raise ValueError("a plaintext size cannot be negative")
    return HEADER + plain + TAG * max(1, _ceil_div(plain, CHUNK))


def plain_size(sealed: int) -> int:
    """Plaintext size of a single-layout object of ``sealed`` bytes; :class:`SealedSizeError`
    (a ValueError) if no plaintext size seals to it."""
    body = sealed - HEADER
    if body < TAG:
        raise SealedSizeError(f"{sealed} bytes is too small to be a sealed object")
    chunks = max(1, _ceil_div(body, _SEALED_CHUNK))
    plain = body - TAG * chunks
    if sealed_size(plain) != sealed:  # the last chunk would be empty: no object seals to this
        raise SealedSizeError(f"{sealed} bytes is not the size of any sealed object (truncated?)")
    return plain


def part_sealed_size(plain: int) -> int:
    """Sealed size of a multipart part of ``plain`` bytes: always ``plain + 4128``."""
    if plain < 0:
        raise ValueError("a plaintext size cannot be negative")
    return plain + PART_OVERHEAD


def part_plain_size(sealed: int) -> int:
    """Plaintext size of a sealed part; :class:`SealedSizeError` if it is smaller than the
    fixed overhead."""
    if sealed < PART_OVERHEAD:
        raise SealedSizeError(f"{sealed} bytes is too small to be a sealed part")
    return sealed - PART_OVERHEAD


def multipart_plain_size(sealed_total: int, parts: int) -> int:
    """Plaintext size of a multipart object of ``parts`` parts (the N of its ``-N`` ETag)."""
    if parts < 1:
        raise ValueError("a multipart object has at least one part")
    plain = sealed_total - parts * PART_OVERHEAD
    if plain < 0:
        raise SealedSizeError(f"{sealed_total} bytes is too small for a sealed object of "
                              f"{parts} parts")
    return plain


# -- headers and chunk geometry ----------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    """A parsed sealed header (single object or part)."""

    raw: bytes
    kind: int
    seed: bytes
    part_number: int  # 0 for a single object
    plain_size: int | None  # known from a part header; None for a single object

    @property
    def chunk_size(self) -> int:
        if self.kind == KIND_SINGLE:
            return CHUNK
        return max(1, _ceil_div(self.plain_size or 0, PART_CHUNKS))


def parse_header(raw: bytes) -> Header:
    """Parse and validate a 32-byte header; :class:`IntegrityError` if it is not one this
    version writes. (Its bytes are authenticated only by the chunks, which all carry it in
    their associated data.)"""
    raw = bytes(raw)
    if len(raw) != HEADER:
        raise IntegrityError(f"sealed header is {len(raw)} bytes, expected {HEADER} (truncated?)")
    if raw[:4] != MAGIC:
        raise IntegrityError("not a sealed object: bad magic (stored without the gateway, "
                             "or damaged)")
    if raw[4] != FORMAT_VERSION:
        raise IntegrityError(f"sealed format version {raw[4]} is not supported (this build "
                             f"reads version {FORMAT_VERSION})")
    kind = raw[5]
    if kind == KIND_SINGLE:
        _, _, _, log2, reserved, seed, tail = _SINGLE_HEADER.unpack(raw)
        if log2 != CHUNK_LOG2:
            raise IntegrityError(f"unsupported chunk size 2**{log2} in a sealed header")
        if reserved or tail != _ZERO12:
            raise IntegrityError("sealed header has non-zero reserved bytes")
        return Header(raw, kind, seed, 0, None)
    if kind == KIND_PART:
        _, _, _, reserved, seed, part_number, size = _PART_HEADER.unpack(raw)
        if reserved:
            raise IntegrityError("sealed part header has non-zero reserved bytes")
        if not 1 <= part_number <= MAX_PART_NUMBER:
            raise IntegrityError(f"sealed part header has part number {part_number}, outside "
                                 f"1..{MAX_PART_NUMBER}")
        return Header(raw, kind, seed, part_number, size)
    raise IntegrityError(f"sealed header has unknown kind {kind}")


def part_header_plain_size(header: bytes) -> int:
    """The plaintext size a part header declares (to rebuild a multipart layout from the part
    headers alone). :class:`IntegrityError` if it is not a part header."""
    parsed = parse_header(header)
    if parsed.kind != KIND_PART:
        raise IntegrityError("expected a part header, found a single-object header")
    return parsed.plain_size or 0


class _Geometry:
    """Where chunk ``j`` of a span of ``plain`` bytes and chunk size ``size`` lies."""

    __slots__ = ("size", "count", "plain")

    def __init__(self, kind: int, plain: int) -> None:
        self.plain = plain
        if kind == KIND_SINGLE:
            self.size = CHUNK
            self.count = max(1, _ceil_div(plain, CHUNK))
        else:
            self.size = max(1, _ceil_div(plain, PART_CHUNKS))
            self.count = PART_CHUNKS

    def plain_start(self, j: int) -> int:
        return min(j * self.size, self.plain)

    def plain_end(self, j: int) -> int:
        return min((j + 1) * self.size, self.plain)

    def cipher_start(self, j: int) -> int:  # relative to the span
        return HEADER + self.plain_start(j) + TAG * j

    def cipher_end(self, j: int) -> int:
        return HEADER + self.plain_end(j) + TAG * (j + 1)

    def index(self, offset: int) -> int:
        """The chunk holding plaintext ``offset`` (< plain)."""
        return offset // self.size


# -- layouts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartSpan:
    """One independently sealed unit of an object: the whole single object, or one part."""

    kind: int
    cipher_start: int
    cipher_size: int
    plain_start: int
    plain_size: int
    #: The part number its header must carry, when the caller knows it (None: only checked to be
    #: at least ``position + 1`` and strictly increasing); 0 for a single object.
    part_number: int | None
    position: int

    @property
    def cipher_end(self) -> int:
        return self.cipher_start + self.cipher_size

    @property
    def plain_end(self) -> int:
        return self.plain_start + self.plain_size


@dataclass
class Layout:
    """How an object's plaintext offsets map to its ciphertext: one span for a single object,
    one per part for a multipart object, in order."""

    parts: list[PartSpan]
    _starts: list[int] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("a layout has at least one span")
        self._starts = [p.plain_start for p in self.parts]

    @classmethod
    def single(cls, sealed_size: int) -> Layout:
        """The layout of a single-layout object of ``sealed_size`` bytes (SealedSizeError if no
        object seals to that size)."""
        return cls([PartSpan(KIND_SINGLE, 0, sealed_size, 0, plain_size(sealed_size), 0, 0)])

    @classmethod
    def multipart(cls, part_sealed_sizes: list[int],
                  part_numbers: list[int] | None = None) -> Layout:
        """The layout of a multipart object from its parts' sealed sizes, in order. Give the
        part numbers when known: ranged reads then also check each part sits where it belongs
        (a full read always checks that they strictly increase)."""
        if not part_sealed_sizes:
            raise ValueError("a multipart object has at least one part")
        if part_numbers is not None:
            if len(part_numbers) != len(part_sealed_sizes):
                raise ValueError("part_numbers and part_sealed_sizes differ in length")
            pairs = zip(part_numbers, part_numbers[1:], strict=False)
            if part_numbers[0] < 1 or any(b <= a for a, b in pairs):
                raise ValueError("part numbers must be positive and strictly increasing")
        spans, cipher, plain = [], 0, 0
        for i, size in enumerate(part_sealed_sizes):
            p = part_plain_size(size)
            number = part_numbers[i] if part_numbers is not None else None
            spans.append(PartSpan(KIND_PART, cipher, size, plain, p, number, i))
            cipher += size
            plain += p
        return cls(spans)

    @property
    def plain_size(self) -> int:
        return self.parts[-1].plain_end

    @property
    def sealed_size(self) -> int:
        return self.parts[-1].cipher_end

    def touched(self, start: int, end: int) -> list[PartSpan]:
        """The spans a read of plaintext ``[start, end)`` must open. A read that reaches a span's
        end also opens its final chunk, so reading to the end verifies completeness; an empty
        span inside the range is opened too."""
        if start == end and self.plain_size:
            return []
        first = max(0, bisect.bisect_right(self._starts, start) - 1)
        while first > 0 and self.parts[first - 1].plain_end >= start and \
                self.parts[first - 1].plain_size == 0:
            first -= 1  # empty spans sitting exactly at start
        out = []
        for span in self.parts[first:]:
            if span.plain_start > end:
                break
            if span.plain_size == 0:
                if start <= span.plain_start <= end:
                    out.append(span)
            elif span.plain_start < end and start < span.plain_end:
                out.append(span)
        return out


# -- sealing -------------------------------------------------------------------------------------


def _read_full(source: Readable, n: int) -> bytes:
    """Read exactly ``n`` bytes unless the source ends first (bytes-like, uncopied when the
    source returned them in one piece)."""
    data = source.read(n)
    if len(data) == n or not data:
        return data
    pieces, got = [data], len(data)
    while got < n:
        more = source.read(n - got)
        if not more:
            break
        pieces.append(more)
        got += len(more)
    return b"".join(pieces)


class _PieceReader:
    """A file-like ``read(n)`` over a generator of byte pieces (exact-size reads, bounded
    buffering: at most one pending piece)."""

    def __init__(self) -> None:
        self._pending = b""
        self._pos = 0
        self._gen: Iterator[bytes] | None = None
        self._done = False
        self._error: BaseException | None = None

    def _pieces(self) -> Iterator[bytes]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _next_piece(self) -> bytes | None:
        if self._error is not None:  # a failed stream keeps failing; it never looks finished
            raise self._error
        if self._done:
            return None
        if self._gen is None:
            self._gen = self._pieces()
        try:
            return next(self._gen)
        except StopIteration:
            self._done = True
            return None
        except BaseException as exc:  # the generator is dead: never let it look finished
            self._error = exc
            raise

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        """Exactly ``n`` bytes (fewer only at the end; ``b""`` at the end). Gathering them costs
        a copy; :meth:`read1` and iteration avoid it."""
        if n is None or n < 0:
            return b"".join(self)
        out: list[bytes | memoryview] = []
        need = n
        while need > 0:
            avail = len(self._pending) - self._pos
            if avail <= 0:
                piece = self._next_piece()
                if piece is None:
                    break
                self._pending, self._pos = piece, 0
                continue
            if self._pos == 0 and avail <= need:
                out.append(self._pending)
                self._pending = b""
                need -= avail
            else:
                take = min(avail, need)
                out.append(memoryview(self._pending)[self._pos:self._pos + take])
                self._pos += take
                need -= take
        if len(out) == 1:
            return bytes(out[0]) if isinstance(out[0], memoryview) else out[0]
        return b"".join(out)

    def read1(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes, possibly fewer (``b""`` only at the end): a whole chunk, uncopied,
        whenever one fits. The fastest way to drain the reader with ``read``-style loops."""
        while len(self._pending) - self._pos <= 0:
            piece = self._next_piece()
            if piece is None:
                return b""
            self._pending, self._pos = piece, 0
        if n is None or n < 0:
            n = len(self._pending)
        if self._pos == 0 and len(self._pending) <= n:
            piece, self._pending = self._pending, b""
            return piece
        take = min(len(self._pending) - self._pos, n)
        out = self._pending[self._pos:self._pos + take]
        self._pos += take
        return out

    def __iter__(self) -> Iterator[bytes]:
        """The remaining bytes as whole pieces (header, then one piece per chunk), uncopied."""
        if self._pos < len(self._pending):
            rest = self._pending[self._pos:]
            self._pending, self._pos = b"", 0
            yield rest
        while (piece := self._next_piece()) is not None:
            if piece:
                yield piece


class SealingReader(_PieceReader):
    """Seals a plaintext ``Readable`` as it is read: ``read(n)`` returns sealed bytes.

    ``part_number`` given: the part layout (``plain_size`` required). Otherwise the single
    layout (``plain_size`` optional, checked when given). A source that yields more or fewer
    bytes than ``plain_size`` raises :class:`SizeMismatch` before the final chunk is produced,
    so a short body can never become a complete-looking sealed object.
    """

    def __init__(self, dek: bytes, source: Readable, *, part_number: int | None = None,
                 plain_size: int | None = None) -> None:
        super().__init__()
        if len(dek) != KEY_SIZE:
            raise ValueError("a data key is 32 bytes")
        if part_number is not None:
            if plain_size is None:
                raise ValueError("a part's plaintext size must be known before it is sealed")
            if not 1 <= part_number <= MAX_PART_NUMBER:
                raise ValueError(f"part numbers are 1..{MAX_PART_NUMBER}")
        if plain_size is not None and plain_size < 0:
            raise ValueError("a plaintext size cannot be negative")
        self._aead = AESGCM(dek)
        self._source = source
        self.part_number = part_number
        self.plain_size = plain_size
        self._read_total = 0

    @property
    def sealed_size(self) -> int | None:
        """The sealed size, when the plaintext size is known up front."""
        if self.plain_size is None:
            return None
        if self.part_number is not None:
            return part_sealed_size(self.plain_size)
        return sealed_size(self.plain_size)

    def _pull(self, n: int) -> bytes:
        data = _read_full(self._source, n)
        self._read_total += len(data)
        if self.plain_size is not None and self._read_total > self.plain_size:
            raise SizeMismatch(f"the body is longer than its declared {self.plain_size} bytes")
        return data

    def _pieces(self) -> Iterator[bytes]:
        if self.part_number is None:
            return self._seal_single()
        return self._seal_part()

    def _seal_single(self) -> Iterator[bytes]:
        """Runs of ``RUN`` plaintext bytes (the last shorter), each read from the source at
        once. The run after is read before a run is sealed: only it tells whether the run
        holds the final chunk."""
        seed = os.urandom(12)
        header = _SINGLE_HEADER.pack(MAGIC, FORMAT_VERSION, KIND_SINGLE, CHUNK_LOG2, 0, seed, _ZERO12)
        yield header
        sealer = _RunSealer(self._aead, header, 0, seed)
        current = self._pull(RUN)
        i = 0
        while True:
            following = self._pull(RUN) if len(current) == RUN else b""
            final = not following
            if final and self.plain_size is not None and self._read_total != self.plain_size:
                raise SizeMismatch(f"the body ended after {self._read_total} of its declared "
                                   f"{self.plain_size} bytes")
            count = max(1, _ceil_div(len(current), CHUNK))
            yield from sealer.seal(current, i, CHUNK, count, i + count - 1 if final else -1)
            if final:
                return
            current = following
            i += count

    def _seal_part(self) -> Iterator[bytes]:
        """The 256 chunks in runs of up to ``RUN`` plaintext bytes, each read at once."""
        assert self.part_number is not None and self.plain_size is not None
        p = self.plain_size
        seed = os.urandom(12)
        header = _PART_HEADER.pack(MAGIC, FORMAT_VERSION, KIND_PART, 0, seed, self.part_number, p)
        yield header
        sealer = _RunSealer(self._aead, header, self.part_number, seed)
        geo = _Geometry(KIND_PART, p)
        per_run = max(1, RUN // geo.size)
        last = PART_CHUNKS - 1
        for j in range(0, PART_CHUNKS, per_run):
            stop = min(PART_CHUNKS, j + per_run)
            want = geo.plain_end(stop - 1) - geo.plain_start(j)
            data = self._pull(want) if want else b""
            if len(data) < want:
                raise SizeMismatch(f"the part body ended after {self._read_total} of its "
                                   f"declared {p} bytes")
            if stop == PART_CHUNKS and self._source.read(1):
                raise SizeMismatch(f"the part body is longer than its declared {p} bytes")
            yield from sealer.seal(data, j, geo.size, stop - j, last)


class _RunSealer:
    """Seals runs of consecutive chunks of one object or part, read from the source at once
    (one read per run rather than per chunk); each sealed chunk stays its own piece."""

    def __init__(self, aead: AESGCM, header: bytes, part_number: int, seed: bytes) -> None:
        self._encrypt = aead.encrypt
        self._prefix = header + _PART_NUMBER.pack(part_number)
        self._seed = int.from_bytes(seed, "big")

    def seal(self, data: bytes, j0: int, size: int, count: int, last: int) -> list[bytes]:
        """Chunks ``j0 .. j0 + count - 1`` of ``size`` plaintext bytes each (the run's last
        one may be shorter or empty), cut from ``data``; chunk ``last`` is the final one."""
        encrypt, pack, seed, prefix = self._encrypt, _INDEX.pack, self._seed, self._prefix
        view = memoryview(data)
        return [encrypt((seed ^ j).to_bytes(12, "big"), view[(j - j0) * size:(j - j0 + 1) * size],
                        prefix + pack(j, j == last)) for j in range(j0, j0 + count)]


# -- opening -------------------------------------------------------------------------------------


class _RangeSource:
    """Reads ciphertext at increasing offsets through as few backend ranges as possible."""

    def __init__(self, fetch: Callable[[int, int], Readable], extents: list[tuple[int, int]]):
        self._fetch = fetch
        self._extents = extents
        self._next = 0
        self._stream: Readable | None = None
        self._pos = 0
        self._end = 0
        self.fetches = 0

    def read_at(self, offset: int, length: int) -> bytes:
        if offset == self._pos and offset + length <= self._end:  # the common, sequential case
            data = self._stream.read(length)  # type: ignore[union-attr]
            if len(data) == length:
                self._pos = offset + length
                return data
            if not data:
                raise IntegrityError("the sealed object ended early (truncated)")
            rest = _read_full(self._stream, length - len(data))  # type: ignore[arg-type]
            if len(rest) < length - len(data):
                raise IntegrityError("the sealed object ended early (truncated)")
            self._pos = offset + length
            return b"".join((data, rest))
        if self._stream is None or offset < self._pos or offset + length > self._end:
            self.close()
            while True:
                if self._next >= len(self._extents):  # pragma: no cover - plan and reads agree
                    raise IntegrityError("internal error: read outside the planned ranges")
                start, end = self._extents[self._next]
                self._next += 1
                if start <= offset and offset + length <= end:
                    break
            self._stream = self._fetch(start, end)
            self.fetches += 1
            self._pos, self._end = start, end
        skip = offset - self._pos
        while skip > 0:
            dropped = self._stream.read(min(skip, 1 << 20))
            if not dropped:
                raise IntegrityError("the sealed object ended early (truncated)")
            skip -= len(dropped)
        data = _read_full(self._stream, length)
        if len(data) < length:
            raise IntegrityError("the sealed object ended early (truncated)")
        self._pos = offset + length
        return data

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            close = getattr(stream, "close", None)
            if close is not None:
                close()


class OpeningReader(_PieceReader):
    """Decrypts plaintext ``[start, end)`` of a sealed object, fetching only the chunks it needs.

    ``fetch(cipher_start, cipher_end)`` opens a ciphertext range ``[cipher_start, cipher_end)``
    on the backend; the reader opens as few as it can (a header and the chunks after it in one
    range when they are close, see ``merge_gap``). Every chunk is authenticated before any of
    its bytes is returned; a read that reaches the end of the object (or of a part) also
    authenticates the final chunk, so truncation is always detected by a full read.
    """

    def __init__(self, dek: bytes, fetch: Callable[[int, int], Readable], layout: Layout,
                 start: int, end: int, *, merge_gap: int = MERGE_GAP) -> None:
        super().__init__()
        if len(dek) != KEY_SIZE:
            raise ValueError("a data key is 32 bytes")
        if not 0 <= start <= end <= layout.plain_size:
            raise ValueError(f"range [{start}, {end}) is outside the object's "
                             f"{layout.plain_size} bytes")
        self._aead = AESGCM(dek)
        self.layout = layout
        self.start, self.end = start, end
        self._plan = []  # (span, first chunk, last chunk, lo, hi)
        extents: list[tuple[int, int]] = []
        for span in layout.touched(start, end):
            geo = _Geometry(span.kind, span.plain_size)
            lo = max(start, span.plain_start) - span.plain_start
            hi = min(end, span.plain_end) - span.plain_start
            # lo == plain_size only for an empty span, which is opened whole
            j0 = geo.index(lo) if lo < span.plain_size else 0
            j1 = geo.count - 1 if hi == span.plain_size else geo.index(hi - 1)
            self._plan.append((span, geo, j0, j1, lo, hi))
            base = span.cipher_start
            _add_extent(extents, base, base + HEADER, merge_gap)
            _add_extent(extents, base + geo.cipher_start(j0), base + geo.cipher_end(j1), merge_gap)
        self._source = _RangeSource(fetch, extents)

    @property
    def fetches(self) -> int:
        """How many backend ranges have been opened so far."""
        return self._source.fetches

    def _pieces(self) -> Iterator[bytes]:
        try:
            yield from self._open()
        finally:
            self._source.close()

    def _open(self) -> Iterator[bytes]:
        """Each span's header, checked, then its chunks in runs of up to ``RUN`` plaintext
        bytes, each read from the backend at once. The first run of a reader is only
        ``CHUNK`` bytes' worth (at least a chunk): what opening an object primes, so a
        consumer reading ``RUN`` bytes at a time after that reads whole runs."""
        previous = 0
        first_run = True
        for span, geo, j0, j1, lo, hi in self._plan:
            header = self._header(span, previous)
            previous = header.part_number
            where = "the object's" if span.kind == KIND_SINGLE else f"part {span.position + 1}'s"
            opener = _RunOpener(self._aead, header, geo, lo, hi, where)
            per_run = max(1, RUN // geo.size)
            j = j0
            while j <= j1:
                stop = min(j1 + 1, j + (max(1, CHUNK // geo.size) if first_run else per_run))
                first_run = False
                offset = span.cipher_start + geo.cipher_start(j)
                sealed = self._source.read_at(offset, geo.cipher_end(stop - 1) - geo.cipher_start(j))
                yield from opener.open(sealed, j, stop)
                j = stop

    def _header(self, span: PartSpan, previous: int) -> Header:
        """A span's header, read and checked against where the span sits in the layout."""
        where = "the object's" if span.kind == KIND_SINGLE else f"part {span.position + 1}'s"
        header = parse_header(self._source.read_at(span.cipher_start, HEADER))
        if header.kind != span.kind:
            raise IntegrityError(f"{where} header is of another kind (a part where a single "
                                 "object belongs, or the reverse)")
        if span.kind == KIND_PART:
            number = header.part_number
            if header.plain_size != span.plain_size:
                raise IntegrityError(f"{where} header declares {header.plain_size} bytes "
                                     f"but the part holds {span.plain_size}")
            if span.part_number is not None and number != span.part_number:
                raise IntegrityError(f"{where} header carries part number {number}, "
                                     f"expected {span.part_number} (parts moved?)")
            if number <= previous or number < span.position + 1:
                raise IntegrityError(f"{where} header carries part number {number}, out of "
                                     "order (parts moved or duplicated)")
        return header

    def close(self) -> None:
        self._done = True
        gen, self._gen = self._gen, None
        if gen is not None:
            gen.close()
        self._source.close()
        self._pending, self._pos = b"", 0

    def __enter__(self) -> OpeningReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RunOpener:
    """Opens runs of consecutive chunks of one span, read from the backend in one piece:
    every chunk authenticated, its plaintext cut to ``[lo, hi)`` of the span. Reading a run
    at a time (rather than a chunk) saves a backend read and the Python around it per chunk;
    the chunks stay separate pieces, since joining them would cost a copy that a consumer
    iterating needs not make and a consumer reading makes anyway."""

    def __init__(self, aead: AESGCM, header: Header, geo: _Geometry, lo: int, hi: int,
                 where: str) -> None:
        self._decrypt = aead.decrypt
        self._prefix = header.raw + _PART_NUMBER.pack(header.part_number)
        self._seed = int.from_bytes(header.seed, "big")
        self._geo, self._lo, self._hi, self._where = geo, lo, hi, where

    def open(self, sealed: bytes, j0: int, stop_j: int) -> list[bytes]:
        """The plaintext of chunks ``j0 .. stop_j - 1`` (``sealed``: exactly their ciphertext),
        non-empty pieces; IntegrityError for the first that fails, so nothing of a failing run
        is returned."""
        decrypt, pack, seed, prefix = self._decrypt, _INDEX.pack, self._seed, self._prefix
        geo, lo, hi = self._geo, self._lo, self._hi
        last, size, total = geo.count - 1, geo.size, geo.plain
        view = memoryview(sealed)
        pieces = []
        first = geo.plain_start(j0)  # plaintext offset of chunk j within the span
        at = 0
        for j in range(j0, stop_j):
            stop = first + size
            if stop > total:
                stop = total
            length = stop - first + TAG
            try:
                plain = decrypt((seed ^ j).to_bytes(12, "big"), view[at:at + length],
                                prefix + pack(j, j == last))
            except InvalidTag:
                raise IntegrityError(
                    f"{self._where} chunk {j} failed authentication: the object was damaged, "
                    "truncated, reordered or swapped on the backend, or the data key is "
                    "not its own") from None
            if lo <= first and hi >= stop:
                if plain:
                    pieces.append(plain)
            else:
                a = lo - first if lo > first else 0
                if hi - first > a:
                    pieces.append(plain[a:hi - first])
            at += length
            first = stop
        return pieces


def _add_extent(extents: list[tuple[int, int]], start: int, end: int, gap: int) -> None:
    if extents and start - extents[-1][1] <= gap:
        extents[-1] = (extents[-1][0], max(extents[-1][1], end))
    else:
        extents.append((start, end))


# -- whole objects in memory ---------------------------------------------------------------------


class _BytesSource:
    def __init__(self, data: bytes) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._pos + n)
        data = bytes(self._view[self._pos:end])
        self._pos = end
        return data


def seal_bytes(dek: bytes, data: bytes, *, part_number: int | None = None) -> bytes:
    """Seal a small object held in memory (single layout, or a part when ``part_number``)."""
    size = len(data) if part_number is not None else None
    return SealingReader(dek, _BytesSource(data), part_number=part_number, plain_size=size).read()


# -- sealed metadata ------------------------------------------------------------------------------

_META_VERSION = 1
_META_INFO = b"orgmem/metadata/v1"


def _metadata_aead(dek: bytes) -> AESGCM:
    if len(dek) != KEY_SIZE:
        raise ValueError("a data key is 32 bytes")
    return AESGCM(HKDF(algorithm=hashes.SHA256(), length=KEY_SIZE, salt=None,
                       info=_META_INFO).derive(dek))


def seal_metadata(dek: bytes, data: bytes, aad: bytes = b"") -> str:
    """Seal an object's client-supplied metadata (content type, user metadata, plaintext
    checksums...) under a key derived from its data key: ``base64url(u8 version 1 | 12-byte
    random nonce | ciphertext | tag)``, ASCII for a metadata value. Copies that keep the data key
    keep this record as it is."""
    nonce = os.urandom(12)
    raw = bytes([_META_VERSION]) + nonce + _metadata_aead(dek).encrypt(nonce, bytes(data), aad)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def open_metadata(dek: bytes, text: str, aad: bytes = b"") -> bytes:
    """Open :func:`seal_metadata`'s record; :class:`IntegrityError` on anything else."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError, TypeError):
        raise IntegrityError("sealed metadata is not base64url") from None
    if len(raw) < 1 + 12 + TAG or raw[0] != _META_VERSION:
        raise IntegrityError("sealed metadata is truncated or of an unknown version")
    try:
        return _metadata_aead(dek).decrypt(raw[1:13], raw[13:], aad)
    except InvalidTag:
        raise IntegrityError("sealed metadata failed authentication: damaged, swapped, or "
                             "not sealed under this object's data key") from None


def open_bytes(dek: bytes, sealed: bytes, layout: Layout | None = None) -> bytes:
    """Open a whole sealed object held in memory (single layout unless ``layout`` says)."""
    layout = layout or Layout.single(len(sealed))
    view = memoryview(sealed)
    return OpeningReader(dek, lambda a, b: _BytesSource(view[a:b]), layout, 0,
                         layout.plain_size).read()
