"""Opening the sealed store at start: the KEK, the seal record, and legacy plaintext.

Encryption is always on. The KEK comes from ``--kek`` (see ``vault.keys``);
the embedded default is a keyring file created beside — never inside — the
data directory on first start. A seal record in the internal bucket names the
KEK the data is sealed under, so a gateway started with the wrong or a missing
KEK refuses to start instead of writing data nobody can read together. Data
written before sealing existed (plaintext) is sealed in place, once, at the
first start that finds it: there is no migration step to remember.
"""

from __future__ import annotations

import getpass
import sys
import time
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import orjson

from vault.errors import MissingKey, VaultError
from vault.keys import KeyProvider, provider_from_spec

from .config import Config
from .logs import log
from .store.base import (
    INTERNAL_BUCKET,
    BucketAlreadyExists,
    NoSuchKey,
    ObjectMeta,
    ObjectStore,
    PreconditionFailed,
    WriteCondition,
)
from .store.objects import read_object
from .store.sealed import SealedStore

#: Bookkeeping under this prefix of the internal bucket holds no secret and stays unsealed:
#: the seal record, the passphrase salt, the rewrap checkpoint.
UNSEALED_PREFIX = "vault/"
SEAL_RECORD = UNSEALED_PREFIX + "seal.json"
SALT_RECORD = UNSEALED_PREFIX + "passphrase-salt"


class SealingError(Exception):
    """The gateway cannot open its sealed data: say why and what to do."""


class InternalSaltStore:
    """The passphrase provider's salt record, kept in the internal bucket (it is not secret)."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    def get(self) -> bytes | None:
        return read_internal(self._store, SALT_RECORD)

    def put(self, salt: bytes) -> None:
        self._store.put_object(INTERNAL_BUCKET, SALT_RECORD, BytesIO(salt), ObjectMeta(),
                               WriteCondition(if_none_match=True))


def default_keyring(config: Config) -> Path:
    """Beside the data directory, never in it: a backup of the data alone cannot be read."""
    data = Path(config.data).resolve()
    return data.parent / f"{data.name}.keyring.json"


def open_keys(config: Config, inner: ObjectStore, record: dict | None) -> KeyProvider:
    prompt = (lambda text: getpass.getpass(text)) if sys.stdin.isatty() else None
    try:
        keys = provider_from_spec(config.kek, default_keyring=default_keyring(config),
                                  passphrase_salt_store=InternalSaltStore(inner), prompt=prompt,
                                  forbidden_dir=Path(config.data).resolve(),
                                  create_default=record is None)
    except VaultError as exc:
        raise SealingError(str(exc)) from None
    if getattr(keys, "created", False):
        log.warning("keyring_created", path=str(default_keyring(config)),
                    hint="back this file up apart from the data: without it nothing can be read")
    return keys


def seal(inner: ObjectStore, config: Config) -> SealedStore:
    """The sealed store over ``inner``, after checking the KEK matches the data."""
    _ensure_internal_bucket(inner)
    record = _seal_record(inner)
    keys = open_keys(config, inner, record)
    if record is not None and record.get("kek_id") != keys.kek_id:
        raise SealingError(
            f"this data is sealed under KEK {record.get('kek_id')!r}, but --kek gives "
            f"{keys.kek_id!r}: start with the KEK the data was sealed with (restore its keyring "
            "from backup); nothing was read or written")
    sealed = SealedStore(inner, keys)
    if record is None:
        migrated = seal_plaintext(sealed)
        if migrated:
            log.warning("plaintext_sealed", objects=migrated)
        _write_seal_record(inner, keys)
    return sealed


def sealed_objects(inner: ObjectStore,
                   after: tuple[str, str] | None = None) -> Iterator[tuple[str, str]]:
    """Every object that is (or must be) sealed, internal ones included, in (bucket, key)
    order, resuming after ``after``."""
    for bucket in sorted(b.name for b in inner.list_buckets()):
        if after is not None and bucket < after[0]:
            continue
        marker = after[1] if after is not None and bucket == after[0] else ""
        while True:
            page = inner.list_objects(bucket, after=marker, limit=1000)
            for entry in page.entries:
                if not (bucket == INTERNAL_BUCKET and entry.key.startswith(UNSEALED_PREFIX)):
                    yield bucket, entry.key
            if not page.is_truncated or not page.next_marker:
                break
            marker = page.next_marker


def seal_plaintext(sealed: SealedStore) -> int:
    """Seal, in place, every object written before sealing existed. Safe to repeat: an
    object already sealed is left alone, one changed meanwhile keeps its new version."""
    return sum(_seal_one(sealed, bucket, key) for bucket, key in sealed_objects(sealed.inner))


def _seal_one(sealed: SealedStore, bucket: str, key: str) -> int:
    inner = sealed.inner
    try:
        reader = inner.open_object(bucket, key)
    except NoSuchKey:
        return 0
    try:
        if reader.info.meta.sealed:
            return 0
        sealed.put_object(bucket, key, reader, reader.info.meta,
                          WriteCondition(if_match=reader.info.etag))
    except PreconditionFailed:
        return 0
    finally:
        reader.close()
    return 1


def _ensure_internal_bucket(inner: ObjectStore) -> None:
    try:
        inner.create_bucket(INTERNAL_BUCKET)
    except BucketAlreadyExists:
        pass


def _seal_record(inner: ObjectStore) -> dict | None:
    raw = read_internal(inner, SEAL_RECORD)
    return orjson.loads(raw) if raw is not None else None


def _write_seal_record(inner: ObjectStore, keys: KeyProvider) -> None:
    record = {"format": 1, "kek_id": keys.kek_id, "sealed_since": time.time()}
    try:
        inner.put_object(INTERNAL_BUCKET, SEAL_RECORD, BytesIO(orjson.dumps(record)),
                         ObjectMeta(content_type="application/json"), WriteCondition(if_none_match=True))
    except PreconditionFailed:
        existing = _seal_record(inner)  # another gateway sealed first: it must agree
        if existing is None or existing.get("kek_id") != keys.kek_id:
            raise SealingError("another gateway sealed this data under a different KEK") from None


def read_internal(store: ObjectStore, key: str) -> bytes | None:
    """A small object of the internal bucket, whole; None when absent."""
    found = read_object(store, INTERNAL_BUCKET, key)
    return found[0] if found is not None else None


__all__ = ["MissingKey", "SealingError", "default_keyring", "seal", "seal_plaintext"]
