"""The sealed object format (vault/stream.py, vault/FORMAT.md): sizes, round trips at every edge,
ranged opens, and every kind of tampering, which must raise IntegrityError and never return
wrong data. Throughput against raw AES-GCM is printed (run with -s); nothing is timed-asserted."""

from __future__ import annotations

import io
import os
import random
import struct
import time

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from vault import stream
from vault.stream import (
    CHUNK,
    HEADER,
    PART_OVERHEAD,
    IntegrityError,
    Layout,
    OpeningReader,
    SealingReader,
    SizeMismatch,
)

MiB = 1 << 20
SINGLE_SIZES = [0, 1, 15, 16, 17, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 5, MiB + 17]
PART_SIZES = [0, 1, 255, 256, 257, 5 * MiB]


class Fetcher:
    """A backend holding sealed bytes; records every ciphertext range opened."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls: list[tuple[int, int]] = []

    def __call__(self, start: int, end: int) -> io.BytesIO:
        assert 0 <= start <= end <= len(self.data), (start, end, len(self.data))
        self.calls.append((start, end))
        return io.BytesIO(self.data[start:end])

    @property
    def fetched(self) -> int:
        return sum(e - s for s, e in self.calls)


class Trickle:
    """A source that returns short reads of random length, like a socket."""

    def __init__(self, data: bytes, seed: int = 1) -> None:
        self.buf = io.BytesIO(data)
        self.rng = random.Random(seed)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return self.buf.read()
        return self.buf.read(self.rng.randint(1, max(1, n)))


def seal(dek: bytes, data: bytes, part_number: int | None = None, read_size: int = -1) -> bytes:
    size = len(data) if part_number is not None else None
    reader = SealingReader(dek, io.BytesIO(data), part_number=part_number, plain_size=size)
    if read_size < 0:
        return reader.read()
    out = []
    while chunk := reader.read(read_size):
        assert len(chunk) <= read_size
        out.append(chunk)
    return b"".join(out)


def open_all(dek: bytes, sealed: bytes, layout: Layout | None = None, start: int = 0,
             end: int | None = None, read_size: int = -1) -> bytes:
    layout = layout or Layout.single(len(sealed))
    end = layout.plain_size if end is None else end
    reader = OpeningReader(dek, Fetcher(sealed), layout, start, end)
    if read_size < 0:
        return reader.read()
    out = []
    while chunk := reader.read(read_size):
        out.append(chunk)
    return b"".join(out)


def multipart(dek: bytes, sizes: list[int], numbers: list[int] | None = None):
    numbers = numbers or list(range(1, len(sizes) + 1))
    plains = [os.urandom(s) for s in sizes]
    sealed = [seal(dek, p, n) for p, n in zip(plains, numbers)]
    return plains, sealed, Layout.multipart([len(s) for s in sealed], numbers)


@pytest.fixture
def dek() -> bytes:
    return stream.new_data_key()


def test_vault_never_imports_gateway():
    import subprocess
    import sys

    code = ("import sys, vault, vault.keys, vault.stream, vault.errors; "
            "bad = [m for m in sys.modules if m == 'gateway' or m.startswith('gateway.')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- sizes -----------------------------------------------------------------------------------


def test_size_arithmetic_is_exact_and_invertible():
    for p in list(range(0, 3 * CHUNK + 40, 997)) + SINGLE_SIZES + [5 * 1024**3, 5 * 1024**4]:
        s = stream.sealed_size(p)
        assert s == 32 + p + 16 * max(1, -(-p // 65536))
        assert stream.plain_size(s) == p
        assert stream.part_sealed_size(p) == p + 4128
        assert stream.part_plain_size(p + 4128) == p
    assert PART_OVERHEAD == 32 + 16 * 256 == 4128
    assert stream.multipart_plain_size(3 * 4128 + 1000, 3) == 1000


def test_impossible_sizes_raise_value_error():
    valid = {stream.sealed_size(p) for p in range(0, 3 * CHUNK + 100)}
    for s in list(range(0, 48)) + [32 + CHUNK + 16 + 16, 32 + 2 * (CHUNK + 16) + 16]:
        assert s not in valid
        with pytest.raises(ValueError):
            stream.plain_size(s)
        with pytest.raises(IntegrityError):  # the same error is also an integrity failure
            stream.plain_size(s)
    # every size from 48 up is either valid or refused, never silently mapped
    for s in range(48, 3 * (CHUNK + 16) + 100, 7):
        try:
            p = stream.plain_size(s)
        except ValueError:
            assert s not in valid
        else:
            assert stream.sealed_size(p) == s
    with pytest.raises(ValueError):
        stream.part_plain_size(4127)
    with pytest.raises(ValueError):
        stream.multipart_plain_size(2 * 4128 - 1, 2)
    with pytest.raises(ValueError):
        stream.multipart_plain_size(10_000, 0)


# -- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SINGLE_SIZES)
def test_single_round_trip(dek, size):
    data = os.urandom(size)
    sealed = seal(dek, data)
    assert len(sealed) == stream.sealed_size(size)
    assert stream.plain_size(len(sealed)) == size
    assert open_all(dek, sealed) == data
    assert len(data) < 16 or data[:16] not in sealed  # no plaintext leaks through


@pytest.mark.parametrize("read_size", [1, 7, 32, 4096, CHUNK + 16, CHUNK + 48, MiB])
def test_any_read_size_gives_the_same_stream(dek, read_size):
    data = os.urandom(3 * CHUNK + 123)
    sealed = seal(dek, data, read_size=read_size)
    assert len(sealed) == stream.sealed_size(len(data))
    assert open_all(dek, sealed, read_size=read_size) == data


def test_short_reads_from_the_source_and_the_backend(dek):
    data = os.urandom(5 * CHUNK + 99)
    sealed = SealingReader(dek, Trickle(data), plain_size=len(data)).read()
    layout = Layout.single(len(sealed))

    def trickling_fetch(a, b):
        return Trickle(sealed[a:b], seed=a)

    assert OpeningReader(dek, trickling_fetch, layout, 0, len(data)).read() == data
    part = SealingReader(dek, Trickle(data), part_number=9, plain_size=len(data)).read()
    assert open_all(dek, part, Layout.multipart([len(part)])) == data


def test_iterating_yields_whole_chunks(dek):
    data = os.urandom(2 * CHUNK + 5)
    pieces = list(SealingReader(dek, io.BytesIO(data)))
    assert [len(p) for p in pieces] == [HEADER, CHUNK + 16, CHUNK + 16, 5 + 16]
    sealed = b"".join(pieces)
    opened = list(OpeningReader(dek, Fetcher(sealed), Layout.single(len(sealed)), 0, len(data)))
    assert [len(p) for p in opened] == [CHUNK, CHUNK, 5]
    # a partial read, then iteration, continues where read stopped
    reader = SealingReader(dek, io.BytesIO(data))
    head = reader.read(10)
    rest = b"".join(reader)
    assert open_all(dek, head + rest) == data


class Counting:
    """A source or backend stream that counts its reads."""

    def __init__(self, data: bytes) -> None:
        self.file, self.reads = io.BytesIO(data), []

    def read(self, n: int = -1) -> bytes:
        self.reads.append(n)
        return self.file.read(n)


def test_sources_and_backends_are_read_a_run_at_a_time(dek):
    """A read per run of chunks (up to stream.RUN plaintext bytes), not per chunk: a backend
    read, and the Python around it, is dearer than the chunk's decryption."""
    data = os.urandom(3 * stream.RUN + 5)
    source = Counting(data)
    sealed = SealingReader(dek, source).read()
    assert len(source.reads) <= 5 and max(source.reads) == stream.RUN
    streams = []

    def fetch(a, b):
        streams.append(Counting(sealed[a:b]))
        return streams[-1]

    assert OpeningReader(dek, fetch, Layout.single(len(sealed)), 0, len(data)).read() == data
    assert len(streams) == 1 and len(streams[0].reads) <= 1 + 1 + 3 + 1  # header, chunk 0, runs
    source = Counting(data)
    part = SealingReader(dek, source, part_number=2, plain_size=len(data)).read()
    assert len(source.reads) <= 256 // (stream.RUN // -(-len(data) // 256)) + 2
    assert open_all(dek, part, Layout.multipart([len(part)])) == data


@pytest.mark.parametrize("size", PART_SIZES)
def test_part_round_trip(dek, size):
    data = os.urandom(size)
    sealed = seal(dek, data, part_number=7)
    assert len(sealed) == size + PART_OVERHEAD
    assert stream.part_plain_size(len(sealed)) == size
    layout = Layout.multipart([len(sealed)], [7])
    assert open_all(dek, sealed, layout) == data
    assert open_all(dek, sealed, Layout.multipart([len(sealed)])) == data
    assert stream.part_header_plain_size(sealed[:HEADER]) == size


def test_multipart_round_trip_and_listing_size(dek):
    sizes = [5 * MiB, 257, 0, 5 * MiB + 3, 1]
    plains, sealed, layout = multipart(dek, sizes, [1, 2, 4, 9, 10])
    blob = b"".join(sealed)
    assert layout.plain_size == sum(sizes)
    assert stream.multipart_plain_size(len(blob), len(sizes)) == sum(sizes)
    assert open_all(dek, blob, layout, read_size=300_001) == b"".join(plains)
    # without the part numbers, a full read still opens (and checks their order)
    unnumbered = Layout.multipart([len(s) for s in sealed])
    assert open_all(dek, blob, unnumbered) == b"".join(plains)


def test_seal_and_open_bytes(dek):
    for size in (0, 1, CHUNK + 1):
        data = os.urandom(size)
        assert stream.open_bytes(dek, stream.seal_bytes(dek, data)) == data
        part = stream.seal_bytes(dek, data, part_number=3)
        assert stream.open_bytes(dek, part, Layout.multipart([len(part)])) == data


def test_sealed_metadata(dek):
    meta = b'{"content-type": "text/plain", "x-amz-meta-owner": "marker-7f3a", "crc32c": "AAAA"}'
    text = stream.seal_metadata(dek, meta)
    assert text.isascii() and b"marker" not in text.encode() and "marker" not in text
    assert stream.open_metadata(dek, text) == meta
    assert stream.seal_metadata(dek, meta) != text  # a fresh nonce each time
    assert stream.open_metadata(dek, stream.seal_metadata(dek, meta, b"x"), b"x") == meta
    for bad in (stream.seal_metadata(stream.new_data_key(), meta), text[:-2], "", "!!", text[:10]):
        with pytest.raises(IntegrityError):
            stream.open_metadata(dek, bad)
    with pytest.raises(IntegrityError):
        stream.open_metadata(dek, stream.seal_metadata(dek, meta, b"x"), b"y")


def test_fresh_seed_per_object_and_part(dek):
    data = b"same plaintext" * 100
    a, b = seal(dek, data), seal(dek, data)
    assert a[8:20] != b[8:20] and a[HEADER:] != b[HEADER:]
    p, q = seal(dek, data, 1), seal(dek, data, 1)  # a part uploaded twice
    assert p[8:20] != q[8:20] and p[HEADER:] != q[HEADER:]


def test_format_matches_the_document(dek):
    """Decrypt with nothing but AESGCM and FORMAT.md's description."""
    data = os.urandom(CHUNK + 10)
    sealed = seal(dek, data)
    header = sealed[:32]
    assert header[:4] == b"OMSL" and header[4] == 1 and header[5] == 1 and header[6] == 16
    assert header[7] == 0 and header[20:32] == bytes(12)
    seed = int.from_bytes(header[8:20], "big")
    aead = AESGCM(dek)
    out = b""
    offsets = [(0, 32, CHUNK + 16, 0), (1, 32 + CHUNK + 16, 10 + 16, 1)]
    for i, off, n, final in offsets:
        nonce = (seed ^ i).to_bytes(12, "big")
        assert nonce[:4] == header[8:12]  # the counter only touches the low 8 bytes
        aad = header + struct.pack(">I", 0) + struct.pack(">Q", i) + bytes([final])
        out += aead.decrypt(nonce, sealed[off:off + n], aad)
    assert out == data

    p = 1000
    data = os.urandom(p)
    part = seal(dek, data, part_number=513)
    h = part[:32]
    assert h[:4] == b"OMSL" and h[4] == 1 and h[5] == 2 and h[6:8] == b"\0\0"
    assert struct.unpack(">I", h[20:24])[0] == 513 and struct.unpack(">Q", h[24:32])[0] == p
    s = -(-p // 256)  # 4-byte chunks: 250 full ones, then 6 empty
    seed = int.from_bytes(h[8:20], "big")
    out, off = b"", 32
    for j in range(256):
        n = max(0, min(s, p - j * s))
        aad = h + struct.pack(">I", 513) + struct.pack(">QB", j, j == 255)
        out += aead.decrypt((seed ^ j).to_bytes(12, "big"), part[off:off + n + 16], aad)
        off += n + 16
    assert out == data and off == len(part)


# -- ranges ----------------------------------------------------------------------------------


def test_random_ranges_of_a_single_object(dek):
    data = os.urandom(7 * CHUNK + 1234)
    sealed = seal(dek, data)
    layout = Layout.single(len(sealed))
    rng = random.Random(4)
    edges = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, len(data) - 1, len(data)]
    cases = [(a, b) for a in edges for b in edges if a <= b]
    cases += [tuple(sorted((rng.randrange(len(data) + 1), rng.randrange(len(data) + 1))))
              for _ in range(300)]
    for a, b in cases:
        fetch = Fetcher(sealed)
        got = OpeningReader(dek, fetch, layout, a, b, merge_gap=0).read()
        assert got == data[a:b], (a, b)
        if a < b:
            first, last = a // CHUNK, (b - 1) // CHUNK
            if b == len(data):
                last = layout.parts[0].plain_size // CHUNK if len(data) % CHUNK else last
            needed = HEADER + (last - first + 1) * (CHUNK + 16)
            assert fetch.fetched <= needed, (a, b, fetch.calls)
            assert len(fetch.calls) <= 2


def test_a_range_reads_only_the_chunks_it_needs(dek):
    data = os.urandom(100 * CHUNK)
    sealed = seal(dek, data)
    layout = Layout.single(len(sealed))
    fetch = Fetcher(sealed)
    a = 50 * CHUNK + 10
    assert OpeningReader(dek, fetch, layout, a, a + 20).read() == data[a:a + 20]
    c = 32 + 50 * (CHUNK + 16)
    assert fetch.calls == [(0, 32), (c, c + CHUNK + 16)]
    # near the start: the header and the chunks come in one backend range
    fetch = Fetcher(sealed)
    assert OpeningReader(dek, fetch, layout, CHUNK + 5, 2 * CHUNK + 5).read() == \
        data[CHUNK + 5:2 * CHUNK + 5]
    assert fetch.calls == [(0, 32 + 3 * (CHUNK + 16))]
    # a full read is a single backend range
    fetch = Fetcher(sealed)
    assert OpeningReader(dek, fetch, layout, 0, len(data)).read() == data
    assert fetch.calls == [(0, len(sealed))]


def test_random_ranges_across_parts(dek):
    sizes = [300_000, 1, 0, 65_536, 257, 1_000_000, 5]
    plains, sealed, layout = multipart(dek, sizes)
    data, blob = b"".join(plains), b"".join(sealed)
    bounds = sorted({0, len(data)} | {sum(sizes[:i]) + d for i in range(len(sizes))
                                     for d in (-1, 0, 1)} - {-1, len(data) + 1})
    rng = random.Random(7)
    cases = [(a, b) for a in bounds for b in bounds if a <= b]
    cases += [tuple(sorted((rng.randrange(len(data) + 1), rng.randrange(len(data) + 1))))
              for _ in range(300)]
    for a, b in cases:
        fetch = Fetcher(blob)
        assert OpeningReader(dek, fetch, layout, a, b).read() == data[a:b], (a, b)


def test_out_of_range_is_refused(dek):
    sealed = seal(dek, b"abc")
    layout = Layout.single(len(sealed))
    for a, b in [(-1, 2), (2, 1), (0, 4)]:
        with pytest.raises(ValueError):
            OpeningReader(dek, Fetcher(sealed), layout, a, b)


def test_empty_ranges(dek):
    sealed = seal(dek, b"")
    fetch = Fetcher(sealed)
    assert OpeningReader(dek, fetch, Layout.single(len(sealed)), 0, 0).read() == b""
    assert fetch.calls  # the empty object's one chunk is still authenticated
    sealed = seal(dek, b"abc")
    fetch = Fetcher(sealed)
    assert OpeningReader(dek, fetch, Layout.single(len(sealed)), 1, 1).read() == b""
    assert fetch.calls == []


# -- tampering ---------------------------------------------------------------------------------


def assert_refused(dek: bytes, sealed: bytes, layout_fn=None, start=0, end=None) -> None:
    """Reading the range must raise IntegrityError (from building the layout or while
    reading); bytes of undamaged chunks before the damage may come first."""
    with pytest.raises(IntegrityError):
        layout = layout_fn(sealed) if layout_fn else Layout.single(len(sealed))
        reader = OpeningReader(dek, Fetcher(sealed), layout, start,
                               layout.plain_size if end is None else end)
        got = 0
        while chunk := reader.read(4096):
            got += len(chunk)
        pytest.fail(f"returned {got} bytes and a clean end instead of raising")


def flip(data: bytes, pos: int, bit: int = 0) -> bytes:
    b = bytearray(data)
    b[pos] ^= 1 << bit
    return bytes(b)


def test_every_flipped_bit_is_detected_small(dek):
    sealed = seal(dek, os.urandom(40))
    for pos in range(len(sealed)):
        for bit in (0, 7):
            assert_refused(dek, flip(sealed, pos, bit))


def test_flipped_bits_anywhere_in_a_multi_chunk_object(dek):
    data = os.urandom(3 * CHUNK + 77)
    sealed = seal(dek, data)
    rng = random.Random(11)
    positions = list(range(0, 32)) + [32 + i * (CHUNK + 16) + d for i in range(4)
                                      for d in (0, 1, CHUNK, CHUNK + 15)] + \
        [rng.randrange(len(sealed)) for _ in range(60)]
    for pos in positions:
        if pos < len(sealed):
            assert_refused(dek, flip(sealed, pos, rng.randrange(8)))


def test_a_range_never_returns_bytes_of_a_damaged_chunk(dek):
    data = os.urandom(2 * CHUNK)
    sealed = seal(dek, data)
    bad = flip(sealed, 32 + CHUNK + 15)  # the tag of chunk 0
    layout = Layout.single(len(bad))
    reader = OpeningReader(dek, Fetcher(bad), layout, 0, 10)
    with pytest.raises(IntegrityError):
        reader.read(1)
    with pytest.raises(IntegrityError):  # and it keeps failing, never looks like a clean end
        reader.read(1)
    # the undamaged chunk 1 is still readable on its own
    assert OpeningReader(dek, Fetcher(bad), layout, CHUNK, 2 * CHUNK).read() == data[CHUNK:]


def test_truncation_anywhere_is_detected(dek):
    data = os.urandom(3 * CHUNK + 100)
    sealed = seal(dek, data)
    cuts = [32 + i * (CHUNK + 16) for i in range(1, 4)]  # exactly at chunk boundaries
    cuts += [len(sealed) - 1, len(sealed) - 16, len(sealed) - 117, 48, 33, 32, 0]
    for cut in cuts:
        assert_refused(dek, sealed[:cut])
    # an object cut to exactly an empty object's size is not an empty object
    assert_refused(dek, seal(dek, b"hello")[:48])


def test_a_backend_returning_fewer_bytes_than_it_listed(dek):
    data = os.urandom(2 * CHUNK)
    sealed = seal(dek, data)
    layout = Layout.single(len(sealed))

    def short_fetch(a, b):
        return io.BytesIO(sealed[a:b][:-5])

    with pytest.raises(IntegrityError, match="ended early"):
        OpeningReader(dek, short_fetch, layout, 0, len(data)).read()


def chunks_of(sealed: bytes) -> tuple[bytes, list[bytes]]:
    body = sealed[HEADER:]
    return sealed[:HEADER], [body[i:i + CHUNK + 16] for i in range(0, len(body), CHUNK + 16)]


def test_reordered_duplicated_dropped_and_appended_chunks(dek):
    sealed = seal(dek, os.urandom(4 * CHUNK + 9))
    header, chunks = chunks_of(sealed)
    c = chunks
    variants = {
        "swap": [c[0], c[2], c[1], c[3], c[4]],
        "duplicate": [c[0], c[1], c[1], c[3], c[4]],
        "drop middle": [c[0], c[1], c[3], c[4]],
        "drop last": c[:4],
        "final moved": [c[0], c[1], c[2], c[4]],
        "repeat final": c + [c[4]],
        "rotate": c[1:] + c[:1],
    }
    for name, order in variants.items():
        assert_refused(dek, header + b"".join(order)), name


def test_header_of_another_object_or_wrong_key(dek):
    a, b = seal(dek, os.urandom(CHUNK + 5)), seal(dek, os.urandom(CHUNK + 5))
    assert_refused(dek, b[:HEADER] + a[HEADER:])
    assert_refused(stream.new_data_key(), a)
    # a whole object sealed under another data key, swapped in
    other = seal(stream.new_data_key(), os.urandom(CHUNK + 5))
    assert_refused(dek, other)
    # a part presented as a single object, and the reverse
    part = seal(dek, os.urandom(1000), 1)
    assert_refused(dek, part, lambda s: Layout.single(stream.sealed_size(1000 + 4128 - 48)))
    single = seal(dek, os.urandom(5000))
    assert_refused(dek, single, lambda s: Layout.multipart([len(s)]))


def test_unknown_version_and_reserved_bytes(dek):
    sealed = seal(dek, b"data")
    for pos, value in [(4, 2), (5, 3), (6, 17), (7, 1), (31, 1)]:
        b = bytearray(sealed)
        b[pos] = value
        assert_refused(dek, bytes(b))
    with pytest.raises(IntegrityError, match="version 2"):
        stream.parse_header(b"OMSL\x02" + bytes(27))


def test_parts_moved_duplicated_or_swapped(dek):
    plains, sealed, _ = multipart(dek, [1000, 1000, 1000])
    sizes = [len(s) for s in sealed]
    numbered = lambda s: Layout.multipart(sizes, [1, 2, 3])  # noqa: E731
    unnumbered = lambda s: Layout.multipart(sizes)  # noqa: E731
    for order in ([1, 0, 2], [0, 2, 1], [0, 0, 2], [0, 1, 1], [2, 1, 0]):
        blob = b"".join(sealed[i] for i in order)
        assert_refused(dek, blob, numbered)
        assert_refused(dek, blob, unnumbered)
    # a ranged read of a moved part is caught when the part numbers are known
    blob = b"".join([sealed[0], sealed[2], sealed[1]])
    assert_refused(dek, blob, numbered, 1000, 2000)
    # a part header moved onto another part's chunks
    a, b = sealed[0], sealed[1]
    assert_refused(dek, b"".join([b[:HEADER] + a[HEADER:], b, sealed[2]]), unnumbered)
    # a part sealed under another upload's key
    foreign = seal(stream.new_data_key(), plains[1], 2)
    assert_refused(dek, b"".join([sealed[0], foreign, sealed[2]]), numbered)
    # the layout says a part has another size than its header does
    bigger = seal(dek, os.urandom(1001), 2)
    assert_refused(dek, b"".join([sealed[0], bigger[:-1] + b"", sealed[2]]),
                   lambda s: Layout.multipart([sizes[0], sizes[1], sizes[2]], [1, 2, 3]))
    # a part number out of reach of its position (part 1 at position 2)
    assert_refused(dek, b"".join([sealed[0], sealed[0]]),
                   lambda s: Layout.multipart(sizes[:2]), 1000, 2000)


def test_part_truncation_and_bit_flips(dek):
    data = os.urandom(100_000)
    part = seal(dek, data, 4)
    layout = lambda s: Layout.multipart([len(s)], [4])  # noqa: E731
    s = -(-len(data) // 256)
    for cut in [32 + (s + 16) * k for k in (1, 100, 255)] + [len(part) - 1, len(part) - 16]:
        assert_refused(dek, part[:cut], layout)
    rng = random.Random(3)
    for pos in list(range(32)) + [rng.randrange(len(part)) for _ in range(60)]:
        assert_refused(dek, flip(part, pos, rng.randrange(8)), layout)
    empty = seal(dek, b"", 4)
    for pos in range(0, len(empty), 97):
        assert_refused(dek, flip(empty, pos), layout)


# -- sealing errors ------------------------------------------------------------------------------


def test_part_body_shorter_or_longer_than_declared(dek):
    for declared, actual in [(1000, 999), (1000, 1001), (0, 1), (5, 0), (256 * 3, 256 * 3 + 1)]:
        reader = SealingReader(dek, io.BytesIO(os.urandom(actual)), part_number=1,
                               plain_size=declared)
        out = []
        with pytest.raises(SizeMismatch):
            while chunk := reader.read(100):
                out.append(chunk)
        # the final chunk was never produced: nothing complete-looking exists
        assert len(b"".join(out)) < stream.part_sealed_size(declared)


def test_single_body_shorter_or_longer_than_declared(dek):
    for declared, actual in [(10, 9), (10, 11), (CHUNK, CHUNK + 1), (CHUNK + 1, CHUNK), (0, 1)]:
        reader = SealingReader(dek, io.BytesIO(os.urandom(actual)), plain_size=declared)
        with pytest.raises(SizeMismatch):
            reader.read()


def test_bad_arguments(dek):
    with pytest.raises(ValueError):
        SealingReader(dek, io.BytesIO(b""), part_number=1)  # no plain size
    with pytest.raises(ValueError):
        SealingReader(dek, io.BytesIO(b""), part_number=0, plain_size=0)
    with pytest.raises(ValueError):
        SealingReader(b"short", io.BytesIO(b""))
    with pytest.raises(ValueError):
        Layout.multipart([])
    with pytest.raises(ValueError):
        Layout.multipart([4128, 4128], [2, 2])


# -- throughput (printed with -s; no timed asserts) -----------------------------------------------


class Repeat:
    """A zero-copy plaintext source: the same run of 64 KiB blocks (the reads a sealing
    reader makes), ``total`` bytes in all."""

    def __init__(self, block: bytes, total: int) -> None:
        self.run, self.left = block * (stream.RUN // len(block)), total

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        assert n == len(self.run) <= self.left
        self.left -= n
        return self.run


def _best_of(fns: dict, rounds: int = 5) -> dict:
    """Best time of each function, rounds interleaved so frequency drift hits all alike."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def test_throughput_against_raw_aesgcm(dek):
    total = 128 * MiB
    n = total // CHUNK
    block = os.urandom(CHUNK)
    aead = AESGCM(dek)
    nonce, aad = os.urandom(12), os.urandom(45)
    one = aead.encrypt(nonce, block, aad)

    def raw_encrypt():
        for _ in range(n):
            aead.encrypt(nonce, block, aad)

    def raw_decrypt():
        for _ in range(n):
            aead.decrypt(nonce, one, aad)

    sealed = b"".join(SealingReader(dek, Repeat(block, total)))
    layout = Layout.single(len(sealed))
    view = memoryview(sealed)

    class View:
        def __init__(self, a, b):
            self.pos, self.end = a, b

        def read(self, k):
            k = min(k, self.end - self.pos)
            out = view[self.pos:self.pos + k]
            self.pos += k
            return out

    def seal_iter():
        for _ in SealingReader(dek, Repeat(block, total)):
            pass

    def seal_read():
        r = SealingReader(dek, Repeat(block, total))
        while r.read(MiB):
            pass

    def open_iter():
        for _ in OpeningReader(dek, View, layout, 0, total):
            pass

    def open_read():
        r = OpeningReader(dek, View, layout, 0, total)
        while r.read(MiB):
            pass

    def seal_read1():
        r = SealingReader(dek, Repeat(block, total))
        while r.read1(MiB):
            pass

    def open_read1():
        r = OpeningReader(dek, View, layout, 0, total)
        while r.read1(MiB):
            pass

    best = _best_of({"raw encrypt": raw_encrypt, "seal (iterate)": seal_iter,
                     "seal (read1 1 MiB)": seal_read1, "seal (read 1 MiB)": seal_read,
                     "raw decrypt": raw_decrypt, "open (iterate)": open_iter,
                     "open (read1 1 MiB)": open_read1, "open (read 1 MiB)": open_read})
    rate = {name: total / t / 1e6 for name, t in best.items()}
    print()
    print(f"{'128 MiB, 64 KiB chunks':<24} {'MB/s':>8} {'vs raw':>7}")
    for name, mbps in rate.items():
        base = rate["raw encrypt" if name.startswith(("seal", "raw e")) else "raw decrypt"]
        print(f"{name:<24} {mbps:>8.0f} {mbps / base:>7.0%}")
