"""Admin routes for the key-encryption key: status, rotate, retire, rewrap."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..rotation import KeyRotation, RotationError
from .rest import ApiError, Call, Reply, Router

ARN = "arn:orgmem:admin:::kek"
MAX_BATCH = 5000


class Retirement(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=1)


class RewrapRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resume: bool = False
    limit: int = Field(default=500, ge=1, le=MAX_BATCH)


def add_routes(router: Router, prefix: str, rotation: KeyRotation) -> None:
    def kek(call: Call) -> str:
        return ARN

    def status(call: Call) -> Reply:
        return Reply(data=rotation.status())

    def rotate(call: Call) -> Reply:
        with _errors():
            primary = rotation.rotate()
        return Reply(data={"primary": primary, "versions": rotation.keys.versions()})

    def retire(call: Call) -> Reply:
        body = call.model(Retirement)
        with _errors():
            return Reply(data=rotation.retire(body.version))

    def rewrap(call: Call) -> Reply:
        body = call.model(RewrapRequest) if call.body.strip() else RewrapRequest()
        batch = rotation.rewrap(body.resume, body.limit)
        return Reply(data={"scanned": batch.scanned, "rewrapped": batch.rewrapped, "done": batch.done,
                           "position": list(batch.position) if batch.position else None,
                           "skipped": batch.skipped, "skipped_keys": batch.skipped_keys,
                           "primary": rotation.keys.primary_version()})

    router.add("GET", f"{prefix}/vault/kek", "KekStatus", "admin:ManageKeys", kek, status)
    router.add("POST", f"{prefix}/vault/kek/rotate", "RotateKek", "admin:ManageKeys", kek, rotate)
    router.add("POST", f"{prefix}/vault/kek/retire", "RetireKek", "admin:ManageKeys", kek, retire)
    router.add("POST", f"{prefix}/vault/rewrap", "Rewrap", "admin:ManageKeys", kek, rewrap)


class _errors:
    """Rotation refusals as API errors with their codes."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if isinstance(exc, RotationError):
            raise ApiError(exc.code, exc.message, exc.status) from None
        return False
