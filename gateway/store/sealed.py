"""The sealed store: a decorator that encrypts everything a backend holds.

Wraps any ObjectStore (embedded or upstream S3). Callers see plaintext,
plaintext sizes and their own metadata; the backend holds only sealed bytes
(``vault/FORMAT.md``) and sealed metadata. Each object has its own data key,
wrapped by the customer's key-encryption key with the object's identity as
associated data (bucket, key, and for a multipart object its part count), so:

- listings compute plaintext sizes from sealed sizes (and the part count of a
  multipart ETag) without reading anything;
- a copy rewraps the data key for the new name and copies the sealed bytes as
  they are; rotation rewraps keys without touching data;
- a ciphertext moved to another name, cut to fewer parts, or tampered with,
  fails to open and is answered as an error, never as wrong data.

What the backend keeps readable: object names, sizes, timestamps, the ETag
of the sealed bytes, and the gateway's bookkeeping (``ObjectMeta.sealed``: the
wrapped key; ``ObjectMeta.sealed_meta``: the client's metadata, sealed).

The ETag clients see is the backend's ETag of the sealed bytes: opaque, as
AWS's ETags of SSE-KMS objects are, and identical in LIST, HEAD, GET and
conditional requests.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

import orjson

from vault import stream
from vault.errors import KeyUnavailable, VaultError
from vault.keys import KeyProvider, WrappedKey

from ..logs import log
from .base import (
    MIN_PART_SIZE,
    BucketInfo,
    EntityTooSmall,
    Finalizer,
    IncompleteBody,
    ListPage,
    MetaUpdate,
    NoSuchUpload,
    ObjectInfo,
    ObjectMeta,
    ObjectStore,
    PartInfo,
    PreconditionFailed,
    Readable,
    SourceChanged,
    StoreError,
    StoreUnavailable,
    UploadInfo,
    WriteCondition,
)

#: How many recently opened objects keep their data key and metadata in memory.
OPENED_CACHE = 4096
#: How many multipart layouts (part sizes) are remembered, keyed by ETag.
LAYOUT_CACHE = 1024
#: Whole-object reseals (copies and rewraps of an object the backend cannot copy whole) that
#: run at once: each reads the object and writes it again (an S3 backend spools it to disk).
RESEALS = 2
#: How much of an object is read while opening it.
PRIME = 64 * 1024
#: Marks a value the backend keeps for us in sealed form (a part's checksum).
SEALED_VALUE = "sealed:"
#: What the backend is told a sealed object's type is.
SEALED_TYPE = "application/vnd.orgmem.sealed"
#: In a multipart object's sealed metadata: its part numbers, in order (not a client field).
PART_NUMBERS = "_part_numbers"


class SealError(StoreError):
    """A stored object failed its integrity check: damaged or tampered with on the backend,
    or sealed under a key this gateway does not hold. No data was returned."""

    code = "InternalError"


def identity(bucket: str, key: str, parts: int = 0, upload: bool = False) -> bytes:
    """What a data key is bound to. A sealed object moved to another name, or a multipart
    object rebuilt from fewer parts, fails to open."""
    name = b"orgmem-object\x00" + bucket.encode() + b"\x00" + key.encode("utf-8", "surrogateescape")
    if upload:
        return name + b"\x00upload"
    return name + (b"\x00parts=%d" % parts if parts else b"")


def parts_in(etag: str) -> int:
    """The part count of a multipart ETag (``<md5>-N``), 0 for a single object."""
    _, dash, count = etag.rpartition("-")
    return int(count) if dash and count.isascii() and count.isdigit() else 0


def plain_size(sealed_size: int, etag: str) -> int:
    parts = parts_in(etag)
    try:
        if parts:
            return stream.multipart_plain_size(sealed_size, parts)
        return stream.plain_size(sealed_size)
    except ValueError:
        return 0  # not a size any sealed object has: opening it reports the damage


class SealedReader:
    """An open sealed object: plaintext info and the decrypted range. An integrity failure
    while streaming becomes the store's error; no unauthenticated byte is ever returned."""

    def __init__(self, info: ObjectInfo, opening: stream.OpeningReader, unused: list,
                 first: bytes = b"") -> None:
        self.info = info
        self._opening = opening
        self._unused = unused  # a backend reader opened ahead and not (yet) handed over
        self._first = first  # read ahead while opening

    def read(self, n: int = -1) -> bytes:
        if self._first:
            if n < 0:
                rest, self._first = self._first + self._read(-1), b""
                return rest
            piece, self._first = self._first[:n], self._first[n:]
            return piece
        return self._read(n)

    def _read(self, n: int) -> bytes:
        try:
            # Whole requested sizes: a short read costs the caller another hop to a thread,
            # which is dearer than the copy read(n) makes.
            return self._opening.read(n)
        except VaultError as exc:
            raise _store_error(exc, self.info.bucket, self.info.key) from None

    def close(self) -> None:
        self._opening.close()
        while self._unused:
            self._unused.pop().close()


class SealedStore:
    def __init__(self, inner: ObjectStore, keys: KeyProvider) -> None:
        self.inner = inner
        self.keys = keys
        self._layouts: OrderedDict[tuple[str, str, str], list[int]] = OrderedDict()
        #: opened data keys and metadata of recently read objects (see _open)
        self._opened: OrderedDict[tuple, tuple[bytes, ObjectMeta, tuple[int, ...] | None]] = OrderedDict()
        self._lock = threading.Lock()
        #: copies and rewraps that reseal a whole object (see _copy_resealed) at once, at most
        self._reseals = threading.BoundedSemaphore(RESEALS)

    # -- keys and metadata -----------------------------------------------------------

    def _seal(self, dek: bytes, meta: ObjectMeta, ident: bytes,
              part_numbers: Sequence[int] | None = None) -> ObjectMeta:
        """The backend's metadata: the wrapped key, and the client's metadata sealed (with, for
        a multipart object, its part numbers in order: a ranged read then checks that each
        part it opens is the one that belongs there)."""
        doc = replace(meta, sealed=None, sealed_meta=None).to_dict()
        if part_numbers:
            doc[PART_NUMBERS] = list(part_numbers)
        return ObjectMeta(content_type=SEALED_TYPE, sealed=self.keys.wrap(dek, ident).encode(),
                          sealed_meta=stream.seal_metadata(dek, orjson.dumps(doc), ident))

    def _open(self, stored: ObjectMeta, ident: bytes, bucket: str, key: str) -> tuple[bytes, ObjectMeta]:
        """The data key and the client's metadata of a stored object."""
        dek, meta, _ = self._open_parts(stored, ident, bucket, key)
        return dek, meta

    def _open_parts(self, stored: ObjectMeta, ident: bytes, bucket: str, key: str,
                    dek: bytes | None = None) -> tuple[bytes, ObjectMeta, tuple[int, ...] | None]:
        """The data key, the client's metadata and the part numbers (None when not recorded) of
        a stored object; remembered for hot objects, keyed by everything they were opened
        from, so a changed byte misses. ``dek``: the object's data key, already in hand (its
        wrapping KEK version may be retired)."""
        cache_key = (ident, stored.sealed, stored.sealed_meta)
        with self._lock:
            hit = self._opened.get(cache_key)
            if hit is not None:
                self._opened.move_to_end(cache_key)
                return hit[0], _own_copy(hit[1]), hit[2]
        dek, meta, numbers = self._open_uncached(stored, ident, bucket, key, dek)
        with self._lock:
            self._opened[cache_key] = (dek, meta, numbers)
            while len(self._opened) > OPENED_CACHE:
                self._opened.popitem(last=False)
        return dek, _own_copy(meta), numbers

    def _open_uncached(self, stored: ObjectMeta, ident: bytes, bucket: str, key: str,
                       dek: bytes | None = None) -> tuple[bytes, ObjectMeta, tuple[int, ...] | None]:
        if not stored.sealed or not stored.sealed_meta:
            raise SealError(f"{bucket}/{key} is stored without a data key: it was not written "
                            "through this gateway's sealed store.")
        try:
            if dek is None:
                dek = self.keys.unwrap(WrappedKey.decode(stored.sealed), ident)
            doc = orjson.loads(stream.open_metadata(dek, stored.sealed_meta, ident))
            numbers = doc.pop(PART_NUMBERS, None)
            return dek, ObjectMeta.from_dict(doc), tuple(numbers) if numbers else None
        except (VaultError, ValueError) as exc:
            raise _store_error(exc, bucket, key) from None

    def _object(self, sealed: ObjectInfo) -> tuple[bytes, ObjectInfo]:
        """The data key and the plaintext view of a stored object."""
        dek, info, _ = self._object_parts(sealed)
        return dek, info

    def _object_parts(self, sealed: ObjectInfo,
                      dek: bytes | None = None) -> tuple[bytes, ObjectInfo, tuple[int, ...] | None]:
        """:meth:`_object`, and the object's part numbers when they were recorded."""
        count = parts_in(sealed.etag)
        if sealed.part_sizes and len(sealed.part_sizes) != count:
            raise SealError(f"{sealed.bucket}/{sealed.key} failed its integrity check: it holds "
                            f"{len(sealed.part_sizes)} parts where its ETag names {count}.")
        ident = identity(sealed.bucket, sealed.key, count)
        dek, meta, numbers = self._open_parts(sealed.meta, ident, sealed.bucket, sealed.key, dek)
        parts = [stream.part_plain_size(s) for s in sealed.part_sizes]
        # Built directly: dataclasses.replace costs more than the rest of this on a small GET.
        return dek, ObjectInfo(sealed.bucket, sealed.key, plain_size(sealed.size, sealed.etag),
                               sealed.etag, sealed.last_modified, meta, parts), numbers

    # -- buckets (nothing to seal) -------------------------------------------------------

    def create_bucket(self, name: str) -> BucketInfo:
        return self.inner.create_bucket(name)

    def delete_bucket(self, name: str) -> None:
        self.inner.delete_bucket(name)

    def head_bucket(self, name: str) -> BucketInfo:
        return self.inner.head_bucket(name)

    def list_buckets(self) -> list[BucketInfo]:
        return self.inner.list_buckets()

    # -- objects -------------------------------------------------------------------------

    def put_object(self, bucket: str, key: str, body: Readable, meta: ObjectMeta,
                   condition: WriteCondition | None = None,
                   finalize: Finalizer | None = None) -> ObjectInfo:
        dek = stream.new_data_key()
        ident = identity(bucket, key)
        stored = self._seal(dek, meta, ident)

        def reseal() -> dict[str, str]:
            """Checksums known only at the end of the body go into the sealed metadata;
            the backend is given nothing to record in clear."""
            found = finalize() or {}
            if found:
                meta.checksums.update(found)
                meta.checksum_type = meta.checksum_type or "FULL_OBJECT"
                stored.sealed_meta = self._seal(dek, meta, ident).sealed_meta
            return {}

        info = self.inner.put_object(bucket, key, stream.SealingReader(dek, body), stored,
                                     condition, reseal if finalize is not None else None)
        if WrappedKey.decode(stored.sealed or "").version != self.keys.primary_version():
            self._rewrap_late(bucket, key, dek, info.etag)
        return replace(info, size=plain_size(info.size, info.etag), meta=meta)

    def _rewrap_late(self, bucket: str, key: str, dek: bytes, etag: str) -> None:
        """The KEK was rotated while this upload ran: its data key was wrapped under the old
        version, which a rewrap and a retire may have passed meanwhile. Wrap it again now,
        from the key still in hand (the old version may be retired already)."""
        try:
            current = self.inner.head_object(bucket, key)
            if current.etag == etag:  # else replaced since, by a writer that used the primary
                self._wrap_again(current, dek, identity(bucket, key))
        except StoreError as exc:  # the next rewrap run takes it; retire refuses until then
            log.warning("late_rewrap_failed", bucket=bucket, error=exc.__class__.__name__)

    def head_object(self, bucket: str, key: str) -> ObjectInfo:
        return self._object(self.inner.head_object(bucket, key))[1]

    def open_object(self, bucket: str, key: str, start: int = 0,
                    end: int | None = None) -> SealedReader:
        """Opens and reads the first piece at once, so an object replaced between its size
        and its bytes being looked up is opened again here, not failed mid-response."""
        for _ in range(3):
            reader = self._open_reader(bucket, key, start, end)
            try:
                first = reader._read(PRIME) if reader.info.size else b""
            except PreconditionFailed:
                reader.close()
                continue
            except BaseException:
                reader.close()
                raise
            reader._first = first
            return reader
        raise StoreUnavailable("The object keeps changing while being opened; retry.")

    def _open_reader(self, bucket: str, key: str, start: int, end: int | None,
                     dek: bytes | None = None) -> SealedReader:
        # A whole read opens the backend once: its info and its stream come together.
        whole = start == 0 and end is None
        ahead = [self.inner.open_object(bucket, key)] if whole else []
        try:
            sealed = ahead[0].info if ahead else self.inner.head_object(bucket, key)
            dek, info, numbers = self._object_parts(sealed, dek)
            stop = info.size if end is None else min(end, info.size)
            layout = self._layout(bucket, key, sealed, numbers)

            def fetch(cipher_start: int, cipher_end: int) -> Readable:
                if ahead and cipher_start == 0 and cipher_end == sealed.size:
                    return ahead.pop()
                reader = self.inner.open_object(bucket, key, cipher_start, cipher_end)
                if reader.info.etag != sealed.etag:  # replaced since its layout was read
                    reader.close()
                    raise PreconditionFailed("The object was replaced while it was being read; retry.")
                return reader

            opening = stream.OpeningReader(dek, fetch, layout, min(start, stop), stop)
        except BaseException as exc:
            for reader in ahead:
                reader.close()
            if isinstance(exc, VaultError):
                raise _store_error(exc, bucket, key) from None
            raise
        return SealedReader(info, opening, ahead)

    def delete_object(self, bucket: str, key: str) -> None:
        self.inner.delete_object(bucket, key)

    def copy_object(self, src_bucket: str, src_key: str, bucket: str, key: str,
                    meta: ObjectMeta | None, condition: WriteCondition | None = None,
                    source_etag: str | None = None) -> ObjectInfo:
        """Copies the sealed bytes as they are; only the data key is rewrapped for the new name.

        The exception: an object stored in one piece beyond the backend's single-copy limit,
        which the backend would copy in parts (see :meth:`_copied_in_parts`), is sealed anew."""
        source = self.inner.head_object(src_bucket, src_key)
        if source_etag is not None and source.etag != source_etag:
            raise SourceChanged()
        dek, plain, numbers = self._object_parts(source)
        new_meta = meta if meta is not None else plain.meta
        if self._copied_in_parts(source):
            return self._copy_resealed(source, dek, bucket, key, new_meta, condition)
        stored = self._seal(dek, new_meta, identity(bucket, key, parts_in(source.etag)), numbers)
        info = self.inner.copy_object(src_bucket, src_key, bucket, key, stored, condition,
                                      source_etag=source.etag)
        if parts_in(info.etag) != parts_in(source.etag):
            raise SealError("the backend changed the part structure of a copied object")
        return replace(info, size=plain.size, meta=new_meta, part_sizes=plain.part_sizes)

    def _copied_in_parts(self, sealed: ObjectInfo) -> bool:
        """Whether the backend would copy ``sealed`` in parts: an object stored in one piece
        beyond its single-copy limit (an S3 upstream's 5 GiB; only upstreams that accept larger
        single PUTs hold such objects). The copy would be a multipart object, whose layout and
        data-key identity the single object's bytes do not have: unreadable."""
        limit = getattr(self.inner, "copy_limit", None)
        return limit is not None and not parts_in(sealed.etag) and sealed.size > limit

    def _copy_resealed(self, source: ObjectInfo, dek: bytes, bucket: str, key: str,
                       meta: ObjectMeta | None, condition: WriteCondition | None) -> ObjectInfo:
        """A copy of exactly the version ``source`` (SourceChanged if it was replaced): its
        plaintext, read with its data key ``dek`` and streamed through this store, sealed anew
        under a fresh data key, with ``meta`` (None: the source's own). A copy onto itself is
        pinned to that version, so a write that lands meanwhile is not overwritten with the
        older bytes. Each moves the whole object through the gateway (and an S3 backend's
        spool), so few run at once."""
        if condition is None and (bucket, key) == (source.bucket, source.key):
            condition = WriteCondition(if_match=source.etag)
        with self._reseals:
            reader = self._open_reader(source.bucket, source.key, 0, None, dek)
            try:
                if reader.info.etag != source.etag:
                    raise SourceChanged()
                return self.put_object(bucket, key, reader,
                                       meta if meta is not None else reader.info.meta, condition)
            except PreconditionFailed:
                if condition is not None and condition.if_match == source.etag:  # replaced since read
                    raise SourceChanged() from None
                raise
            finally:
                reader.close()

    def list_objects(self, bucket: str, prefix: str = "", delimiter: str = "", after: str = "",
                     limit: int = 1000) -> ListPage:
        page = self.inner.list_objects(bucket, prefix, delimiter, after, limit)
        for entry in page.entries:
            entry.size = plain_size(entry.size, entry.etag)
        return page

    # -- multipart -----------------------------------------------------------------------

    def create_multipart(self, bucket: str, key: str, meta: ObjectMeta) -> UploadInfo:
        dek = stream.new_data_key()
        upload = self.inner.create_multipart(bucket, key, self._seal(dek, meta, identity(bucket, key,
                                                                                          upload=True)))
        return replace(upload, meta=meta)

    def _upload(self, bucket: str, key: str, upload_id: str) -> tuple[bytes, UploadInfo]:
        upload = self.inner.get_upload(bucket, key, upload_id)
        dek, meta = self._open(upload.meta, identity(bucket, key, upload=True), bucket, key)
        return dek, replace(upload, meta=meta)

    def get_upload(self, bucket: str, key: str, upload_id: str) -> UploadInfo:
        return self._upload(bucket, key, upload_id)[1]

    def upload_part(self, bucket: str, key: str, upload_id: str, part_number: int, body: Readable,
                    finalize: Finalizer | None = None, size: int | None = None) -> PartInfo:
        if size is None:
            raise IncompleteBody("A part's length must be declared (Content-Length) so it can be "
                                 "sealed.")
        dek, _ = self._upload(bucket, key, upload_id)
        sealing = stream.SealingReader(dek, body, part_number=part_number, plain_size=size)

        def sealed_checksums() -> dict[str, str]:
            """A part's plaintext checksums, kept by the backend only in sealed form."""
            found = finalize() or {}
            return {name: SEALED_VALUE + stream.seal_metadata(dek, value.encode(), b"checksum")
                    for name, value in found.items()}

        try:
            part = self.inner.upload_part(bucket, key, upload_id, part_number, sealing,
                                          sealed_checksums if finalize is not None else None,
                                          size=stream.part_sealed_size(size))
        except stream.SizeMismatch:
            raise IncompleteBody() from None
        return replace(part, size=size, checksums=self._open_checksums(dek, part.checksums))

    def _open_checksums(self, dek: bytes, checksums: dict[str, str]) -> dict[str, str]:
        opened = {}
        for name, value in checksums.items():
            if value.startswith(SEALED_VALUE):
                try:
                    value = stream.open_metadata(dek, value[len(SEALED_VALUE):], b"checksum").decode()
                except VaultError as exc:
                    raise SealError(f"a part checksum cannot be opened: {exc}") from None
            opened[name] = value
        return opened

    def complete_multipart(self, bucket: str, key: str, upload_id: str,
                           parts: Sequence[tuple[int, str]], condition: WriteCondition | None = None,
                           meta_update: MetaUpdate | None = None) -> ObjectInfo:
        """Completes, rebinding the data key to the final part count, so an object cut back
        to fewer parts on the backend no longer opens."""
        try:
            dek, upload = self._upload(bucket, key, upload_id)
            self._check_part_sizes(bucket, key, upload_id, parts)
        except NoSuchUpload:
            # Completed already (a retry whose first answer was lost, or an identical Complete
            # that won between our two reads of the upload): the backend answers with that
            # object while it is current, without calling ``reseal``.
            return self._object(self.inner.complete_multipart(bucket, key, upload_id, parts,
                                                              condition, None))[1]

        def reseal(stored: ObjectMeta, chosen: Sequence[PartInfo]) -> ObjectMeta:
            plain = [replace(p, size=stream.part_plain_size(p.size),
                             checksums=self._open_checksums(dek, p.checksums)) for p in chosen]
            final = meta_update(upload.meta, plain) if meta_update else upload.meta
            return self._seal(dek, final, identity(bucket, key, len(chosen)), [p.part_number for p in chosen])

        info = self.inner.complete_multipart(bucket, key, upload_id, parts, condition, reseal)
        return self._object(info)[1]

    def _check_part_sizes(self, bucket: str, key: str, upload_id: str,
                          parts: Sequence[tuple[int, str]]) -> None:
        """Every part but the last must hold 5 MiB of the client's bytes; the backend checks
        the sealed sizes, a little larger, and would let a part just under the line pass."""
        stored = {p.part_number: p for p in self.inner.list_parts(bucket, key, upload_id)}
        numbers = [number for number, _ in parts]
        known = all(number in stored and stored[number].etag == etag.strip('"') for number, etag in parts)
        if not known or any(b <= a for a, b in zip(numbers, numbers[1:], strict=False)):
            return  # the backend answers InvalidPart / InvalidPartOrder first, as S3 does
        for number in numbers[:-1]:
            size = stream.part_plain_size(stored[number].size)
            if size < MIN_PART_SIZE:
                raise EntityTooSmall(f"Part {number} is {size} bytes; every part but the last must "
                                     "be at least 5 MiB.")

    def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        self.inner.abort_multipart(bucket, key, upload_id)

    def list_parts(self, bucket: str, key: str, upload_id: str) -> list[PartInfo]:
        dek, _ = self._upload(bucket, key, upload_id)
        return [replace(p, size=stream.part_plain_size(p.size),
                        checksums=self._open_checksums(dek, p.checksums))
                for p in self.inner.list_parts(bucket, key, upload_id)]

    def list_uploads(self, bucket: str, prefix: str = "") -> list[UploadInfo]:
        uploads = []
        for upload in self.inner.list_uploads(bucket, prefix):
            try:
                _, meta = self._open(upload.meta, identity(bucket, upload.key, upload=True), bucket,
                                     upload.key)
            except StoreError:
                meta = ObjectMeta()
            uploads.append(replace(upload, meta=meta))
        return uploads

    def expire_uploads(self, older_than: float) -> int:
        return self.inner.expire_uploads(older_than)

    def count_uploads(self) -> int:
        return self.inner.count_uploads()

    # -- health ----------------------------------------------------------------------------

    def check(self) -> None:
        self.inner.check()

    def close(self) -> None:
        self.inner.close()

    # -- rotation -----------------------------------------------------------------------------

    def forget_opened(self) -> None:
        """Drop the data keys kept in memory (after a KEK version is retired, nothing may open
        with it any more, cached or not)."""
        with self._lock:
            self._opened.clear()

    def key_version(self, bucket: str, key: str) -> tuple[str, int] | None:
        """Which KEK (id, version) wraps an object's data key; None for an unsealed object."""
        stored = self.inner.head_object(bucket, key).meta.sealed
        if not stored:
            return None
        wrapped = WrappedKey.decode(stored)
        return wrapped.kek_id, wrapped.version

    def rewrap(self, bucket: str, key: str) -> bool:
        """Rewrap one object's data key under the primary KEK version, data untouched. False
        when it already is, or when the object changed meanwhile (its writer used the primary)."""
        sealed = self.inner.head_object(bucket, key)
        wrapped = WrappedKey.decode(sealed.meta.sealed or "")
        if wrapped.kek_id == self.keys.kek_id and wrapped.version == self.keys.primary_version():
            return False
        ident = identity(bucket, key, parts_in(sealed.etag))
        try:
            dek = self.keys.unwrap(wrapped, ident)
        except VaultError as exc:
            raise _store_error(exc, bucket, key) from None
        return self._wrap_again(sealed, dek, ident)

    def _wrap_again(self, current: ObjectInfo, dek: bytes, ident: bytes) -> bool:
        """Store ``dek`` wrapped under the primary version on exactly the version ``current``;
        False when it was replaced meanwhile (its writer used the primary). An object the
        backend cannot copy whole (:meth:`_copied_in_parts`) is sealed anew in place instead:
        its data is rewritten, under a fresh data key wrapped by the primary."""
        try:
            if self._copied_in_parts(current):
                self._copy_resealed(current, dek, current.bucket, current.key, None,
                                    WriteCondition(if_match=current.etag))
                return True
            stored = replace(current.meta, sealed=self.keys.wrap(dek, ident).encode())
            self._replace_meta(current, stored)
        except PreconditionFailed:  # SourceChanged included
            return False
        return True

    def _replace_meta(self, current: ObjectInfo, stored: ObjectMeta) -> None:
        """New bookkeeping for exactly the version ``current`` (PreconditionFailed once it was
        replaced): in one call where the backend offers it (``replace_meta``: LocalStore's
        also requires the metadata ``current`` holds, and keeps Last-Modified), else as a copy
        onto itself pinned to that version."""
        replace_meta = getattr(self.inner, "replace_meta", None)
        if replace_meta is not None:
            replace_meta(current, stored)
            return
        self.inner.copy_object(current.bucket, current.key, current.bucket, current.key, stored,
                               WriteCondition(if_match=current.etag), source_etag=current.etag)

    # -- layouts -----------------------------------------------------------------------------

    def _layout(self, bucket: str, key: str, sealed: ObjectInfo,
                numbers: Sequence[int] | None = None) -> stream.Layout:
        """Where each part sits. The part count is bound into the data key's identity (from the
        ETag); the backend's list of parts must agree with it, and with the part numbers the
        sealed metadata recorded, or a part dropped or moved on the backend would be served."""
        parts = parts_in(sealed.etag)
        if not parts:
            return stream.Layout.single(sealed.size)
        sizes = list(sealed.part_sizes) or self._part_sizes(bucket, key, sealed, parts)
        if len(sizes) != parts or (numbers is not None and len(numbers) != parts):
            raise SealError(f"{bucket}/{key} failed its integrity check: it holds {len(sizes)} parts "
                            f"where its ETag names {parts}.")
        try:
            return stream.Layout.multipart(sizes, list(numbers) if numbers else None)
        except ValueError as exc:
            raise SealError(f"{bucket}/{key} failed its integrity check: {exc}.") from None

    def _part_sizes(self, bucket: str, key: str, sealed: ObjectInfo, parts: int) -> list[int]:
        """Sealed part sizes read from the part headers (for backends that do not report
        them); immutable for an ETag, so remembered."""
        cache_key = (bucket, key, sealed.etag)
        with self._lock:
            if cache_key in self._layouts:
                self._layouts.move_to_end(cache_key)
                return self._layouts[cache_key]
        sizes, offset = [], 0
        for _ in range(parts):
            if offset + stream.HEADER > sealed.size:
                raise SealError(f"{bucket}/{key} failed its integrity check: it is shorter than "
                                "its parts.")
            reader = self.inner.open_object(bucket, key, offset, offset + stream.HEADER)
            try:
                if reader.info.etag != sealed.etag:
                    raise PreconditionFailed("The object was replaced while it was being read; retry.")
                header = _read_exactly(reader, stream.HEADER)
            finally:
                reader.close()
            try:
                size = stream.part_sealed_size(stream.part_header_plain_size(header))
            except (VaultError, ValueError) as exc:
                raise SealError(f"{bucket}/{key} has a damaged part header: {exc}") from None
            sizes.append(size)
            offset += size
        if offset != sealed.size:
            raise SealError(f"{bucket}/{key} failed its integrity check: its parts do not add up "
                            "to its size.")
        with self._lock:
            self._layouts[cache_key] = sizes
            while len(self._layouts) > LAYOUT_CACHE:
                self._layouts.popitem(last=False)
        return sizes


def _own_copy(meta: ObjectMeta) -> ObjectMeta:
    """A copy the caller may change without touching the cached one."""
    fresh = copy.copy(meta)
    fresh.user, fresh.checksums = dict(meta.user), dict(meta.checksums)
    return fresh


def _store_error(exc: Exception, bucket: str, key: str) -> StoreError:
    """Vault failures as store errors: an unreachable key service is 503, the rest 500."""
    if isinstance(exc, KeyUnavailable):
        return StoreUnavailable(f"the key service is unavailable: {exc}")
    return SealError(f"{bucket}/{key} cannot be opened: {exc}")


def _read_exactly(reader: Readable, n: int) -> bytes:
    chunks, size = [], 0
    while size < n:
        chunk = reader.read(n - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
