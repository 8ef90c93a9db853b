"""Key-encryption keys (KEKs) and the wrapping of per-object data keys.

A data key (DEK) seals one object (``vault/stream.py``); a :class:`KeyProvider` wraps it under
the customer's KEK with associated data binding it to the object's identity, and the gateway
keeps the resulting :class:`WrappedKey` (``encode()``: compact ASCII) in the object's bookkeeping
metadata. The KEK itself never enters the bucket.

Providers, chosen by ``--kek`` / ``ORGMEM_KEK`` and built by :func:`provider_from_spec`:

``file:PATH``
    A keyring file holding every KEK version (:class:`FileKeyring`, mode 0600, written
    atomically, refused with group/other permissions or inside the data directory).
``env:VAR``
    One 32-byte KEK in an environment variable (base64 or 64 hex characters), version 1.
``passphrase``
    scrypt(passphrase, salt) as version 1; the salt and a check value sit in the gateway's
    internal bucket through a :class:`SaltStore`, so a wrong passphrase is refused at start.
``aws-kms:KEY[,OLDKEY...]``
    AWS KMS, with an intermediate key cached like S3 Bucket Keys (:class:`KmsKeyProvider`).

Wrapping is AES-256-GCM with a random 96-bit nonce under the KEK version (for KMS: under the
intermediate key), with associated data ``"orgmem/wrap/v1" || kek_id || version || aad``. Errors
never carry key material, passphrases or wrapped bytes.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import stat
import struct
import tempfile
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import (
    KeyringError,
    KeyUnavailable,
    MissingKey,
    UnwrapError,
    VaultError,
    WrongKey,
)

__all__ = [
    "KEY_SIZE", "EnvKeyProvider", "FileKeyring", "KeyProvider", "KeyUnavailable", "KeyringError",
    "KmsKeyProvider", "MemorySaltStore", "MissingKey", "PassphraseKeyProvider", "SaltStore",
    "StaticKeyProvider", "UnwrapError", "VaultError", "WrappedKey", "WrongKey", "create_keyring",
    "key_check", "parse_kms_spec", "provider_from_spec", "rewrap", "version_gaps",
]

log = logging.getLogger("orgmem.vault")

KEY_SIZE = 32
NONCE_SIZE = 12
_WRAPPED_DEK = NONCE_SIZE + KEY_SIZE + 16  # nonce | ciphertext | tag
_ENCODING_VERSION = 1
_MAX_ENCODED = 2048
_WRAP_DOMAIN = b"orgmem/wrap/v1\x00"
_KEK_ID_DOMAIN = b"orgmem/kek-id/v1"
_KEK_ID = re.compile(r"^[A-Za-z0-9._:/@+=-]{1,200}\Z")
_B64URL = re.compile(r"^[A-Za-z0-9_-]+\Z")


# -- wrapped keys ----------------------------------------------------------------------------


@dataclass(frozen=True)
class WrappedKey:
    """A data key wrapped by one KEK version.

    ``blob`` is the provider's wrapped form: ``nonce | ciphertext | tag`` for local KEKs, or
    ``u16 length | KMS ciphertext blob | nonce | ciphertext | tag`` for KMS.
    """

    kek_id: str
    version: int
    blob: bytes

    def __post_init__(self) -> None:
        if not _KEK_ID.match(self.kek_id or ""):
            raise ValueError("a KEK id is 1-200 characters of [A-Za-z0-9._:/@+=-]")
        if not 1 <= self.version <= 0xFFFFFFFF:
            raise ValueError("a KEK version is 1..2**32-1")
        if not self.blob:
            raise ValueError("a wrapped key has a blob")

    def __repr__(self) -> str:  # no bytes, even wrapped ones, in logs
        return f"WrappedKey(kek_id={self.kek_id!r}, version={self.version}, blob=<{len(self.blob)} bytes>)"

    def encode(self) -> str:
        """base64url (unpadded) of ``u8 encoding version (1) | u8 len(kek_id) | kek_id |
        u32 version | blob``: ASCII, no spaces, short enough for an S3 metadata value."""
        kid = self.kek_id.encode("ascii")
        raw = struct.pack(">BB", _ENCODING_VERSION, len(kid)) + kid + struct.pack(">I", self.version) \
            + self.blob
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    @classmethod
    def decode(cls, text: str) -> WrappedKey:
        """Parse :meth:`encode`'s output; ValueError with a clear message on anything else."""
        if not isinstance(text, str) or not text:
            raise ValueError("not a wrapped data key: empty")
        text = text.strip()
        if len(text) > _MAX_ENCODED or not _B64URL.match(text):
            raise ValueError("not a wrapped data key: expected unpadded base64url text")
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise ValueError("not a wrapped data key: invalid base64url") from None
        if len(raw) < 2 or raw[0] != _ENCODING_VERSION:
            version = raw[0] if raw else "?"
            raise ValueError(f"not a wrapped data key: unknown encoding version {version} "
                             f"(this build reads version {_ENCODING_VERSION})")
        n = raw[1]
        if len(raw) < 2 + n + 4 + 1:
            raise ValueError("not a wrapped data key: truncated")
        try:
            kek_id = raw[2:2 + n].decode("ascii")
        except UnicodeDecodeError:
            raise ValueError("not a wrapped data key: the KEK id is not ASCII") from None
        (version,) = struct.unpack(">I", raw[2 + n:6 + n])
        try:
            return cls(kek_id, version, raw[6 + n:])
        except ValueError as exc:
            raise ValueError(f"not a wrapped data key: {exc}") from None


def _wrap_aad(kek_id: str, version: int, aad: bytes) -> bytes:
    kid = kek_id.encode("ascii")
    return _WRAP_DOMAIN + struct.pack(">B", len(kid)) + kid + struct.pack(">I", version) + bytes(aad)


def _kek_id_for(key: bytes, prefix: str) -> str:
    """A stable, one-way id for a single KEK: a different key gives a different id."""
    return f"{prefix}-{hmac.new(key, _KEK_ID_DOMAIN, hashlib.sha256).hexdigest()[:16]}"


def _seal_dek(kek: AESGCM, dek: bytes, aad: bytes) -> bytes:
    if len(dek) != KEY_SIZE:
        raise ValueError("a data key is 32 bytes")
    nonce = os.urandom(NONCE_SIZE)
    return nonce + kek.encrypt(nonce, bytes(dek), aad)


def _open_dek(kek: AESGCM, blob: bytes, aad: bytes, what: str) -> bytes:
    if len(blob) != _WRAPPED_DEK:
        raise UnwrapError(f"the wrapped data key under {what} is {len(blob)} bytes, expected "
                          f"{_WRAPPED_DEK}: damaged or not written by this provider")
    try:
        return kek.decrypt(blob[:NONCE_SIZE], blob[NONCE_SIZE:], aad)
    except InvalidTag:
        raise UnwrapError(f"the data key wrapped under {what} failed authentication: it belongs "
                          "to another object (moved or swapped on the backend), was tampered "
                          "with, or the key is not the one that wrapped it") from None


def _check_kek_id(wrapped: WrappedKey, kek_id: str) -> None:
    if wrapped.kek_id != kek_id:
        raise UnwrapError(f"this data key was wrapped by KEK {wrapped.kek_id!r}, but the "
                          f"configured KEK is {kek_id!r}: start the gateway with the KEK that "
                          "sealed this data (wrong key?)")


# -- protocols -------------------------------------------------------------------------------


@runtime_checkable
class KeyProvider(Protocol):
    """What the sealed store needs from a KEK: wrap with the primary version, unwrap with any
    version still held, and notice rotation."""

    kek_id: str

    def primary_version(self) -> int: ...

    def versions(self) -> list[int]: ...

    def wrap(self, dek: bytes, aad: bytes) -> WrappedKey: ...

    def unwrap(self, wrapped: WrappedKey, aad: bytes) -> bytes: ...

    def reload(self) -> bool: ...


class SaltStore(Protocol):
    """Where the passphrase provider keeps its (not secret) salt record; the gateway stores it in
    its internal bucket. ``put`` should create only (a conditional write): when two gateways race
    on first start, the loser's ``put`` may raise and the provider re-reads the winner's."""

    def get(self) -> bytes | None: ...

    def put(self, salt: bytes) -> None: ...


class MemorySaltStore:
    """A :class:`SaltStore` in memory (tests, and one-shot tools)."""

    def __init__(self, salt: bytes | None = None) -> None:
        self.salt = salt

    def get(self) -> bytes | None:
        return self.salt

    def put(self, salt: bytes) -> None:
        if self.salt is not None and self.salt != salt:
            raise VaultError("a salt record is already stored")
        self.salt = salt


def rewrap(provider: KeyProvider, wrapped: WrappedKey, aad: bytes,
           new_aad: bytes | None = None) -> WrappedKey:
    """Unwrap and wrap again under the primary version (and, for a copy, a new identity)."""
    dek = provider.unwrap(wrapped, aad)
    return provider.wrap(dek, aad if new_aad is None else new_aad)


# -- local keys (env, passphrase, keyring file) ------------------------------------------------


class StaticKeyProvider:
    """One KEK held in memory as version 1 (the ``env:`` and ``passphrase`` providers)."""

    def __init__(self, key: bytes, *, kek_id: str | None = None, source: str = "KEK") -> None:
        if len(key) != KEY_SIZE:
            raise ValueError("a KEK is 32 bytes")
        self.kek_id = kek_id or _kek_id_for(key, "kek")
        self.source = source
        self._aead = AESGCM(key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kek_id={self.kek_id!r}, source={self.source!r})"

    def primary_version(self) -> int:
        return 1

    def versions(self) -> list[int]:
        return [1]

    def wrap(self, dek: bytes, aad: bytes) -> WrappedKey:
        return WrappedKey(self.kek_id, 1, _seal_dek(self._aead, dek, _wrap_aad(self.kek_id, 1, aad)))

    def unwrap(self, wrapped: WrappedKey, aad: bytes) -> bytes:
        _check_kek_id(wrapped, self.kek_id)
        if wrapped.version != 1:
            raise UnwrapError(f"this data key was wrapped by version {wrapped.version} of KEK "
                              f"{self.kek_id!r}, but {self.source} holds only version 1")
        return _open_dek(self._aead, wrapped.blob, _wrap_aad(self.kek_id, 1, aad),
                         f"KEK {self.kek_id!r} version 1")

    def reload(self) -> bool:
        return False


def parse_key_text(text: str) -> bytes:
    """A 32-byte key from base64 (standard or url-safe, padding optional) or 64 hex characters.
    ValueError (never echoing the text) otherwise."""
    text = "".join(text.split())
    if len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text):
        return bytes.fromhex(text)
    if re.fullmatch(r"[A-Za-z0-9+/_-]+={0,2}", text) is None:
        raise ValueError("not base64 or hex")
    try:
        key = base64.urlsafe_b64decode(text.replace("+", "-").replace("/", "_").rstrip("=")
                                       + "=" * (-len(text.rstrip("=")) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not base64 or hex") from None
    if len(key) != KEY_SIZE:
        raise ValueError("not 32 bytes")
    return key


class EnvKeyProvider(StaticKeyProvider):
    """``env:VAR``: one KEK, version 1, from an environment variable."""

    def __init__(self, var: str, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        # Never echo what follows "env:": it may be the key itself, pasted in the wrong place.
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var or "") or _looks_like_key(var):
            raise VaultError("--kek env:VAR: the environment variable name is not valid; did you "
                             "paste the key itself? After 'env:' give the name of an environment "
                             "variable (letters, digits and underscores) that holds the key, e.g. "
                             "--kek env:ORGMEM_KEK_KEY")
        shown = _shown_name(var)
        value = env.get(var, "")
        if not value.strip():
            raise MissingKey(f"the KEK variable {shown} is not set. Put the KEK in it: 32 random "
                             "bytes as base64 (e.g. `head -c32 /dev/urandom | base64`) or 64 hex "
                             "characters, and keep a copy: without it the sealed data cannot be "
                             "decrypted.")
        try:
            key = parse_key_text(value)
        except ValueError:
            raise VaultError(f"the KEK variable {shown} does not hold a 32-byte key: it must be "
                             "44 base64 characters or 64 hex characters") from None
        super().__init__(key, kek_id=_kek_id_for(key, "env"),
                         source=f"env:{var}" if shown == var else "the env: variable")


def _looks_like_key(text: str) -> bool:
    """Whether text given where a name or path belongs is probably key material: a 32-byte key
    as base64 or hex, or a long run of hex digits. Such text is never echoed."""
    compact = "".join((text or "").split())
    try:
        parse_key_text(compact)
        return True
    except ValueError:
        pass
    return len(compact) >= 32 and re.fullmatch(r"[0-9A-Fa-f]+", compact) is not None


def _shown_name(var: str) -> str:
    """A variable name as an error may quote it: conventional names (upper case, at most 64
    characters) as they are; anything else, which could be a pasted secret, is not repeated."""
    if re.fullmatch(r"[A-Z_][A-Z0-9_]{0,63}", var) and not _looks_like_key(var):
        return var
    return "named after env:"


# passphrase record: magic, version, log2(n), r, p, salt length, salt, 32-byte check value
_PASS_MAGIC = b"OMPS"
_PASS_CHECK = b"orgmem/passphrase-check/v1"
SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P = 15, 8, 1
MIN_PASSPHRASE = 8


def _scrypt(passphrase: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    n = 1 << log2_n
    return hashlib.scrypt(passphrase.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=KEY_SIZE,
                          maxmem=256 * r * n + (1 << 20))


def _check_value(kek: bytes) -> bytes:
    return hmac.new(kek, _PASS_CHECK, hashlib.sha256).digest()


def _encode_salt_record(salt: bytes, check: bytes, log2_n: int = SCRYPT_LOG2_N,
                        r: int = SCRYPT_R, p: int = SCRYPT_P) -> bytes:
    return _PASS_MAGIC + bytes([1, log2_n, r, p, len(salt)]) + salt + check


def _decode_salt_record(record: bytes) -> tuple[bytes, bytes, int, int, int]:
    bad = VaultError("the stored passphrase salt record is malformed (damaged in the internal "
                     "bucket?); without it the passphrase KEK cannot be derived")
    record = bytes(record)
    if len(record) < 9 or record[:4] != _PASS_MAGIC or record[4] != 1:
        raise bad
    log2_n, r, p, salt_len = record[5], record[6], record[7], record[8]
    if not (14 <= log2_n <= 22 and 1 <= r <= 32 and 1 <= p <= 16 and 16 <= salt_len <= 64):
        raise bad
    if len(record) != 9 + salt_len + 32:
        raise bad
    return record[9:9 + salt_len], record[9 + salt_len:], log2_n, r, p


class PassphraseKeyProvider(StaticKeyProvider):
    """``passphrase``: scrypt(passphrase, salt, n=2**15, r=8, p=1) as KEK version 1.

    On first start the salt record (salt, scrypt parameters and an HMAC check value of the KEK)
    is created and stored through ``salt_store``; afterwards a wrong passphrase is refused with
    :class:`WrongKey`. ``created`` says whether this start created it.
    """

    def __init__(self, passphrase: str, salt_store: SaltStore) -> None:
        if not passphrase:
            raise MissingKey("the passphrase KEK needs its passphrase: set ORGMEM_KEK_PASSPHRASE "
                             "or start orgmem on a terminal to be asked for it")
        record = salt_store.get()
        self.created = False
        if record is None:
            if len(passphrase) < MIN_PASSPHRASE:
                raise VaultError(f"the KEK passphrase must be at least {MIN_PASSPHRASE} "
                                 "characters (it protects everything; prefer a long random one)")
            salt = os.urandom(16)
            kek = _scrypt(passphrase, salt, SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P)
            record = _encode_salt_record(salt, _check_value(kek))
            try:
                salt_store.put(record)
            except Exception:  # lost a race with another gateway's first start?
                if salt_store.get() is None:
                    raise
            stored = salt_store.get()
            if stored is not None and stored != record:
                record = stored  # the other gateway won: use its salt
            else:
                self.created = True
        salt, check, log2_n, r, p = _decode_salt_record(record)
        kek = _scrypt(passphrase, salt, log2_n, r, p)
        if not hmac.compare_digest(_check_value(kek), check):
            raise WrongKey("wrong KEK passphrase: it does not match the one this deployment's data "
                           "was sealed with (check ORGMEM_KEK_PASSPHRASE)")
        super().__init__(kek, kek_id=_kek_id_for(kek, "pass"), source="passphrase")


# -- the keyring file ------------------------------------------------------------------------

KEYRING_FORMAT = "orgmem-keyring"
KEYRING_VERSION = 1
_KEYRING_NOTE = ("The key-encryption keys of an orgmem deployment. Without this file the sealed "
                 "data cannot be decrypted: back it up, apart from the bucket and data directory.")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _resolve(path: Path) -> Path:
    return Path(os.path.abspath(Path(path).expanduser())).resolve(strict=False)


def _inside(path: Path, directory: Path) -> bool:
    p, d = _resolve(path), _resolve(directory)
    return p == d or d in p.parents


def _refuse_inside(path: Path, forbidden_dir: Path | None) -> None:
    if forbidden_dir is not None and _inside(path, forbidden_dir):
        raise KeyringError(f"the keyring {path} is inside the data directory {forbidden_dir}: "
                           "the KEK must never sit beside the data it protects. Keep it "
                           "elsewhere and pass --kek file:PATH")


def key_check(key: bytes) -> str:
    """A key check value: tells one KEK version's key from another without revealing it
    (HMAC-SHA-256 of a fixed label under the key, 128 bits), so a record kept with the data
    can say which key each version was."""
    return hmac.new(key, b"orgmem KEK check value 1", hashlib.sha256).hexdigest()[:32]


def version_gaps(held: Mapping[int, object], found: Mapping[int, object],
                 noun: str = "version(s)") -> tuple[list[int], list[int], str]:
    """What ``found`` (version -> key, or key check value) lacks of ``held`` and holds
    otherwise: those versions, and a phrase naming them ("lacks version(s) [2] and holds
    other keys for version(s) [3]"; empty when it holds every one as it is)."""
    lost = sorted(v for v in held if v not in found)
    other = sorted(v for v in held if v in found and found[v] != held[v])
    return lost, other, " and ".join(part for part in (
        f"lacks {noun} {lost}" if lost else "",
        f"holds other keys for version(s) {other}" if other else "") if part)


def _check_successor(held: _KeyringState, found: _KeyringState, path: Path) -> None:
    """A keyring only ever gains versions (a retired one keeps its key): a file that lacks a
    version in use, or holds another key for one, is an older or another copy put in place
    (a restored backup, config management), and adopting it would lose the data wrapped
    under what it lacks, and let a rotation reuse that version's number."""
    *_, what = version_gaps(held.keys, found.keys)
    if what:
        raise KeyringError(f"the keyring {path} on disk {what} that this gateway holds: it is an "
                           "older copy or another keyring; the keys in memory stay in use. Put the "
                           f"current keyring back (it holds versions {sorted(held.keys)})")


@dataclass(frozen=True)
class _KeyringState:
    kek_id: str
    primary: int
    keys: dict[int, bytes]
    created: dict[int, str]
    retired: dict[int, str | None]
    stamp: tuple[int, int, int, int]  # device, inode, mtime ns, size

    def to_json(self) -> bytes:
        doc = {
            "format": KEYRING_FORMAT,
            "format_version": KEYRING_VERSION,
            "note": _KEYRING_NOTE,
            "kek_id": self.kek_id,
            "primary": self.primary,
            "versions": {
                str(v): {"key": base64.b64encode(self.keys[v]).decode("ascii"),
                         "created": self.created[v], "retired": self.retired[v]}
                for v in sorted(self.keys)
            },
        }
        return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _load_keyring(path: Path) -> _KeyringState:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise MissingKey(f"the KEK keyring {path} does not exist. If this deployment already holds "
                         "data, restore the keyring from your backup (without it the data cannot "
                         "be decrypted); for a new deployment, create the keyring first or omit "
                         "--kek to use the default keyring.") from None
    except PermissionError:
        raise MissingKey(f"the KEK keyring {path} cannot be read by this user") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise KeyringError(f"the KEK keyring {path} is not a regular file")
        if os.name == "posix" and st.st_mode & 0o077:
            raise KeyringError(f"the KEK keyring {path} is accessible by group or others (mode "
                               f"{stat.S_IMODE(st.st_mode):04o}); it holds the key-encryption "
                               f"keys, so it must be private to its owner: chmod 600 {path}")
        raw = f.read(1 << 20)
    return _parse_keyring(raw, path, _stamp(st))


def _parse_keyring(raw: bytes, path: Path, stamp: tuple[int, int, int, int]) -> _KeyringState:
    def bad(reason: str) -> KeyringError:
        return KeyringError(f"the KEK keyring {path} is not a valid orgmem keyring: {reason}")

    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise bad("not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != KEYRING_FORMAT:
        raise bad(f"no \"format\": \"{KEYRING_FORMAT}\"")
    if doc.get("format_version") != KEYRING_VERSION:
        raise bad(f"format_version {doc.get('format_version')!r} is not supported (this build "
                  f"reads {KEYRING_VERSION})")
    kek_id, primary, versions = doc.get("kek_id"), doc.get("primary"), doc.get("versions")
    if not isinstance(kek_id, str) or not _KEK_ID.match(kek_id):
        raise bad("missing or invalid kek_id")
    if not isinstance(versions, dict) or not versions:
        raise bad("no versions")
    keys: dict[int, bytes] = {}
    created: dict[int, str] = {}
    retired: dict[int, str | None] = {}
    for name, entry in versions.items():
        if not (isinstance(name, str) and name.isdigit() and 1 <= int(name) <= 0xFFFFFFFF):
            raise bad("version numbers are positive integers")
        v = int(name)
        if not isinstance(entry, dict):
            raise bad(f"version {v} is not an object")
        try:
            key = base64.b64decode(entry.get("key", ""), validate=True)
        except (binascii.Error, ValueError, TypeError):
            key = b""
        if len(key) != KEY_SIZE:
            raise bad(f"version {v}'s key is not 32 bytes of base64")
        keys[v] = key
        created[v] = str(entry.get("created") or "")
        r = entry.get("retired")
        retired[v] = str(r) if r else None
    if not isinstance(primary, int) or primary not in keys:
        raise bad("the primary version is not among the versions")
    if retired[primary]:
        raise bad(f"the primary version {primary} is marked retired")
    return _KeyringState(kek_id, primary, keys, created, retired, stamp)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_keyring(path: Path, state: _KeyringState, *, exclusive: bool) -> None:
    """Write atomically: a 0600 temp file beside it, fsync, then link (exclusive: refuses an
    existing file) or rename over it, then fsync the directory."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(state.to_json())
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise KeyringError(f"the keyring {path} already exists; refusing to overwrite "
                                   "it (it may be the only copy of your KEK)") from None
            except OSError:  # a filesystem without hard links
                if path.exists():
                    raise KeyringError(f"the keyring {path} already exists; refusing to "
                                       "overwrite it") from None
                os.replace(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_dir(path.parent)


@contextlib.contextmanager
def _dir_lock(directory: Path) -> Iterator[None]:
    """Serialize keyring changes by several processes (the CLI and a gateway)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class FileKeyring:
    """``file:PATH``: every KEK version in one JSON keyring file (mode 0600).

    ::

        {"format": "orgmem-keyring", "format_version": 1, "note": "...",
         "kek_id": "<random uuid>", "primary": 2,
         "versions": {"1": {"key": "<base64 of 32 bytes>", "created": "<UTC>", "retired": null},
                      "2": {...}}}

    Another process (``orgmem vault kek rotate``) may change the file: :meth:`reload` re-reads
    it when its stat changed, ``wrap`` does so at most every ``reload_interval`` seconds, and
    ``unwrap`` does so when it meets a version it does not know.
    """

    def __init__(self, path: str | Path, *, forbidden_dir: Path | None = None,
                 reload_interval: float = 1.0) -> None:
        self.path = Path(path).expanduser()
        _refuse_inside(self.path, forbidden_dir)
        self.reload_interval = reload_interval
        self.created = False  # set by create_keyring / provider_from_spec when it made the file
        self._lock = threading.Lock()
        self._state = _load_keyring(self.path)
        self._checked = time.monotonic()
        self._refused: tuple[int, int, int, int] | None = None  # the file a reload refused

    def __repr__(self) -> str:
        return (f"FileKeyring(path={str(self.path)!r}, kek_id={self.kek_id!r}, "
                f"primary={self.primary_version()})")

    @property
    def kek_id(self) -> str:
        return self._state.kek_id

    def primary_version(self) -> int:
        return self._state.primary

    def versions(self) -> list[int]:
        s = self._state
        return sorted(v for v in s.keys if not s.retired[v])

    def retired_versions(self) -> list[int]:
        s = self._state
        return sorted(v for v in s.keys if s.retired[v])

    def key_checks(self) -> dict[int, str]:
        """Each version's :func:`key_check` (retired versions included)."""
        return {v: key_check(k) for v, k in self._state.keys.items()}

    def describe(self) -> list[dict[str, Any]]:
        """Every version with its dates and state, without key material (for ``kek status``)."""
        s = self._state
        return [{"version": v, "created": s.created[v], "retired": s.retired[v],
                 "primary": v == s.primary} for v in sorted(s.keys)]

    # -- wrapping ---------------------------------------------------------------------

    def wrap(self, dek: bytes, aad: bytes) -> WrappedKey:
        if time.monotonic() - self._checked >= self.reload_interval:
            self._reload_quietly()
        s = self._state
        aead = AESGCM(s.keys[s.primary])
        return WrappedKey(s.kek_id, s.primary,
                          _seal_dek(aead, dek, _wrap_aad(s.kek_id, s.primary, aad)))

    def unwrap(self, wrapped: WrappedKey, aad: bytes) -> bytes:
        s = self._state
        if wrapped.kek_id != s.kek_id or wrapped.version not in s.keys:
            if self._reload_quietly():
                s = self._state
        _check_kek_id(wrapped, s.kek_id)
        v = wrapped.version
        if v not in s.keys:
            raise UnwrapError(f"this data key was wrapped by version {v} of KEK {s.kek_id!r}, "
                              f"which the keyring {self.path} does not hold (it has "
                              f"{sorted(s.keys)}): the keyring is older than the data; restore "
                              "the current keyring")
        if s.retired[v]:
            raise UnwrapError(f"this data key was wrapped by version {v} of KEK {s.kek_id!r}, "
                              f"which was retired on {s.retired[v]}; unretire it to read the data "
                              f"(orgmem vault kek unretire {v} --keyring {self.path})")
        return _open_dek(AESGCM(s.keys[v]), wrapped.blob, _wrap_aad(s.kek_id, v, aad),
                         f"KEK {s.kek_id!r} version {v}")

    # -- rotation state ----------------------------------------------------------------

    def reload(self) -> bool:
        """Re-read the file if it changed on disk; True if the state changed."""
        with self._lock:
            self._checked = time.monotonic()
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                raise MissingKey(f"the KEK keyring {self.path} has disappeared; restore it from "
                                 "your backup (the keys in memory stay in use until restart)") from None
            if _stamp(st) in (self._state.stamp, self._refused):
                return False
            fresh = _load_keyring(self.path)
            try:
                if fresh.kek_id != self._state.kek_id:
                    raise KeyringError(f"the keyring {self.path} was replaced by one of another KEK "
                                       f"({fresh.kek_id!r} instead of {self._state.kek_id!r}); "
                                       "refusing to switch KEKs while running")
                _check_successor(self._state, fresh, self.path)
            except KeyringError:
                self._refused = _stamp(st)  # said once, not at every reload
                raise
            changed = (fresh.primary, fresh.keys, fresh.retired) != \
                (self._state.primary, self._state.keys, self._state.retired)
            self._state = fresh
            return changed

    def _reload_quietly(self) -> bool:
        try:
            return self.reload()
        except (VaultError, OSError) as exc:
            log.warning(json.dumps({"event": "keyring_reload_failed", "path": str(self.path),
                                    "error": str(exc)}))
            return False

    def _change(self, mutate: Callable[[_KeyringState], _KeyringState]) -> _KeyringState:
        # Written where the file really is: through a symlink, replacing the link itself
        # would leave the real keyring (the one backed up) without the change. Read, as
        # ever, through the path given, which a deployment may point elsewhere.
        real = self.path.resolve()
        with _dir_lock(real.parent):
            current = _load_keyring(real)
            if current.kek_id != self._state.kek_id:
                raise KeyringError(f"the keyring {self.path} now holds another KEK; refusing")
            _check_successor(self._state, current, self.path)
            new = mutate(current)
            _write_keyring(real, new, exclusive=False)
            st = os.stat(self.path)
            new = _KeyringState(new.kek_id, new.primary, new.keys, new.created, new.retired,
                                _stamp(st))
            with self._lock:
                self._state = new
                self._checked = time.monotonic()
            return new

    def rotate(self, at_least: int = 1, announce: Callable[[int, str], None] | None = None) -> int:
        """Add a new random KEK version and make it primary; returns its number: past every
        version the keyring holds, and at least ``at_least`` (versions the caller knows of
        elsewhere). ``announce(version, key_check)`` runs before the file is written (the
        gateway records the new key's check value beside the data, so two rotations on two
        hosts cannot both take one number); if it raises, nothing changes. Existing data keys
        stay wrapped by their versions until rewrapped."""
        def mutate(s: _KeyringState) -> _KeyringState:
            v = max(max(s.keys) + 1, at_least)
            key = os.urandom(KEY_SIZE)
            if announce is not None:
                announce(v, key_check(key))
            return _KeyringState(s.kek_id, v, {**s.keys, v: key},
                                 {**s.created, v: _now()}, {**s.retired, v: None}, s.stamp)
        return self._change(mutate).primary

    def retire(self, version: int) -> None:
        """Mark a version retired: it no longer unwraps. The caller checks first that no data key
        uses it; the primary cannot be retired (rotate first). The key stays in the file, so
        :meth:`unretire` can undo it."""
        def mutate(s: _KeyringState) -> _KeyringState:
            if version not in s.keys:
                raise KeyringError(f"the keyring has no version {version} (it has {sorted(s.keys)})")
            if version == s.primary:
                raise KeyringError(f"version {version} is the primary KEK version; rotate to a "
                                   "new primary before retiring it")
            if s.retired[version]:
                return s
            return _KeyringState(s.kek_id, s.primary, s.keys, s.created,
                                 {**s.retired, version: _now()}, s.stamp)
        self._change(mutate)

    def unretire(self, version: int) -> None:
        """Undo :meth:`retire`."""
        def mutate(s: _KeyringState) -> _KeyringState:
            if version not in s.keys:
                raise KeyringError(f"the keyring has no version {version} (it has {sorted(s.keys)})")
            return _KeyringState(s.kek_id, s.primary, s.keys, s.created,
                                 {**s.retired, version: None}, s.stamp)
        self._change(mutate)


def create_keyring(path: str | Path, *, forbidden_dir: Path | None = None) -> FileKeyring:
    """Create a new keyring file (a random kek_id, version 1 primary) at ``path``, mode 0600,
    its directory created 0700 if missing. Refuses an existing file, and a path inside
    ``forbidden_dir`` (the gateway's data directory)."""
    path = Path(path).expanduser()
    _refuse_inside(path, forbidden_dir)
    if path.exists():
        raise KeyringError(f"the keyring {path} already exists; refusing to overwrite it (it may "
                           "be the only copy of your KEK)")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    state = _KeyringState(str(uuid.uuid4()), 1, {1: os.urandom(KEY_SIZE)}, {1: _now()},
                          {1: None}, (0, 0, 0, 0))
    _write_keyring(path, state, exclusive=True)
    ring = FileKeyring(path, forbidden_dir=forbidden_dir)
    ring.created = True
    return ring


# -- AWS KMS ---------------------------------------------------------------------------------

KMS_KEK_ID = "aws-kms"
_KMS_CONTEXT = {"orgmem": "intermediate-key/v1"}
#: KMS errors that mean "this blob cannot be opened with this key" (not transient).
_KMS_UNWRAP_ERRORS = {"InvalidCiphertextException", "IncorrectKeyException",
                      "AccessDeniedException", "InvalidKeyUsageException"}


def parse_kms_spec(text: str) -> list[tuple[int, str]]:
    """``KEY[@N][,KEY[@N]...]`` -> ``[(version, key_id), ...]``, the primary first.

    Without ``@N``, keys are numbered from the end of the list: the last (oldest) is 1, the first
    (primary) is ``len``. Rotation prepends the new key, so every key keeps its number. Dropping
    a retired key from the end would renumber the rest: give explicit ``@N`` from then on
    (either every key has one or none does).
    """
    items = [item.strip() for item in text.split(",")]
    if not items or any(not item for item in items):
        raise VaultError("--kek aws-kms: needs KMS key ids separated by commas, the primary first "
                         "(aws-kms:NEWKEY,OLDKEY)")
    parsed: list[tuple[str, int | None]] = []
    for item in items:
        key, at, number = item.rpartition("@")
        if at and number.isdigit():
            parsed.append((key.strip(), int(number)))
        else:
            parsed.append((item, None))
    explicit = [n for _, n in parsed if n is not None]
    if explicit and len(explicit) != len(parsed):
        raise VaultError("--kek aws-kms: give an explicit version (KEY@N) for every key or for none")
    if explicit:
        out = [(n, key) for key, n in parsed]  # type: ignore[misc]
    else:
        out = [(len(parsed) - i, key) for i, (key, _) in enumerate(parsed)]
    versions = [v for v, _ in out]
    keys = [k for _, k in out]
    if any(not 1 <= v <= 0xFFFFFFFF for v in versions) or len(set(versions)) != len(versions):
        raise VaultError("--kek aws-kms: versions must be distinct positive integers")
    if len(set(keys)) != len(keys):
        raise VaultError("--kek aws-kms: a KMS key is listed twice")
    for key in keys:
        if not re.fullmatch(r"[A-Za-z0-9:/_.+=-]{1,2048}", key):
            raise VaultError("--kek aws-kms: a KMS key id is a key id, key ARN, alias name or "
                             "alias ARN")
    return out


@dataclass
class _Intermediate:
    version: int
    blob: bytes
    aead: AESGCM
    born: float
    uses: int = 0


class KmsKeyProvider:
    """``aws-kms:KEY[,OLDKEY...]``: KEKs in AWS KMS, used like S3 Bucket Keys.

    ``wrap`` uses an intermediate 256-bit key from ``GenerateDataKey`` under the primary KMS key,
    kept in memory for ``ttl`` seconds or ``max_uses`` wraps, so a PUT needs no KMS round trip.
    The wrapped blob is ``u16 len | KMS ciphertext blob of the intermediate | nonce | DEK
    ciphertext | tag``. ``unwrap`` decrypts intermediates with ``Decrypt`` (the KMS key of the
    wrapped version as KeyId) and caches them in a bounded LRU (``cache_size`` entries, each for
    ``ttl`` seconds). ``calls`` counts KMS requests by operation.

    The kek_id is ``aws-kms`` for every key; each KMS key is a version (:func:`parse_kms_spec`).
    Which KMS key each version is, as KMS names it (the key ARN, whatever id, ARN or alias
    ``--kek`` used), is :meth:`key_identities`: the gateway records it in its seal record and
    refuses to start when another KMS key is given for a version the data uses.
    Rotation: put a new key first in the spec and rewrap. KMS's own automatic key rotation
    needs nothing from orgmem (the key id stays the same and old blobs keep decrypting).
    """

    def __init__(self, keys: Sequence[tuple[int, str]], *, client: Any = None,
                 endpoint_url: str | None = None, region: str | None = None,
                 env: Mapping[str, str] | None = None, ttl: float = 3600.0,
                 max_uses: int = 1_000_000, cache_size: int = 1024, validate: bool = True,
                 kek_id: str = KMS_KEK_ID, clock: Callable[[], float] = time.monotonic) -> None:
        if not keys:
            raise VaultError("aws-kms needs at least one KMS key")
        self.kek_id = kek_id
        self._keys = dict(keys)
        self._primary = keys[0][0]
        #: version -> the key's ARN as DescribeKey reports it (see key_identities)
        self._arns: dict[int, str] = {}
        self.ttl, self.max_uses, self.cache_size = ttl, max_uses, cache_size
        self._clock = clock
        self._lock = threading.Lock()
        self._generating = threading.Lock()
        self._current: _Intermediate | None = None
        self._opened: OrderedDict[bytes, tuple[AESGCM, float]] = OrderedDict()
        self.calls: Counter[str] = Counter()
        self.endpoint_url = endpoint_url
        self.client = client if client is not None else _kms_client(endpoint_url, region, env)
        if validate:
            self.check()

    def __repr__(self) -> str:
        return f"KmsKeyProvider(keys={sorted(self._keys.items())!r}, primary={self._primary})"

    def primary_version(self) -> int:
        return self._primary

    def versions(self) -> list[int]:
        return sorted(self._keys)

    def key_id(self, version: int) -> str:
        return self._keys[version]

    def key_identities(self) -> dict[int, str]:
        """Each version's KMS key as KMS itself names it: the key ARN from DescribeKey, the same
        whether ``--kek`` gave the key id, its ARN or an alias. Not secret."""
        if any(v not in self._arns for v in self._keys):
            self.check()
        return {v: self._arns[v] for v in sorted(self._keys)}

    def reload(self) -> bool:
        return False  # the key list comes from the command line / configuration

    def _call(self, op: str, key_id: str, **kwargs: Any) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        self.calls[op] += 1
        method = {"GenerateDataKey": "generate_data_key", "Decrypt": "decrypt",
                  "DescribeKey": "describe_key"}[op]
        try:
            return getattr(self.client, method)(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "Unknown")
            if op == "DescribeKey" and code == "NotFoundException":
                raise MissingKey(f"KMS key {key_id!r} was not found{self._where()}: check --kek / "
                                 "ORGMEM_KEK, the AWS account and region") from None
            if op == "Decrypt" and code in _KMS_UNWRAP_ERRORS:
                raise UnwrapError(f"KMS refused to decrypt this object's intermediate key with "
                                  f"{key_id!r} ({code}): it was wrapped under another KMS key, "
                                  "damaged, or this principal may not use the key") from None
            raise KeyUnavailable(f"KMS {op} with key {key_id!r} failed ({code}){self._where()}; "
                                 "retry later") from None
        except BotoCoreError as exc:
            raise KeyUnavailable(f"KMS {op} with key {key_id!r} failed{self._where()}: "
                                 f"{type(exc).__name__}; retry later") from None

    def _where(self) -> str:
        return f" at {self.endpoint_url}" if self.endpoint_url else ""

    def check(self) -> None:
        """Every listed key exists, is enabled and is a symmetric encryption key (one
        DescribeKey each): a missing key refuses the start with :class:`MissingKey`."""
        for version, key_id in sorted(self._keys.items()):
            meta = self._call("DescribeKey", key_id, KeyId=key_id)["KeyMetadata"]
            state = meta.get("KeyState", "Enabled" if meta.get("Enabled", True) else "Disabled")
            if state != "Enabled":
                raise MissingKey(f"KMS key {key_id!r} (version {version}) is {state}: enable it "
                                 "or remove it from --kek once nothing uses it")
            usage, spec = meta.get("KeyUsage", "ENCRYPT_DECRYPT"), meta.get("KeySpec", "SYMMETRIC_DEFAULT")
            if usage != "ENCRYPT_DECRYPT" or spec != "SYMMETRIC_DEFAULT":
                raise MissingKey(f"KMS key {key_id!r} is {spec}/{usage}; orgmem needs a "
                                 "symmetric encryption key (SYMMETRIC_DEFAULT, ENCRYPT_DECRYPT)")
            self._arns[version] = str(meta.get("Arn") or meta.get("KeyId") or key_id)

    def _intermediate(self) -> _Intermediate:
        with self._lock:
            cur = self._current
            if self._fresh(cur, self._clock()):
                cur.uses += 1  # type: ignore[union-attr]
                return cur  # type: ignore[return-value]
        with self._generating:  # one GenerateDataKey at a time; unwraps are not held up
            with self._lock:
                cur = self._current
                if self._fresh(cur, self._clock()):
                    cur.uses += 1  # type: ignore[union-attr]
                    return cur  # type: ignore[return-value]
                version = self._primary
            key_id = self._keys[version]
            out = self._call("GenerateDataKey", key_id, KeyId=key_id, KeySpec="AES_256",
                             EncryptionContext=_KMS_CONTEXT)
            plaintext, blob = out["Plaintext"], out["CiphertextBlob"]
            if len(plaintext) != KEY_SIZE or not 0 < len(blob) < 0x10000:
                raise KeyUnavailable(f"KMS GenerateDataKey with {key_id!r} returned an "
                                     "unexpected key")
            now = self._clock()
            cur = _Intermediate(version, bytes(blob), AESGCM(plaintext), now, uses=1)
            with self._lock:
                self._current = cur
                self._remember(cur.blob, cur.aead, now)
            return cur

    def _fresh(self, cur: _Intermediate | None, now: float) -> bool:
        return cur is not None and cur.version == self._primary and now - cur.born < self.ttl \
            and cur.uses < self.max_uses

    def _remember(self, blob: bytes, aead: AESGCM, now: float) -> None:
        self._opened[blob] = (aead, now)
        self._opened.move_to_end(blob)
        while len(self._opened) > self.cache_size:
            self._opened.popitem(last=False)

    def wrap(self, dek: bytes, aad: bytes) -> WrappedKey:
        cur = self._intermediate()
        sealed = _seal_dek(cur.aead, dek, _wrap_aad(self.kek_id, cur.version, aad))
        return WrappedKey(self.kek_id, cur.version, struct.pack(">H", len(cur.blob)) + cur.blob + sealed)

    def unwrap(self, wrapped: WrappedKey, aad: bytes) -> bytes:
        _check_kek_id(wrapped, self.kek_id)
        v = wrapped.version
        if v not in self._keys:
            raise UnwrapError(f"this data key was wrapped under KMS key version {v}, which --kek "
                              f"does not list (it lists versions {sorted(self._keys)}): add that "
                              "key back (KEY@N)")
        blob = wrapped.blob
        if len(blob) < 2:
            raise UnwrapError("the KMS-wrapped data key is truncated")
        (n,) = struct.unpack(">H", blob[:2])
        if len(blob) != 2 + n + _WRAPPED_DEK or n == 0:
            raise UnwrapError("the KMS-wrapped data key has the wrong length: damaged or not "
                              "written by this provider")
        kms_blob, sealed = blob[2:2 + n], blob[2 + n:]
        now = self._clock()
        with self._lock:
            hit = self._opened.get(kms_blob)
            if hit is not None and now - hit[1] < self.ttl:
                self._opened.move_to_end(kms_blob)
                aead = hit[0]
            else:
                aead = None
        if aead is None:
            key_id = self._keys[v]
            out = self._call("Decrypt", key_id, CiphertextBlob=kms_blob, KeyId=key_id,
                             EncryptionContext=_KMS_CONTEXT)
            if len(out["Plaintext"]) != KEY_SIZE:
                raise UnwrapError(f"KMS key {key_id!r} decrypted this object's intermediate key "
                                  "to something that is not a 256-bit key")
            aead = AESGCM(out["Plaintext"])
            with self._lock:
                self._remember(kms_blob, aead, now)
        return _open_dek(aead, sealed, _wrap_aad(self.kek_id, v, aad),
                         f"KMS key version {v} ({self._keys[v]!r})")


def _kms_client(endpoint_url: str | None, region: str | None, env: Mapping[str, str] | None):
    import boto3
    from botocore.config import Config

    env = os.environ if env is None else env
    session_args: dict[str, str] = {}
    for var, arg in (("AWS_ACCESS_KEY_ID", "aws_access_key_id"),
                     ("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"),
                     ("AWS_SESSION_TOKEN", "aws_session_token"), ("AWS_PROFILE", "profile_name")):
        if env.get(var):
            session_args[arg] = env[var]
    region = region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        session_args["region_name"] = region
    session = boto3.session.Session(**session_args)
    if not session.region_name:
        raise MissingKey("aws-kms needs an AWS region: set AWS_REGION (or a profile with one)")
    config = Config(connect_timeout=5, read_timeout=15,
                    retries={"max_attempts": 4, "mode": "standard"})
    return session.client("kms", endpoint_url=endpoint_url, config=config)


# -- choosing a provider ----------------------------------------------------------------------

_SPEC_HELP = ("use file:PATH (a keyring file), env:VAR (a key in an environment variable), "
              "passphrase (ORGMEM_KEK_PASSPHRASE or a prompt) or aws-kms:KEY_ID[,OLD_KEY_ID...]")


def provider_from_spec(spec: str, *, default_keyring: Path, passphrase_salt_store: SaltStore | None,
                       env: Mapping[str, str] = os.environ,
                       prompt: Callable[[str], str] | None = None,
                       forbidden_dir: Path | None = None, create_default: bool = True,
                       kms_endpoint: str | None = None, kms_client: Any = None) -> KeyProvider:
    """Build the provider ``--kek`` / ``ORGMEM_KEK`` names.

    An empty spec means the default keyring file ``default_keyring``, created on first start
    when ``create_default`` (``FileKeyring.created`` then says so, so the caller can tell the
    operator where it is). Any spec refuses a keyring inside ``forbidden_dir`` (the data
    directory). ``prompt`` (e.g. a getpass wrapper) asks for a passphrase that is not in
    ``ORGMEM_KEK_PASSPHRASE``. Raises :class:`MissingKey` with what to do when the KEK is absent.
    """
    spec = (spec or "").strip()
    scheme, colon, rest = spec.partition(":")
    if not spec or spec == "default":
        path = Path(default_keyring).expanduser()
        _refuse_inside(path, forbidden_dir)
        if not path.exists():
            if not create_default:
                raise MissingKey(f"the default KEK keyring {path} does not exist, but this data "
                                 "directory already holds sealed data: restore the keyring from "
                                 "your backup or pass --kek with the KEK the data was sealed with")
            return create_keyring(path, forbidden_dir=forbidden_dir)
        return FileKeyring(path, forbidden_dir=forbidden_dir)
    if scheme == "file" and colon:
        if not rest:
            raise VaultError("--kek file:PATH needs the keyring's path")
        if _looks_like_key(rest) and not Path(rest).expanduser().exists():
            # never echoed: it is probably the key itself, pasted in the wrong place
            raise VaultError("--kek file:PATH: the keyring path is not valid (it looks like a "
                             "key); did you paste the key itself? Give the path of the keyring "
                             "file, or put the key in an environment variable and use --kek "
                             "env:VAR")
        return FileKeyring(Path(rest), forbidden_dir=forbidden_dir)
    if scheme == "env" and colon:
        return EnvKeyProvider(rest, env)
    if spec == "passphrase":
        if passphrase_salt_store is None:
            raise VaultError("the passphrase KEK needs a place for its salt (internal error: no "
                             "salt store given)")
        passphrase = env.get("ORGMEM_KEK_PASSPHRASE")
        if not passphrase and prompt is not None:
            if passphrase_salt_store.get() is None:
                passphrase = prompt("New KEK passphrase: ")
                if passphrase and prompt("Repeat the KEK passphrase: ") != passphrase:
                    raise VaultError("the two passphrases differ; nothing was created")
            else:
                passphrase = prompt("KEK passphrase: ")
        return PassphraseKeyProvider(passphrase or "", passphrase_salt_store)
    if scheme == "aws-kms" and colon:
        endpoint = kms_endpoint or env.get("AWS_ENDPOINT_URL_KMS") or env.get("AWS_ENDPOINT_URL")
        keys = parse_kms_spec(rest)
        if any(_looks_like_key(k) and not k.startswith(("alias/", "arn:")) for _, k in keys):
            # never echoed (KMS's "not found" would): it is probably the key itself
            raise VaultError("--kek aws-kms: a KMS key id is not valid (it looks like a key); did "
                             "you paste the key itself? Give the KMS key id, key ARN, alias name "
                             "or alias ARN")
        region = None
        for _, key_id in keys:  # a key ARN names its region
            if key_id.startswith("arn:"):
                region = key_id.split(":")[3] or None
                break
        return KmsKeyProvider(keys, client=kms_client, endpoint_url=endpoint, env=env,
                              region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or region)
    # never echo the spec: it may be a key pasted in the wrong place
    raise VaultError(f"unknown --kek value: {_SPEC_HELP}")
