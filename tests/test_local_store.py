"""The embedded store on its own: races the S3 tests cannot time, and listing edge cases."""

from __future__ import annotations

import io
import threading

import pytest

from gateway.store.base import InvalidPart, NoSuchUpload, ObjectMeta, PreconditionFailed, WriteCondition
from gateway.store.local import LocalStore

MIB = 1024 * 1024


class HookedStore(LocalStore):
    """Pauses a named thread inside a method, so a race can be played out in a fixed order."""

    pause_in: str = ""
    thread_name: str = ""
    gate = threading.Event()

    def _maybe_pause(self, method: str) -> None:
        if method == self.pause_in and threading.current_thread().name == self.thread_name:
            assert self.gate.wait(10)

    def get_upload(self, *args):
        info = super().get_upload(*args)
        self._maybe_pause("get_upload")
        return info

    def _parts_snapshot(self, *args):
        snapshot = super()._parts_snapshot(*args)
        self._maybe_pause("_parts_snapshot")
        return snapshot


@pytest.fixture
def store(tmp_path):
    s = HookedStore(tmp_path / "store")
    s.gate = threading.Event()
    s.create_bucket("b")
    yield s
    s.close()


def _body(data: bytes) -> io.BytesIO:
    return io.BytesIO(data)


def _run(name: str, fn) -> tuple[threading.Thread, list]:
    outcome: list = []

    def target():
        try:
            outcome.append(fn())
        except Exception as exc:  # noqa: BLE001
            outcome.append(exc)

    thread = threading.Thread(target=target, name=name)
    thread.start()
    return thread, outcome


def test_abort_that_loses_to_complete_keeps_the_object(store):
    up = store.create_multipart("b", "k", ObjectMeta())
    part = store.upload_part("b", "k", up.upload_id, 1, _body(b"x" * 100))
    store.pause_in, store.thread_name = "get_upload", "aborter"
    thread, outcome = _run("aborter", lambda: store.abort_multipart("b", "k", up.upload_id))
    store.complete_multipart("b", "k", up.upload_id, [(1, part.etag)])
    store.gate.set()
    thread.join()
    assert isinstance(outcome[0], NoSuchUpload)
    reader = store.open_object("b", "k")
    assert reader.read(-1) == b"x" * 100


def test_part_reuploaded_during_complete_is_refused(store):
    up = store.create_multipart("b", "k", ObjectMeta())
    first = store.upload_part("b", "k", up.upload_id, 1, _body(b"old" * 10))
    store.pause_in, store.thread_name = "_parts_snapshot", "completer"
    thread, outcome = _run("completer", lambda: store.complete_multipart(
        "b", "k", up.upload_id, [(1, first.etag)]))
    store.upload_part("b", "k", up.upload_id, 1, _body(b"new" * 10))
    store.gate.set()
    thread.join()
    assert isinstance(outcome[0], (InvalidPart, NoSuchUpload))
    # The upload is intact with the new part and completes with it.
    parts = store.list_parts("b", "k", up.upload_id)
    store.complete_multipart("b", "k", up.upload_id, [(1, parts[0].etag)])
    assert store.open_object("b", "k").read(-1) == b"new" * 10


def test_conditional_put_checked_at_commit(store):
    store.put_object("b", "k", _body(b"1"), ObjectMeta(), WriteCondition(if_none_match=True))
    with pytest.raises(PreconditionFailed):
        store.put_object("b", "k", _body(b"2"), ObjectMeta(), WriteCondition(if_none_match=True))


def test_listing_skips_common_prefixes_and_high_bytes(store):
    keys = ["a/1", "a/2", "a\U0010ffff/x", "a\U0010ffff\U0010ffff", "b", "é/1", "é/2"]
    for key in keys:
        store.put_object("b", key, _body(b"."), ObjectMeta())
    page = store.list_objects("b", delimiter="/")
    assert page.common_prefixes == ["a/", "a\U0010ffff/", "é/"]
    assert [e.key for e in page.entries] == ["a\U0010ffff\U0010ffff", "b"]
    # Resuming after a common prefix does not report it again.
    page = store.list_objects("b", delimiter="/", after="a/", limit=1)
    assert page.common_prefixes == ["a\U0010ffff/"] and page.is_truncated
    assert [e.key for e in store.list_objects("b").entries] == sorted(keys, key=str.encode)


def test_large_object_bytes_live_in_files_and_are_reclaimed(store, tmp_path):
    store.put_object("b", "big", _body(b"z" * (2 * MIB)), ObjectMeta())
    files = list((tmp_path / "store" / "objects").rglob("*"))
    assert any(f.is_file() for f in files)
    store.copy_object("b", "big", "b", "copy", None)
    store.delete_object("b", "big")
    assert store.open_object("b", "copy").read(-1) == b"z" * (2 * MIB)
    store.delete_object("b", "copy")
    assert not [f for f in (tmp_path / "store" / "objects").rglob("*") if f.is_file()]


def test_identical_bytes_from_two_writers_one_wins(store):
    """A lock object whose body is the same for everyone is still exclusive."""
    store.put_object("b", "lock", _body(b"locked"), ObjectMeta(),
                     WriteCondition(if_none_match=True, writer="agent-1"))
    with pytest.raises(PreconditionFailed):
        store.put_object("b", "lock", _body(b"locked"), ObjectMeta(),
                         WriteCondition(if_none_match=True, writer="agent-2"))
    # The first writer's retry of the same write is recognised.
    info = store.put_object("b", "lock", _body(b"locked"), ObjectMeta(),
                            WriteCondition(if_none_match=True, writer="agent-1"))
    assert info.size == 6


def test_recovery_reports_missing_data_files(tmp_path):
    store = LocalStore(tmp_path / "s")
    store.create_bucket("b")
    store.put_object("b", "big", _body(b"q" * (1 * MIB)), ObjectMeta())
    data_file = next(f for f in (tmp_path / "s" / "objects").rglob("*") if f.is_file())
    (tmp_path / "s" / "tmp" / "leftover").write_bytes(b"partial")
    store.close()
    data_file.unlink()
    reopened = LocalStore(tmp_path / "s")
    try:
        assert reopened.recovery["temp_files_removed"] == 1
        assert reopened.recovery["missing_data_files"] == [str(data_file.relative_to(tmp_path / "s"))]
    finally:
        reopened.close()


def test_part_uploaded_during_complete_is_not_orphaned(store, tmp_path):
    """A part uploaded while a Complete runs (and not chosen by it) is removed with the upload."""
    up = store.create_multipart("b", "k", ObjectMeta())
    first = store.upload_part("b", "k", up.upload_id, 1, _body(b"a" * 10))
    store.pause_in, store.thread_name = "_parts_snapshot", "completer"
    thread, outcome = _run("completer", lambda: store.complete_multipart(
        "b", "k", up.upload_id, [(1, first.etag)]))
    store.upload_part("b", "k", up.upload_id, 2, _body(b"late"))
    store.gate.set()
    thread.join()
    assert not isinstance(outcome[0], Exception)
    part_files = [f for f in (tmp_path / "store" / "parts").rglob("*") if f.is_file()]
    assert len(part_files) == 1  # only the chosen part, now the object's data


def test_connections_of_threads_that_ended_are_closed(tmp_path):
    """Short-lived thread pools (log reads, collection) each open a connection per thread;
    those of ended threads are closed when the next one opens, so descriptors do not pile up."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    store = LocalStore(tmp_path / "data")
    try:
        store.create_bucket("b")

        def open_files() -> int:
            return sum(1 for fd in os.listdir("/proc/self/fd")
                       if os.path.realpath(f"/proc/self/fd/{fd}").startswith(str(tmp_path / "data" / "index.db")))

        for _ in range(10):
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda _: store.list_buckets(), range(8)))
        assert open_files() <= 3 * 9  # at most the last pool's eight and ours, each db, wal and shm
    finally:
        store.close()
