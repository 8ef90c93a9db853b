"""Who is calling: principals and the credentials that prove it."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: its name, the key it signed with, and its teams."""

    name: str
    access_key: str
    is_root: bool = False
    teams: tuple[str, ...] = field(default=())
    kind: str = "agent"
    #: a disabled principal's signatures still verify, so it learns why it is refused
    disabled: bool = False
    #: sandbox credentials: when the key stops working (unix seconds); None for a lasting key.
    #: Checked at each request, so expiry needs no document refresh.
    expires_at: float | None = None
    #: sandbox credentials narrowed by a session policy: its name, or ``inline:<access key>``;
    #: the principal may do only what its own policies and this one both allow
    session_policy: str | None = None

    @property
    def temporary(self) -> bool:
        return self.expires_at is not None


class CredentialStore(Protocol):
    """Looks up the secret behind an access key; None when the key is unknown or disabled."""

    def lookup(self, access_key: str) -> tuple[Principal, str] | None: ...


class RootCredentials:
    """The gateway's root identity: from the environment or generated, never subject to policies."""

    def __init__(self, access_key: str, secret_key: str) -> None:
        self._principal = Principal("root", access_key, is_root=True, kind="root")
        self._secret = secret_key

    @property
    def principal(self) -> Principal:
        return self._principal

    def lookup(self, access_key: str) -> tuple[Principal, str] | None:
        candidate = access_key.encode("utf-8", "surrogateescape")
        if hmac.compare_digest(candidate, self._principal.access_key.encode()):
            return self._principal, self._secret
        return None
