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
import os
import sys
import time
from collections.abc import Callable, Iterator
from io import BytesIO
from pathlib import Path

import orjson

from vault.errors import MissingKey, VaultError
from vault.keys import FileKeyring, KeyProvider, WrappedKey, provider_from_spec, version_gaps

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
from .store.sealed import SealedStore, SealError

#: The only objects of the internal bucket that hold no secret and stay unsealed: the seal
#: record, the passphrase salt, the rewrap checkpoint. Everything else is sealed, the secret
#: store's objects under ``vault/meta/`` and ``vault/data/`` included, so ``kek status``
#: counts it and rewrap rewraps it.
SEAL_RECORD = "vault/seal.json"
SALT_RECORD = "vault/passphrase-salt"
REWRAP_CHECKPOINT = "vault/rewrap.json"
#: Set to 1 to seal unsealed objects found beside sealed ones when the seal record is gone.
ACCEPT_UNSEALED_ENV = "ORGMEM_ACCEPT_UNSEALED"
#: KEK versions (comma-separated) an operator starts without: every copy of the keyring that
#: held them is lost. The seal record keeps their check values, so their numbers stay taken.
ACCEPT_MISSING_ENV = "ORGMEM_ACCEPT_MISSING_KEK_VERSIONS"
UNSEALED_RECORDS = frozenset({SEAL_RECORD, SALT_RECORD, REWRAP_CHECKPOINT})
#: How many sealed objects a start looks at to check a KMS key against a seal record written
#: before it named its KMS keys.
KMS_PROBE_OBJECTS = 200


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
    if isinstance(keys, FileKeyring) and keys.created:
        log.warning("keyring_created", path=str(keys.path),
                    hint="back this file up apart from the data: without it nothing can be read")
    return keys


def seal(inner: ObjectStore, config: Config) -> SealedStore:
    """The sealed store over ``inner``, after checking the KEK matches the data."""
    _ensure_internal_bucket(inner)
    record = _seal_record(inner)
    keys = open_keys(config, inner, record)
    if record is not None:
        _check_record(record, keys)
    sealed = SealedStore(inner, keys)
    if record is None:
        _refuse_if_record_lost(inner)
        migrated = seal_plaintext(sealed)
        if migrated:
            log.warning("plaintext_sealed", objects=migrated)
        _write_seal_record(inner, keys)
    elif _kms_keys(keys) is not None:
        _record_kms_keys(sealed)
    elif _key_checks(keys) is not None:
        record_key_checks(inner, keys)
    return sealed


def _check_record(record: dict, keys: KeyProvider) -> None:
    """The KEK is the one the seal record names: same KEK id and, for AWS KMS (whose KEK id
    is ``aws-kms`` for every key), the same KMS key for every version both name."""
    if record.get("kek_id") != keys.kek_id:
        raise SealingError(
            f"this data is sealed under KEK {record.get('kek_id')!r}, but --kek gives "
            f"{keys.kek_id!r}: start with the KEK the data was sealed with (restore its keyring "
            "from backup); nothing was read or written")
    _check_key_checks(record, keys)
    given, recorded = _kms_keys(keys), _recorded_kms_keys(record)
    if given is None or recorded is None:
        return  # not KMS, or a record from before it named KMS keys (see _record_kms_keys)
    for version, arn in sorted(given.items()):
        if recorded.get(version, arn) != arn:
            raise SealingError(
                f"this data is sealed under KMS key {recorded[version]!r} as version {version}, "
                f"but --kek gives {arn!r} for version {version}: start with the KMS keys the data "
                "was sealed with (when adding a new key, list it first and keep the old ones, "
                "e.g. --kek aws-kms:NEW,OLD, or give explicit versions KEY@N); nothing was read "
                "or written")
    if recorded and not set(given) & set(recorded):
        listed = ", ".join(f"{arn} (version {v})" for v, arn in sorted(recorded.items()))
        raise SealingError(
            f"this data is sealed under the KMS keys {listed}, and --kek lists none of them: "
            "start with the KMS key the data was sealed with (to move to a new key, list it first "
            "and keep the old one, --kek aws-kms:NEW,OLD, then rewrap); nothing was read or "
            "written")


def _key_checks(keys: KeyProvider) -> dict[int, str] | None:
    """For a keyring of versions (``file:``), each version's key check value; None otherwise."""
    checks = getattr(keys, "key_checks", None)
    return dict(checks()) if checks is not None else None


def _recorded_key_checks(record: dict) -> dict[int, str]:
    found = record.get("key_checks") or {}
    try:
        return {int(v): str(check) for v, check in found.items()}
    except (AttributeError, TypeError, ValueError):
        raise SealingError(f"the seal record {SEAL_RECORD} in the internal bucket is damaged "
                           "(its key_checks are not versions and values); restore it from "
                           "backup") from None


def _check_key_checks(record: dict, keys: KeyProvider) -> None:
    """The keyring holds every version the seal record knows, each with its own key: an older
    copy (a backup from before a rotation) or another keyring under the same KEK id would
    leave the data of the versions it lacks unreadable, and a rotation would then reuse their
    numbers for new keys."""
    given = _key_checks(keys)
    if given is None:
        return
    recorded = _recorded_key_checks(record)
    lost, other, what = version_gaps(recorded, given, "KEK version(s)")
    only_lost = bool(lost) and not other
    if only_lost and set(lost) <= _accepted_missing():
        log.error("kek_versions_missing", versions=lost,
                  hint=f"{ACCEPT_MISSING_ENV} is set: data wrapped under these versions cannot be "
                       "read until a keyring holding them is back; their numbers stay taken")
        return
    if what:
        hint = (f" If every copy of a newer keyring is lost, start with {ACCEPT_MISSING_ENV}="
                f"{','.join(map(str, lost))} to go on without: what those versions wrapped stays "
                "unreadable" if only_lost else "")
        raise SealingError(
            f"the keyring {what} that this data was sealed with (versions "
            f"{sorted(recorded)}): it is an older copy or another keyring. Start with the current "
            f"keyring (restore it from backup); nothing was read or written.{hint}")


def _accepted_missing() -> set[int]:
    """The KEK versions an operator said to start without (:data:`ACCEPT_MISSING_ENV`)."""
    text = os.environ.get(ACCEPT_MISSING_ENV, "")
    return {int(v) for v in text.split(",") if v.strip().isascii() and v.strip().isdigit()}


def next_key_version(inner: ObjectStore, keys: KeyProvider) -> int:
    """Before a rotation: the keyring holds every version the seal record knows (else it is
    an older copy, refused with SealingError), and the least number the new version may take,
    past every recorded one (a version whose keyring is lost keeps its number)."""
    record = _seal_record(inner)
    if record is None:
        return 1
    _check_key_checks(record, keys)
    return max(_recorded_key_checks(record), default=0) + 1


def announce_key_check(inner: ObjectStore, version: int, check: str) -> None:
    """Record a new version's key check value before any data is wrapped under it, by
    compare-and-swap; SealingError when the record holds that version already (another
    gateway rotated to it meanwhile: rotating again there is the way on)."""
    def add(record: dict) -> bool:
        recorded = _recorded_key_checks(record)
        if version in recorded:
            raise SealingError(f"KEK version {version} was made meanwhile by another gateway: this "
                               "keyring is not the current one; nothing was rotated")
        record["key_checks"] = {str(v): c for v, c in sorted({**recorded, version: check}.items())}
        return True

    # no record to keep it in: the next start refuses, or writes one
    _update_record(inner, add, missing=None)


def record_key_checks(inner: ObjectStore, keys: KeyProvider) -> None:
    """Add the keyring's versions to the seal record's key checks at start (a record from
    before them, or a version added to the keyring file offline), by compare-and-swap."""
    given = _key_checks(keys)
    if given is None:
        return

    def merge(record: dict) -> bool:
        _check_record(record, keys)  # again: another gateway may have changed it meanwhile
        recorded = _recorded_key_checks(record)
        merged = {**recorded, **given}
        record["key_checks"] = {str(v): check for v, check in sorted(merged.items())}
        return merged != recorded

    _update_record(inner, merge, missing=None)


def _kms_keys(keys: KeyProvider) -> dict[int, str] | None:
    """For an AWS KMS KEK, each version's key as KMS names it (its ARN); None otherwise."""
    identities = getattr(keys, "key_identities", None)
    if identities is None:
        return None
    try:
        return dict(identities())
    except VaultError as exc:
        raise SealingError(str(exc)) from None


def _recorded_kms_keys(record: dict) -> dict[int, str] | None:
    found = record.get("kms_keys")
    if not isinstance(found, dict):
        return None
    try:
        return {int(v): str(arn) for v, arn in found.items()}
    except (TypeError, ValueError):
        raise SealingError(f"the seal record {SEAL_RECORD} in the internal bucket is damaged "
                           "(its kms_keys are not versions and keys); restore it from backup") from None


def _record_kms_keys(sealed: SealedStore) -> None:
    """Add the KMS keys this start uses to the seal record (a new key listed first at rotation
    becomes a recorded version), by compare-and-swap. A record written before it named KMS keys
    is checked first against the data itself: a sealed object is opened with the given keys."""
    keys = sealed.keys
    given = _kms_keys(keys) or {}

    def merge(record: dict) -> bool:
        _check_record(record, keys)  # again: another gateway may have changed it meanwhile
        recorded = _recorded_kms_keys(record)
        if recorded is None:
            _probe_kms(sealed, given)
            recorded = {}
        merged = {**recorded, **given}
        if merged == recorded and "kms_keys" in record:
            return False
        record["kms_keys"] = {str(v): arn for v, arn in sorted(merged.items())}
        return True

    _update_record(sealed.inner, merge,
                   missing=f"the seal record {SEAL_RECORD} disappeared while starting; restart")


def _update_record(inner: ObjectStore, change: Callable[[dict], bool], missing: str | None) -> None:
    """Change the seal record by compare-and-swap: ``change`` edits it in place and says
    whether there is anything to write; run again on the record another gateway wrote first.
    Without a record, SealingError(``missing``), or nothing when ``missing`` is None."""
    for _ in range(8):
        found = read_object(inner, INTERNAL_BUCKET, SEAL_RECORD)
        if found is None:
            if missing is not None:
                raise SealingError(missing)
            return
        record = _parse_record(found[0])
        if not change(record):
            return
        try:
            inner.put_object(INTERNAL_BUCKET, SEAL_RECORD, BytesIO(orjson.dumps(record)),
                             ObjectMeta(content_type="application/json"),
                             WriteCondition(if_match=found[1].etag))
            return
        except PreconditionFailed:
            continue  # another gateway changed the record first: read it again
    raise SealingError(f"the seal record {SEAL_RECORD} keeps changing; retry")


def _probe_kms(sealed: SealedStore, given: dict[int, str]) -> None:
    """Before the seal record learns its KMS keys: a sealed object whose data key is wrapped
    under a version --kek lists must open with it, or the KMS key is not the data's. A few
    objects are tried, so one damaged object does not refuse the start alone."""
    looked, failed = 0, []
    for bucket, key in sealed_objects(sealed.inner):
        if looked >= KMS_PROBE_OBJECTS or len(failed) >= 3:
            break
        try:
            stored = sealed.inner.head_object(bucket, key).meta.sealed
            version = WrappedKey.decode(stored or "").version
        except (NoSuchKey, ValueError):
            continue
        looked += 1
        if version not in given:
            continue
        try:
            sealed.head_object(bucket, key)
            return  # opens: the KMS keys are the data's
        except SealError as exc:
            failed.append((bucket, key, version, exc))
        except NoSuchKey:
            continue
    if failed:
        bucket, key, version, exc = failed[0]
        raise SealingError(
            f"--kek gives KMS key {given[version]!r} as version {version}, but {bucket}/{key} "
            f"does not open with it ({exc}): start with the KMS key the data was sealed with; "
            "nothing was written")
    if looked:
        raise SealingError(
            f"none of the {looked} sealed objects looked at is wrapped under a KMS key version "
            f"--kek lists ({sorted(given)}): start with the KMS keys the data was sealed with; "
            "nothing was written")


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
                if not (bucket == INTERNAL_BUCKET and entry.key in UNSEALED_RECORDS):
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


def _refuse_if_record_lost(inner: ObjectStore) -> None:
    """No seal record, yet sealed objects: the record was removed (or lost) behind the
    gateway's back. Sealing the plaintext found beside them would take as the data's own
    whatever someone with write access to the bucket planted (identities, secrets...), so
    the gateway refuses unless an operator who checked says the plaintext is theirs."""
    if os.environ.get(ACCEPT_UNSEALED_ENV, "") == "1":
        return
    for bucket, key in sealed_objects(inner):
        try:
            if inner.head_object(bucket, key).meta.sealed:
                raise SealingError(
                    f"the seal record ({INTERNAL_BUCKET}/{SEAL_RECORD}) is missing, but the data "
                    "holds sealed objects: it was removed or lost, and any plaintext object beside "
                    "them may have been planted. Restore the record from a backup of the bucket; "
                    f"or, once you have checked every unsealed object is yours (as after a first "
                    f"start that was sealing data from before sealing existed and was cut short), "
                    f"start once with {ACCEPT_UNSEALED_ENV}=1 to seal them. Nothing was read or "
                    "written")
        except NoSuchKey:
            continue


def _ensure_internal_bucket(inner: ObjectStore) -> None:
    try:
        inner.create_bucket(INTERNAL_BUCKET)
    except BucketAlreadyExists:
        pass


def _seal_record(inner: ObjectStore) -> dict | None:
    raw = read_internal(inner, SEAL_RECORD)
    return _parse_record(raw) if raw is not None else None


def _parse_record(raw: bytes) -> dict:
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        record = None
    if not isinstance(record, dict):
        raise SealingError(f"the seal record {SEAL_RECORD} in the internal bucket is damaged (not a "
                           "JSON object); restore it from backup. Nothing was read or written")
    return record


def _write_seal_record(inner: ObjectStore, keys: KeyProvider) -> None:
    record: dict = {"format": 1, "kek_id": keys.kek_id, "sealed_since": time.time()}
    kms, checks = _kms_keys(keys), _key_checks(keys)
    if kms is not None:
        record["kms_keys"] = {str(v): arn for v, arn in sorted(kms.items())}
    if checks is not None:
        record["key_checks"] = {str(v): check for v, check in sorted(checks.items())}
    try:
        inner.put_object(INTERNAL_BUCKET, SEAL_RECORD, BytesIO(orjson.dumps(record)),
                         ObjectMeta(content_type="application/json"), WriteCondition(if_none_match=True))
    except PreconditionFailed:
        existing = _seal_record(inner)  # another gateway sealed first: it must agree
        if existing is None or existing.get("kek_id") != keys.kek_id:
            raise SealingError("another gateway sealed this data under a different KEK") from None
        _check_record(existing, keys)


def read_internal(store: ObjectStore, key: str) -> bytes | None:
    """A small object of the internal bucket, whole; None when absent."""
    found = read_object(store, INTERNAL_BUCKET, key)
    return found[0] if found is not None else None


__all__ = ["MissingKey", "SealingError", "announce_key_check", "default_keyring", "next_key_version",
           "record_key_checks", "seal", "seal_plaintext"]
