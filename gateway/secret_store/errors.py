"""The one error type of the secret store: an S3-style code, a message, an HTTP status."""

from __future__ import annotations

#: The HTTP status of each code the vault answers.
STATUS = {
    "InvalidPath": 400, "InvalidRequest": 400, "ValueTooLarge": 413, "CasMismatch": 412,
    "NoSuchSecret": 404, "SecretDestroyed": 410, "Conflict": 409, "SecretDamaged": 500,
    "ServiceUnavailable": 503,
}


class SecretError(Exception):
    """A refusal the caller can act on. Messages never carry a secret value."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = STATUS[code]
