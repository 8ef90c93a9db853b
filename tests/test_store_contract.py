"""The ObjectStore contract, checked the same way on the embedded store and on the
upstream backend (S3Store over a real SeaweedFS).

The S3Store here runs with small thresholds, so a few MiB exercise the paths real
sizes take: PUT bodies over ``single_put_limit`` and part bodies of unknown length
over ``spool_memory`` are spooled to disk, copies over ``copy_limit`` go part by part.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import random
import threading
import time
import uuid

import pytest
from conftest import UPSTREAM_BUCKET

from gateway.store.base import (
    BucketAlreadyExists,
    BucketNotEmpty,
    EntityTooSmall,
    IncompleteBody,
    InvalidPart,
    InvalidPartOrder,
    NoSuchBucket,
    NoSuchKey,
    NoSuchUpload,
    ObjectMeta,
    PreconditionFailed,
    SourceChanged,
    StoreError,
    WriteCondition,
)
from gateway.store.local import LocalStore
from gateway.store.s3 import (
    S3Store,
    decode_key,
    encode_key,
    encode_prefix,
    parse_location,
)

MiB = 1024 * 1024
PART = 5 * MiB


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, monkeypatch):
    if request.param == "local":
        s = LocalStore(tmp_path / "store")
    else:
        sw = request.getfixturevalue("seaweed")
        for name, value in sw.env.items():
            monkeypatch.setenv(name, value)
        s = S3Store(UPSTREAM_BUCKET, f"contract-{uuid.uuid4().hex[:8]}", sw.endpoint, threads=16,
                    spool_dir=tmp_path / "spool", single_put_limit=1 * MiB,
                    spool_memory=256 * 1024, copy_limit=6 * MiB, copy_part=PART)
        s.list_page = 4  # many upstream pages, so paging and skipping are exercised
        s.learn_quirks()  # as the gateway does at start
    s.kind = request.param
    yield s
    s.close()


@pytest.fixture
def bkt(store):
    name = f"b-{uuid.uuid4().hex[:10]}"
    store.create_bucket(name)
    return name


def put(store, bucket, key, data: bytes, meta: ObjectMeta | None = None, condition=None, finalize=None):
    return store.put_object(bucket, key, io.BytesIO(data), meta or ObjectMeta(), condition, finalize)


def read(store, bucket, key, start=0, end=None) -> bytes:
    reader = store.open_object(bucket, key, start, end)
    try:
        chunks = []
        while chunk := reader.read(256 * 1024):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        reader.close()


def every_key(store, bucket, **query) -> list[str]:
    keys, after = [], ""
    while True:
        page = store.list_objects(bucket, after=after, **query)
        keys += [e.key for e in page.entries] + page.common_prefixes
        if not page.is_truncated:
            return keys
        after = page.next_marker


# -- buckets ------------------------------------------------------------------


def test_buckets(store):
    names = sorted(f"bk-{uuid.uuid4().hex[:8]}-{i}" for i in range(3))
    for name in names:
        info = store.create_bucket(name)
        assert info.name == name
    with pytest.raises(BucketAlreadyExists):
        store.create_bucket(names[0])
    listed = [b.name for b in store.list_buckets()]
    assert [n for n in listed if n in names] == names
    assert listed == sorted(listed)
    created = store.head_bucket(names[0]).created
    assert abs(created - time.time()) < 60
    assert {b.name: b.created for b in store.list_buckets()}[names[0]] == created
    with pytest.raises(NoSuchBucket):
        store.head_bucket("no-such-bucket-here")
    with pytest.raises(NoSuchBucket):
        store.delete_bucket("no-such-bucket-here")
    put(store, names[0], "k", b"x")
    with pytest.raises(BucketNotEmpty):
        store.delete_bucket(names[0])
    store.delete_object(names[0], "k")
    upload = store.create_multipart(names[1], "k", ObjectMeta())
    with pytest.raises(BucketNotEmpty):
        store.delete_bucket(names[1])
    store.abort_multipart(names[1], "k", upload.upload_id)
    for name in names:
        store.delete_bucket(name)
    assert not {b.name for b in store.list_buckets()} & set(names)


def test_internal_buckets_live_beside_user_buckets(store):
    store.create_bucket(".internal-x")
    put(store, ".internal-x", "doc", b"{}")
    assert read(store, ".internal-x", "doc") == b"{}"
    assert ".internal-x" in [b.name for b in store.list_buckets()]


# -- objects ------------------------------------------------------------------


def full_meta() -> ObjectMeta:
    """Every field of ObjectMeta set (whatever fields later issues add), with text
    no HTTP header carries as is."""
    meta = ObjectMeta()
    for f in dataclasses.fields(ObjectMeta):
        if f.name == "user":
            meta.user = {"plain": "v", "utf8": "ünï €😀", "spaces": "a  b ", "json": '{"x": [1]}'}
        elif f.name == "checksums":
            meta.checksums = {"CRC32": "AAAAAA==", "SHA256": "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg="}
        elif f.name == "checksum_type":
            meta.checksum_type = "FULL_OBJECT"
        elif f.name == "expires":
            meta.expires = "Thu, 01 Dec 1994 16:00:00 GMT"
        else:
            setattr(meta, f.name, f"{f.name} ü; x=\"1\"")
    return meta


def test_object_round_trip_with_all_metadata(store, bkt):
    meta = full_meta()
    data = os.urandom(3000)
    info = put(store, bkt, "dir/obj", data, meta)
    assert info.etag == hashlib.md5(data).hexdigest()
    head = store.head_object(bkt, "dir/obj")
    assert head.meta == meta and head.size == 3000 and head.etag == info.etag
    reader = store.open_object(bkt, "dir/obj")
    assert reader.info == head
    assert reader.read() == data
    reader.close()
    [entry] = store.list_objects(bkt).entries
    assert (entry.key, entry.size, entry.etag, entry.last_modified) == \
        ("dir/obj", 3000, head.etag, head.last_modified)


def test_ranges(store, bkt):
    data = bytes(range(256)) * 40
    put(store, bkt, "r", data)
    for start, end in [(0, 1), (5, 100), (1000, None), (0, len(data)), (10, len(data) + 50),
                       (len(data) - 1, None), (len(data), None), (len(data) + 5, len(data) + 10)]:
        reader = store.open_object(bkt, "r", start, end)
        assert reader.info.size == len(data)
        got = reader.read()
        reader.close()
        assert got == data[start:end], (start, end)
    put(store, bkt, "empty", b"")
    assert read(store, bkt, "empty") == b""
    assert read(store, bkt, "empty", 0, 10) == b""


def test_missing_things(store, bkt):
    for call in (lambda: store.head_object(bkt, "nope"), lambda: store.open_object(bkt, "nope"),
                 lambda: store.copy_object(bkt, "nope", bkt, "dst", None)):
        with pytest.raises(NoSuchKey):
            call()
    store.delete_object(bkt, "nope")
    for call in (lambda: store.head_object("no-bucket-x", "k"), lambda: store.open_object("no-bucket-x", "k"),
                 lambda: put(store, "no-bucket-x", "k", b"1"), lambda: store.delete_object("no-bucket-x", "k"),
                 lambda: store.list_objects("no-bucket-x"),
                 lambda: store.create_multipart("no-bucket-x", "k", ObjectMeta()),
                 lambda: store.list_uploads("no-bucket-x")):
        with pytest.raises(NoSuchBucket):
            call()


def test_overwrite_and_delete(store, bkt):
    put(store, bkt, "k", b"one")
    put(store, bkt, "k", b"two!", ObjectMeta(content_type="text/plain"))
    assert read(store, bkt, "k") == b"two!"
    assert store.head_object(bkt, "k").meta.content_type == "text/plain"
    store.delete_object(bkt, "k")
    with pytest.raises(NoSuchKey):
        store.head_object(bkt, "k")


# -- conditional writes ---------------------------------------------------------


def test_conditional_writes(store, bkt):
    first = put(store, bkt, "c", b"1", condition=WriteCondition(if_none_match=True))
    with pytest.raises(PreconditionFailed):
        put(store, bkt, "c", b"2", condition=WriteCondition(if_none_match=True))
    with pytest.raises(PreconditionFailed):
        put(store, bkt, "c", b"2", condition=WriteCondition(if_match="0" * 32))
    second = put(store, bkt, "c", b"2", condition=WriteCondition(if_match=first.etag))
    with pytest.raises(PreconditionFailed):
        put(store, bkt, "c", b"3", condition=WriteCondition(if_match=first.etag))
    put(store, bkt, "c", b"3", condition=WriteCondition(if_match="*"))
    with pytest.raises(NoSuchKey):
        put(store, bkt, "absent", b"x", condition=WriteCondition(if_match=second.etag))
    assert read(store, bkt, "c") == b"3"


def test_retried_conditional_write_by_the_same_writer_succeeds(store, bkt):
    cond = WriteCondition(if_none_match=True, writer="agent-1")
    info = put(store, bkt, "lease", b"mine", condition=cond)
    assert put(store, bkt, "lease", b"mine", condition=cond).etag == info.etag
    with pytest.raises(PreconditionFailed):  # another writer, same bytes
        put(store, bkt, "lease", b"mine", condition=WriteCondition(if_none_match=True, writer="agent-2"))
    with pytest.raises(PreconditionFailed):  # same writer, other bytes
        put(store, bkt, "lease", b"theirs", condition=cond)


def test_if_none_match_race_has_exactly_one_winner(store, bkt):
    results: list[object] = []
    barrier = threading.Barrier(8)

    def writer(i: int) -> None:
        barrier.wait()
        try:
            put(store, bkt, "race", f"writer-{i}".encode(), condition=WriteCondition(if_none_match=True))
            results.append(i)
        except PreconditionFailed:
            results.append(None)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r is not None]
    assert len(results) == 8 and len(winners) == 1
    assert read(store, bkt, "race") == f"writer-{winners[0]}".encode()


def test_compare_and_swap_race_has_exactly_one_winner(store, bkt):
    base = put(store, bkt, "cas", b"v0")
    results: list[bool] = []
    barrier = threading.Barrier(6)

    def writer(i: int) -> None:
        barrier.wait()
        try:
            put(store, bkt, "cas", f"v1-{i}".encode(), condition=WriteCondition(if_match=base.etag))
            results.append(True)
        except PreconditionFailed:
            results.append(False)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 5 + [True]


# -- the finalizer ----------------------------------------------------------------


@pytest.mark.parametrize("size", [1000, 6 * MiB + 123], ids=["small", "large"])
def test_finalizer_runs_before_the_object_is_visible(store, bkt, size):
    data = random.Random(size).randbytes(size)
    put(store, bkt, "f", b"old")
    seen = []

    def refuse():
        # the whole body was read, and the new version is not visible yet
        seen.append(read(store, bkt, "f"))
        raise ValueError("checksum mismatch")

    with pytest.raises(ValueError):
        put(store, bkt, "f", data, finalize=refuse)
    assert seen == [b"old"]
    assert read(store, bkt, "f") == b"old"
    assert [e.key for e in store.list_objects(bkt).entries] == ["f"]
    assert store.count_uploads() == 0 or store.kind == "s3" and not store.list_uploads(bkt)

    info = put(store, bkt, "f", data, ObjectMeta(user={"k": "v"}), finalize=lambda: {"CRC32": "AAAAAA=="})
    head = store.head_object(bkt, "f")
    assert head.meta.checksums == {"CRC32": "AAAAAA=="} and head.meta.checksum_type == "FULL_OBJECT"
    assert head.meta.user == {"k": "v"}
    assert (head.etag, head.size) == (info.etag, size)
    assert read(store, bkt, "f") == data
    assert not head.part_sizes or sum(head.part_sizes) == size
    assert read(store, bkt, "f", PART - 10, PART + 10) == data[PART - 10:PART + 10]


def test_large_put_failing_midway_leaves_nothing(store, bkt):
    class Broken(io.RawIOBase):
        sent = 0

        def read(self, n=-1):
            if self.sent > 7 * MiB:
                raise ConnectionError("client went away")
            self.sent += MiB
            return b"x" * MiB

    with pytest.raises(ConnectionError):
        store.put_object(bkt, "broken", Broken(), ObjectMeta())
    with pytest.raises(NoSuchKey):
        store.head_object(bkt, "broken")
    if store.kind == "s3":  # nothing reached the upstream, and the spool is empty again
        client = store._client
        assert not client.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix).get("Uploads")
        assert not list(store.spool_dir.iterdir())


# -- copies -------------------------------------------------------------------------


def test_copy(store, bkt):
    meta = full_meta()
    src = put(store, bkt, "src", b"hello world", meta)
    copied = store.copy_object(bkt, "src", bkt, "dst", None)
    assert copied.etag == src.etag
    assert store.head_object(bkt, "dst").meta == meta
    replaced = store.copy_object(bkt, "src", bkt, "dst2", ObjectMeta(content_type="text/x"))
    assert store.head_object(bkt, "dst2").meta == ObjectMeta(content_type="text/x")
    assert replaced.etag == src.etag
    store.copy_object(bkt, "src", bkt, "src", ObjectMeta(user={"chmod": "600"}))  # onto itself
    assert store.head_object(bkt, "src").meta.user == {"chmod": "600"}
    assert read(store, bkt, "src") == b"hello world"
    with pytest.raises(SourceChanged):
        store.copy_object(bkt, "src", bkt, "dst3", None, source_etag="0" * 32)
    with pytest.raises(PreconditionFailed):
        store.copy_object(bkt, "src", bkt, "dst", None, WriteCondition(if_none_match=True))
    store.copy_object(bkt, "src", bkt, "dst", None, WriteCondition(if_match=copied.etag))
    other = f"b-{uuid.uuid4().hex[:10]}"
    store.create_bucket(other)
    store.copy_object(bkt, "src", other, "x", None)
    assert read(store, other, "x") == b"hello world"


def test_large_copy_keeps_bytes_and_metadata(store, bkt):
    data = random.Random(7).randbytes(11 * MiB)
    put(store, bkt, "big", data, ObjectMeta(user={"a": "b"}, checksums={"CRC32": "AAAAAA=="}))
    info = store.copy_object(bkt, "big", bkt, "big-copy", None)
    assert info.size == len(data)
    head = store.head_object(bkt, "big-copy")
    assert head.meta.user == {"a": "b"} and head.meta.checksums == {"CRC32": "AAAAAA=="}
    assert read(store, bkt, "big-copy") == data
    assert read(store, bkt, "big-copy", 5 * MiB - 3, 5 * MiB + 3) == data[5 * MiB - 3:5 * MiB + 3]


# -- listings -----------------------------------------------------------------------

LIST_KEYS = ["a", "a b", "a!", "a-b", "a.b", "a/", "a/b", "a/b/c", "a/b-c", "a//x", "a0", "ab",
             "./x", "../y", "/lead", "dir/", "dir/x", "dir/y/", "dir/y/z", "~", "!", ",", "é", "z/é/ü",
             "x%2F", "q?x=1", "tab\tkey", "sp ace/ok", "\U0001f600/k", "b" * 200 + "/c"]


def model(keys: list[str], prefix: str, delimiter: str) -> list[str]:
    """S3 listing semantics on the whole key set, in byte order."""
    out: list[str] = []
    for key in sorted(keys, key=lambda k: k.encode()):
        if not key.startswith(prefix):
            continue
        cut = key.find(delimiter, len(prefix)) if delimiter else -1
        entry = key[:cut + len(delimiter)] if cut >= 0 else key
        if entry not in out:
            out.append(entry)
    return out


@pytest.fixture
def listed(store, bkt):
    for key in LIST_KEYS:
        put(store, bkt, key, key.encode())
    return bkt


def test_listing_matches_s3_semantics(store, listed):
    for prefix in ["", "a", "a/", "a/b", "dir/", "dir/y", "z", "nothing", "."]:
        for delimiter in ["", "/", "-", "b", "é"]:
            check_listing(store, listed, prefix, delimiter)


def check_listing(store, listed, prefix, delimiter):
    want = model(LIST_KEYS, prefix, delimiter)
    page = store.list_objects(listed, prefix=prefix, delimiter=delimiter)
    got = sorted([e.key for e in page.entries] + page.common_prefixes, key=lambda k: k.encode())
    assert got == want and not page.is_truncated, (prefix, delimiter)
    for limit in (1, 2, 5):
        collected, after = [], ""
        for _ in range(100):
            page = store.list_objects(listed, prefix=prefix, delimiter=delimiter, after=after, limit=limit)
            items = sorted([e.key for e in page.entries] + page.common_prefixes, key=lambda k: k.encode())
            assert len(items) <= limit
            collected += items
            if not page.is_truncated:
                break
            assert page.next_marker == items[-1]
            after = page.next_marker
        assert collected == want, (prefix, delimiter, limit, collected)


def test_listing_entries_carry_size_and_etag(store, listed):
    page = store.list_objects(listed, prefix="dir/")
    for entry in page.entries:
        assert entry.size == len(entry.key.encode())
        assert entry.etag == hashlib.md5(entry.key.encode()).hexdigest()
    assert store.list_objects(listed, limit=0).entries == []


def test_deleted_keys_leave_no_common_prefix(store, bkt):
    """SeaweedFS keeps the empty directories of deleted keys, and reports them as common
    prefixes in its own delimiter listings; a store must not."""
    for key in ("ed/y/z", "ed/y/deeper/", "ed/keep"):
        put(store, bkt, key, b"1")
    for key in ("ed/y/z", "ed/y/deeper/"):
        store.delete_object(bkt, key)
    page = store.list_objects(bkt, prefix="ed/", delimiter="/")
    assert ([e.key for e in page.entries], page.common_prefixes) == (["ed/keep"], [])
    assert store.list_objects(bkt, prefix="ed/y/", delimiter="/").entries == []


def test_a_large_common_prefix_is_skipped_not_listed(store, bkt):
    for i in range(30):
        put(store, bkt, f"big/{i:03d}", b"")
    put(store, bkt, "small/x", b"")
    put(store, bkt, "z", b"")
    page = store.list_objects(bkt, delimiter="/", limit=2)
    assert (page.common_prefixes, page.is_truncated, page.next_marker) == (["big/", "small/"], True, "small/")
    page = store.list_objects(bkt, delimiter="/", after="small/")
    assert ([e.key for e in page.entries], page.common_prefixes) == (["z"], [])


def test_listing_resumes_after_arbitrary_markers(store, listed):
    for after in ["a", "a/", "a/b", "a0", "b", "dir", "dir/x", "zzz", "\U0001f600"]:
        for delimiter in ("", "/"):
            want = model(LIST_KEYS, "", delimiter)
            if delimiter and after.find(delimiter) >= 0:
                rolled = after[:after.find(delimiter) + 1]
                want = [k for k in want if k > after and not k.startswith(rolled)]
            else:
                want = [k for k in want if k.encode() > after.encode()]
            page = store.list_objects(listed, delimiter=delimiter, after=after)
            got = sorted([e.key for e in page.entries] + page.common_prefixes, key=lambda k: k.encode())
            assert got == want, (after, delimiter)


# -- multipart ------------------------------------------------------------------------


def upload_parts(store, bkt, key, upload_id, bodies, with_size=True, checksums=None):
    parts = []
    for n, body in enumerate(bodies, 1):
        finalize = (lambda n=n: {"CRC32": checksums[n]}) if checksums else None
        size = len(body) if with_size else None
        parts.append(store.upload_part(bkt, key, upload_id, n, io.BytesIO(body), finalize, size=size))
    return parts


@pytest.mark.parametrize("with_size", [True, False], ids=["declared-size", "unknown-size"])
def test_multipart_round_trip(store, bkt, with_size):
    meta = ObjectMeta(content_type="text/plain", user={"u": "ü"}, checksums={"CRC32": ""},
                      checksum_type="COMPOSITE")
    upload = store.create_multipart(bkt, "mp", meta)
    assert store.get_upload(bkt, "mp", upload.upload_id).meta == meta
    bodies = [random.Random(1).randbytes(PART), random.Random(2).randbytes(PART), b"tail" * 100]
    parts = upload_parts(store, bkt, "mp", upload.upload_id, bodies, with_size,
                         checksums={1: "AAAAAQ==", 2: "AAAAAg==", 3: "AAAAAw=="})
    assert [p.etag for p in parts] == [hashlib.md5(b).hexdigest() for b in bodies]
    listed = store.list_parts(bkt, "mp", upload.upload_id)
    assert [(p.part_number, p.size, p.etag, p.checksums) for p in listed] == \
        [(p.part_number, p.size, p.etag, p.checksums) for p in parts]
    assert [u.upload_id for u in store.list_uploads(bkt)] == [upload.upload_id]
    assert store.count_uploads() >= 1

    def update(meta, chosen):
        assert [p.checksums["CRC32"] for p in chosen] == ["AAAAAQ==", "AAAAAg==", "AAAAAw=="]
        meta.checksums = {"CRC32": "Zm9v-3"}
        return meta

    info = store.complete_multipart(bkt, "mp", upload.upload_id,
                                    [(p.part_number, p.etag) for p in parts], None, update)
    md5s = b"".join(hashlib.md5(b).digest() for b in bodies)
    assert info.etag == f"{hashlib.md5(md5s).hexdigest()}-3"
    assert list(info.part_sizes) == [len(b) for b in bodies]
    head = store.head_object(bkt, "mp")
    assert head.etag == info.etag and list(head.part_sizes) == [len(b) for b in bodies]
    assert head.meta.checksums == {"CRC32": "Zm9v-3"} and head.meta.user == {"u": "ü"}
    assert read(store, bkt, "mp") == b"".join(bodies)
    assert read(store, bkt, "mp", PART - 1, PART + 1) == b"".join(bodies)[PART - 1:PART + 1]
    assert store.list_uploads(bkt) == []
    with pytest.raises(NoSuchUpload):
        store.get_upload(bkt, "mp", upload.upload_id)
    # A retried Complete answers with the object it made, while that object is current.
    again = store.complete_multipart(bkt, "mp", upload.upload_id, [(p.part_number, p.etag) for p in parts])
    assert again.etag == info.etag
    # A copy keeps what the object learned at completion.
    store.copy_object(bkt, "mp", bkt, "mp-copy", None)
    assert store.head_object(bkt, "mp-copy").meta.checksums == {"CRC32": "Zm9v-3"}
    put(store, bkt, "mp", b"replaced")
    with pytest.raises(NoSuchUpload):
        store.complete_multipart(bkt, "mp", upload.upload_id, [(p.part_number, p.etag) for p in parts])


def test_part_bodies_that_fail_leave_no_part(store, bkt):
    upload = store.create_multipart(bkt, "k", ObjectMeta())
    good = upload_parts(store, bkt, "k", upload.upload_id, [b"first" * 10])[0]

    def refuse():
        raise ValueError("bad digest")

    for size in (None, 2 * MiB):
        with pytest.raises(ValueError):
            store.upload_part(bkt, "k", upload.upload_id, 2, io.BytesIO(b"z" * 2 * MiB), refuse, size=size)
    if store.kind == "s3":  # it streams a part of declared size: a body of another size is refused
        for body in (b"z" * 10, b"z" * 30):
            with pytest.raises(IncompleteBody):
                store.upload_part(bkt, "k", upload.upload_id, 3, io.BytesIO(body), None, size=20)
    assert [p.part_number for p in store.list_parts(bkt, "k", upload.upload_id)] == [1]
    info = store.complete_multipart(bkt, "k", upload.upload_id, [(1, good.etag)])
    assert read(store, bkt, "k") == b"first" * 10
    assert info.part_sizes == ()


def test_uploading_a_part_again_replaces_it(store, bkt):
    upload = store.create_multipart(bkt, "k", ObjectMeta())
    big = random.Random(3).randbytes(PART)
    first = upload_parts(store, bkt, "k", upload.upload_id, [b"first"])[0]
    second = upload_parts(store, bkt, "k", upload.upload_id, [big])[0]
    tail = store.upload_part(bkt, "k", upload.upload_id, 2, io.BytesIO(b"end"), size=3)
    assert [(p.part_number, p.etag) for p in store.list_parts(bkt, "k", upload.upload_id)] == \
        [(1, second.etag), (2, tail.etag)]
    with pytest.raises(InvalidPart):  # the replaced upload of part 1 is gone
        store.complete_multipart(bkt, "k", upload.upload_id, [(1, first.etag), (2, tail.etag)])
    # A failed upload of part 1 leaves the last complete one in place.
    def refuse():
        raise ValueError("bad digest")

    for size in (None, 5):
        with pytest.raises(ValueError):
            store.upload_part(bkt, "k", upload.upload_id, 1, io.BytesIO(b"wrong"), refuse, size=size)
    if store.kind == "s3":
        with pytest.raises(IncompleteBody):
            store.upload_part(bkt, "k", upload.upload_id, 1, io.BytesIO(b"short"), size=10)
    assert [p.etag for p in store.list_parts(bkt, "k", upload.upload_id)] == [second.etag, tail.etag]
    store.complete_multipart(bkt, "k", upload.upload_id, [(1, second.etag), (2, tail.etag)])
    assert read(store, bkt, "k") == big + b"end"


def test_complete_refusals(store, bkt):
    upload = store.create_multipart(bkt, "k", ObjectMeta())
    parts = upload_parts(store, bkt, "k", upload.upload_id, [b"a" * 100, b"b" * 100])
    with pytest.raises(InvalidPart):
        store.complete_multipart(bkt, "k", upload.upload_id, [(1, "0" * 32)])
    with pytest.raises(InvalidPartOrder):
        store.complete_multipart(bkt, "k", upload.upload_id, [(2, parts[1].etag), (1, parts[0].etag)])
    with pytest.raises(EntityTooSmall):
        store.complete_multipart(bkt, "k", upload.upload_id, [(1, parts[0].etag), (2, parts[1].etag)])
    with pytest.raises(NoSuchUpload):
        store.complete_multipart(bkt, "other-key", upload.upload_id, [(1, parts[0].etag)])
    put(store, bkt, "k", b"exists")
    with pytest.raises(PreconditionFailed):
        store.complete_multipart(bkt, "k", upload.upload_id, [(1, parts[0].etag)],
                                 WriteCondition(if_none_match=True))
    assert read(store, bkt, "k") == b"exists"
    store.abort_multipart(bkt, "k", upload.upload_id)
    with pytest.raises(NoSuchUpload):
        store.complete_multipart(bkt, "k", upload.upload_id, [(1, parts[0].etag)])
    with pytest.raises(NoSuchUpload):
        store.abort_multipart(bkt, "k", upload.upload_id)
    with pytest.raises(NoSuchUpload):
        store.upload_part(bkt, "k", upload.upload_id, 1, io.BytesIO(b"x"))
    with pytest.raises(NoSuchUpload):
        store.upload_part(bkt, "k", upload.upload_id, 1, io.BytesIO(b"x"), size=1)
    with pytest.raises(NoSuchUpload):
        store.get_upload(bkt, "k", "../../not-an-id")


def test_part_for_an_upload_gone_upstream_is_no_such_upload(store, bkt):
    """The upload's record outlived its upstream upload (completed or aborted by another
    gateway a moment ago): the upstream's NoSuchUpload is the answer, not a 503."""
    if store.kind != "s3":
        pytest.skip("an upstream upload only exists on the s3 backend")
    upload = store.create_multipart(bkt, "k", ObjectMeta())
    _, upstream = store._upload(bkt, "k", upload.upload_id)
    store._client.abort_multipart_upload(Bucket=store.bucket, Key=store._okey(bkt, "k"), UploadId=upstream)
    for size in (None, 3):
        with pytest.raises(NoSuchUpload):
            store.upload_part(bkt, "k", upload.upload_id, 1, io.BytesIO(b"abc"), size=size)


def test_uploads_listing_expiry_and_count(store, bkt):
    keys = ["b", "a/x", "a", "dir/", "a-b"]
    ids = {k: store.create_multipart(bkt, k, ObjectMeta(user={"k": k})).upload_id for k in keys}
    second_a = store.create_multipart(bkt, "a", ObjectMeta()).upload_id
    uploads = store.list_uploads(bkt)
    assert [u.key for u in uploads] == sorted(keys + ["a"], key=lambda k: k.encode())
    assert [u.upload_id for u in uploads if u.key == "a"] == sorted([ids["a"], second_a])
    assert [u.key for u in store.list_uploads(bkt, "a")] == ["a", "a", "a-b", "a/x"]
    assert {u.key: u.meta.user for u in uploads if u.upload_id in ids.values()}["b"] == {"k": "b"}
    before = store.count_uploads()
    assert before >= 6
    assert store.expire_uploads(time.time() - 3600) == 0
    assert store.count_uploads() == before
    assert store.expire_uploads(time.time() + 60) >= 6
    assert store.list_uploads(bkt) == []
    assert store.count_uploads() == 0


def test_check_and_close(store):
    store.check()


# -- the s3 backend's own pieces ---------------------------------------------------------


def test_a_key_the_upstream_would_store_as_another_is_refused(store, bkt):
    """SeaweedFS stores "\\" as "/": "\\x" would land on "x", and ESC (encoded ",\\") on
    the name of the key with "," before a slash. Such keys are refused there, never stored
    over another; elsewhere they are ordinary keys."""
    put(store, bkt, "x", b"original")
    put(store, bkt, "p/q", b"slash")
    for key in ("\\x", "p\\q", "win\\path\\file.txt", "esc\x1bx"):
        if store.kind == "s3":
            assert store.folds_backslash  # SeaweedFS 4.48 does
            with pytest.raises(StoreError) as err:
                put(store, bkt, key, b"refused")
            assert err.value.code == "InvalidArgument" and "backslash" in err.value.message
        else:
            put(store, bkt, key, key.encode())
            assert read(store, bkt, key) == key.encode()
    assert read(store, bkt, "x") == b"original" and read(store, bkt, "p/q") == b"slash"


def test_an_upstream_that_refuses_the_start_probes_still_serves(request, monkeypatch, tmp_path):
    """A bucket policy may forbid multipart uploads or copies to the gateway's probes: the
    safe answers are taken (backslash keys refused, multipart objects copied by parts)."""
    from botocore.exceptions import ClientError

    sw = request.getfixturevalue("seaweed")
    for name, value in sw.env.items():
        monkeypatch.setenv(name, value)
    store = S3Store(UPSTREAM_BUCKET, f"probe-{uuid.uuid4().hex[:8]}", sw.endpoint)
    real = store._call

    def refusing(operation, *args, **kwargs):
        if operation in ("create_multipart_upload", "put_object"):
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "policy"},
                               "ResponseMetadata": {"HTTPStatusCode": 403}}, operation)
        return real(operation, *args, **kwargs)

    monkeypatch.setattr(store, "_call", refusing)
    try:
        store.learn_quirks()
        assert store.folds_backslash and not store.copy_keeps_parts
    finally:
        store.close()


def test_key_encoding_round_trips_and_keeps_byte_order():
    rng = random.Random(4)
    alphabet = "ab/.-!,~ \t\x00é😀0Z_"
    keys = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(3000)}
    keys |= set(LIST_KEYS)
    for key in keys:
        name = encode_key(key)
        assert decode_key(name) == key
        assert "//" not in name and not name.endswith("/")
        assert all(seg not in (".", "..", "") for seg in name.split("/"))
        for cut in range(len(key) + 1):
            assert name.startswith(encode_prefix(key[:cut]))
    ordered = sorted(keys, key=lambda k: k.encode())
    names = [encode_key(k) for k in ordered]
    assert names == sorted(names, key=lambda n: n.encode())
    # file-tree order ("/" before every other byte, segment by segment) is the same order
    assert names == sorted(names, key=lambda n: [s.encode() for s in n.split("/")])
    for bad in ("a/b", "a.b", "a b", "x!", "a.~/", ",", ".q"):
        assert decode_key(bad) is None


def test_backend_urls():
    assert parse_location("s3://bucket") == parse_location("s3://bucket/")
    assert parse_location("s3://my-bucket/team/a/").prefix == "team/a/"
    assert parse_location("s3://my.bucket_1/p").prefix == "p/"
    for bad in ("gs://bucket", "bucket", "s3://", "s3:///x", "s3://B", "s3://a", "s3://b..x",
                "s3://bucket//x", "s3://bucket/./x", "s3://bucket/../x", "s3://bucket?x=1",
                "s3://bucket/p#f"):
        with pytest.raises(ValueError):
            parse_location(bad)
    with pytest.raises(ValueError) as err:
        parse_location("s3://AKIA:hunter2@bucket")
    assert "hunter2" not in str(err.value)


def test_layout_in_the_upstream_bucket(request, monkeypatch, tmp_path):
    sw = request.getfixturevalue("seaweed")
    for name, value in sw.env.items():
        monkeypatch.setenv(name, value)
    prefix = f"layout-{uuid.uuid4().hex[:6]}"
    store = S3Store(UPSTREAM_BUCKET, prefix, sw.endpoint)
    store.create_bucket("notes")
    put(store, "notes", "dir/a.txt", b"x")
    put(store, "notes", "dir/", b"")
    upload = store.create_multipart("notes", "big file", ObjectMeta())
    store.upload_part("notes", "big file", upload.upload_id, 1, io.BytesIO(b"p"), lambda: {"CRC32": "AAAAAA=="})
    client = sw.client()
    names = {o["Key"] for o in client.list_objects_v2(Bucket=UPSTREAM_BUCKET, Prefix=prefix + "/")
             .get("Contents", [])}
    assert names >= {f"{prefix}/_buckets/notes", f"{prefix}/notes/dir.~/a.-txt", f"{prefix}/notes/dir.~/!",
                     f"{prefix}/_uploads/notes/big,afile!{upload.upload_id}"}
    assert any(n.startswith(f"{prefix}/_parts/{upload.upload_id}/00001.") for n in names)
    head = client.head_object(Bucket=UPSTREAM_BUCKET, Key=f"{prefix}/notes/dir.~/a.-txt")
    assert set(head["Metadata"]) == {"orgmem"}
    store.close()


def test_one_sweep_goes_on_while_it_finds_stale_completion_records(store, bkt, monkeypatch):
    """Replacing a multipart object leaves its completion record stale; a sweep takes batch
    after batch while the last one found any, so heavy churn does not outgrow it."""
    if store.kind != "s3":
        pytest.skip("completion records exist on the s3 backend")
    import gateway.store.s3 as s3_module

    for _ in range(7):  # each completion replaces the one before: six stale records, one live
        upload = store.create_multipart(bkt, "churn", ObjectMeta())
        part = store.upload_part(bkt, "churn", upload.upload_id, 1, io.BytesIO(b"x" * 10), size=10)
        store.complete_multipart(bkt, "churn", upload.upload_id, [(1, part.etag)])
    root = f"{store.prefix}_done/"

    def records() -> int:
        return sum(len(r.get("Contents", ())) for r in store._list(root, ""))

    assert records() == 7
    monkeypatch.setattr(s3_module, "DONE_GRACE", -60.0)
    monkeypatch.setattr(s3_module, "DONE_SWEEP_BATCH", 2)
    store._sweep_done()
    assert records() == 1
    assert store.head_object(bkt, "churn").size == 10


def test_part_records_an_upload_left_behind_are_swept(store, bkt, monkeypatch):
    """A Complete or Abort clears its part records, unless the upstream refused that call
    just then: the upload sweep removes part records whose upload no longer exists."""
    if store.kind != "s3":
        pytest.skip("part records exist on the s3 backend")
    import gateway.store.s3 as s3_module

    live = store.create_multipart(bkt, "live", ObjectMeta())
    store.upload_part(bkt, "live", live.upload_id, 1, io.BytesIO(b"x" * 10), size=10)
    gone = store.create_multipart(bkt, "gone", ObjectMeta())
    store.upload_part(bkt, "gone", gone.upload_id, 1, io.BytesIO(b"y" * 10), size=10)
    monkeypatch.setattr(store, "_clear_parts", lambda upload_id: None)  # the upstream refused
    store.abort_multipart(bkt, "gone", gone.upload_id)
    monkeypatch.undo()

    def parts(upload_id: str) -> int:
        return sum(1 for _ in store._names(store._parts_prefix(upload_id)))

    assert parts(gone.upload_id) == 1
    store.expire_uploads(0)  # nothing expires; records younger than the grace stay
    assert parts(gone.upload_id) == 1
    monkeypatch.setattr(s3_module, "DONE_GRACE", -60.0)
    store.expire_uploads(0)
    assert parts(gone.upload_id) == 0 and parts(live.upload_id) == 1
