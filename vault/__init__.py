"""Envelope encryption library: the sealed object format (``stream``), key-encryption keys and
the wrapping of data keys (``keys``), and their errors. Never imports ``gateway``."""

from .errors import (
    IntegrityError,
    KeyringError,
    KeyUnavailable,
    MissingKey,
    SealedSizeError,
    SizeMismatch,
    UnwrapError,
    VaultError,
    WrongKey,
)

__all__ = ["IntegrityError", "KeyUnavailable", "KeyringError", "MissingKey", "SealedSizeError",
           "SizeMismatch", "UnwrapError", "VaultError", "WrongKey"]
