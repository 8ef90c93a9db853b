"""The vault's errors. Messages say what happened and what to do; they never carry key
material, passphrases, plaintext or wrapped-key bytes."""

from __future__ import annotations


class VaultError(Exception):
    """Base class of every error the vault raises on purpose."""


class MissingKey(VaultError):
    """The key-encryption key is not available (file absent, variable unset, no passphrase,
    KMS key not found). The gateway must refuse to start; it never falls back to plaintext."""


class WrongKey(MissingKey):
    """A KEK is available but it is not the one this deployment was sealed with (a wrong
    passphrase, detected at start by the stored check value)."""


class KeyringError(VaultError):
    """A keyring file is malformed, unsafe (group/other permissions), or in a forbidden place,
    or a keyring operation was refused (retiring the primary, creating over an existing file)."""


class UnwrapError(VaultError):
    """A wrapped data key cannot be unwrapped: another KEK, an unknown or retired version,
    associated data of another object (the key was moved), or tampering."""


class KeyUnavailable(VaultError):
    """The KEK exists but cannot be reached right now (KMS unreachable, throttled, disabled key).
    Retrying later may succeed; answer 503, not "corrupt"."""


class IntegrityError(VaultError):
    """A sealed object failed authentication: a flipped bit, truncation, reordered, duplicated or
    moved chunks or parts, a header of another object, or a wrong data key. Raised before any
    unauthenticated byte is returned."""


class SealedSizeError(IntegrityError, ValueError):
    """A ciphertext size that no plaintext size maps to (a truncated or foreign object).
    Also a ValueError, so size arithmetic callers may catch either."""


class SizeMismatch(VaultError):
    """The plaintext source yielded more or fewer bytes than the declared size (a short or long
    request body). The sealed output so far must be discarded."""
