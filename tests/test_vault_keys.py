"""Key providers and wrapped keys (vault/keys.py): the file keyring (create, rotate, retire,
reload, permission and data-dir refusals), env and passphrase KEKs, and AWS KMS against a real
moto server process, including the intermediate-key cache and rotation to a second key."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from vault import keys
from vault.keys import (
    EnvKeyProvider,
    FileKeyring,
    KeyProvider,
    KeyringError,
    KeyUnavailable,
    KmsKeyProvider,
    MemorySaltStore,
    MissingKey,
    PassphraseKeyProvider,
    UnwrapError,
    VaultError,
    WrappedKey,
    WrongKey,
    create_keyring,
    parse_kms_spec,
    provider_from_spec,
)

DEK = bytes(range(32))
AAD = b"orgmem-object\x00bucket\x00key"


def secret_free(text: str, *secrets: bytes | str) -> bool:
    """No secret in any of its usual spellings appears in ``text``."""
    for secret in secrets:
        raw = secret.encode() if isinstance(secret, str) else secret
        spellings = {raw.hex(), base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()}
        if isinstance(secret, str):
            spellings.add(secret)
        if any(s.rstrip("=") in text for s in spellings if len(s) >= 8):
            return False
    return True


def assert_binds(provider: KeyProvider) -> WrappedKey:
    """Wrap/unwrap round trip; another identity, a flipped bit, another version fail."""
    wrapped = provider.wrap(DEK, AAD)
    assert wrapped.kek_id == provider.kek_id and wrapped.version == provider.primary_version()
    again = WrappedKey.decode(wrapped.encode())
    assert again == wrapped
    assert provider.unwrap(again, AAD) == DEK
    with pytest.raises(UnwrapError):
        provider.unwrap(wrapped, AAD + b"2")  # moved to another object
    blob = bytearray(wrapped.blob)
    blob[-1] ^= 1
    with pytest.raises(UnwrapError):
        provider.unwrap(WrappedKey(wrapped.kek_id, wrapped.version, bytes(blob)), AAD)
    with pytest.raises(UnwrapError):
        provider.unwrap(WrappedKey(wrapped.kek_id, wrapped.version, wrapped.blob[:-1]), AAD)
    with pytest.raises(UnwrapError, match="wrong key"):
        provider.unwrap(WrappedKey("another-kek", wrapped.version, wrapped.blob), AAD)
    with pytest.raises(UnwrapError):
        provider.unwrap(WrappedKey(wrapped.kek_id, 77, wrapped.blob), AAD)
    two = provider.wrap(DEK, AAD)
    assert two.blob != wrapped.blob  # a fresh nonce every time
    return wrapped


# -- wrapped keys ---------------------------------------------------------------------------------


def test_wrapped_key_encoding():
    w = WrappedKey("2a833dfb-64b6-49c9-872e-004afe4ebe58", 3, os.urandom(60))
    text = w.encode()
    assert text.isascii() and " " not in text and "=" not in text and len(text) < 400
    assert WrappedKey.decode(text) == w
    assert WrappedKey.decode(f"  {text}\n") == w
    assert "blob=<60 bytes>" in repr(w) and w.blob.hex() not in repr(w)
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    assert raw[0] == 1 and raw[1] == 36 and raw[2:38] == w.kek_id.encode()
    assert int.from_bytes(raw[38:42], "big") == 3 and raw[42:] == w.blob


@pytest.mark.parametrize("garbage", [
    "", "   ", "!!!", "abc def", "a" * 3000, "AQ", base64.urlsafe_b64encode(b"\x02\x03abc\0\0\0\1x").decode(),
    base64.urlsafe_b64encode(b"\x01\x10abc").decode(),  # truncated
    base64.urlsafe_b64encode(b"\x01\x03a b\0\0\0\1x").decode(),  # bad kek id
    base64.urlsafe_b64encode(b"\x01\x03abc\0\0\0\0x").decode(),  # version 0
    base64.urlsafe_b64encode(b"\x01\x03abc\0\0\0\1").decode(),  # no blob
    base64.urlsafe_b64encode(b"\x01\x03\xff\xfe\xfd\0\0\0\1x").decode(),  # not ASCII
    "A",  # not a valid base64 length
])
def test_wrapped_key_garbage_is_a_clear_value_error(garbage):
    with pytest.raises(ValueError, match="not a wrapped data key"):
        WrappedKey.decode(garbage)


# -- file keyring ----------------------------------------------------------------------------------


def test_create_keyring(tmp_path):
    path = tmp_path / "secrets" / "keyring.json"
    ring = create_keyring(path, forbidden_dir=tmp_path / "data")
    assert ring.created and isinstance(ring, KeyProvider)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    doc = json.loads(path.read_text())
    assert doc["format"] == "orgmem-keyring" and doc["format_version"] == 1
    assert doc["kek_id"] == ring.kek_id and doc["primary"] == 1
    assert set(doc["versions"]) == {"1"} and doc["versions"]["1"]["retired"] is None
    key = base64.b64decode(doc["versions"]["1"]["key"])
    assert len(key) == 32 and secret_free(repr(ring), key)
    assert [p.name for p in path.parent.iterdir()] == ["keyring.json"]  # no temp files left
    assert ring.primary_version() == 1 and ring.versions() == [1]
    wrapped = assert_binds(ring)
    assert len(wrapped.encode()) < 200
    # a second keyring has another id: its keys are "wrong key" for the first one's data
    other = create_keyring(tmp_path / "other.json")
    assert other.kek_id != ring.kek_id
    with pytest.raises(UnwrapError, match="wrong key"):
        other.unwrap(wrapped, AAD)


def test_create_refuses_an_existing_file(tmp_path):
    path = tmp_path / "keyring.json"
    create_keyring(path)
    before = path.read_bytes()
    with pytest.raises(KeyringError, match="already exists"):
        create_keyring(path)
    assert path.read_bytes() == before


def test_keyring_inside_the_data_dir_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for path in (data / "keyring.json", data / "sub" / "k.json", data):
        with pytest.raises(KeyringError, match="inside the data directory"):
            create_keyring(path, forbidden_dir=data)
    # also when reached through a symlink, and when the file already exists
    (tmp_path / "link").symlink_to(data)
    with pytest.raises(KeyringError, match="inside the data directory"):
        create_keyring(tmp_path / "link" / "k.json", forbidden_dir=data)
    create_keyring(data / "k.json")
    with pytest.raises(KeyringError, match="inside the data directory"):
        FileKeyring(data / "k.json", forbidden_dir=data)
    with pytest.raises(KeyringError, match="inside the data directory"):
        provider_from_spec(f"file:{data / 'k.json'}", default_keyring=tmp_path / "d.json",
                           passphrase_salt_store=None, forbidden_dir=data)
    assert not list(data.glob("keyring*"))


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o700 | 0o004])
def test_keyring_with_group_or_other_permissions_is_refused(tmp_path, mode):
    path = tmp_path / "keyring.json"
    create_keyring(path)
    os.chmod(path, mode)
    with pytest.raises(KeyringError, match=f"chmod 600 {path}"):
        FileKeyring(path)
    os.chmod(path, 0o600)
    FileKeyring(path)
    os.chmod(path, 0o400)  # read-only for the owner is fine
    FileKeyring(path)


def test_missing_and_malformed_keyrings(tmp_path):
    with pytest.raises(MissingKey, match="does not exist.*backup"):
        FileKeyring(tmp_path / "nope.json")
    path = tmp_path / "bad.json"
    key = os.urandom(32)
    docs = {
        "not JSON": "{",
        "format": json.dumps({"format": "x"}),
        "short key": json.dumps({"format": "orgmem-keyring", "format_version": 1, "kek_id": "k",
                                 "primary": 1, "versions": {"1": {"key": base64.b64encode(key[:31]).decode()}}}),
        "primary": json.dumps({"format": "orgmem-keyring", "format_version": 1, "kek_id": "k",
                               "primary": 2, "versions": {"1": {"key": base64.b64encode(key).decode()}}}),
        "version 9": json.dumps({"format": "orgmem-keyring", "format_version": 9}),
    }
    for reason, text in docs.items():
        path.write_text(text)
        os.chmod(path, 0o600)
        with pytest.raises(KeyringError, match="not a valid orgmem keyring") as err:
            FileKeyring(path)
        assert secret_free(str(err.value), key, key[:31]), reason


def test_rotate_retire_unretire(tmp_path):
    ring = create_keyring(tmp_path / "keyring.json")
    old = ring.wrap(DEK, AAD)
    assert ring.rotate() == 2
    assert ring.primary_version() == 2 and ring.versions() == [1, 2]
    new = ring.wrap(DEK, AAD)
    assert new.version == 2 and new.kek_id == old.kek_id
    assert ring.unwrap(old, AAD) == DEK and ring.unwrap(new, AAD) == DEK
    assert keys.rewrap(ring, old, AAD).version == 2
    moved = keys.rewrap(ring, old, AAD, b"new identity")
    assert ring.unwrap(moved, b"new identity") == DEK
    with pytest.raises(KeyringError, match="primary"):
        ring.retire(2)
    with pytest.raises(KeyringError, match="no version 5"):
        ring.retire(5)
    ring.retire(1)
    assert ring.versions() == [2] and ring.retired_versions() == [1]
    with pytest.raises(UnwrapError, match="retired"):
        ring.unwrap(old, AAD)
    doc = json.loads((tmp_path / "keyring.json").read_text())
    assert doc["versions"]["1"]["retired"] and doc["versions"]["2"]["retired"] is None
    assert stat.S_IMODE((tmp_path / "keyring.json").stat().st_mode) == 0o600
    # the retired state survives a restart, and can be undone
    again = FileKeyring(tmp_path / "keyring.json")
    assert again.versions() == [2] and again.primary_version() == 2
    again.unretire(1)
    assert again.unwrap(old, AAD) == DEK
    assert [d["version"] for d in again.describe()] == [1, 2]
    assert all("key" not in d for d in again.describe())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keyring.json"]


def test_a_keyring_reached_through_a_symlink_is_rotated_in_place(tmp_path):
    """Rotating through a symlink once replaced the link with a file of its own: the real
    keyring (the one backed up) kept the old versions only."""
    real = tmp_path / "real" / "keyring.json"
    create_keyring(real)
    (tmp_path / "link").mkdir()
    link = tmp_path / "link" / "keyring.json"
    link.symlink_to(real)
    ring = FileKeyring(link)
    assert ring.rotate() == 2
    assert link.is_symlink() and FileKeyring(real).versions() == [1, 2]
    assert sorted(p.name for p in (tmp_path / "link").iterdir()) == ["keyring.json"]
    # re-pointed (a Kubernetes Secret volume swaps its link): read through the link again
    import shutil

    shutil.copytree(tmp_path / "real", tmp_path / "next")
    FileKeyring(tmp_path / "next" / "keyring.json").rotate()
    link.unlink()
    link.symlink_to(tmp_path / "next" / "keyring.json")
    reader = FileKeyring(link, reload_interval=0)
    assert reader.primary_version() == 3
    ring._checked = 0  # as if the reload interval had passed
    wrapped = reader.wrap(DEK, AAD)
    assert ring.unwrap(wrapped, AAD) == DEK  # the first keyring object follows the link too


def test_reload_sees_rotation_by_another_process(tmp_path):
    path = tmp_path / "keyring.json"
    gateway = create_keyring(path)
    gateway.reload_interval = 3600  # only explicit reloads here
    before = gateway.wrap(DEK, AAD)
    assert gateway.reload() is False
    cli = FileKeyring(path)  # `orgmem vault kek rotate` in another process
    assert cli.rotate() == 2
    assert gateway.primary_version() == 1
    assert gateway.reload() is True
    assert gateway.primary_version() == 2 and gateway.wrap(DEK, AAD).version == 2
    assert gateway.reload() is False
    # unwrap of a version it has not seen yet reloads by itself
    assert cli.rotate() == 3
    newer = cli.wrap(DEK, AAD)
    assert gateway.unwrap(newer, AAD) == DEK and gateway.primary_version() == 3
    assert gateway.unwrap(before, AAD) == DEK
    # wrap notices a rotation after reload_interval
    gateway.reload_interval = 0
    cli.rotate()
    assert gateway.wrap(DEK, AAD).version == 4
    # a keyring replaced by one of another KEK is refused, and the old keys stay in use
    os.unlink(path)
    create_keyring(path)
    with pytest.raises(KeyringError, match="another KEK"):
        gateway.reload()
    assert gateway.wrap(DEK, AAD).kek_id == before.kek_id


def test_an_older_copy_of_the_keyring_put_in_place_is_refused(tmp_path):
    """A keyring from before a rotation (a backup restored, config management) was adopted
    while running: version 2 vanished from memory, and the next rotate made a new random key
    numbered 2, so what version 2 had wrapped could never be read again."""
    import shutil

    path = tmp_path / "keyring.json"
    gateway = create_keyring(path)
    gateway.reload_interval = 0
    shutil.copy2(path, tmp_path / "before-rotation.json")
    assert gateway.rotate() == 2
    under_two = gateway.wrap(DEK, AAD)
    checks = gateway.key_checks()
    os.replace(tmp_path / "before-rotation.json", path)
    with pytest.raises(KeyringError, match=r"lacks version\(s\) \[2\]"):
        gateway.reload()
    assert gateway.reload() is False  # refused once; the same file is not read again
    assert gateway.wrap(DEK, AAD).version == 2 and gateway.unwrap(under_two, AAD) == DEK
    assert gateway.key_checks() == checks
    with pytest.raises(KeyringError, match="older copy"):
        gateway.rotate()  # would have reused the number 2 for a new key
    # another key under a version number it holds is refused as well
    other = FileKeyring(path)
    other.rotate()  # the stale file's own "version 2": a different key
    with pytest.raises(KeyringError, match=r"holds other keys for version\(s\) \[2\]"):
        gateway.reload()
    assert gateway.unwrap(under_two, AAD) == DEK


def test_key_checks_tell_keys_apart_without_revealing_them(tmp_path):
    ring = create_keyring(tmp_path / "keyring.json")
    ring.rotate()
    checks = ring.key_checks()
    assert sorted(checks) == [1, 2] and checks[1] != checks[2]
    assert all(len(c) == 32 for c in checks.values())
    raw = (tmp_path / "keyring.json").read_text()
    assert not any(c in raw for c in checks.values())
    assert FileKeyring(tmp_path / "keyring.json").key_checks() == checks


def test_default_keyring_is_created_once(tmp_path):
    default = tmp_path / "config" / "keyring.json"
    kwargs = dict(default_keyring=default, passphrase_salt_store=None, forbidden_dir=tmp_path / "data")
    first = provider_from_spec("", **kwargs)
    assert isinstance(first, FileKeyring) and first.created and default.exists()
    second = provider_from_spec("", **kwargs)
    assert not second.created and second.kek_id == first.kek_id
    with pytest.raises(MissingKey, match="restore the keyring"):
        provider_from_spec("", **{**kwargs, "default_keyring": tmp_path / "gone.json"},
                           create_default=False)
    with pytest.raises(KeyringError, match="inside the data directory"):
        provider_from_spec("", **{**kwargs, "default_keyring": tmp_path / "data" / "k.json"})
    assert isinstance(provider_from_spec(f"file:{default}", **kwargs), FileKeyring)
    with pytest.raises(MissingKey, match="does not exist"):
        provider_from_spec(f"file:{tmp_path / 'absent.json'}", **kwargs)


def test_unknown_spec_never_echoes_it(tmp_path):
    key = base64.b64encode(os.urandom(32)).decode()
    for spec in (key, "s3:whatever", "kms:abc", "file", "env"):
        with pytest.raises(VaultError, match="use file:PATH") as err:
            provider_from_spec(spec, default_keyring=tmp_path / "k", passphrase_salt_store=None)
        assert secret_free(str(err.value), key)


# -- env -------------------------------------------------------------------------------------------


def test_env_provider(tmp_path):
    key = os.urandom(32)
    spellings = [base64.b64encode(key).decode(), base64.urlsafe_b64encode(key).decode().rstrip("="),
                 key.hex(), key.hex().upper(), f"  {base64.b64encode(key).decode()}\n"]
    ids = set()
    for text in spellings:
        p = provider_from_spec("env:MY_KEK", default_keyring=tmp_path / "k",
                               passphrase_salt_store=None, env={"MY_KEK": text})
        assert isinstance(p, EnvKeyProvider) and p.versions() == [1]
        ids.add(p.kek_id)
        assert secret_free(repr(p), key)
    assert len(ids) == 1 and ids.pop().startswith("env-")
    wrapped = assert_binds(p)
    other = EnvKeyProvider("K", {"K": base64.b64encode(os.urandom(32)).decode()})
    assert other.kek_id != p.kek_id
    with pytest.raises(UnwrapError, match="wrong key"):
        other.unwrap(wrapped, AAD)


def test_env_provider_bad_values():
    with pytest.raises(MissingKey, match="MY_KEK is not set.*base64"):
        EnvKeyProvider("MY_KEK", {})
    with pytest.raises(MissingKey):
        EnvKeyProvider("MY_KEK", {"MY_KEK": "   "})
    bad = [base64.b64encode(os.urandom(31)).decode(), base64.b64encode(os.urandom(33)).decode(),
           os.urandom(32).hex()[:-2], "correct horse battery staple", "zz" * 32, "%%%%"]
    for value in bad:
        with pytest.raises(VaultError, match="does not hold a 32-byte key") as err:
            EnvKeyProvider("MY_KEK", {"MY_KEK": value})
        assert value not in str(err.value)
    key = base64.b64encode(os.urandom(32)).decode()
    with pytest.raises(VaultError, match="name of an environment variable") as err:
        EnvKeyProvider(key, {})
    assert key not in str(err.value)


def test_a_key_pasted_as_a_name_or_path_is_never_echoed(tmp_path):
    """--kek env:<the key> or file:<the key>: the error says what is wrong, never the value."""
    for _ in range(20):
        raw = os.urandom(32)
        for key in (raw.hex(), "c" + raw.hex()[1:], raw.hex().upper(), base64.b64encode(raw).decode(),
                    base64.urlsafe_b64encode(raw).decode().rstrip("="), raw.hex()[:32]):
            for spec in (f"env:{key}", f"file:{key}", f" env:{key} ", f"aws-kms:{key}"):
                with pytest.raises(VaultError) as err:
                    provider_from_spec(spec, default_keyring=tmp_path / "k", passphrase_salt_store=None,
                                       env={})
                text = str(err.value)
                assert key not in text and key.strip("=")[:16] not in text, (spec, text)
                assert secret_free(text, raw)
                assert "did you paste the key itself" in text, text
    # a real variable name is still named, so the operator knows which one to set
    with pytest.raises(MissingKey, match="ORGMEM_TEST_KEK is not set"):
        provider_from_spec("env:ORGMEM_TEST_KEK", default_keyring=tmp_path / "k",
                           passphrase_salt_store=None, env={})
    # an unusual (lower-case) name works, but is not repeated in errors
    good = base64.b64encode(os.urandom(32)).decode()
    assert EnvKeyProvider("kek_var", {"kek_var": good}).versions() == [1]
    with pytest.raises(MissingKey) as err:
        EnvKeyProvider("s3cretlowercase", {})
    assert "s3cretlowercase" not in str(err.value)
    # a keyring path is still named
    with pytest.raises(MissingKey, match="nothere.json"):
        provider_from_spec(f"file:{tmp_path / 'nothere.json'}", default_keyring=tmp_path / "k",
                           passphrase_salt_store=None)


# -- passphrase --------------------------------------------------------------------------------------


def test_passphrase_right_and_wrong(tmp_path):
    store = MemorySaltStore()
    kwargs = dict(default_keyring=tmp_path / "k", passphrase_salt_store=store)
    first = provider_from_spec("passphrase", **kwargs, env={"ORGMEM_KEK_PASSPHRASE": "correct horse"})
    assert isinstance(first, PassphraseKeyProvider) and first.created
    record = store.get()
    assert record is not None and b"correct horse" not in record
    assert record[:4] == b"OMPS" and record[5:8] == bytes([15, 8, 1])
    wrapped = assert_binds(first)
    again = provider_from_spec("passphrase", **kwargs, env={"ORGMEM_KEK_PASSPHRASE": "correct horse"})
    assert not again.created and again.kek_id == first.kek_id and store.get() == record
    assert again.unwrap(wrapped, AAD) == DEK
    with pytest.raises(WrongKey, match="wrong KEK passphrase") as err:
        provider_from_spec("passphrase", **kwargs, env={"ORGMEM_KEK_PASSPHRASE": "correct horsf"})
    assert "horsf" not in str(err.value) and isinstance(err.value, MissingKey)
    assert secret_free(repr(first), "correct horse")
    # another deployment (another salt), same passphrase: another KEK
    other = PassphraseKeyProvider("correct horse", MemorySaltStore())
    assert other.kek_id != first.kek_id
    with pytest.raises(UnwrapError, match="wrong key"):
        other.unwrap(wrapped, AAD)


def test_passphrase_missing_prompted_and_refused(tmp_path):
    store = MemorySaltStore()
    kwargs = dict(default_keyring=tmp_path / "k", passphrase_salt_store=store)
    with pytest.raises(MissingKey, match="ORGMEM_KEK_PASSPHRASE"):
        provider_from_spec("passphrase", **kwargs, env={})
    with pytest.raises(VaultError, match="at least 8"):
        provider_from_spec("passphrase", **kwargs, env={"ORGMEM_KEK_PASSPHRASE": "short"})
    asked: list[str] = []
    answers = iter(["a long passphrase", "a long typo"])
    with pytest.raises(VaultError, match="differ"):
        provider_from_spec("passphrase", **kwargs, env={},
                           prompt=lambda q: (asked.append(q), next(answers))[1])
    assert store.get() is None and len(asked) == 2
    answers = iter(["a long passphrase", "a long passphrase"])
    created = provider_from_spec("passphrase", **kwargs, env={}, prompt=lambda q: next(answers))
    asked.clear()
    opened = provider_from_spec("passphrase", **kwargs, env={},
                                prompt=lambda q: (asked.append(q), "a long passphrase")[1])
    assert asked == ["KEK passphrase: "] and opened.kek_id == created.kek_id
    with pytest.raises(WrongKey):
        provider_from_spec("passphrase", **kwargs, env={}, prompt=lambda q: "not it at all")
    with pytest.raises(VaultError, match="salt"):
        provider_from_spec("passphrase", default_keyring=tmp_path / "k", passphrase_salt_store=None,
                           env={"ORGMEM_KEK_PASSPHRASE": "a long passphrase"})


def test_passphrase_salt_record_damaged_or_raced():
    for record in (b"", b"OMPS", b"OMPS\x01\x0f\x08\x01\x10" + bytes(10), b"XXXX" + bytes(60),
                   b"OMPS\x01\x30\x08\x01\x10" + bytes(48)):  # 2**48 would be a denial of service
        with pytest.raises(VaultError, match="malformed"):
            PassphraseKeyProvider("a long passphrase", MemorySaltStore(record))

    class Racing(MemorySaltStore):
        """Another gateway stores its record first; our conditional put fails."""

        def __init__(self, winner: bytes) -> None:
            super().__init__()
            self.winner = winner

        def get(self):
            return self.salt

        def put(self, salt):
            self.salt = self.winner
            raise RuntimeError("PreconditionFailed")

    winner_store = MemorySaltStore()
    winner = PassphraseKeyProvider("a long passphrase", winner_store)
    loser = PassphraseKeyProvider("a long passphrase", Racing(winner_store.get()))
    assert loser.kek_id == winner.kek_id and not loser.created


# -- AWS KMS against a real moto server --------------------------------------------------------------

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def kms(moto):
    return boto3.client("kms", endpoint_url=moto, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def kms_provider(moto, spec: str, **kw) -> KmsKeyProvider:
    env = {**AWS_ENV, "AWS_ENDPOINT_URL_KMS": moto}
    p = provider_from_spec(spec, default_keyring=Path("/nonexistent"), passphrase_salt_store=None,
                           env=env)
    assert isinstance(p, KmsKeyProvider)
    for name, value in kw.items():
        setattr(p, name, value)
    return p


def count_requests(provider: KmsKeyProvider) -> list[str]:
    """KMS operations sent over HTTP, counted by botocore itself."""
    sent: list[str] = []
    provider.client.meta.events.register("before-send.kms",
                                         lambda request, **_: sent.append(request.headers["X-Amz-Target"].decode().split(".")[-1]))
    return sent


def test_kms_wrap_unwrap_and_the_intermediate_cache(moto, kms):
    key = kms.create_key(Description="orgmem test")["KeyMetadata"]["KeyId"]
    p = kms_provider(moto, f"aws-kms:{key}")
    assert p.kek_id == "aws-kms" and p.versions() == [1] and p.primary_version() == 1
    assert p.calls["DescribeKey"] == 1
    sent = count_requests(p)
    wrapped = [p.wrap(os.urandom(32), f"object {i}".encode()) for i in range(200)]
    assert p.calls["GenerateDataKey"] == 1 and sent == ["GenerateDataKey"]
    text = wrapped[0].encode()
    assert len(text) < 400, len(text)
    assert WrappedKey.decode(text) == wrapped[0]
    assert_binds(p)
    # a fresh gateway: one Decrypt opens every key wrapped under the same intermediate
    q = kms_provider(moto, f"aws-kms:{key}")
    sent = count_requests(q)
    for i, w in enumerate(wrapped):
        assert len(q.unwrap(w, f"object {i}".encode())) == 32
    assert q.calls["Decrypt"] == 1 and sent == ["Decrypt"]
    with pytest.raises(UnwrapError):
        q.unwrap(wrapped[0], b"object 1")  # moved to another object


def test_kms_concurrent_wraps_share_one_intermediate(moto, kms):
    from concurrent.futures import ThreadPoolExecutor

    key = kms.create_key()["KeyMetadata"]["KeyId"]
    p = kms_provider(moto, f"aws-kms:{key}")
    with ThreadPoolExecutor(8) as pool:
        wrapped = list(pool.map(lambda i: p.wrap(DEK, b"%d" % i), range(400)))
    assert p.calls["GenerateDataKey"] == 1
    q = kms_provider(moto, f"aws-kms:{key}")
    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(lambda iw: q.unwrap(iw[1], b"%d" % iw[0]), enumerate(wrapped))) == {DEK}
    assert 1 <= q.calls["Decrypt"] <= 8  # threads may race to open the same intermediate


def test_kms_intermediate_expires_by_time_and_uses(moto, kms):
    key = kms.create_key()["KeyMetadata"]["KeyId"]
    now = [1000.0]
    p = kms_provider(moto, f"aws-kms:{key}", _clock=lambda: now[0], max_uses=5)
    intermediates = {p.wrap(DEK, AAD).blob[:-60] for _ in range(12)}
    assert p.calls["GenerateDataKey"] == 3 and len(intermediates) == 3  # 5 + 5 + 2 uses
    now[0] += p.ttl + 1
    p.wrap(DEK, AAD)
    assert p.calls["GenerateDataKey"] == 4
    # the unwrap cache is a bounded LRU
    q = kms_provider(moto, f"aws-kms:{key}", cache_size=2, max_uses=1)
    ws = [q.wrap(DEK, AAD) for _ in range(3)]
    assert q.calls["GenerateDataKey"] == 3 and len(q._opened) == 2
    for w in reversed(ws):
        assert q.unwrap(w, AAD) == DEK
    assert q.calls["Decrypt"] == 1  # only the evicted first one needed KMS
    assert len(q._opened) == 2


def test_kms_rotation_to_a_second_key(moto, kms):
    k1 = kms.create_key()["KeyMetadata"]["Arn"]
    k2 = kms.create_key()["KeyMetadata"]["KeyId"]
    old = kms_provider(moto, f"aws-kms:{k1}")
    w1 = old.wrap(DEK, AAD)
    assert w1.version == 1
    new = kms_provider(moto, f"aws-kms:{k2},{k1}")
    assert new.primary_version() == 2 and new.versions() == [1, 2] and new.key_id(2) == k2
    assert new.unwrap(w1, AAD) == DEK
    w2 = keys.rewrap(new, w1, AAD)
    assert w2.version == 2 and new.unwrap(w2, AAD) == DEK
    assert new.calls["GenerateDataKey"] == 1
    # once nothing uses k1 it may leave the spec, with explicit versions
    only = kms_provider(moto, f"aws-kms:{k2}@2")
    assert only.versions() == [2] and only.unwrap(w2, AAD) == DEK
    with pytest.raises(UnwrapError, match="version 1.*does not list"):
        only.unwrap(w1, AAD)
    # a blob presented as another key's version is refused by KMS
    swapped = WrappedKey(w1.kek_id, 2, w1.blob)
    with pytest.raises(UnwrapError):
        kms_provider(moto, f"aws-kms:{k2},{k1}").unwrap(swapped, AAD)


def test_kms_missing_disabled_and_unreachable(moto, kms, monkeypatch):
    with pytest.raises(MissingKey, match="was not found"):
        kms_provider(moto, "aws-kms:00000000-0000-0000-0000-000000000000")
    key = kms.create_key()["KeyMetadata"]["KeyId"]
    kms.disable_key(KeyId=key)
    with pytest.raises(MissingKey, match="Disabled"):
        kms_provider(moto, f"aws-kms:{key}")
    from servers import free_port

    dead = boto3.client("kms", endpoint_url=f"http://127.0.0.1:{free_port()}", region_name="us-east-1",
                        aws_access_key_id="x", aws_secret_access_key="y",
                        config=Config(retries={"max_attempts": 1}, connect_timeout=1))
    with pytest.raises(KeyUnavailable, match="retry later"):
        KmsKeyProvider([(1, key)], client=dead)
    p = KmsKeyProvider([(1, key)], client=dead, validate=False)
    with pytest.raises(KeyUnavailable):
        p.wrap(DEK, AAD)
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(MissingKey, match="region"):
        provider_from_spec(f"aws-kms:{key}", default_keyring=Path("/x"), passphrase_salt_store=None,
                           env={"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"})


def test_parse_kms_spec():
    assert parse_kms_spec("a") == [(1, "a")]
    assert parse_kms_spec("c, b ,a") == [(3, "c"), (2, "b"), (1, "a")]
    assert parse_kms_spec("alias/new@7,arn:aws:kms:eu-west-1:1:key/x@2") == \
        [(7, "alias/new"), (2, "arn:aws:kms:eu-west-1:1:key/x")]
    for bad in ("", "a,,b", "a@1,b", "a,a", "a@1,b@1", "a@0", "has space"):
        with pytest.raises(VaultError):
            parse_kms_spec(bad)


# -- the KMS key in the seal record (gateway/sealing.py) ---------------------------------------------


class _Gateway:
    """Gateway starts on one data directory, one at a time (the store is locked to its owner):
    ``start(spec)`` stops the running one, then does what a start does with --kek ``spec``."""

    def __init__(self, tmp_path: Path) -> None:
        self.data = tmp_path / "data"
        self.store = None

    def start(self, spec: str):
        from gateway.config import Config
        from gateway.sealing import seal
        from gateway.store.local import LocalStore

        if self.store is not None:
            self.store.close()
            self.store = None
        inner = LocalStore(self.data / "store")
        try:
            self.store = seal(inner, Config(data=str(self.data), kek=spec))
        except BaseException:
            inner.close()
            raise
        return self.store

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def record(self) -> dict:
        """The seal record as stored (read while no gateway runs, after a refused start)."""
        from gateway.sealing import SEAL_RECORD
        from gateway.store.base import INTERNAL_BUCKET
        from gateway.store.local import LocalStore
        from gateway.store.objects import read_object

        inner = self.store.inner if self.store is not None else LocalStore(self.data / "store")
        try:
            return json.loads(read_object(inner, INTERNAL_BUCKET, SEAL_RECORD)[0])
        finally:
            if self.store is None:
                inner.close()


@pytest.fixture
def gateway_starts(tmp_path):
    starts = _Gateway(tmp_path)
    yield starts
    starts.close()


def _put(store, key: str, body: bytes) -> None:
    import io

    from gateway.store.base import ObjectMeta

    store.put_object("b", key, io.BytesIO(body), ObjectMeta())


def _get(store, key: str) -> bytes:
    from gateway.store.objects import read_object

    return read_object(store, "b", key)[0]


@pytest.fixture
def kms_env(moto, monkeypatch):
    for name, value in {**AWS_ENV, "AWS_ENDPOINT_URL_KMS": moto}.items():
        monkeypatch.setenv(name, value)


def test_the_seal_record_names_the_kms_key_and_refuses_another(kms, kms_env, gateway_starts):
    from gateway.sealing import SealingError

    a = kms.create_key()["KeyMetadata"]
    b = kms.create_key()["KeyMetadata"]
    kms.create_alias(AliasName=f"alias/orgmem-{a['KeyId'][:8]}", TargetKeyId=a["KeyId"])
    first = gateway_starts.start(f"aws-kms:{a['KeyId']}")
    first.create_bucket("b")
    _put(first, "k", b"sealed under a")
    record = gateway_starts.record()
    assert record["kek_id"] == "aws-kms" and record["kms_keys"] == {"1": a["Arn"]}
    before = json.dumps(record, sort_keys=True)

    with pytest.raises(SealingError) as refused:
        gateway_starts.start(f"aws-kms:{b['KeyId']}")
    assert a["Arn"] in str(refused.value) and b["Arn"] in str(refused.value)
    assert json.dumps(gateway_starts.record(), sort_keys=True) == before  # nothing was written
    # the same key under another name (its ARN, an alias) is the same key
    for spec in (a["Arn"], f"alias/orgmem-{a['KeyId'][:8]}"):
        assert _get(gateway_starts.start(f"aws-kms:{spec}"), "k") == b"sealed under a"


def test_rotation_to_a_new_kms_key_keeps_working(kms, kms_env, gateway_starts):
    from gateway.rotation import KeyRotation
    from gateway.sealing import SealingError

    a, b, c = (kms.create_key()["KeyMetadata"] for _ in range(3))
    store = gateway_starts.start(f"aws-kms:{a['KeyId']}")
    store.create_bucket("b")
    _put(store, "old", b"under a")
    # rotate: restart with the new key first; it becomes version 2 in the seal record
    store = gateway_starts.start(f"aws-kms:{b['KeyId']},{a['KeyId']}")
    assert gateway_starts.record()["kms_keys"] == {"1": a["Arn"], "2": b["Arn"]}
    _put(store, "new", b"under b")
    rotation = KeyRotation(store)
    while not rotation.rewrap(True, 100).done:
        pass
    assert set(rotation.status()["objects_by_version"]) == {"2"}
    # the old key leaves the spec (explicit versions from then on)
    store = gateway_starts.start(f"aws-kms:{b['KeyId']}@2")
    assert _get(store, "old") == b"under a" and _get(store, "new") == b"under b"
    assert gateway_starts.record()["kms_keys"] == {"1": a["Arn"], "2": b["Arn"]}
    # another key for a recorded version, or none of the recorded keys at all, is refused
    for spec in (f"aws-kms:{c['KeyId']}@2", f"aws-kms:{c['KeyId']}@3", f"aws-kms:{c['KeyId']},{a['KeyId']}"):
        with pytest.raises(SealingError, match="KMS key"):
            gateway_starts.start(spec)
    # a next rotation, to c, is accepted the same way
    store = gateway_starts.start(f"aws-kms:{c['KeyId']}@3,{b['KeyId']}@2")
    assert _get(store, "new") == b"under b"
    assert gateway_starts.record()["kms_keys"] == {"1": a["Arn"], "2": b["Arn"], "3": c["Arn"]}


def test_a_seal_record_from_before_kms_keys_were_recorded(kms, kms_env, gateway_starts):
    """A record holding only kek_id "aws-kms" (older gateways) still opens: the KMS key is
    checked against the data itself once, then recorded."""
    import io

    from gateway.sealing import SEAL_RECORD, SealingError
    from gateway.store.base import INTERNAL_BUCKET, ObjectMeta

    a, b = (kms.create_key()["KeyMetadata"] for _ in range(2))
    store = gateway_starts.start(f"aws-kms:{a['KeyId']}")
    store.create_bucket("b")
    _put(store, "k", b"from an older gateway")
    old_form = {"format": 1, "kek_id": "aws-kms", "sealed_since": 1.0}
    store.inner.put_object(INTERNAL_BUCKET, SEAL_RECORD, io.BytesIO(json.dumps(old_form).encode()),
                           ObjectMeta(content_type="application/json"))
    with pytest.raises(SealingError, match="does not open with it"):
        gateway_starts.start(f"aws-kms:{b['KeyId']}")
    with pytest.raises(SealingError, match="none of the"):
        gateway_starts.start(f"aws-kms:{b['KeyId']}@2")
    assert "kms_keys" not in gateway_starts.record()
    store = gateway_starts.start(f"aws-kms:{a['KeyId']}")
    assert _get(store, "k") == b"from an older gateway"
    assert gateway_starts.record()["kms_keys"] == {"1": a["Arn"]}
    with pytest.raises(SealingError, match="sealed under KMS key"):
        gateway_starts.start(f"aws-kms:{b['KeyId']}")
