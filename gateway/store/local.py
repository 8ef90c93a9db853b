"""The embedded store: objects in a local directory, indexed by SQLite.

Layout under the store root::

    index.db            buckets, objects, uploads and parts (SQLite, WAL, synchronous=FULL)
    objects/ab/<id>     data of objects larger than the inline limit
    parts/<upload>/<n>.<id>  data of multipart parts (a completed object keeps them in place)
    tmp/                bytes being received; emptied at start-up

Why an index rather than one file per key: S3 keys are arbitrary byte strings
up to 1024 bytes, ``a`` and ``a/b`` may both exist, and listings must come back
in byte order with sizes and ETags. A B-tree gives that in one range scan,
makes check-and-write atomic per key (a write transaction), and lets small
objects live inline in the index so a 4 KiB PUT costs one fsync.

Durability: a large object's bytes are written to ``tmp/``, fsynced and renamed
into ``objects/`` before the transaction that makes them visible commits.
A crash leaves either the old object or the new one; files no row refers to
are removed when the store opens.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import orjson

from .base import (
    MIN_PART_SIZE,
    BucketAlreadyExists,
    BucketInfo,
    BucketNotEmpty,
    EntityTooSmall,
    Finalizer,
    InvalidPart,
    InvalidPartOrder,
    ListEntry,
    ListPage,
    MetaUpdate,
    NoSuchBucket,
    NoSuchKey,
    NoSuchUpload,
    ObjectInfo,
    ObjectMeta,
    PartInfo,
    PreconditionFailed,
    Readable,
    SourceChanged,
    StoreUnavailable,
    UploadInfo,
    WriteCondition,
)

#: Objects up to this size live inside the index: one fsync per PUT, one read per GET.
INLINE_LIMIT = 128 * 1024
#: Every part but the last must be at least this large (AWS's rule).
READ_CHUNK = 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS buckets(
    name TEXT PRIMARY KEY,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS objects(
    bucket TEXT NOT NULL,
    key BLOB NOT NULL,
    size INTEGER NOT NULL,
    etag TEXT NOT NULL,
    mtime REAL NOT NULL,
    meta TEXT NOT NULL,
    files TEXT,            -- JSON [[relative path, size], ...] or NULL when inline
    data BLOB,             -- inline bytes (listings never read it)
    writer TEXT,           -- principal that wrote it, to recognise retried conditional writes
    PRIMARY KEY(bucket, key)
);
CREATE TABLE IF NOT EXISTS uploads(
    upload_id TEXT PRIMARY KEY,
    bucket TEXT NOT NULL,
    key BLOB NOT NULL,
    initiated REAL NOT NULL,
    meta TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS uploads_by_key ON uploads(bucket, key);
CREATE TABLE IF NOT EXISTS completed(  -- recently completed uploads, so a retried Complete succeeds
    upload_id TEXT PRIMARY KEY,
    bucket TEXT NOT NULL,
    key BLOB NOT NULL,
    etag TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS parts(
    upload_id TEXT NOT NULL,
    part_number INTEGER NOT NULL,
    size INTEGER NOT NULL,
    etag TEXT NOT NULL,
    mtime REAL NOT NULL,
    checksums TEXT NOT NULL,
    file TEXT NOT NULL,
    PRIMARY KEY(upload_id, part_number)
);
"""


@dataclass
class _Staged:
    """Bytes received into ``tmp/``: either small enough to inline, or a file."""

    size: int
    md5: bytes
    data: bytes | None
    tmp_path: Path | None


class LocalObjectReader:
    """Streams a byte range of an object held inline or in one or more files."""

    def __init__(self, info: ObjectInfo, root: Path, data: bytes | None,
                 files: list[tuple[str, int]], start: int, end: int) -> None:
        self.info = info
        self._remaining = end - start
        self._data = data[start:end] if data is not None else None
        self._fh = None
        # Every file is opened now, while the row that names it is current: an
        # overwrite or delete may unlink it at any moment, and an open file stays
        # readable, so a GET in flight is never cut short.
        self._segments = []
        try:
            for path, offset in self._locate(files, start, end):
                fh = open(root / path, "rb")
                self._segments.append(fh)
                fh.seek(offset)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _locate(files: list[tuple[str, int]], start: int, end: int) -> list[tuple[str, int]]:
        """The (path, offset) of every segment the range [start, end) touches."""
        segments, offset = [], 0
        for path, size in files:
            if offset + size > start and offset < end:
                segments.append((path, max(0, start - offset)))
            offset += size
        return segments

    def read(self, n: int = -1) -> bytes:
        if self._remaining <= 0:
            return b""
        n = self._remaining if n < 0 else min(n, self._remaining)
        if self._data is not None:
            chunk, self._data = self._data[:n], self._data[n:]
        else:
            chunk = self._read_files(n)
        self._remaining -= len(chunk)
        return chunk

    def _read_files(self, n: int) -> bytes:
        while True:
            if self._fh is None:
                if not self._segments:
                    return b""
                self._fh = self._segments.pop(0)
            chunk = self._fh.read(n)
            if chunk:
                return chunk
            self._fh.close()
            self._fh = None

    def close(self) -> None:
        for fh in [self._fh, *self._segments]:
            if fh is not None:
                fh.close()
        self._fh, self._segments = None, []


class LocalStore:
    """An ObjectStore on a local directory. One process owns a directory at a time."""

    def __init__(self, root: str | os.PathLike, inline_limit: int = INLINE_LIMIT) -> None:
        self.root = Path(root)
        self.inline_limit = inline_limit
        for sub in ("objects", "parts", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        self._local = threading.local()
        self._conns: list[tuple[threading.Thread, sqlite3.Connection]] = []  # each thread's own
        self._conns_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._lock_owner()
        self._db().executescript(_SCHEMA)
        self._migrate()
        self._recover()

    # -- plumbing ---------------------------------------------------------

    def _lock_owner(self) -> None:
        """Refuse to open a directory another live process is serving."""
        import fcntl

        self._lockfile = open(self.root / "LOCK", "a+")
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreUnavailable(f"{self.root} is in use by another orgmem process") from None

    def _db(self) -> sqlite3.Connection:
        """This thread's connection. Those of threads that have ended are closed here: a
        short-lived pool's threads each opened one, and a connection dropped with its thread
        kept its file descriptors open."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.root / "index.db", isolation_level=None,
                                 check_same_thread=False, timeout=60)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA cache_size=-65536")
            self._local.db = db
            with self._conns_lock:
                self._close_orphans()
                self._conns.append((threading.current_thread(), db))
        return db

    def _close_orphans(self) -> None:
        """Close the connections of threads that have ended (under ``_conns_lock``)."""
        for thread, conn in self._conns:
            if not thread.is_alive():
                conn.close()
        self._conns = [(t, c) for t, c in self._conns if t.is_alive()]

    class _Txn:
        def __init__(self, store: LocalStore) -> None:
            self.store = store

        def __enter__(self) -> sqlite3.Connection:
            self.store._write_lock.acquire()
            self.db = self.store._db()
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, exc_type, exc, tb) -> None:
            try:
                self.db.execute("ROLLBACK" if exc_type else "COMMIT")
            finally:
                self.store._write_lock.release()

    def _write(self) -> LocalStore._Txn:
        """A serialized write transaction; commits on success, rolls back on error."""
        return LocalStore._Txn(self)

    def _migrate(self) -> None:
        """Bring an index made by an earlier version up to this schema."""
        columns = {row[1] for row in self._db().execute("PRAGMA table_info(objects)")}
        if "writer" not in columns:
            self._db().execute("ALTER TABLE objects ADD COLUMN writer TEXT")

    def _recover(self) -> None:
        """Remove what a crash left behind (temp files, data files no row refers to),
        and report rows whose data files are missing, which no crash should cause.

        The outcome is kept in ``self.recovery`` for the gateway to log.
        """
        temp = sum(1 for _ in (self.root / "tmp").iterdir())
        shutil.rmtree(self.root / "tmp", ignore_errors=True)
        (self.root / "tmp").mkdir(mode=0o700, exist_ok=True)
        db = self._db()
        referenced = {row[0] for row in db.execute("SELECT file FROM parts")}
        for (files,) in db.execute("SELECT files FROM objects WHERE files IS NOT NULL"):
            referenced.update(path for path, _ in orjson.loads(files))
        live_uploads = {row[0] for row in db.execute("SELECT upload_id FROM uploads")}
        present, orphans = set(), 0
        for top in ("objects", "parts"):
            for dirpath, _dirs, names in os.walk(self.root / top):
                for name in names:
                    rel = os.path.relpath(os.path.join(dirpath, name), self.root)
                    if rel in referenced:
                        present.add(rel)
                    else:
                        os.unlink(os.path.join(dirpath, name))
                        orphans += 1
        for entry in os.scandir(self.root / "parts"):
            if entry.name not in live_uploads and not any(os.scandir(entry.path)):
                os.rmdir(entry.path)
        self.recovery = {"temp_files_removed": temp, "orphan_files_removed": orphans,
                         "missing_data_files": sorted(referenced - present)[:100]}

    def _stage(self, body: Readable, finalize: Finalizer | None) -> _Staged:
        """Read a body to its end: inline in memory if small, else an fsynced temp file."""
        md5 = hashlib.md5()
        head = bytearray()
        fh = tmp_path = None
        size = 0
        try:
            while True:
                chunk = body.read(READ_CHUNK)
                if not chunk:
                    break
                md5.update(chunk)
                size += len(chunk)
                if fh is None and len(head) + len(chunk) <= self.inline_limit:
                    head += chunk
                    continue
                if fh is None:
                    tmp_path = self.root / "tmp" / uuid.uuid4().hex
                    fh = open(tmp_path, "wb")
                    fh.write(head)
                    head = bytearray()
                fh.write(chunk)
            if finalize is not None:
                finalize()
            if fh is not None:
                fh.flush()
                os.fsync(fh.fileno())
                fh.close()
                fh = None
        except BaseException:
            if fh is not None:
                fh.close()
            if tmp_path is not None:
                tmp_path.unlink(missing_ok=True)
            raise
        if tmp_path is None:
            return _Staged(size, md5.digest(), bytes(head), None)
        return _Staged(size, md5.digest(), None, tmp_path)

    def _place(self, staged: _Staged, directory: Path, name: str) -> str:
        """Move a staged file to its final place; returns its path relative to the root."""
        final = directory / name
        for attempt in range(3):
            _ensure_dir(directory)
            try:
                os.rename(staged.tmp_path, final)
                break
            except FileNotFoundError:
                # An upload directory emptied by a concurrent discard may vanish
                # between mkdir and rename: make it again.
                if attempt == 2 or not staged.tmp_path.exists():
                    raise
        _fsync_dir(directory)
        return os.path.relpath(final, self.root)

    def _discard(self, rel_paths: Sequence[str]) -> None:
        """Remove data files no row refers to any more (and an emptied upload directory)."""
        for rel in rel_paths:
            path = self.root / rel
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            if rel.startswith("parts" + os.sep):
                try:
                    os.rmdir(path.parent)
                except OSError:
                    pass  # other parts still live there

    # -- buckets ------------------------------------------------------------

    def create_bucket(self, name: str) -> BucketInfo:
        now = time.time()
        with self._write() as db:
            try:
                db.execute("INSERT INTO buckets(name, created) VALUES(?, ?)", (name, now))
            except sqlite3.IntegrityError:
                raise BucketAlreadyExists() from None
        return BucketInfo(name, now)

    def delete_bucket(self, name: str) -> None:
        with self._write() as db:
            self._require_bucket(db, name)
            if db.execute("SELECT 1 FROM objects WHERE bucket=? LIMIT 1", (name,)).fetchone():
                raise BucketNotEmpty()
            uploads = db.execute("SELECT upload_id FROM uploads WHERE bucket=?", (name,)).fetchall()
            if uploads:
                raise BucketNotEmpty("The bucket you tried to delete has multipart uploads in progress.")
            db.execute("DELETE FROM buckets WHERE name=?", (name,))

    def head_bucket(self, name: str) -> BucketInfo:
        return self._require_bucket(self._db(), name)

    def list_buckets(self) -> list[BucketInfo]:
        rows = self._db().execute("SELECT name, created FROM buckets ORDER BY name")
        return [BucketInfo(name, created) for name, created in rows]

    @staticmethod
    def _require_bucket(db: sqlite3.Connection, name: str) -> BucketInfo:
        row = db.execute("SELECT created FROM buckets WHERE name=?", (name,)).fetchone()
        if row is None:
            raise NoSuchBucket()
        return BucketInfo(name, row[0])

    # -- objects ------------------------------------------------------------

    def put_object(self, bucket: str, key: str, body: Readable, meta: ObjectMeta,
                   condition: WriteCondition | None = None,
                   finalize: Finalizer | None = None) -> ObjectInfo:
        self.head_bucket(bucket)
        staged = self._stage(body, _collecting(finalize, meta))
        etag = staged.md5.hex()
        files = None
        if staged.tmp_path is not None:
            name = uuid.uuid4().hex
            files = [[self._place(staged, self.root / "objects" / name[:2], name), staged.size]]
        try:
            return self._commit_object(bucket, key, staged.size, etag, meta, files,
                                       staged.data, condition)
        except BaseException:
            self._discard([p for p, _ in files or ()])
            raise

    def _commit_object(self, bucket: str, key: str, size: int, etag: str, meta: ObjectMeta,
                       files: list | None, data: bytes | None,
                       condition: WriteCondition | None,
                       consume_upload: str | None = None) -> ObjectInfo:
        """Make an object visible, atomically with its write condition.

        With ``consume_upload``, the upload must still exist and still hold exactly
        the part files ``files`` names: a concurrent Complete, Abort or re-upload of
        a part would otherwise leave the object pointing at discarded files.
        """
        kb = key.encode()
        now = time.time()
        with self._write() as db:
            self._require_bucket(db, bucket)
            if consume_upload is not None:
                _check_upload_unchanged(db, consume_upload, files or [])
            current = db.execute("SELECT etag, mtime, files, size, meta, writer FROM objects "
                                 "WHERE bucket=? AND key=?", (bucket, kb)).fetchone()
            if not _condition_holds(condition, current):
                if consume_upload is None and _is_retry(condition, current, etag, now):
                    self._discard([p for p, _ in files or ()])
                    return ObjectInfo(bucket, key, current[3], current[0], current[1],
                                      ObjectMeta.from_dict(orjson.loads(current[4])))
                if condition and condition.if_match and current is None:
                    raise NoSuchKey()
                raise PreconditionFailed()
            db.execute(
                "INSERT OR REPLACE INTO objects(bucket, key, size, etag, mtime, meta, files, data, writer) "
                "VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (bucket, kb, size, etag, now, json.dumps(meta.to_dict()),
                 json.dumps(files) if files is not None else None, data,
                 condition.writer if condition else None))
            unused_parts: list[str] = []
            if consume_upload is not None:
                kept = {path for path, _ in files or ()}
                unused_parts = [row[0] for row in db.execute(
                    "SELECT file FROM parts WHERE upload_id=?", (consume_upload,)) if row[0] not in kept]
                db.execute("DELETE FROM uploads WHERE upload_id=?", (consume_upload,))
                db.execute("DELETE FROM parts WHERE upload_id=?", (consume_upload,))
                db.execute("INSERT INTO completed VALUES(?, ?, ?, ?, ?)",
                           (consume_upload, bucket, kb, etag, now))
        # Parts the Complete did not choose (read inside the transaction, so a part
        # uploaded while it ran is included), and the replaced object's files.
        self._discard(unused_parts)
        if current is not None and current[2]:
            kept = {p for p, _ in files or ()}
            self._discard([p for p, _ in orjson.loads(current[2]) if p not in kept])
        part_sizes = [s for _, s in files] if files and len(files) > 1 else ()
        return ObjectInfo(bucket, key, size, etag, now, meta, part_sizes)

    def _row(self, bucket: str, key: str, with_data: bool) -> tuple:
        cols = "size, etag, mtime, meta, files" + (", data" if with_data else "")
        db = self._db()
        row = db.execute(f"SELECT {cols} FROM objects WHERE bucket=? AND key=?",
                         (bucket, key.encode())).fetchone()
        if row is None:
            self._require_bucket(db, bucket)
            raise NoSuchKey()
        return row

    def _info(self, bucket: str, key: str, row: tuple) -> ObjectInfo:
        files = orjson.loads(row[4]) if row[4] else []
        part_sizes = [s for _, s in files] if len(files) > 1 else ()
        return ObjectInfo(bucket, key, row[0], row[1], row[2],
                          ObjectMeta.from_dict(orjson.loads(row[3])), part_sizes)

    def head_object(self, bucket: str, key: str) -> ObjectInfo:
        return self._info(bucket, key, self._row(bucket, key, with_data=False))

    def open_object(self, bucket: str, key: str, start: int = 0,
                    end: int | None = None) -> LocalObjectReader:
        for attempt in range(3):
            row = self._row(bucket, key, with_data=True)
            info = self._info(bucket, key, row)
            stop = info.size if end is None else min(end, info.size)
            files = [tuple(f) for f in orjson.loads(row[4])] if row[4] else []
            try:
                return LocalObjectReader(info, self.root, row[5], files, start, stop)
            except FileNotFoundError:
                if attempt == 2:  # replaced between reading its row and opening its files
                    raise StoreUnavailable("The object keeps changing while being opened; "
                                           "retry.") from None
        raise AssertionError("unreachable")

    def delete_object(self, bucket: str, key: str) -> None:
        with self._write() as db:
            self._require_bucket(db, bucket)
            row = db.execute("SELECT files FROM objects WHERE bucket=? AND key=?",
                             (bucket, key.encode())).fetchone()
            db.execute("DELETE FROM objects WHERE bucket=? AND key=?", (bucket, key.encode()))
        if row is not None and row[0]:
            self._discard([p for p, _ in orjson.loads(row[0])])

    def copy_object(self, src_bucket: str, src_key: str, bucket: str, key: str,
                    meta: ObjectMeta | None, condition: WriteCondition | None = None,
                    source_etag: str | None = None) -> ObjectInfo:
        """Copy by hard-linking data files: data files are immutable once placed.

        ``source_etag`` pins the version a caller's copy-source conditions were
        checked against; without it, whichever version is current is copied.
        """
        for attempt in range(3):
            row = self._row(src_bucket, src_key, with_data=True)
            size, etag, _, src_meta, src_files, data = row
            if source_etag is not None and source_etag != etag:
                raise SourceChanged()
            try:
                files = self._link_all(orjson.loads(src_files)) if src_files else None
                break
            except FileNotFoundError:
                # Replaced or deleted between reading its row and linking its files.
                if attempt == 2:
                    raise StoreUnavailable("The source object keeps changing; retry the copy.") from None
        new_meta = meta if meta is not None else ObjectMeta.from_dict(orjson.loads(src_meta))
        try:
            return self._commit_object(bucket, key, size, etag, new_meta, files, data, condition)
        except BaseException:
            self._discard([p for p, _ in files or ()])
            raise

    def replace_meta(self, current: ObjectInfo, meta: ObjectMeta) -> ObjectInfo:
        """Give the version ``current`` of an object new metadata, its bytes, files and
        Last-Modified untouched (a rewrap's newly wrapped data key): one UPDATE, made only
        while the object still has the ETag *and* the metadata ``current`` was read with,
        since a metadata-only copy keeps the ETag and must not be undone. PreconditionFailed
        when either changed; NoSuchKey once deleted."""
        kb = current.key.encode()
        with self._write() as db:
            self._require_bucket(db, current.bucket)
            row = db.execute("SELECT etag, meta FROM objects WHERE bucket=? AND key=?",
                             (current.bucket, kb)).fetchone()
            if row is None:
                raise NoSuchKey()
            if row[0] != current.etag or ObjectMeta.from_dict(orjson.loads(row[1])) != current.meta:
                raise PreconditionFailed()
            db.execute("UPDATE objects SET meta=? WHERE bucket=? AND key=?",
                       (json.dumps(meta.to_dict()), current.bucket, kb))
        return replace(current, meta=meta)

    def _link_all(self, src_files: list) -> list:
        """Hard-link each data file under a new name; all or nothing."""
        files: list = []
        try:
            for rel, part_size in src_files:
                name = uuid.uuid4().hex
                target = self.root / "objects" / name[:2]
                _ensure_dir(target)
                os.link(self.root / rel, target / name)
                _fsync_dir(target)  # the new name must survive a crash once acknowledged
                files.append([os.path.relpath(target / name, self.root), part_size])
        except BaseException:
            self._discard([p for p, _ in files])
            raise
        return files

    def list_objects(self, bucket: str, prefix: str = "", delimiter: str = "",
                     after: str = "", limit: int = 1000) -> ListPage:
        """One page in byte order; common prefixes are skipped over, not scanned."""
        db = self._db()
        self._require_bucket(db, bucket)
        pb, db_delim = prefix.encode(), delimiter.encode()
        cursor = max(_resume_after(after.encode(), pb, db_delim), pb)
        entries: list[ListEntry] = []
        prefixes: list[str] = []
        last = None
        if limit <= 0:
            return ListPage(entries, prefixes, False, None)
        while len(entries) + len(prefixes) < limit:
            rows = db.execute(
                "SELECT key, size, etag, mtime FROM objects WHERE bucket=? AND key>=? "
                "ORDER BY key LIMIT ?", (bucket, cursor, limit + 1)).fetchall()
            if not rows:
                return ListPage(entries, prefixes, False, last)
            for kb, size, etag, mtime in rows:
                if not kb.startswith(pb):
                    return ListPage(entries, prefixes, False, last)
                if len(entries) + len(prefixes) >= limit:
                    return ListPage(entries, prefixes, True, last)
                cut = kb.find(db_delim, len(pb)) if db_delim else -1
                if cut >= 0:
                    common = kb[:cut + len(db_delim)]
                    prefixes.append(common.decode())
                    last = common.decode()
                    cursor = _successor(common)
                    break
                entries.append(ListEntry(kb.decode(), size, etag, mtime))
                last = kb.decode()
                cursor = kb + b"\x00"
            else:
                if len(rows) <= limit:
                    return ListPage(entries, prefixes, False, last)
        more = db.execute("SELECT 1 FROM objects WHERE bucket=? AND key>=? AND substr(key,1,?)=? LIMIT 1",
                          (bucket, cursor, len(pb), pb)).fetchone()
        return ListPage(entries, prefixes, more is not None, last)

    # -- multipart ----------------------------------------------------------

    def create_multipart(self, bucket: str, key: str, meta: ObjectMeta) -> UploadInfo:
        upload_id = uuid.uuid4().hex + uuid.uuid4().hex
        now = time.time()
        with self._write() as db:
            self._require_bucket(db, bucket)
            db.execute("INSERT INTO uploads(upload_id, bucket, key, initiated, meta) "
                       "VALUES(?, ?, ?, ?, ?)",
                       (upload_id, bucket, key.encode(), now, json.dumps(meta.to_dict())))
        _ensure_dir(self.root / "parts" / upload_id)
        return UploadInfo(bucket, key, upload_id, now, meta)

    def get_upload(self, bucket: str, key: str, upload_id: str) -> UploadInfo:
        row = self._db().execute(
            "SELECT initiated, meta FROM uploads WHERE upload_id=? AND bucket=? AND key=?",
            (upload_id, bucket, key.encode())).fetchone()
        if row is None:
            self._require_bucket(self._db(), bucket)
            raise NoSuchUpload()
        return UploadInfo(bucket, key, upload_id, row[0], ObjectMeta.from_dict(orjson.loads(row[1])))

    def upload_part(self, bucket: str, key: str, upload_id: str, part_number: int,
                    body: Readable, finalize: Finalizer | None = None,
                    size: int | None = None) -> PartInfo:
        self.get_upload(bucket, key, upload_id)
        checksums: dict[str, str] = {}
        staged = self._stage(body, _collecting(finalize, None, checksums))
        name = f"{part_number}.{uuid.uuid4().hex}"
        upload_dir = self.root / "parts" / upload_id
        if staged.tmp_path is None:
            staged.tmp_path = self.root / "tmp" / uuid.uuid4().hex
            _write_fsynced(staged.tmp_path, staged.data or b"")
        rel = self._place(staged, upload_dir, name)
        etag, now = staged.md5.hex(), time.time()
        try:
            with self._write() as db:
                if db.execute("SELECT 1 FROM uploads WHERE upload_id=?", (upload_id,)).fetchone() is None:
                    raise NoSuchUpload()
                old = db.execute("SELECT file FROM parts WHERE upload_id=? AND part_number=?",
                                 (upload_id, part_number)).fetchone()
                db.execute("INSERT OR REPLACE INTO parts VALUES(?, ?, ?, ?, ?, ?, ?)",
                           (upload_id, part_number, staged.size, etag, now,
                            json.dumps(checksums), rel))
        except BaseException:
            self._discard([rel])
            raise
        if old is not None:
            self._discard([old[0]])
        return PartInfo(part_number, staged.size, etag, now, checksums)

    def _parts_snapshot(self, upload_id: str) -> tuple[dict[int, PartInfo], dict[int, str]]:
        """Parts and their files read together, so they describe the same bytes."""
        rows = self._db().execute(
            "SELECT part_number, size, etag, mtime, checksums, file FROM parts WHERE upload_id=?",
            (upload_id,)).fetchall()
        parts = {n: PartInfo(n, sz, e, m, orjson.loads(c)) for n, sz, e, m, c, _ in rows}
        return parts, {row[0]: row[5] for row in rows}

    def list_parts(self, bucket: str, key: str, upload_id: str) -> list[PartInfo]:
        self.get_upload(bucket, key, upload_id)
        rows = self._db().execute(
            "SELECT part_number, size, etag, mtime, checksums FROM parts WHERE upload_id=? "
            "ORDER BY part_number", (upload_id,))
        return [PartInfo(n, s, e, m, orjson.loads(c)) for n, s, e, m, c in rows]

    def complete_multipart(self, bucket: str, key: str, upload_id: str,
                           parts: Sequence[tuple[int, str]],
                           condition: WriteCondition | None = None,
                           meta_update: MetaUpdate | None = None) -> ObjectInfo:
        try:
            upload = self.get_upload(bucket, key, upload_id)
            stored, files_by_part = self._parts_snapshot(upload_id)
            try:
                chosen = _check_parts(parts, stored)
            except (InvalidPart, InvalidPartOrder, EntityTooSmall):
                self.get_upload(bucket, key, upload_id)  # an Abort or Complete may have won
                raise
            md5s = b"".join(bytes.fromhex(p.etag) for p in chosen)
            etag = f"{hashlib.md5(md5s).hexdigest()}-{len(chosen)}"
            meta = meta_update(upload.meta, chosen) if meta_update else upload.meta
            files = [[files_by_part[p.part_number], p.size] for p in chosen]
            return self._commit_object(bucket, key, sum(p.size for p in chosen), etag, meta,
                                       files, None, condition, consume_upload=upload_id)
        except NoSuchUpload:
            # Completed already (this is a retry, or lost a race with an identical
            # Complete): answer with that object while it is current. Aborted: 404.
            return self._completed_before(bucket, key, upload_id, parts)

    def _completed_before(self, bucket: str, key: str, upload_id: str,
                          parts: Sequence[tuple[int, str]]) -> ObjectInfo:
        """A retried Complete (its first response lost) gets the object it created.

        Like S3, this holds only while that object is still the current one, and only for
        the same list of parts: another list names an upload that no longer exists.
        """
        row = self._db().execute("SELECT etag FROM completed WHERE upload_id=? AND bucket=? AND key=?",
                                 (upload_id, bucket, key.encode())).fetchone()
        if row is not None and _multipart_etag(parts) == row[0]:
            try:
                info = self.head_object(bucket, key)
            except NoSuchKey:
                info = None
            if info is not None and info.etag == row[0]:
                return info
        raise NoSuchUpload()

    def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        self.get_upload(bucket, key, upload_id)
        with self._write() as db:
            # Checked again inside the transaction: a Complete that won the race owns
            # the part files now, and they must not be removed.
            if db.execute("SELECT 1 FROM uploads WHERE upload_id=?", (upload_id,)).fetchone() is None:
                raise NoSuchUpload()
            files = [r[0] for r in db.execute("SELECT file FROM parts WHERE upload_id=?", (upload_id,))]
            db.execute("DELETE FROM uploads WHERE upload_id=?", (upload_id,))
            db.execute("DELETE FROM parts WHERE upload_id=?", (upload_id,))
        self._discard(files)
        shutil.rmtree(self.root / "parts" / upload_id, ignore_errors=True)

    def list_uploads(self, bucket: str, prefix: str = "") -> list[UploadInfo]:
        db = self._db()
        self._require_bucket(db, bucket)
        rows = db.execute("SELECT upload_id, key, initiated, meta FROM uploads WHERE bucket=? "
                          "ORDER BY key, upload_id", (bucket,))
        uploads = [UploadInfo(bucket, k.decode(), u, i, ObjectMeta.from_dict(orjson.loads(m)))
                   for u, k, i, m in rows]
        return [u for u in uploads if u.key.startswith(prefix)]

    def expire_uploads(self, older_than: float) -> int:
        """Abort uploads initiated before ``older_than`` (unix seconds), and forget
        completions older than that."""
        with self._write() as db:
            db.execute("DELETE FROM completed WHERE at < ?", (older_than,))
        rows = self._db().execute("SELECT bucket, key, upload_id FROM uploads WHERE initiated < ?",
                                  (older_than,)).fetchall()
        for bucket, key, upload_id in rows:
            try:
                self.abort_multipart(bucket, key.decode(), upload_id)
            except NoSuchUpload:
                pass
        return len(rows)

    def count_uploads(self) -> int:
        """Uploads in progress in every bucket (user and internal), for the metrics."""
        return self._db().execute("SELECT COUNT(*) FROM uploads").fetchone()[0]

    # -- health -------------------------------------------------------------

    def check(self) -> None:
        try:
            self._db().execute("SELECT 1 FROM buckets LIMIT 1").fetchall()
            probe = self.root / "tmp" / f".probe-{uuid.uuid4().hex}"
            probe.write_bytes(b"ok")
            probe.unlink()
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(f"local store not usable: {exc.__class__.__name__}") from exc

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
        with self._conns_lock:
            self._close_orphans()
            self._conns = [(t, c) for t, c in self._conns if c is not db]
        self._lockfile.close()


#: How long after a write its writer's identical conditional retry is recognised.
RETRY_WINDOW = 900.0


def _is_retry(condition: WriteCondition | None, current: tuple | None, etag: str, now: float) -> bool:
    """A failed conditional write is the retry of one that succeeded (its response lost)
    when the same writer wrote these same bytes moments ago. Another writer with the
    same bytes still loses: of concurrent conditional writers exactly one wins."""
    return (condition is not None and condition.writer is not None and current is not None
            and current[0] == etag and current[5] == condition.writer
            and now - current[1] <= RETRY_WINDOW)


def _condition_holds(condition: WriteCondition | None, current: tuple | None) -> bool:
    if condition is None:
        return True
    if condition.if_none_match and current is not None:
        return False
    if condition.if_match is not None:
        return current is not None and (condition.if_match in ("*", current[0]))
    return True


def _check_upload_unchanged(db: sqlite3.Connection, upload_id: str, files: list) -> None:
    current = {row[0] for row in db.execute("SELECT file FROM parts WHERE upload_id=?", (upload_id,))}
    if not current:
        raise NoSuchUpload()
    if not {path for path, _ in files} <= current:
        raise InvalidPart("A part was uploaded again while the upload was being completed; "
                          "list the parts and complete again.")


def _multipart_etag(parts: Sequence[tuple[int, str]]) -> str | None:
    """The ETag a Complete of these (number, part ETag) pairs makes; None if one is not an MD5."""
    try:
        md5s = b"".join(bytes.fromhex(etag.strip('"')) for _, etag in parts)
    except ValueError:
        return None
    return f"{hashlib.md5(md5s).hexdigest()}-{len(parts)}"


def _check_parts(parts: Sequence[tuple[int, str]], stored: dict[int, PartInfo]) -> list[PartInfo]:
    """Validate a CompleteMultipartUpload part list against the uploaded parts."""
    if not parts:
        raise InvalidPart("You must specify at least one part.")
    chosen, previous = [], 0
    for number, etag in parts:
        if number <= previous:
            raise InvalidPartOrder()
        previous = number
        part = stored.get(number)
        if part is None or part.etag != etag.strip('"'):
            raise InvalidPart(f"Part {number} was not uploaded or its ETag does not match.")
        chosen.append(part)
    for part in chosen[:-1]:
        if part.size < MIN_PART_SIZE:
            raise EntityTooSmall(f"Part {part.part_number} is {part.size} bytes; every part "
                                 f"but the last must be at least 5 MiB.")
    return chosen


def _collecting(finalize: Finalizer | None, meta: ObjectMeta | None,
                into: dict | None = None) -> Finalizer | None:
    """Wrap a finalizer so the checksums it returns land in ``meta`` or ``into``."""
    if finalize is None:
        return None

    def run() -> dict[str, str]:
        checksums = finalize() or {}
        if meta is not None:
            meta.checksums.update(checksums)
            if checksums and not meta.checksum_type:
                meta.checksum_type = "FULL_OBJECT"
        if into is not None:
            into.update(checksums)
        return checksums

    return run


def _resume_after(after: bytes, prefix: bytes, delimiter: bytes) -> bytes:
    """Where a listing continues after ``after``, a key or a common prefix already returned.

    Keys that would roll up into a common prefix at or before ``after`` were
    already reported as that prefix, so the listing skips past all of them.
    """
    if not after:
        return b""
    if delimiter and after.startswith(prefix):
        cut = after.find(delimiter, len(prefix))
        if cut >= 0:
            return max(after + b"\x00", _successor(after[:cut + len(delimiter)]))
    return after + b"\x00"


def _successor(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string that starts with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\xff" * 1100
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _ensure_dir(path: Path) -> None:
    """Make a directory durably: its entry in the parent is fsynced too."""
    if path.is_dir():
        return
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        return
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_fsynced(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
