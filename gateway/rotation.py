"""KEK rotation: status per version, new versions, retirement, and rewrapping.

Runs inside the gateway (the embedded store is locked to it), driven by the
admin API and the ``orgmem vault`` CLI. Rewrapping goes in batches from a
checkpoint kept in the internal bucket, so it survives an interrupted CLI or
a restarted gateway (``--resume``) and runs while traffic is served: each
object is rewrapped with a compare-and-swap on its ETag, so a concurrent
overwrite wins (it is sealed under the primary version already).

Every sealed object is covered, the vault's secret store included (its objects under the
internal bucket's ``vault/`` prefix; only the unsealed bookkeeping records are left out). An
object whose wrapped key is damaged is skipped and reported, never a failed batch. Multipart
uploads in progress keep the data key of their creation, wrapped under the version primary
then: the store offers no way to rewrap it, so ``status`` counts them per version and
``retire`` refuses while any uses the version (they complete, expire or are aborted).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from io import BytesIO

import orjson

from vault.errors import VaultError
from vault.keys import WrappedKey

from .logs import log
from .sealing import (
    REWRAP_CHECKPOINT,
    SealingError,
    announce_key_check,
    next_key_version,
    read_internal,
    sealed_objects,
)
from .secret_store.service import Secrets
from .store.base import INTERNAL_BUCKET, NoSuchBucket, NoSuchKey, ObjectMeta, StoreError, StoreUnavailable
from .store.sealed import SealedStore, SealError

CHECKPOINT = REWRAP_CHECKPOINT
#: At most this many skipped names are returned with one batch (all are counted and logged).
MAX_SKIPPED_NAMES = 100
#: Objects rewrapped at once within a batch, unless the backend says how many calls it
#: takes at once (``parallel_calls``: an upstream S3 service, where each is a round trip).
REWRAP_WORKERS = 8


@contextlib.contextmanager
def _keyring_errors() -> Iterator[None]:
    """A keyring the gateway cannot change (bad permissions, damaged, read-only): say why, as
    a 409 the operator can act on, not an internal error with the reason in a log."""
    try:
        yield
    except VaultError as exc:
        raise RotationError(f"the keyring cannot be changed: {exc}", code="KeyringError", status=409) \
            from None
    except OSError as exc:
        raise RotationError(f"the keyring cannot be written ({exc.strerror or exc.__class__.__name__}: "
                            "is its directory writable by the gateway?)", code="KeyringError",
                            status=409) from None


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
    #: objects (and secret records) that could not be rewrapped (a damaged wrapped key, or none
    #: at all): how many, and the first MAX_SKIPPED_NAMES of them as "bucket/key"
    skipped: int = 0
    skipped_keys: list[str] = field(default_factory=list)


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
        """Objects, secret versions and multipart uploads in progress per (KEK id, version):
        what rewrap has left, what retire would strand."""
        counts: Counter[str] = Counter()
        for bucket, key in self._objects():
            try:
                found = self._version(bucket, key)
            except (NoSuchKey, NoSuchBucket):
                continue  # deleted meanwhile
            counts[self._label(found)] += 1
        retired = getattr(self.keys, "retired_versions", lambda: [])()
        secrets = self.secrets.kek_versions() if self.secrets else Counter()
        uploads = self._uploads_by_version()
        return {"kek_id": self.keys.kek_id, "primary": self.keys.primary_version(),
                "versions": self.keys.versions(), "retired": retired,
                "objects_by_version": dict(sorted(counts.items())),
                "total": sum(counts.values()),
                "secrets_by_version": dict(sorted(secrets.items())),
                "secrets_total": sum(secrets.values()),
                "uploads_by_version": dict(sorted(uploads.items())),
                "uploads_total": sum(uploads.values())}

    def _label(self, found: tuple[str, int] | None) -> str:
        if found is None:
            return "unsealed"
        return str(found[1]) if found[0] == self.keys.kek_id else f"{found[0]}#{found[1]}"

    def rotate(self) -> int:
        rotate = getattr(self.keys, "rotate", None)
        if rotate is None:
            raise RotationError(
                f"the {self.keys.kek_id} KEK is not rotated by the gateway: for aws-kms restart "
                "with the new key first (--kek aws-kms:NEW,OLD); env: and passphrase keys have one "
                "version and cannot be rotated (choose file: or aws-kms: for a rotatable KEK)",
                code="NotRotatable")
        inner = self.sealed.inner
        try:
            # a keyring that is an older copy (another host's, a restored backup) is refused
            # before it makes a key, and the new number comes after every recorded one
            at_least = next_key_version(inner, self.keys)
            with _keyring_errors():
                return rotate(at_least=at_least,
                              announce=lambda version, check: announce_key_check(inner, version, check))
        except SealingError as exc:
            raise RotationError(str(exc), code="KeyringConflict", status=409) from None

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
        uploads = status["uploads_by_version"].get(str(version), 0)
        damaged = status["objects_by_version"].get("damaged#0", 0) + \
            status["secrets_by_version"].get("damaged#0", 0)
        refusals = []
        if damaged:
            refusals.append(
                f"{damaged} objects or secret versions have a wrapped key that cannot be read, so "
                f"whether they use version {version} is unknown: restore them from backup or "
                "delete them (their names are in the gateway's log), then retire")
        if in_use or secrets:
            refusals.append(
                f"{in_use} objects and {secrets} secret versions are still sealed under version "
                f"{version}: run `orgmem vault rewrap` first (an object rewrap reports as damaged "
                "cannot be rewrapped: restore it from backup or delete it)")
        if uploads:
            refusals.append(
                f"{uploads} multipart uploads in progress were started under version {version}; "
                "an upload keeps the data key of its creation and cannot be rewrapped: retire the "
                "version once they are completed, or have expired (after --upload-expiry, 7 days "
                "by default), or abort them (`aws s3api list-multipart-uploads` lists them, "
                "`abort-multipart-upload` aborts one)")
        if refusals:
            raise RotationError(f"KEK version {version} is still in use: " + "; and ".join(refusals),
                                code="DeleteConflict", status=409)
        with _keyring_errors():
            retire(version)
        self.sealed.forget_opened()  # data keys opened under the version before it was retired
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
                results = list(pool.map(self._rewrap_one, batch))
            rewrapped = sum(n for n, _ in results)
            skipped = [name for _, name in results if name is not None]
            if more:
                self._save_checkpoint(batch[-1])
                return RewrapBatch(len(batch), rewrapped, False, batch[-1], len(skipped),
                                   skipped[:MAX_SKIPPED_NAMES])
            self._clear_checkpoint()
            # the objects are done; the secrets' own data keys follow (a few per secret)
            if self.secrets is not None:
                rewrapped += self.secrets.rewrap(skipped)
            return RewrapBatch(len(batch), rewrapped, True, None, len(skipped),
                               skipped[:MAX_SKIPPED_NAMES])

    def _rewrap_one(self, name: tuple[str, str]) -> tuple[int, str | None]:
        """1 when rewrapped, 0 when not needed (already under the primary, changed or deleted
        meanwhile); with the object's name when it cannot be rewrapped: its wrapped key is
        damaged, or missing. Those are skipped and logged (their names only: no key material),
        so one damaged object neither fails the batch nor holds the checkpoint back; retire
        still counts them under their version. An unreachable KEK (StoreUnavailable) still
        fails the batch: retrying later helps."""
        bucket, key = name
        try:
            return int(self.sealed.rewrap(bucket, key)), None
        except (NoSuchKey, NoSuchBucket):
            return 0, None  # deleted meanwhile
        except (SealError, ValueError) as exc:
            reason = "its data key does not unwrap" if isinstance(exc, SealError) \
                else "it has no valid wrapped data key"
            log.warning("rewrap_skipped", bucket=bucket, key=key, reason=reason)
            return 0, f"{bucket}/{key}"

    # -- walking the store ---------------------------------------------------------

    def _objects(self, after: tuple[str, str] | None = None) -> Iterator[tuple[str, str]]:
        return sealed_objects(self.sealed.inner, after)

    def _version(self, bucket: str, key: str) -> tuple[str, int] | None:
        """The (KEK id, version) of an object's wrapped key; None when it has none."""
        try:
            return self.sealed.key_version(bucket, key)
        except (NoSuchKey, NoSuchBucket, StoreUnavailable):
            # deleted meanwhile: not counted; an upstream that failed answers nothing about it,
            # so the count fails (retire must never go ahead on a guess)
            raise
        except (StoreError, ValueError):
            return ("damaged", 0)

    def _uploads_by_version(self) -> Counter[str]:
        """Multipart uploads in progress per KEK version: each keeps the data key wrapped at
        its creation until it completes, expires or is aborted."""
        counts: Counter[str] = Counter()
        inner = self.sealed.inner
        for bucket in sorted(b.name for b in inner.list_buckets()):
            try:
                uploads = inner.list_uploads(bucket)
            except NoSuchBucket:
                continue  # deleted meanwhile
            for upload in uploads:
                try:
                    wrapped = WrappedKey.decode(upload.meta.sealed or "")
                    found: tuple[str, int] | None = (wrapped.kek_id, wrapped.version)
                except ValueError:
                    found = ("damaged", 0) if upload.meta.sealed else None
                counts[self._label(found)] += 1
        return counts

    # -- checkpoint ------------------------------------------------------------------

    def _checkpoint(self) -> tuple[str, str] | None:
        raw = read_internal(self.sealed.inner, CHECKPOINT)
        if raw is None:
            return None
        record = orjson.loads(raw)
        if record.get("primary", self.keys.primary_version()) != self.keys.primary_version():
            return None  # left by a rewrap to an earlier primary: what it passed needs doing again
        return record["bucket"], record["key"]

    def _save_checkpoint(self, position: tuple[str, str] | None) -> None:
        if position is None:
            return
        record = {"bucket": position[0], "key": position[1], "at": time.time(),
                  "primary": self.keys.primary_version()}
        self.sealed.inner.put_object(INTERNAL_BUCKET, CHECKPOINT, BytesIO(orjson.dumps(record)),
                                     ObjectMeta(content_type="application/json"))

    def _clear_checkpoint(self) -> None:
        try:
            self.sealed.inner.delete_object(INTERNAL_BUCKET, CHECKPOINT)
        except NoSuchKey:
            pass
