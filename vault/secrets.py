"""Secret records: one secret version's value under its own envelope (``FORMAT.md`` section 6).

Objects are already sealed by the store; a secret is sealed once more, here, because it is the
one thing that must stay unreadable when everything around it is readable to the gateway: its
data key is wrapped with associated data naming the secret's path and version, so a record
copied to another path or version fails to open, and destroying a version means discarding its
wrapped key (the record), after which no KEK, not even the root's, can open it again.

A record is a small JSON document::

    {"format": 1, "path": "agents/a1/db", "version": 3, "kek": "<WrappedKey.encode()>",
     "nonce": "<base64>", "ciphertext": "<base64 of AES-256-GCM ciphertext | tag>", "size": 17}

``path`` and ``version`` are informational (for the error message of a moved record); opening
checks the path and version the caller expects, never the ones the record claims.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import IntegrityError, UnwrapError
from .keys import KEY_SIZE, NONCE_SIZE, KeyProvider, WrappedKey

FORMAT = 1
#: The largest value a secret may hold (the issue's 64 KiB).
MAX_VALUE = 64 * 1024
_DOMAIN = b"orgmem/secret/v1\x00"


def binding(path: str, version: int) -> bytes:
    """The associated data of a secret version: its path and version, length-prefixed so no
    two (path, version) pairs give the same bytes."""
    encoded = path.encode("utf-8")
    return _DOMAIN + struct.pack(">I", len(encoded)) + encoded + struct.pack(">Q", version)


@dataclass(frozen=True)
class SecretRecord:
    """One sealed secret version as stored; never holds plaintext."""

    path: str
    version: int
    wrapped: WrappedKey
    nonce: bytes
    ciphertext: bytes
    size: int

    def __repr__(self) -> str:  # no bytes in logs, even sealed ones
        return f"SecretRecord(path={self.path!r}, version={self.version}, size={self.size})"

    def encode(self) -> bytes:
        return json.dumps({
            "format": FORMAT, "path": self.path, "version": self.version,
            "kek": self.wrapped.encode(), "nonce": _b64(self.nonce),
            "ciphertext": _b64(self.ciphertext), "size": self.size,
        }, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> SecretRecord:
        """Parse a stored record; IntegrityError (never a KeyError) on anything malformed."""
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT:
                raise IntegrityError(f"a secret record of format {doc.get('format')!r}; this build "
                                     f"reads format {FORMAT}")
            return cls(str(doc["path"]), int(doc["version"]), WrappedKey.decode(doc["kek"]),
                       _unb64(doc["nonce"]), _unb64(doc["ciphertext"]), int(doc["size"]))
        except IntegrityError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
            raise IntegrityError("a secret record is damaged: it is not a record this "
                                 "build wrote") from None

    @property
    def kek_version(self) -> tuple[str, int]:
        return self.wrapped.kek_id, self.wrapped.version


def seal(keys: KeyProvider, path: str, version: int, value: bytes) -> SecretRecord:
    """Seal ``value`` as ``path`` version ``version`` under a fresh data key."""
    if len(value) > MAX_VALUE:
        raise ValueError(f"a secret value is at most {MAX_VALUE} bytes")
    aad = binding(path, version)
    dek = AESGCM.generate_key(bit_length=KEY_SIZE * 8)
    nonce = os.urandom(NONCE_SIZE)
    ciphertext = AESGCM(dek).encrypt(nonce, bytes(value), aad)
    return SecretRecord(path, version, keys.wrap(dek, aad), nonce, ciphertext, len(value))


def open_record(keys: KeyProvider, record: SecretRecord, path: str, version: int) -> bytes:
    """The value of ``record``, which must have been sealed as ``path`` version ``version``.

    A record moved or copied to another path or version, a changed byte, or a data key wrapped
    for another secret raises IntegrityError; no plaintext is returned unless it authenticates.
    """
    aad = binding(path, version)
    dek = _unwrap(keys, record, path, version, aad)
    try:
        value = AESGCM(dek).decrypt(record.nonce, record.ciphertext, aad)
    except InvalidTag:
        raise IntegrityError(_moved(record, path, version)) from None
    if len(value) != record.size:
        raise IntegrityError(f"the sealed value of {path} version {version} has the wrong size")
    return value


def rewrap(keys: KeyProvider, record: SecretRecord, path: str, version: int) -> SecretRecord:
    """The same record with its data key wrapped under the primary KEK version; the
    ciphertext is untouched. Like opening, it must be where it was sealed."""
    aad = binding(path, version)
    dek = _unwrap(keys, record, path, version, aad)
    return SecretRecord(path, version, keys.wrap(dek, aad), record.nonce, record.ciphertext,
                        record.size)


def _unwrap(keys: KeyProvider, record: SecretRecord, path: str, version: int, aad: bytes) -> bytes:
    """The record's data key; a record claiming another place is reported as moved, else the
    key provider's own reason (another KEK, a retired version, tampering) is kept."""
    try:
        return keys.unwrap(record.wrapped, aad)
    except UnwrapError as exc:
        if (record.path, record.version) != (path, version):
            raise IntegrityError(_moved(record, path, version)) from None
        raise IntegrityError(f"the data key of {path} version {version} cannot be unwrapped: "
                             f"{exc}") from None


def _moved(record: SecretRecord, path: str, version: int) -> str:
    where = ("" if (record.path, record.version) == (path, version)
             else f" (it claims to be {record.path!r} version {record.version})")
    return (f"the sealed value of {path} version {version} failed authentication{where}: it was "
            "sealed for another path or version, moved or altered on the backend, or its key is "
            "not the configured KEK; it is not returned")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)
