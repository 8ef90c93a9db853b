"""Root credentials: from the environment, or generated once and kept owner-only.

The generated pair is written to ``<data>/.orgmem/root-credentials.json`` with
mode 0600 inside a 0700 directory; the encryption issue seals this file.
"""

from __future__ import annotations

import json
import os
import secrets
import string
from pathlib import Path

_ALPHABET = string.ascii_uppercase + string.digits


def generate() -> tuple[str, str]:
    access = "OM" + "".join(secrets.choice(_ALPHABET) for _ in range(18))
    secret = secrets.token_urlsafe(30)[:40]
    return access, secret


def load_or_create(data_dir: Path, env_access: str | None,
                   env_secret: str | None) -> tuple[str, str, bool]:
    """``(access, secret, created)``; ``created`` is True only the first time a pair is generated."""
    if env_access and env_secret:
        return env_access, env_secret, False
    internal = data_dir / ".orgmem"
    internal.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(internal, 0o700)
    path = internal / "root-credentials.json"
    if path.exists():
        stored = json.loads(path.read_text())
        return stored["access_key"], stored["secret_key"], False
    access, secret = generate()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"access_key": access, "secret_key": secret}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, path)
    return access, secret, True
