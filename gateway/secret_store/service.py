"""The vault's secret store: versioned secrets, check-and-set, soft delete, undelete, destroy.

Each version's value is sealed by ``vault.secrets`` under a fresh data key bound to its path and
version, and written as its own object before the path's metadata is swapped to list it (see
``paths`` for the layout and ``metadata`` for the table). A writer that dies between the two
leaves an unlisted record, never a listed version without a value; unlisted records older than
``ORPHAN_GRACE`` are swept at the path's next write.

The service also keeps the plaintext of every readable version in memory (``values``) so the
biography redactor can remove a secret wherever an agent pastes it. Other gateways' writes
reach that set through :meth:`refresh_values`, which the gateway runs every few seconds.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, TypeVar

from vault import IntegrityError, KeyUnavailable, VaultError
from vault import secrets as sealed
from vault.keys import KeyProvider

from ..iam.audit import iso_ms
from ..logs import log
from ..store.base import INTERNAL_BUCKET, NoSuchKey, ObjectStore, PreconditionFailed, WriteCondition
from ..store.objects import read_object, swap_condition, write_object
from ..store.sealed import SealError
from .errors import SecretError
from .metadata import SecretMeta, check_custom, check_max_versions
from .paths import (
    META_PREFIX,
    check_path,
    check_prefix,
    data_prefix,
    meta_key,
    new_record_name,
    path_of_meta,
)

T = TypeVar("T")
_CAS_ATTEMPTS = 8
#: Unlisted records younger than this may belong to a writer still at work.
ORPHAN_GRACE = 600.0
MAX_LIST = 1000
#: The most versions one undelete or destroy names.
MAX_VERSIONS_PER_CALL = 100
#: The largest version number a request may name (twelve digits, as in queries).
MAX_VERSION_NUMBER = 10**12 - 1


class Secrets:
    def __init__(self, store: ObjectStore, keys: KeyProvider,
                 on_values: Callable[[Iterable[str]], None] | None = None) -> None:
        self.store = store
        self.keys = keys
        self._on_values = on_values
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        #: (path, version) -> the texts to redact for it (see _texts); never logged
        self._values: dict[tuple[str, int], tuple[str, ...]] = {}
        #: meta key -> ETag, as last read by refresh_values
        self._seen: dict[str, str] = {}

    # -- writing ------------------------------------------------------------------

    def put(self, path: str, value: bytes, by: str, cas: int | None = None,
            custom: dict[str, str] | None = None) -> dict[str, Any]:
        """Store ``value`` as the path's next version; ``cas`` must equal the current version
        (0: the path must not exist)."""
        check_path(path)
        if len(value) > sealed.MAX_VALUE:
            raise SecretError("ValueTooLarge", f"A secret value is at most {sealed.MAX_VALUE} bytes; "
                              f"this one is {len(value)}.")
        if custom is not None:
            custom = check_custom(custom)
        for _ in range(_CAS_ATTEMPTS):
            meta, etag = self._read(path)
            meta = meta or SecretMeta(path)
            if cas is not None and cas != meta.current:
                raise SecretError("CasMismatch", _cas_message(path, cas, meta.current))
            version = meta.current + 1
            name = new_record_name(version)
            record = sealed.seal(self.keys, path, version, value)
            write_object(self.store, INTERNAL_BUCKET, data_prefix(path) + name, record.encode(),
                         "application/json", WriteCondition(if_none_match=True))
            now = time.time()
            _, dropped = meta.add_version(name, by, now)
            if custom is not None:
                meta.custom = custom
            # versions pruned past max_versions lose their records first: a crash after this
            # leaves them listed but unreadable (410), never unlisted but still on the backend
            self._delete_records(path, dropped)
            if self._swap(path, meta, etag):
                self._remember(path, version, value, publish=False)
                self._keep_values(path, meta.versions)
                self._sweep(path, meta, now)
                return {"path": path, "version": version, "created_time": iso_ms(now), "created_by": by}
            self._delete_records(path, [name])  # lost the race: our record is nobody's
        raise _busy(path)

    def delete(self, path: str, versions: list[int] | None = None) -> dict[str, Any]:
        """Soft-delete the latest version (or ``versions``): unreadable until undeleted."""
        def change(meta: SecretMeta) -> None:
            for n in versions or [meta.current]:
                entry = meta.entry(n)
                if not entry.destroyed and entry.deleted is None:
                    entry.deleted = time.time()
        return self._update(path, change, versions)

    def undelete(self, path: str, versions: list[int]) -> dict[str, Any]:
        def change(meta: SecretMeta) -> None:
            for n in versions:
                entry = meta.entry(n)
                if entry.destroyed:
                    raise SecretError("SecretDestroyed", f"Version {n} of {path} was destroyed; it "
                                      "can never be read or undeleted.")
                entry.deleted = None
        return self._update(path, change, _required(versions))

    def destroy(self, path: str, versions: list[int]) -> dict[str, Any]:
        """Discard the records (and so the wrapped data keys) of ``versions`` for good.

        The records go before the metadata says so: should the swap fail or the gateway stop
        in between, the versions are already unreadable, and a retry finishes the job."""
        def change(meta: SecretMeta) -> None:
            entries = [meta.entry(n) for n in versions]  # every version named must exist
            self._delete_records(path, [e.record for e in entries if e.record])
            for entry in entries:
                entry.record = None
        view = self._update(path, change, _required(versions))
        self._keep_values(path, _readable(view))
        return view

    def set_metadata(self, path: str, max_versions: int | None = None,
                     custom: dict[str, str] | None = None) -> dict[str, Any]:
        if max_versions is not None:
            check_max_versions(max_versions)
        if custom is not None:
            custom = check_custom(custom)
        def change(meta: SecretMeta) -> None:
            if max_versions is not None:
                meta.max_versions = max_versions
                self._delete_records(path, meta.prune())  # before the swap, as in destroy
            if custom is not None:
                meta.custom = custom
        view = self._update(path, change, None)
        self._keep_values(path, _readable(view))
        return view

    def destroy_all(self, path: str) -> None:
        """Destroy every version and forget the path (its versions start again at 1).

        The metadata is swapped for an empty one rather than deleted, so a writer racing
        with this loses its compare-and-swap and retries on the empty path instead of
        having its freshly written record swept away; only records listed in the
        metadata this call read are deleted (before the swap, as in :meth:`destroy`)."""
        check_path(path)
        for _ in range(_CAS_ATTEMPTS):
            meta, etag = self._read(path)
            if meta is None or meta.empty:
                raise _no_such(path)
            self._delete_records(path, [e.record for e in meta.versions.values() if e.record])
            if self._swap(path, SecretMeta(path), etag):
                break
        else:
            raise _busy(path)
        self._keep_values(path, ())

    # -- reading ------------------------------------------------------------------

    def get(self, path: str, version: int | None = None) -> tuple[bytes, dict[str, Any]]:
        """A version's value (the latest by default) and its description."""
        check_path(path)
        meta, _ = self._read(path)
        if meta is None or meta.empty:
            raise _no_such(path)
        n = meta.current if version is None else version
        entry = meta.entry(n)
        if entry.destroyed:
            raise SecretError("SecretDestroyed", f"Version {n} of {path} was destroyed; it can never "
                              "be read again.")
        if entry.deleted is not None:
            raise SecretError("NoSuchSecret", f"Version {n} of {path} is deleted; undelete it to read "
                              "it" + ("" if version else ", or ask for an earlier ?version=N") + ".")
        value = self._open(path, n, entry.record)
        return value, {"path": path, "version": n, "metadata": dict(meta.custom),
                       **{k: v for k, v in entry.view(n).items() if k in ("created_time", "created_by")}}

    def metadata(self, path: str) -> dict[str, Any]:
        check_path(path)
        meta, _ = self._read(path)
        if meta is None or meta.empty:
            raise _no_such(path)
        return meta.view()

    def list(self, prefix: str, recursive: bool = False, after: str = "",
             hidden: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """The secrets (and, unless recursive, folders) under ``prefix``; never values.

        ``hidden(path_or_folder)`` leaves entries out, and the cursor never names one: it is
        the last entry shown, and pages of hidden entries alone are read through."""
        check_prefix(prefix)
        rows: list[dict[str, Any]] = []
        folders: list[str] = []
        cursor = after
        while True:
            page = self.store.list_objects(INTERNAL_BUCKET, META_PREFIX + prefix,
                                           delimiter="" if recursive else "/",
                                           after=(META_PREFIX + cursor) if cursor else "", limit=MAX_LIST)
            shown: list[str] = []  # the cursors of what this page shows
            for entry in page.entries:
                path = path_of_meta(entry.key)
                if path is None or (hidden is not None and hidden(path)):
                    continue
                meta = self._read(path)[0]
                if meta is not None and not meta.empty:
                    rows.append(meta.summary())
                    shown.append(entry.key[len(META_PREFIX):])
            for common in page.common_prefixes:
                folder = common[len(META_PREFIX):]
                if hidden is None or not hidden(folder):
                    folders.append(folder)
                    shown.append(folder)
            more = page.is_truncated and page.next_marker
            if not more or shown:
                break
            cursor = page.next_marker[len(META_PREFIX):]
        out: dict[str, Any] = {"prefix": prefix, "secrets": rows, "folders": folders}
        if more:
            out["next"] = max(shown) if hidden is not None else page.next_marker[len(META_PREFIX):]
        return out

    # -- keys: status and rewrap ------------------------------------------------------

    def kek_versions(self) -> Counter[str]:
        """Readable versions per KEK version (as ``KeyRotation.status`` names them); a record
        (or a path's metadata) that cannot be read is counted as ``damaged#0``."""
        counts: Counter[str] = Counter()

        def damaged(_key: str) -> None:
            counts["damaged#0"] += 1
        for path, _, name in self._records(damaged):
            record = self._record(path, name)
            kek_id, version = record.kek_version if record else ("damaged", 0)
            counts[str(version) if kek_id == self._kek_id() else f"{kek_id}#{version}"] += 1
        return counts

    def rewrap(self, skipped: list[str] | None = None) -> int:
        """Rewrap every record not under the primary KEK version; how many were.

        A record that cannot be rewrapped (damaged, or its path's metadata is) is skipped: its
        object name ("bucket/key") is appended to ``skipped`` and logged, never key material,
        and the others go on. An unreachable KEK still raises: retrying later helps."""
        primary, done = self.keys.primary_version(), 0

        def skip(key: str) -> None:
            log.warning("rewrap_skipped", bucket=INTERNAL_BUCKET, key=key,
                        reason="the secret record cannot be opened")
            if skipped is not None:
                skipped.append(f"{INTERNAL_BUCKET}/{key}")
        for path, version, name in self._records(skip):
            key = data_prefix(path) + name
            try:
                found = read_object(self.store, INTERNAL_BUCKET, key)
                if found is None:
                    continue  # destroyed meanwhile
                record = sealed.SecretRecord.decode(found[0])
                if record.kek_version == (self._kek_id(), primary):
                    continue
                fresh = sealed.rewrap(self.keys, record, path, version)
            except KeyUnavailable:
                raise
            except (SealError, VaultError):
                skip(key)
                continue
            try:
                write_object(self.store, INTERNAL_BUCKET, key, fresh.encode(), "application/json",
                             WriteCondition(if_match=found[1].etag))
                done += 1
            except (PreconditionFailed, NoSuchKey):
                continue  # destroyed or rewrapped by someone else meanwhile
        return done

    # -- redaction by value --------------------------------------------------------------

    def refresh_values(self) -> int:
        """Learn the values written or destroyed through other gateways; how many metadata
        objects changed. Only changed metadata (by ETag) is read."""
        listed: dict[str, str] = {}
        after = ""
        while True:
            page = self.store.list_objects(INTERNAL_BUCKET, META_PREFIX, after=after, limit=MAX_LIST)
            listed.update((e.key, e.etag) for e in page.entries)
            if not page.is_truncated or not page.next_marker:
                break
            after = page.next_marker
        changed = [k for k, etag in listed.items() if self._seen.get(k) != etag]
        gone = [k for k in self._seen if k not in listed]
        for key in changed:
            self._learn(key)
        for key in gone:
            self._keep_values(path_of_meta(key) or "", (), publish=False)
        self._seen = listed
        if changed or gone:
            self._publish()
        return len(changed) + len(gone)

    def _learn(self, key: str) -> None:
        path = path_of_meta(key)
        meta = self._read(path)[0] if path else None
        if meta is None or path is None:
            return
        readable = {n: e.record for n, e in meta.versions.items() if e.record}
        self._keep_values(path, readable, publish=False)
        with self._lock:
            missing = [n for n in readable if (path, n) not in self._values]
        for n in missing:
            try:
                value = self._open(path, n, readable[n])
            except SecretError:
                continue  # destroyed meanwhile, or damaged: nothing to redact
            self._remember(path, n, value, publish=False)

    def values(self) -> list[str]:
        with self._lock:
            return [text for texts in self._values.values() for text in texts]

    # -- internals ----------------------------------------------------------------------

    def _kek_id(self) -> str:
        return getattr(self.keys, "kek_id", "")

    def _read(self, path: str) -> tuple[SecretMeta | None, str | None]:
        found = read_object(self.store, INTERNAL_BUCKET, meta_key(path))
        if found is None:
            return None, None
        return SecretMeta.decode(found[0]), found[1].etag

    def _swap(self, path: str, meta: SecretMeta, etag: str | None) -> bool:
        try:
            write_object(self.store, INTERNAL_BUCKET, meta_key(path), meta.encode(), "application/json",
                         swap_condition(etag))
            return True
        except (PreconditionFailed, NoSuchKey):  # someone else changed it first
            return False

    def _update(self, path: str, change: Callable[[SecretMeta], None],
                versions: list[int] | None) -> dict[str, Any]:
        """Apply ``change`` to the path's metadata by compare-and-swap, retrying on races."""
        check_path(path)
        check_versions(versions)
        for _ in range(_CAS_ATTEMPTS):
            meta, etag = self._read(path)
            if meta is None or meta.empty:
                raise _no_such(path)
            change(meta)
            meta.updated = time.time()
            if self._swap(path, meta, etag):
                return meta.view()
        raise _busy(path)

    def _open(self, path: str, version: int, name: str | None) -> bytes:
        """The value of one version; a record that fails either seal (the store's, bound to the
        object's name, or its own, bound to path and version) is SecretDamaged, never data."""
        try:
            found = read_object(self.store, INTERNAL_BUCKET, data_prefix(path) + name) if name else None
            if found is None:
                raise SecretError("SecretDestroyed", f"Version {version} of {path} was destroyed; it "
                                  "can never be read again.")
            return sealed.open_record(self.keys, sealed.SecretRecord.decode(found[0]), path, version)
        except KeyUnavailable:
            raise SecretError("ServiceUnavailable", "The key-encryption key cannot be reached right "
                              "now; try again shortly.") from None
        except (VaultError, SealError) as exc:
            raise SecretError("SecretDamaged", f"Version {version} of {path} cannot be opened: "
                              f"{str(exc).rstrip('.')}.") from None

    def _record(self, path: str, name: str) -> sealed.SecretRecord | None:
        try:
            found = read_object(self.store, INTERNAL_BUCKET, data_prefix(path) + name)
        except SealError:
            return None  # its object fails the store's seal: damaged
        if found is None:
            return None
        try:
            return sealed.SecretRecord.decode(found[0])
        except IntegrityError:
            return None

    def _records(self, damaged: Callable[[str], None] | None = None) -> Iterator[tuple[str, int, str]]:
        """(path, version, record name) of every readable version, path by path. A path whose
        metadata cannot be read is passed (its object key) to ``damaged``, or raises."""
        after = ""
        while True:
            page = self.store.list_objects(INTERNAL_BUCKET, META_PREFIX, after=after, limit=MAX_LIST)
            for entry in page.entries:
                path = path_of_meta(entry.key)
                try:
                    meta = self._read(path)[0] if path else None
                except (SealError, SecretError) as exc:
                    if damaged is None or (isinstance(exc, SecretError) and exc.code != "SecretDamaged"):
                        raise
                    damaged(entry.key)
                    continue
                for n, e in sorted(meta.versions.items()) if meta else ():
                    if e.record:
                        yield meta.path, n, e.record
            if not page.is_truncated or not page.next_marker:
                return
            after = page.next_marker

    def _delete_records(self, path: str, names: Iterable[str]) -> None:
        for name in names:
            try:
                self.store.delete_object(INTERNAL_BUCKET, data_prefix(path) + name)
            except NoSuchKey:
                pass

    def _sweep(self, path: str, meta: SecretMeta, now: float) -> None:
        """Delete this path's records no version lists, once surely abandoned."""
        listed = {e.record for e in meta.versions.values() if e.record}
        page = self.store.list_objects(INTERNAL_BUCKET, data_prefix(path), delimiter="/", limit=MAX_LIST)
        orphans = [e.key.rsplit("/", 1)[1] for e in page.entries
                   if e.key.rsplit("/", 1)[1] not in listed and e.last_modified < now - ORPHAN_GRACE]
        self._delete_records(path, orphans)

    def _remember(self, path: str, version: int, value: bytes, publish: bool = True) -> None:
        texts = _texts(value)
        if not texts:
            return  # binary values are not found in text
        with self._lock:
            self._values[(path, version)] = texts
        if publish:
            self._publish()

    def _keep_values(self, path: str, readable: Collection[int], publish: bool = True) -> None:
        """Stop redacting the path's versions not in ``readable`` (destroyed or pruned)."""
        with self._lock:
            for key in [k for k in self._values if k[0] == path and k[1] not in readable]:
                del self._values[key]
        if publish:
            self._publish()

    def _publish(self) -> None:
        """Hand the current values to the redactor; snapshot and hand-over under one lock, so
        a slower publisher never installs an older set over a newer one."""
        if self._on_values is not None:
            with self._publish_lock:
                self._on_values(self.values())


def _texts(value: bytes) -> tuple[str, ...]:
    """What to redact for one value: its text, the text without surrounding whitespace (a
    file's trailing newline), and for a JSON object each string in it (what ``orgmem run
    ENV=PATH#field`` hands out alone)."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return ()
    found = {text, text.strip()}
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, (dict, list)):
        found.update(_strings(doc))
    return tuple(t for t in found if t)


def _strings(doc: Any) -> Iterator[str]:
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for item in doc.values():
            yield from _strings(item)
    elif isinstance(doc, list):
        for item in doc:
            yield from _strings(item)


def _readable(view: dict[str, Any]) -> list[int]:
    """The versions a metadata view lists as not destroyed."""
    return [v["version"] for v in view["versions"] if not v["destroyed"]]


def _cas_message(path: str, cas: int, current: int) -> str:
    if cas == 0:
        return f"Check-and-set failed: {path} already exists (version {current}); cas=0 only creates."
    if current == 0:
        return f"Check-and-set failed: {path} does not exist yet; use cas=0 to create it."
    return f"Check-and-set failed: the current version of {path} is {current}, not {cas}."


def check_versions(versions: list[int] | None) -> None:
    """Version numbers a request names: whole numbers from 1 to :data:`MAX_VERSION_NUMBER`
    (the API checks them before the request's audit record takes one, an int64 there)."""
    if versions is None:
        return
    if len(versions) > MAX_VERSIONS_PER_CALL:
        raise SecretError("InvalidRequest", f"Name at most {MAX_VERSIONS_PER_CALL} versions at once.")
    for n in versions:
        if type(n) is not int or not 1 <= n <= MAX_VERSION_NUMBER:
            raise SecretError("InvalidRequest", "Versions are whole numbers from 1.")


def _required(versions: list[int]) -> list[int]:
    if not versions:
        raise SecretError("InvalidRequest", "Name the versions, e.g. {\"versions\": [1, 2]}.")
    return versions


def _no_such(path: str) -> SecretError:
    return SecretError("NoSuchSecret", f"There is no secret {path}.")


def _busy(path: str) -> SecretError:
    return SecretError("ServiceUnavailable", f"{path} is being changed by many writers at once; "
                       "try again.")
