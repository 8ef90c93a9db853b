"""KEK rotation: status per version, new versions, retirement, and rewrapping.

Runs inside the gateway (the embedded store is locked to it), driven by the
admin API and the ``orgmem vault`` CLI. Rewrapping goes in batches from a
checkpoint kept in the internal bucket, so it survives an interrupted CLI or
a restarted gateway (``--resume``) and runs while traffic is served: each
object is rewrapped with a compare-and-swap on its ETag, so a concurrent
overwrite wins (it is sealed under the primary version already).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from io import BytesIO

import orjson

from .sealing import UNSEALED_PREFIX, read_internal, sealed_objects
from .secret_store.service import Secrets
from .store.base import INTERNAL_BUCKET, NoSuchKey, ObjectMeta, StoreError
from .store.sealed import SealedStore

CHECKPOINT = UNSEALED_PREFIX + "rewrap.json"
#: Objects rewrapped at once within a batch, unless the backend says how many calls it
#: takes at once (``parallel_calls``: an upstream S3 service, where each is a round trip).
REWRAP_WORKERS = 8


class RotationError(Exception):
    code = "InvalidRequest"
    status = 400

    def __init__(self, message: str, code: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.code
        self.status = status or self.status


@dataclass
class RewrapBatch:
    scanned: int
    rewrapped: int
    done: bool
    #: where the next batch starts: (bucket, key) of the last object looked at
    position: tuple[str, str] | None


class KeyRotation:
    def __init__(self, sealed: SealedStore, secrets: Secrets | None = None) -> None:
        self.sealed = sealed
        #: the vault's secrets carry a data key of their own each, rewrapped here too
        self.secrets = secrets
        self._lock = threading.Lock()  # one rewrap batch at a time

    @property
    def keys(self):
        return self.sealed.keys

    def status(self) -> dict:
        """Objects per (KEK id, version): what rewrap has left, what retire would strand."""
        counts: Counter[str] = Counter()
        for bucket, key in self._objects():
            found = self._version(bucket, key)
            counts["unsealed" if found is None else
                   (str(found[1]) if found[0] == self.keys.kek_id else f"{found[0]}#{found[1]}")] += 1
        retired = getattr(self.keys, "retired_versions", lambda: [])()
        secrets = self.secrets.kek_versions() if self.secrets else Counter()
        return {"kek_id": self.keys.kek_id, "primary": self.keys.primary_version(),
                "versions": self.keys.versions(), "retired": retired,
                "objects_by_version": dict(sorted(counts.items())),
                "total": sum(counts.values()),
                "secrets_by_version": dict(sorted(secrets.items())),
                "secrets_total": sum(secrets.values())}

    def rotate(self) -> int:
        rotate = getattr(self.keys, "rotate", None)
        if rotate is None:
            raise RotationError(
                f"the {self.keys.kek_id} KEK is not rotated by the gateway: for aws-kms restart "
                "with the new key first (--kek aws-kms:NEW,OLD); for env: and passphrase keys, "
                "move to a file: keyring to rotate", code="NotRotatable")
        return rotate()

    def retire(self, version: int) -> dict:
        retire = getattr(self.keys, "retire", None)
        if retire is None:
            raise RotationError(f"the {self.keys.kek_id} KEK has no versions to retire",
                                code="NotRotatable")
        if version not in self.keys.versions():
            raise RotationError(f"there is no KEK version {version}", code="NoSuchEntity", status=404)
        if version == self.keys.primary_version():
            raise RotationError(f"version {version} is the primary: rotate first, then rewrap")
        status = self.status()
        in_use = status["objects_by_version"].get(str(version), 0)
        secrets = status["secrets_by_version"].get(str(version), 0)
        if in_use or secrets:
            raise RotationError(f"{in_use} objects and {secrets} secret versions are still sealed "
                                f"under version {version}: run `orgmem vault rewrap` first",
                                code="DeleteConflict", status=409)
        retire(version)
        return {"retired": version, "primary": self.keys.primary_version()}

    def rewrap(self, resume: bool, limit: int) -> RewrapBatch:
        """Rewrap up to ``limit`` objects after the checkpoint (or from the start).

        Objects are rewrapped several at a time: on an upstream S3 service each is two
        round trips (a HEAD and a conditional copy onto itself), and the checkpoint only moves
        once the whole batch is done."""
        with self._lock:
            position = self._checkpoint() if resume else None
            batch = list(itertools.islice(self._objects(after=position), limit + 1))
            more, batch = len(batch) > limit, batch[:limit]
            workers = getattr(self.sealed.inner, "parallel_calls", REWRAP_WORKERS)
            with ThreadPoolExecutor(workers, thread_name_prefix="orgmem-rewrap") as pool:
                rewrapped = sum(pool.map(self._rewrap_one, batch))
            if more:
                self._save_checkpoint(batch[-1])
                return RewrapBatch(len(batch), rewrapped, False, batch[-1])
            self._clear_checkpoint()
            # the objects are done; the secrets' own data keys follow (a few per secret)
            if self.secrets is not None:
                rewrapped += self.secrets.rewrap()
            return RewrapBatch(len(batch), rewrapped, True, None)

    def _rewrap_one(self, name: tuple[str, str]) -> int:
        try:
            return int(self.sealed.rewrap(*name))
        except NoSuchKey:
            return 0  # deleted meanwhile

    # -- walking the store ---------------------------------------------------------

    def _objects(self, after: tuple[str, str] | None = None) -> Iterator[tuple[str, str]]:
        return sealed_objects(self.sealed.inner, after)

    def _version(self, bucket: str, key: str) -> tuple[str, int] | None:
        try:
            return self.sealed.key_version(bucket, key)
        except NoSuchKey:
            return None
        except (StoreError, ValueError):
            return ("damaged", 0)

    # -- checkpoint ------------------------------------------------------------------

    def _checkpoint(self) -> tuple[str, str] | None:
        raw = read_internal(self.sealed.inner, CHECKPOINT)
        if raw is None:
            return None
        record = orjson.loads(raw)
        return record["bucket"], record["key"]

    def _save_checkpoint(self, position: tuple[str, str] | None) -> None:
        if position is None:
            return
        record = {"bucket": position[0], "key": position[1], "at": time.time()}
        self.sealed.inner.put_object(INTERNAL_BUCKET, CHECKPOINT, BytesIO(orjson.dumps(record)),
                                     ObjectMeta(content_type="application/json"))

    def _clear_checkpoint(self) -> None:
        try:
            self.sealed.inner.delete_object(INTERNAL_BUCKET, CHECKPOINT)
        except NoSuchKey:
            pass
