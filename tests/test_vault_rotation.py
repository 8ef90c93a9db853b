"""KEK rotation at the store level (gateway/rotation.py), without a gateway process: every sealed
object is counted and rewrapped, the vault's secret store included; multipart uploads in
progress hold their version; a damaged object is skipped and reported, never a failed batch."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.logs import log
from gateway.rotation import KeyRotation, RotationError
from gateway.sealing import REWRAP_CHECKPOINT, SEAL_RECORD, sealed_objects
from gateway.secret_store.service import Secrets
from gateway.store.base import INTERNAL_BUCKET, ObjectMeta, WriteCondition
from gateway.store.local import LocalStore
from gateway.store.objects import read_object
from gateway.store.sealed import SealedStore
from vault.keys import FileKeyring, WrappedKey, create_keyring

MIB5 = 5 * 2**20


def sealed_store(tmp_path: Path) -> SealedStore:
    inner = LocalStore(tmp_path / "data")
    keys = create_keyring(tmp_path / "ring.json", forbidden_dir=tmp_path / "data")
    store = SealedStore(inner, keys)
    inner.create_bucket(INTERNAL_BUCKET)
    store.create_bucket("b")
    return store


def reopened(store: SealedStore, tmp_path: Path) -> SealedStore:
    """The same data after a gateway restart: a fresh keyring read, nothing cached."""
    return SealedStore(store.inner, FileKeyring(tmp_path / "ring.json"))


def rewrap_all(rotation: KeyRotation, limit: int) -> list:
    batches = [rotation.rewrap(False, limit)]
    while not batches[-1].done:
        batches.append(rotation.rewrap(True, limit))
    return batches


def read(store: SealedStore, key: str) -> bytes:
    found = read_object(store, "b", key)
    assert found is not None
    return found[0]


def wrapped_version(store: SealedStore, bucket: str, key: str) -> int:
    return WrappedKey.decode(store.inner.head_object(bucket, key).meta.sealed).version


# -- the secret store's objects are sealed objects like any other ------------------------------------


def test_secrets_survive_rotate_rewrap_retire_and_a_restart(tmp_path):
    store = sealed_store(tmp_path)
    secrets = Secrets(store, store.keys)
    secrets.put("team/db-password", b"hunter2-rotation", by="root")
    secrets.put("team/api", b"first", by="root")
    secrets.put("team/api", b"second", by="root")
    # the unsealed bookkeeping stays out of the count (and out of rewrap)
    store.inner.put_object(INTERNAL_BUCKET, SEAL_RECORD, io.BytesIO(
        f'{{"kek_id": "{store.keys.kek_id}"}}'.encode()), ObjectMeta())
    vault_objects = [k for b, k in sealed_objects(store.inner) if k.startswith("vault/")]
    assert SEAL_RECORD not in vault_objects and len(vault_objects) == 5
    assert {k.split("/")[1] for k in vault_objects} == {"meta", "data"}
    # only the bookkeeping records themselves are left out: anything else unsealed is reported
    store.inner.put_object(INTERNAL_BUCKET, REWRAP_CHECKPOINT + ".unused", io.BytesIO(b"x"), ObjectMeta())
    rotation = KeyRotation(store, secrets)
    status = rotation.status()
    # 2 metadata objects and 3 records, besides the stray object written unsealed above
    assert status["objects_by_version"] == {"1": 5, "unsealed": 1}
    assert status["secrets_by_version"] == {"1": 3}
    store.inner.delete_object(INTERNAL_BUCKET, REWRAP_CHECKPOINT + ".unused")

    assert rotation.rotate() == 2
    with pytest.raises(RotationError) as refused:
        rotation.retire(1)
    assert refused.value.code == "DeleteConflict" and "5 objects" in refused.value.message
    batches = rewrap_all(rotation, 2)  # several batches, through the checkpoint
    assert len(batches) >= 3 and all(b.skipped == 0 for b in batches)
    status = rotation.status()
    assert status["objects_by_version"] == {"2": 5} and status["secrets_by_version"] == {"2": 3}
    for key in vault_objects:
        assert wrapped_version(store, INTERNAL_BUCKET, key) == 2, key
    assert rotation.retire(1) == {"retired": 1, "primary": 2}

    fresh = reopened(store, tmp_path)
    again = Secrets(fresh, fresh.keys)
    assert again.get("team/db-password")[0] == b"hunter2-rotation"
    assert again.get("team/api")[0] == b"second"
    assert again.get("team/api", 1)[0] == b"first"
    again.put("team/api", b"third", by="root")  # the metadata's compare-and-swap still works
    assert again.get("team/api")[0] == b"third"


# -- multipart uploads in progress --------------------------------------------------------------------


def test_uploads_in_progress_hold_their_version_until_done(tmp_path):
    store = sealed_store(tmp_path)
    rotation = KeyRotation(store)
    kept = store.create_multipart("b", "big", ObjectMeta())
    part = store.upload_part("b", "big", kept.upload_id, 1, io.BytesIO(b"a" * MIB5), size=MIB5)
    dropped = store.create_multipart("b", "dropped", ObjectMeta())
    assert rotation.status()["uploads_by_version"] == {"1": 2}

    rotation.rotate()
    rewrap_all(rotation, 100)
    status = rotation.status()
    assert status["uploads_by_version"] == {"1": 2} and status["uploads_total"] == 2
    with pytest.raises(RotationError) as refused:
        rotation.retire(1)
    message = refused.value.message
    assert refused.value.code == "DeleteConflict" and refused.value.status == 409
    assert "2 multipart uploads in progress" in message and "version 1" in message
    assert "abort" in message and "expire" in message
    assert 1 not in rotation.keys.retired_versions()

    # an upload started after rotation is under the new primary and does not hold version 1
    later = store.create_multipart("b", "later", ObjectMeta())
    assert rotation.status()["uploads_by_version"] == {"1": 2, "2": 1}
    # completing one (its data key is wrapped anew, under the primary) and aborting the other
    # frees version 1
    last = store.upload_part("b", "big", kept.upload_id, 2, io.BytesIO(b"b" * 10), size=10)
    store.complete_multipart("b", "big", kept.upload_id, [(1, part.etag), (2, last.etag)])
    store.abort_multipart("b", "dropped", dropped.upload_id)
    assert rotation.status()["uploads_by_version"] == {"2": 1}
    assert rotation.retire(1)["retired"] == 1

    fresh = reopened(store, tmp_path)
    assert read(fresh, "big") == b"a" * MIB5 + b"b" * 10
    fresh.upload_part("b", "later", later.upload_id, 1, io.BytesIO(b"c" * 10), size=10)


# -- damaged objects -------------------------------------------------------------------------------------


def damage_wrapped_key(store: SealedStore, key: str) -> None:
    """Bit rot in an object's wrapped key on the backend (its header still names version 1)."""
    info = store.inner.head_object("b", key)
    text = info.meta.sealed
    bad = text[:-4] + ("AAAA" if text[-4:] != "AAAA" else "BBBB")
    store.inner.copy_object("b", key, "b", key, replace(info.meta, sealed=bad),
                            WriteCondition(if_match=info.etag), source_etag=info.etag)


def test_rewrap_skips_and_reports_a_damaged_object(tmp_path, monkeypatch):
    logged = io.StringIO()
    monkeypatch.setattr(log, "_stream", logged)
    store = sealed_store(tmp_path)
    for key in ("a", "b-damaged", "c", "d", "e"):
        store.put_object("b", key, io.BytesIO(b"x" * 10), ObjectMeta())
    damage_wrapped_key(store, "b-damaged")
    wrapped = store.inner.head_object("b", "b-damaged").meta.sealed
    rotation = KeyRotation(store)
    rotation.rotate()

    first = rotation.rewrap(False, 2)
    assert first.done is False and first.skipped == 1 and first.skipped_keys == ["b/b-damaged"]
    assert first.rewrapped == 1 and first.position == ("b", "b-damaged")  # the checkpoint moved on
    rest = rewrap_all_from_checkpoint(rotation, 2)
    assert all(b.skipped == 0 for b in rest) and sum(b.rewrapped for b in rest) == 3
    for key in ("a", "c", "d", "e"):
        assert wrapped_version(store, "b", key) == 2
    assert rotation.status()["objects_by_version"] == {"1": 1, "2": 4}
    # the damaged object still uses version 1: retire refuses
    with pytest.raises(RotationError) as refused:
        rotation.retire(1)
    assert "1 objects" in refused.value.message and "damaged" in refused.value.message
    # logged by name, without key material
    text = logged.getvalue()
    assert "rewrap_skipped" in text and "b-damaged" in text
    assert wrapped not in text and wrapped[8:40] not in text
    # a whole run in one batch reports it too
    again = rotation.rewrap(False, 1000)
    assert again.done and again.skipped == 1 and again.skipped_keys == ["b/b-damaged"]


def rewrap_all_from_checkpoint(rotation: KeyRotation, limit: int) -> list:
    batches = [rotation.rewrap(True, limit)]
    while not batches[-1].done:
        batches.append(rotation.rewrap(True, limit))
    return batches


def test_rewrap_skips_a_damaged_secret_record(tmp_path, monkeypatch):
    monkeypatch.setattr(log, "_stream", io.StringIO())
    store = sealed_store(tmp_path)
    secrets = Secrets(store, store.keys)
    secrets.put("ok/one", b"value-one", by="root")
    secrets.put("bad/two", b"value-two", by="root")
    rotation = KeyRotation(store, secrets)
    rotation.rotate()
    # the record of bad/two claims a wrapped key that does not open (its seal is intact)
    from gateway.secret_store.paths import data_prefix
    from gateway.store.objects import write_object
    from vault import secrets as envelope

    key = store.list_objects(INTERNAL_BUCKET, data_prefix("bad/two")).entries[0].key
    record = envelope.SecretRecord.decode(read_object(store, INTERNAL_BUCKET, key)[0])
    other = envelope.seal(store.keys, "bad/two", 1, b"other").wrapped
    old = WrappedKey(other.kek_id, 1, other.blob)
    write_object(store, INTERNAL_BUCKET, key, replace(record, wrapped=old).encode(), "application/json")
    batch = rewrap_all(rotation, 100)[-1]
    assert batch.done and batch.skipped_keys == [f"{INTERNAL_BUCKET}/{key}"]
    assert rotation.status()["secrets_by_version"] == {"1": 1, "2": 1}
    with pytest.raises(RotationError):
        rotation.retire(1)
    assert secrets.get("ok/one")[0] == b"value-one"


def test_retire_never_goes_ahead_on_a_count_the_store_could_not_make(tmp_path, monkeypatch):
    """One object's HEAD failing for a moment once counted it as damaged, and retire went
    ahead while the object still used the version. Now the count fails, and an object whose
    wrapped key cannot be read holds retire back too."""
    from gateway.store.base import StoreUnavailable

    store = sealed_store(tmp_path)
    store.put_object("b", "k", io.BytesIO(b"still under version 1"), ObjectMeta())
    rotation = KeyRotation(store)
    rotation.rotate()
    real = store.key_version

    def failing(error):
        def key_version(bucket, key):
            if (bucket, key) == ("b", "k"):
                raise error
            return real(bucket, key)
        return key_version

    monkeypatch.setattr(store, "key_version", failing(StoreUnavailable("the upstream answered 503")))
    with pytest.raises(StoreUnavailable):
        rotation.retire(1)
    monkeypatch.setattr(store, "key_version", failing(ValueError("a wrapped key that cannot be read")))
    with pytest.raises(RotationError) as refused:
        rotation.retire(1)
    assert "cannot be read" in refused.value.message
    monkeypatch.undo()
    assert 1 in store.keys.versions() and read(store, "k") == b"still under version 1"


def test_a_resumed_rewrap_after_another_rotation_starts_over(tmp_path):
    """A checkpoint left by a rewrap to version 2, resumed after a rotation to 3, once
    skipped what the first batch had passed and then said everything was under 3."""
    store = sealed_store(tmp_path)
    for n in range(6):
        store.put_object("b", f"k{n}", io.BytesIO(b"x"), ObjectMeta())
    rotation = KeyRotation(store)
    rotation.rotate()
    assert not rotation.rewrap(False, 3).done  # interrupted after one batch
    rotation.rotate()
    rewrap_all_resumed = [rotation.rewrap(True, 3)]
    while not rewrap_all_resumed[-1].done:
        rewrap_all_resumed.append(rotation.rewrap(True, 3))
    assert set(rotation.status()["objects_by_version"]) == {"3"}


def test_a_keyring_that_cannot_be_changed_is_said_so(tmp_path):
    store = sealed_store(tmp_path)
    rotation = KeyRotation(store)
    (tmp_path / "ring.json").chmod(0o644)
    with pytest.raises(RotationError) as refused:
        rotation.rotate()
    assert refused.value.code == "KeyringError" and "ring.json" in refused.value.message
    (tmp_path / "ring.json").chmod(0o600)
    assert rotation.rotate() == 2


def test_rewrap_keeps_last_modified_and_the_files(tmp_path):
    """A rewrap changes the wrapped key only: Last-Modified moved to the rewrap's time once
    (If-Unmodified-Since then failed, mtime-based syncs saw every object as changed)."""
    store = sealed_store(tmp_path)
    store.put_object("b", "small", io.BytesIO(b"inline"), ObjectMeta(user={"a": "1"}))
    store.put_object("b", "large", io.BytesIO(b"x" * 300_000), ObjectMeta())
    before = {k: store.inner.head_object("b", k) for k in ("small", "large")}
    files = store.inner._row("b", "large", with_data=False)[4]
    rotation = KeyRotation(store)
    rotation.rotate()
    rewrap_all(rotation, 10)
    for key, info in before.items():
        after = store.inner.head_object("b", key)
        assert (after.last_modified, after.etag) == (info.last_modified, info.etag)
        assert wrapped_version(store, "b", key) == 2
    assert store.inner._row("b", "large", with_data=False)[4] == files  # not relinked
    assert read(store, "small") == b"inline" and read(store, "large") == b"x" * 300_000
    assert store.head_object("b", "small").meta.user == {"a": "1"}


def test_rewrap_never_undoes_a_metadata_change_made_while_it_ran(tmp_path, monkeypatch):
    """A metadata-only copy (s3fs chmod, copy-object with REPLACE) keeps the ETag, so a rewrap
    pinned to the ETag alone wrote back the metadata it had read before the copy."""
    store = sealed_store(tmp_path)
    store.put_object("b", "k", io.BytesIO(b"data"), ObjectMeta(user={"mode": "0644"}))
    rotation = KeyRotation(store)
    rotation.rotate()
    real_head = store.inner.head_object

    def head_then_chmod(bucket, key):
        info = real_head(bucket, key)
        monkeypatch.setattr(store.inner, "head_object", real_head)  # the copy reads it too
        store.copy_object("b", "k", "b", "k", ObjectMeta(user={"mode": "0600"}))
        return info

    monkeypatch.setattr(store.inner, "head_object", head_then_chmod)
    assert store.rewrap("b", "k") is False  # the copy won: it was sealed under the primary
    monkeypatch.undo()
    assert store.head_object("b", "k").meta.user == {"mode": "0600"}
    assert read(store, "k") == b"data" and wrapped_version(store, "b", "k") == 2


def test_a_gateway_holding_an_older_keyring_copy_cannot_rotate(tmp_path):
    """Replicas each hold a copy of the keyring. A rotation on one whose copy predates another
    replica's rotation made a second, different version 2 (and made it primary) before the
    seal record was asked: what each wrote under "2" the other could not read."""
    import shutil

    from gateway.sealing import _write_seal_record, announce_key_check

    store = sealed_store(tmp_path)
    _write_seal_record(store.inner, store.keys)
    shutil.copy2(tmp_path / "ring.json", tmp_path / "copy.json")
    other = SealedStore(store.inner, FileKeyring(tmp_path / "copy.json"))  # a second replica
    assert KeyRotation(store).rotate() == 2
    before = (tmp_path / "copy.json").read_bytes()
    with pytest.raises(RotationError) as refused:
        KeyRotation(other).rotate()
    assert refused.value.status == 409 and "lacks KEK version(s) [2]" in refused.value.message
    assert (tmp_path / "copy.json").read_bytes() == before and other.keys.primary_version() == 1
    # two rotations at once: the number is taken in the seal record before the keyring is written
    shutil.copy2(tmp_path / "ring.json", tmp_path / "copy.json")
    racer = SealedStore(store.inner, FileKeyring(tmp_path / "copy.json"))
    announce_key_check(store.inner, 3, "0" * 32)  # the other replica's rotation lands first
    before = (tmp_path / "copy.json").read_bytes()
    with pytest.raises(RotationError) as refused:
        KeyRotation(racer).rotate()
    assert refused.value.status == 409 and (tmp_path / "copy.json").read_bytes() == before
