"""The upstream backend: the gateway's buckets inside one bucket (and prefix) of an
S3-compatible service (AWS S3, MinIO/AIStor, SeaweedFS, Ceph RGW, Garage), through boto3.

Layout under ``PREFIX/`` in the upstream bucket::

    _buckets/<bucket>                     an empty marker per bucket; its Last-Modified is the creation time
    <bucket>/<encoded key>                the objects; everything about them besides their bytes
                                          is in one metadata value, x-amz-meta-orgmem
    _uploads/<bucket>/<encoded key>!<id>  a multipart upload in progress: its upstream upload id,
                                          initiation time and metadata (JSON)
    _parts/<id>/<part>.<time>.<etag>.<checksums>  a part received whole, its checksums in the
                                          name (empty body)
    _done/<bucket>/<encoded key>!<id>     what a multipart object learned when it was completed:
                                          its checksums and part sizes (JSON)

Every gateway keeps no state of its own: each call reads the upstream, so any
number of gateways can share one bucket and prefix. Check-and-write is the
upstream's own conditional write (``If-None-Match: *``, ``If-Match``), so its
ETag is what compare-and-swap compares.

Key encoding. S3 lists keys in UTF-8 byte order and lets ``a``, ``a/b``,
``a//b``, ``./a`` and ``dir/`` (with bytes and metadata) all exist. Services
built on a file tree (SeaweedFS's filer, MinIO) list in tree order, refuse
``.`` and ``..`` segments, fold ``//`` and turn ``dir/`` into a directory.
So a key is stored under an encoding in which "/" only ever follows ``.~`` and
the characters that sort below "/" are escaped: tree order then equals byte
order, and no segment is empty, ``.``, ``..`` or a trailing "/"::

    U+0000..U+002C  ->  ","  followed by chr(0x41 + code point)   (" " is ",a")
    "."             ->  ".-"
    "/"             ->  ".~/"
    a key ending in "/" gets a final "!"
    everything else is itself

The encoding keeps byte order and prefixes, so a listing page is one upstream
range scan; delimiters are applied here (see ``list_objects``).

What SeaweedFS 4.48 gets wrong, and what this module does about it, is listed
in the README ("Running on an S3 service").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import re
import secrets
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import boto3
import urllib3.exceptions
from botocore.awsrequest import AWSRequest
from botocore.config import Config as BotoConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from ..logs import log
from .base import (
    BucketAlreadyExists,
    BucketInfo,
    BucketNotEmpty,
    EntityTooSmall,
    Finalizer,
    IncompleteBody,
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
    StoreError,
    StoreTimeout,
    StoreUnavailable,
    UploadInfo,
    WriteCondition,
)
from .local import RETRY_WINDOW
from .local import _check_parts as check_parts

MiB = 1024 * 1024
#: A PUT body is held in memory up to this size, beyond it in a spool file.
SINGLE_PUT_LIMIT = 8 * MiB
#: An UploadPart body of unknown length is held in memory up to this size, beyond it in
#: a spool file. (A part of known length streams through.)
SPOOL_MEMORY = 8 * MiB
#: CopyObject copies up to this size in one upstream call (AWS's limit), larger in parts.
COPY_LIMIT = 5 * 1024**3
COPY_PART = 512 * MiB
READ_CHUNK = 1 * MiB
#: The metadata value (x-amz-meta-orgmem) holding ObjectMeta and bookkeeping, base64 JSON.
META_NAME = "orgmem"
#: Attempts of an idempotent call when the upstream refuses connections or answers 5xx.
ATTEMPTS = 3
BACKOFF = 0.1
#: Completion records younger than this are never collected (a Complete may be in flight).
DONE_GRACE = 3600.0
#: Completion records looked at by one upkeep pass.
DONE_SWEEP_BATCH = 1000
#: How long one sweep goes on taking batches while they find records to delete.
DONE_SWEEP_SECONDS = 60.0

_UPLOAD_ID = re.compile(r"[0-9a-f]{32}")
#: Sorts after every key that starts with what it is appended to (as a StartAfter).
_AFTER_EVERY_KEY = "\U0010ffff"
_BUCKET_URL = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]\Z")
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class UnstorableKey(StoreError):
    """The storage upstream cannot store this key."""

    code = "InvalidArgument"


# -- key encoding -------------------------------------------------------------

#: Characters of a key that reach the upstream as a backslash: itself, and ESC (",\\").
FOLDED = ("\\", "\x1b")

_ENCODE = {code: "," + chr(0x41 + code) for code in range(0x2D)}
_ENCODE[ord(".")] = ".-"
_ENCODE[ord("/")] = ".~/"
_TOKEN = re.compile(r",[\x41-\x6d]|\.-|\.~/|!\Z|[\x00-\x2c./!]")


def encode_prefix(text: str) -> str:
    """The encoding of a key prefix: every key starting with ``text`` encodes to a string
    starting with this, and no other key does."""
    return text.translate(_ENCODE)


def encode_key(key: str) -> str:
    encoded = key.translate(_ENCODE)
    return encoded + "!" if key.endswith("/") else encoded


def decode_key(name: str, prefix: bool = False) -> str | None:
    """The key (or, with ``prefix``, the common prefix ending in "/") that ``name``
    encodes; None for a name this encoding never produces."""
    if not prefix and name.endswith(".~/"):
        return None

    def token(match: re.Match) -> str:
        text = match.group()
        if len(text) == 2 and text[0] == ",":
            return chr(ord(text[1]) - 0x41)
        if text == ".-":
            return "."
        if text == ".~/":
            return "/"
        if text == "!" and not prefix and match.start() == len(name) - 1 and name.endswith(".~/!"):
            return ""
        raise ValueError(text)

    try:
        return _TOKEN.sub(token, name)
    except ValueError:
        return None


# -- the backend URL ----------------------------------------------------------


@dataclass(frozen=True)
class Location:
    """``s3://BUCKET[/PREFIX]``: the upstream bucket and the prefix (empty, or ending in "/")."""

    bucket: str
    prefix: str = ""

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def parse_location(url: str) -> Location:
    """Parse ``s3://BUCKET[/PREFIX]``; raises ValueError with a message for a person."""
    usage = "--backend must be 'local' or s3://BUCKET[/PREFIX]"
    if not url.startswith("s3://"):
        scheme = url.split("://", 1)[0] if "://" in url else None
        if scheme:
            raise ValueError(f"{usage}: the {scheme}:// scheme is not supported")
        raise ValueError(f"{usage}, not {url!r}")
    rest = url[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket:
        # Never echo it: it may hold a secret.
        raise ValueError(f"{usage}: credentials do not belong in the URL; set AWS_ACCESS_KEY_ID "
                         "and AWS_SECRET_ACCESS_KEY or AWS_PROFILE instead")
    if any(c in rest for c in "?#"):
        raise ValueError(f"{usage}: a query or fragment ({url!r}) is not allowed")
    if not bucket:
        raise ValueError(f"{usage}: the bucket name is missing in {url!r}")
    if not _BUCKET_URL.match(bucket) or ".." in bucket:
        raise ValueError(f"{usage}: {bucket!r} is not a valid bucket name (3 to 63 lowercase "
                         "letters, digits, dots, hyphens or underscores)")
    prefix = prefix.removesuffix("/")
    if prefix:
        segments = prefix.split("/")
        if any(s in ("", ".", "..") for s in segments):
            raise ValueError(f"{usage}: the prefix {prefix!r} has an empty, '.' or '..' segment")
        if len(prefix.encode()) > 512:
            raise ValueError(f"{usage}: the prefix is longer than 512 bytes")
        prefix += "/"
    return Location(bucket, prefix)


def check_endpoint(endpoint: str) -> None:
    """An endpoint is ``http(s)://host[:port]``; raises ValueError otherwise."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--backend-endpoint must be http(s)://HOST[:PORT], not {endpoint!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"--backend-endpoint must be http(s)://HOST[:PORT] with no path, "
                         f"query or credentials, not {endpoint!r}")
    del port


# -- what is stored with an object ---------------------------------------------


def _pack(meta: ObjectMeta, **extra: Any) -> str:
    """ObjectMeta and bookkeeping as one metadata value: base64 of UTF-8 JSON, so no
    upstream can fold, trim or reject any of it (user metadata may hold any text)."""
    doc = {"m": meta.to_dict(), **{k: v for k, v in extra.items() if v not in (None, [], ())}}
    raw = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    return base64.b64encode(raw).decode("ascii")


def _unpack(value: str | None) -> dict | None:
    if not value:
        return None
    try:
        doc = json.loads(base64.b64decode(value).decode("utf-8", "surrogatepass"))
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _meta(data: dict | None) -> ObjectMeta:
    try:
        return ObjectMeta.from_dict(dict(data or {}))
    except TypeError:
        return ObjectMeta()


def _rle(sizes: Sequence[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    return runs


def _unrle(runs: Any) -> list[int]:
    try:
        return [int(size) for size, count in runs for _ in range(int(count))]
    except (TypeError, ValueError):
        return []


def _etag_parts(etag: str) -> int:
    """How many parts a multipart ETag (``<hex>-N``) names; 0 for any other ETag."""
    count = etag.rpartition("-")[2]
    return int(count) if "-" in etag and count.isascii() and count.isdigit() else 0


def _part_list(parts: Sequence[tuple[int, str]]) -> str:
    """A short fingerprint of a Complete's (number, ETag) list, to know its retry."""
    text = "\n".join(f"{number}:{etag.strip(chr(34))}" for number, etag in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _multipart_etag(md5s: Sequence[str]) -> str:
    """The ETag S3 gives a multipart object; "" when a part's ETag is no MD5 (as
    SeaweedFS gives copied parts), since only the upstream knows it then."""
    try:
        joined = b"".join(bytes.fromhex(e) for e in md5s)
    except ValueError:
        return ""
    return f"{hashlib.md5(joined).hexdigest()}-{len(md5s)}"


def _collect(finalize: Finalizer | None, meta: ObjectMeta | None) -> dict[str, str]:
    """Run a finalizer; the checksums it returns land in ``meta`` (as LocalStore does)."""
    if finalize is None:
        return {}
    checksums = finalize() or {}
    if meta is not None and checksums:
        meta.checksums.update(checksums)
        if not meta.checksum_type:
            meta.checksum_type = "FULL_OBJECT"
    return checksums


def _seconds(when) -> int:
    """Upstream times to whole seconds: HEAD has only seconds, LIST may have more, and
    ObjectInfo must agree across both."""
    return int(when.timestamp())


def _strip(etag: str) -> str:
    return etag.strip().strip('"')


@dataclass
class _Head:
    info: ObjectInfo
    writer: str | None
    record: str | None  # the id of the object's completion record, if it has one


class S3ObjectReader:
    """Streams (a range of) an upstream object; a short or broken stream raises
    StoreUnavailable instead of ending early, so a truncated read is never taken
    for the whole."""

    def __init__(self, info: ObjectInfo, body, length: int) -> None:
        self.info = info
        self._body = body
        self._remaining = length

    def read(self, n: int = -1) -> bytes:
        if self._remaining <= 0 or self._body is None:
            return b""
        n = self._remaining if n < 0 else min(n, self._remaining)
        try:
            chunk = self._body.read(n)
        except (BotoCoreError, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            self.close()
            raise StoreUnavailable("The storage upstream stopped sending the object; "
                                   "retry.") from exc
        if not chunk:
            self.close()
            raise StoreUnavailable("The storage upstream ended the object early; retry.")
        self._remaining -= len(chunk)
        return chunk

    def close(self) -> None:
        if self._body is not None:
            body, self._body = self._body, None
            try:
                body.close()
            except Exception:  # noqa: BLE001 - closing a broken stream
                pass


#: Completion records remembered (a few hundred bytes each).
RECORD_CACHE = 4096


class S3Store:
    """An ObjectStore in one bucket (and prefix) of an S3-compatible service.

    Credentials come from boto3's default chain (AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY, AWS_PROFILE, config files, instance roles).
    """

    #: keys asked of the upstream per listing request (S3's maximum)
    list_page = 1000

    def __init__(self, bucket: str, prefix: str = "", endpoint: str | None = None,
                 region: str | None = None, *, threads: int = 64, spool_dir: str | Path | None = None,
                 connect_timeout: float = 3.0, read_timeout: float = 30.0,
                 single_put_limit: int = SINGLE_PUT_LIMIT, spool_memory: int = SPOOL_MEMORY,
                 copy_limit: int = COPY_LIMIT, copy_part: int = COPY_PART) -> None:
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        #: calls worth making at once for one job (rewrap): each is a round trip, and the
        #: connection pool holds ``threads + 8``
        self.parallel_calls = max(1, min(32, threads))
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint = endpoint
        #: completion records by (bucket, key, record, etag): immutable once written, so
        #: safe to remember whatever other gateways do; saves a GET per read of a multipart object
        self._records: OrderedDict[tuple[str, str, str, str], dict | None] = OrderedDict()
        self._records_lock = threading.Lock()
        self.single_put_limit = single_put_limit
        self.spool_memory = spool_memory
        self.copy_limit = copy_limit
        self.copy_part = copy_part
        self.spool_dir = Path(spool_dir) if spool_dir else None
        if self.spool_dir is not None:
            self.spool_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            for leftover in self.spool_dir.iterdir():
                if leftover.is_file():
                    leftover.unlink(missing_ok=True)
        session = boto3.session.Session()
        region = region or session.region_name or "us-east-1"

        def client(connect: float, read: float):
            config = BotoConfig(
                connect_timeout=connect, read_timeout=read,
                retries={"total_max_attempts": 1},  # retried here, and only when idempotent
                max_pool_connections=threads + 8, tcp_keepalive=True,
                # UNSIGNED-PAYLOAD even over http: hashing a body for the signature means
                # reading it twice (or, for a streamed part, holding all of it). Bodies
                # carry Content-MD5 when they are in memory; use https to the upstream.
                s3={"addressing_style": "path" if endpoint else "auto",
                    "payload_signing_enabled": False},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                parameter_validation=False)  # every request is built here
            return session.client("s3", endpoint_url=endpoint, region_name=region, config=config)

        self._client = client(connect_timeout, read_timeout)
        #: for /ready: answers within a few seconds whatever the upstream does
        self._probe = client(min(connect_timeout, 2.0), min(read_timeout, 3.0))
        #: HEAD and metadata-only copies without botocore's per-call cost, where possible
        self._direct = _Direct.of(self._client, self.bucket, endpoint, region)
        self._sweep_lock = threading.Lock()
        self._sweep_after = ""
        #: whether the upstream turns "\\" in a name into "/" (see learn_quirks)
        self.folds_backslash = False
        #: whether a CopyObject of a multipart object keeps its parts (its ``-N`` ETag), as
        #: SeaweedFS's does and AWS's does not; until learned, copies assume not
        self.copy_keeps_parts = False

    @property
    def where(self) -> str:
        """The upstream location for messages and logs (no credentials)."""
        return f"s3://{self.bucket}/{self.prefix}" + (f" at {self.endpoint}" if self.endpoint else "")

    # -- upstream calls ---------------------------------------------------------

    def _call(self, operation: str, retry: bool = False, client=None, **params):
        """One upstream call. Idempotent calls (``retry``) are tried again with backoff
        when the upstream refuses connections or answers 5xx; a read timeout is never
        retried, so no caller waits longer than the timeout once. Transport failures
        become StoreUnavailable; ClientError is left to the caller to translate."""
        method = getattr(client or self._client, operation)
        return self._attempts(lambda: method(**params), retry, params.get("Body"))

    def _attempts(self, send: Callable[[], Any], retry: bool, body: Any = None):
        """``send`` tried as ``_call`` describes (also for the direct calls of ``_Direct``)."""
        attempts = ATTEMPTS if retry else 1
        for attempt in range(attempts):
            if attempt and hasattr(body, "seek"):
                body.seek(0)
            try:
                return send()
            except ClientError as exc:
                if attempt + 1 < attempts and _transient(exc):
                    _sleep(attempt)
                    continue
                raise
            except (EndpointConnectionError, ConnectionClosedError, ConnectTimeoutError) as exc:
                if attempt + 1 < attempts:
                    _sleep(attempt)
                    continue
                raise StoreUnavailable(f"The storage upstream is not reachable "
                                       f"({exc.__class__.__name__}); retry later.") from exc
            except NoCredentialsError as exc:
                raise StoreUnavailable("No credentials for the storage upstream: set "
                                       "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                                       "AWS_PROFILE.") from exc
            except ReadTimeoutError as exc:
                raise StoreTimeout("The storage upstream did not answer in time; retry later.") from exc
            except BotoCoreError as exc:
                raise StoreUnavailable(f"The storage upstream failed ({exc.__class__.__name__}); "
                                       "retry later.") from exc
            except OSError as exc:
                raise StoreUnavailable(f"The storage upstream failed ({exc.__class__.__name__}); "
                                       "retry later.") from exc
        raise AssertionError("unreachable")

    def _head_call(self, name: str) -> dict:
        """HEAD of an upstream name, as botocore's head_object answers it."""
        if self._direct is not None:
            return self._attempts(lambda: self._direct.head(name), retry=True)
        return self._call("head_object", retry=True, Bucket=self.bucket, Key=name)

    def _error(self, exc: ClientError) -> StoreError:
        """The store error for an upstream answer no caller handled itself."""
        code, status = _code(exc), _status(exc)
        known = {"PreconditionFailed": PreconditionFailed, "NoSuchUpload": NoSuchUpload,
                 "InvalidPart": InvalidPart, "InvalidPartOrder": InvalidPartOrder,
                 "EntityTooSmall": EntityTooSmall, "NoSuchKey": NoSuchKey}
        if _transient(exc) or code == "RequestTimeout":
            return StoreUnavailable(f"The storage upstream is unavailable ({code or status}); "
                                    "retry later.")
        if code == "NoSuchBucket":
            return StoreUnavailable(f"The upstream bucket {self.bucket!r} does not exist.")
        if status in (401, 403):
            return StoreUnavailable(f"The storage upstream refused the gateway's credentials "
                                    f"({code or status}).")
        if code in known:
            return known[code]()
        err = StoreError(_message(exc) or f"The storage upstream refused the request ({code}).")
        err.code = code if code and code.isalnum() else "InvalidRequest"
        return err

    # -- names --------------------------------------------------------------------

    def _marker(self, bucket: str) -> str:
        return f"{self.prefix}_buckets/{bucket}"

    def _okey(self, bucket: str, key: str) -> str:
        return f"{self.prefix}{bucket}/{self._encoded(key)}"

    def _upload_name(self, bucket: str, key: str, upload_id: str) -> str:
        return f"{self.prefix}_uploads/{bucket}/{self._encoded(key)}!{upload_id}"

    def _done_name(self, bucket: str, key: str, upload_id: str) -> str:
        return f"{self.prefix}_done/{bucket}/{self._encoded(key)}!{upload_id}"

    def _encoded(self, key: str) -> str:
        """The stored form of ``key``; refused when the upstream would store it as another
        key's name (see :meth:`learn_quirks`)."""
        if self.folds_backslash and any(c in key for c in FOLDED):
            raise UnstorableKey("The storage upstream stores '\\' as '/' (SeaweedFS does), so "
                                "keys containing a backslash or the control character ESC "
                                "cannot be stored on it.")
        return encode_key(key)

    def _parts_prefix(self, upload_id: str) -> str:
        return f"{self.prefix}_parts/{upload_id}/"

    # -- small JSON documents -------------------------------------------------

    def _get_json(self, name: str) -> dict | None:
        try:
            response = self._call("get_object", retry=True, Bucket=self.bucket, Key=name)
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise self._error(exc) from exc
        try:
            data = response["Body"].read()
        except (BotoCoreError, OSError) as exc:
            raise StoreUnavailable("The storage upstream stopped sending; retry later.") from exc
        try:
            doc = json.loads(data.decode("utf-8", "surrogatepass"))
        except (ValueError, UnicodeDecodeError):
            return None
        return doc if isinstance(doc, dict) else None

    def _put_json(self, name: str, doc: dict) -> None:
        data = json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")
        try:
            self._call("put_object", retry=True, Bucket=self.bucket, Key=name, Body=data,
                       ContentType="application/json")
        except ClientError as exc:
            raise self._error(exc) from exc

    def _delete_quietly(self, *names: str) -> bool:
        """Delete ``names``; whether every delete went through (one that did not is collected by
        upkeep later)."""
        done = True
        for name in names:
            try:
                self._call("delete_object", retry=True, Bucket=self.bucket, Key=name)
            except (ClientError, StoreError):
                done = False
        return done

    def _list(self, prefix: str, start_after: str = "", delimiter: str = "",
              page: int = 1000) -> Iterator[dict]:
        """Every upstream ListObjectsV2 page under ``prefix``."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": page}
        if start_after:
            params["StartAfter"] = start_after
        if delimiter:
            params["Delimiter"] = delimiter
        while True:
            try:
                response = self._call("list_objects_v2", retry=True, **params)
            except ClientError as exc:
                raise self._error(exc) from exc
            yield response
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return
            params.pop("StartAfter", None)
            params["ContinuationToken"] = token

    def _names(self, prefix: str) -> Iterator[dict]:
        for response in self._list(prefix):
            yield from response.get("Contents", ())

    # -- buckets ----------------------------------------------------------------

    def create_bucket(self, name: str) -> BucketInfo:
        try:
            self._call("put_object", Bucket=self.bucket, Key=self._marker(name), Body=b"",
                       IfNoneMatch="*")
        except ClientError as exc:
            if _precondition(exc):
                raise BucketAlreadyExists() from None
            raise self._error(exc) from exc
        return BucketInfo(name, float(int(time.time())))

    def delete_bucket(self, name: str) -> None:
        self.head_bucket(name)
        for prefix, message in ((f"{self.prefix}{name}/", ""),
                                (f"{self.prefix}_uploads/{name}/", "The bucket you tried to delete "
                                 "has multipart uploads in progress.")):
            page = next(self._list(prefix, page=1))
            if page.get("KeyCount", len(page.get("Contents", ()))):
                raise BucketNotEmpty(message)
        try:
            self._call("delete_object", retry=True, Bucket=self.bucket, Key=self._marker(name))
        except ClientError as exc:
            raise self._error(exc) from exc

    def head_bucket(self, name: str) -> BucketInfo:
        try:
            response = self._head_call(self._marker(name))
        except ClientError as exc:
            if _status(exc) == 404:
                raise NoSuchBucket() from None
            raise self._error(exc) from exc
        return BucketInfo(name, float(_seconds(response["LastModified"])))

    def list_buckets(self) -> list[BucketInfo]:
        base = f"{self.prefix}_buckets/"
        buckets = []
        for item in self._names(base):
            name = item["Key"][len(base):]
            if name and "/" not in name:
                buckets.append(BucketInfo(name, float(_seconds(item["LastModified"]))))
        return sorted(buckets, key=lambda b: b.name)

    # -- reading objects ----------------------------------------------------------

    def _missing(self, bucket: str) -> StoreError:
        """NoSuchBucket or NoSuchKey for an object the upstream does not have."""
        self.head_bucket(bucket)
        return NoSuchKey()

    def _describe(self, bucket: str, key: str, response: dict, size: int) -> _Head:
        etag = _strip(response.get("ETag", ""))
        modified = float(_seconds(response["LastModified"]))
        doc = _unpack((response.get("Metadata") or {}).get(META_NAME)) or {}
        meta = _meta(doc.get("m"))
        part_sizes: list[int] = []
        record = doc.get("r") if isinstance(doc.get("r"), str) else None
        count = _etag_parts(etag)
        if record is not None:
            done = self._completion(bucket, key, record, etag)
            if done is not None and done.get("etag") == etag:
                meta = _meta(done.get("m"))
                part_sizes = _unrle(done.get("ps"))
        if not part_sizes and doc.get("ps"):
            part_sizes = _unrle(doc.get("ps"))
        if len(part_sizes) != count or sum(part_sizes) != size or count < 2:
            part_sizes = []
        info = ObjectInfo(bucket, key, size, etag, modified, meta, tuple(part_sizes))
        writer = doc.get("w") if isinstance(doc.get("w"), str) else None
        return _Head(info, writer, record)

    def _completion(self, bucket: str, key: str, record: str, etag: str) -> dict | None:
        cache_key = (bucket, key, record, etag)
        with self._records_lock:
            if cache_key in self._records:
                self._records.move_to_end(cache_key)
                return self._records[cache_key]
        done = self._get_json(self._done_name(bucket, key, record))
        if done is not None and done.get("etag") == etag:
            with self._records_lock:
                self._records[cache_key] = done
                while len(self._records) > RECORD_CACHE:
                    self._records.popitem(last=False)
        return done

    def _head(self, bucket: str, key: str) -> _Head:
        try:
            response = self._head_call(self._okey(bucket, key))
        except ClientError as exc:
            if _status(exc) == 404:
                raise self._missing(bucket) from None
            raise self._error(exc) from exc
        return self._describe(bucket, key, response, int(response["ContentLength"]))

    def head_object(self, bucket: str, key: str) -> ObjectInfo:
        return self._head(bucket, key).info

    def open_object(self, bucket: str, key: str, start: int = 0,
                    end: int | None = None) -> S3ObjectReader:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._okey(bucket, key)}
        if end is not None and end <= start:
            return S3ObjectReader(self.head_object(bucket, key), None, 0)
        if start > 0 or end is not None:
            params["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        try:
            response = self._call("get_object", retry=True, **params)
        except ClientError as exc:
            if _status(exc) == 404:
                raise self._missing(bucket) from None
            if _status(exc) == 416:  # the range starts at or past the end
                return S3ObjectReader(self.head_object(bucket, key), None, 0)
            raise self._error(exc) from exc
        body = response["Body"]
        try:
            length = int(response["ContentLength"])
            size = length
            if response.get("ContentRange"):
                size = int(response["ContentRange"].rsplit("/", 1)[1])
            head = self._describe(bucket, key, response, size)
        except BaseException:
            body.close()
            raise
        return S3ObjectReader(head.info, body, length)

    # -- writing objects ----------------------------------------------------------

    def put_object(self, bucket: str, key: str, body: Readable, meta: ObjectMeta,
                   condition: WriteCondition | None = None,
                   finalize: Finalizer | None = None) -> ObjectInfo:
        """The body is read to its end first (in memory up to ``single_put_limit``, beyond
        that in a spool file), the finalizer runs, and only then does one upstream PUT
        with Content-MD5 make it visible: a PUT stays a single-part object (its ETag its
        MD5) as on AWS and the embedded store, and a body cut off on the way to the
        upstream is refused by it rather than stored short."""
        self.head_bucket(bucket)
        data, size, md5 = self._spool(body, self.single_put_limit)
        try:
            _collect(finalize, meta)
            return self._put_single(bucket, key, data, size, md5, meta, condition)
        finally:
            if not isinstance(data, bytes):
                data.close()

    def _put_single(self, bucket: str, key: str, data, size: int, md5: bytes, meta: ObjectMeta,
                    condition: WriteCondition | None) -> ObjectInfo:
        writer = condition.writer if condition else None
        params = {"Bucket": self.bucket, "Key": self._okey(bucket, key), "Body": data,
                  "ContentLength": size, "ContentMD5": base64.b64encode(md5).decode(),
                  "Metadata": {META_NAME: _pack(meta, w=writer)}, **_condition_params(condition)}
        try:
            response = self._call("put_object", retry=not _conditional(condition), **params)
        except ClientError as exc:
            if _precondition(exc):
                return self._condition_failed(bucket, key, condition, md5.hex())
            raise self._error(exc) from exc
        return ObjectInfo(bucket, key, size, _strip(response["ETag"]), time.time(), meta)

    def _upload_bytes(self, okey: str, upload: str, number: int, data, size: int,
                      md5: bytes) -> str:
        try:
            response = self._call("upload_part", retry=True, Bucket=self.bucket, Key=okey,
                                  UploadId=upload, PartNumber=number, Body=data, ContentLength=size,
                                  ContentMD5=base64.b64encode(md5).decode())
        except ClientError as exc:
            raise self._error(exc) from exc
        return _strip(response["ETag"])

    def _abort_quietly(self, okey: str, upload: str) -> None:
        try:
            self._call("abort_multipart_upload", retry=True, Bucket=self.bucket, Key=okey,
                       UploadId=upload)
        except (ClientError, StoreError):
            pass  # expire_uploads aborts it later

    def _condition_failed(self, bucket: str, key: str, condition: WriteCondition | None,
                          etag: str) -> ObjectInfo:
        """The upstream refused a conditional write: a retry of a write this same writer
        made moments ago with these bytes succeeds (as LocalStore's), otherwise 412, or
        404 for If-Match on a key that does not exist."""
        try:
            current = self._head(bucket, key)
        except NoSuchKey:
            current = None
        if (current is not None and condition is not None and condition.writer is not None
                and current.writer == condition.writer and current.info.etag == etag
                and time.time() - current.info.last_modified <= RETRY_WINDOW):
            return current.info
        if condition is not None and condition.if_match and current is None:
            raise NoSuchKey()
        raise PreconditionFailed()

    def delete_object(self, bucket: str, key: str) -> None:
        self.head_bucket(bucket)
        try:
            self._call("delete_object", retry=True, Bucket=self.bucket, Key=self._okey(bucket, key))
        except ClientError as exc:
            raise self._error(exc) from exc

    def copy_object(self, src_bucket: str, src_key: str, bucket: str, key: str,
                    meta: ObjectMeta | None, condition: WriteCondition | None = None,
                    source_etag: str | None = None) -> ObjectInfo:
        """A server-side copy, pinned (``x-amz-copy-source-if-match``) to the version whose
        metadata it carries; ``source_etag`` pins the version a caller checked."""
        self.head_bucket(bucket)
        for _ in range(3):
            source = self._head(src_bucket, src_key)
            if source_etag is not None and source.info.etag != source_etag:
                raise SourceChanged()
            try:
                return self._copy_once(source.info, bucket, key, meta, condition)
            except _SourceMoved:
                if source_etag is not None:
                    raise SourceChanged() from None
        raise StoreUnavailable("The source object keeps changing; retry the copy.")

    def _copy_once(self, source: ObjectInfo, bucket: str, key: str, meta: ObjectMeta | None,
                   condition: WriteCondition | None) -> ObjectInfo:
        new_meta = meta if meta is not None else source.meta
        writer = condition.writer if condition else None
        blob = _pack(new_meta, w=writer, ps=_rle(source.part_sizes) if source.part_sizes else None)
        copy_source = {"Bucket": self.bucket, "Key": self._okey(source.bucket, source.key)}
        okey = self._okey(bucket, key)
        if source.size > self.copy_limit or (_etag_parts(source.etag) and not self.copy_keeps_parts):
            # AWS gives a CopyObject of a multipart object a plain MD5 ETag: one part. The
            # sealed store reads an object by its parts, so there a multipart one is copied
            # part by part (server-side still), and the copy keeps them.
            return self._copy_in_parts(source, bucket, key, new_meta, condition, writer)
        try:
            response = self._call("copy_object", Bucket=self.bucket, Key=okey, CopySource=copy_source,
                                  CopySourceIfMatch=f'"{source.etag}"', MetadataDirective="REPLACE",
                                  Metadata={META_NAME: blob}, **_condition_params(condition))
        except ClientError as exc:
            if _precondition(exc):
                self._check_source(source)
                return self._condition_failed(bucket, key, condition, source.etag)
            if _status(exc) == 404 and _code(exc) == "NoSuchKey":
                self._check_source(source)
            raise self._error(exc) from exc
        result = response["CopyObjectResult"]
        etag = _strip(result["ETag"])
        part_sizes = source.part_sizes if _etag_parts(etag) == len(source.part_sizes) else ()
        return ObjectInfo(bucket, key, source.size, etag, float(_seconds(result["LastModified"])),
                          new_meta, part_sizes)

    def _check_source(self, source: ObjectInfo) -> None:
        """After a refused copy: was it the source that changed (or went)?"""
        try:
            now = self._head(source.bucket, source.key).info.etag
        except NoSuchKey:
            now = None
        if now != source.etag:
            raise _SourceMoved()

    def replace_meta(self, current: ObjectInfo, meta: ObjectMeta) -> ObjectInfo:
        """Give the version ``current`` of an object new metadata, its bytes untouched: one
        CopyObject onto itself, pinned to that version as its source and as its destination,
        so a write that replaced it meanwhile is never overwritten (PreconditionFailed; or
        NoSuchKey once deleted). Rewrapping a data key is this, once per object, so it is one
        upstream call rather than copy_object's four."""
        if current.size > self.copy_limit or (_etag_parts(current.etag) and not self.copy_keeps_parts):
            return self.copy_object(current.bucket, current.key, current.bucket, current.key, meta,
                                    WriteCondition(if_match=current.etag), source_etag=current.etag)
        name = self._okey(current.bucket, current.key)
        blob = _pack(meta, ps=_rle(current.part_sizes) if current.part_sizes else None)
        try:
            if self._direct is not None:
                result = self._attempts(lambda: self._direct.copy_meta(name, current.etag, blob),
                                        retry=False)
            else:
                quoted = f'"{current.etag}"'
                result = self._call("copy_object", Bucket=self.bucket, Key=name,
                                    CopySource={"Bucket": self.bucket, "Key": name},
                                    CopySourceIfMatch=quoted, IfMatch=quoted,
                                    MetadataDirective="REPLACE",
                                    Metadata={META_NAME: blob})["CopyObjectResult"]
        except ClientError as exc:
            if _precondition(exc):
                raise PreconditionFailed() from None
            raise self._error(exc) from exc
        etag = _strip(result["ETag"])
        part_sizes = current.part_sizes if _etag_parts(etag) == len(current.part_sizes) else ()
        return ObjectInfo(current.bucket, current.key, current.size, etag,
                          float(_seconds(result["LastModified"])), meta, part_sizes)

    def _copy_in_parts(self, source: ObjectInfo, bucket: str, key: str, meta: ObjectMeta,
                       condition: WriteCondition | None, writer: str | None) -> ObjectInfo:
        """Copies beyond the upstream's single-copy limit, as UploadPartCopy ranges along
        the source's own part boundaries, so the copy has the same parts (and, where
        the upstream gives copied parts their MD5 as AWS does, the same ETag)."""
        okey = self._okey(bucket, key)
        copy_source = {"Bucket": self.bucket, "Key": self._okey(source.bucket, source.key)}
        sizes = list(source.part_sizes)
        if not sizes and _etag_parts(source.etag) == 1:
            sizes = [source.size]  # a multipart object of one part stays one
        if not sizes:
            count = -(-source.size // self.copy_part)
            sizes = [self.copy_part] * (count - 1) + [source.size - self.copy_part * (count - 1)]
        blob = _pack(meta, w=writer, ps=_rle(sizes) if len(sizes) > 1 else None)
        try:
            upload = self._call("create_multipart_upload", Bucket=self.bucket, Key=okey,
                                Metadata={META_NAME: blob})["UploadId"]
        except ClientError as exc:
            raise self._error(exc) from exc
        try:
            etags, first = [], 0
            for number, size in enumerate(sizes, 1):
                try:
                    response = self._call("upload_part_copy", retry=True, Bucket=self.bucket, Key=okey,
                                          UploadId=upload, PartNumber=number, CopySource=copy_source,
                                          CopySourceRange=f"bytes={first}-{first + size - 1}",
                                          CopySourceIfMatch=f'"{source.etag}"')
                except ClientError as exc:
                    if _precondition(exc) or _status(exc) == 404:
                        self._check_source(source)
                    raise self._error(exc) from exc
                etags.append(_strip(response["CopyPartResult"]["ETag"]))
                first += size
            parts = [{"PartNumber": n, "ETag": f'"{e}"'} for n, e in enumerate(etags, 1)]
            try:
                response = self._call("complete_multipart_upload", Bucket=self.bucket, Key=okey,
                                      UploadId=upload, MultipartUpload={"Parts": parts},
                                      **_condition_params(condition))
            except ClientError as exc:
                if _precondition(exc):
                    self._abort_quietly(okey, upload)
                    return self._condition_failed(bucket, key, condition, source.etag)
                raise self._error(exc) from exc
        except BaseException:
            self._abort_quietly(okey, upload)
            raise
        return ObjectInfo(bucket, key, source.size, _strip(response["ETag"]), time.time(), meta,
                          tuple(sizes) if len(sizes) > 1 else ())

    # -- listing ------------------------------------------------------------------

    def list_objects(self, bucket: str, prefix: str = "", delimiter: str = "",
                     after: str = "", limit: int = 1000) -> ListPage:
        """One page in byte order, the same as LocalStore's, from flat upstream pages.

        A bucket's marker is looked at only when a page comes back empty (a bucket
        holding keys exists). The delimiter is applied here, not by the upstream: SeaweedFS reports the empty
        directories that deleted keys leave behind as common prefixes. Keys under a
        common prefix already returned are skipped within the page; when they fill the
        rest of it, the next upstream page starts past them (one request), so a large
        "directory" is never listed key by key.
        """
        entries: list[ListEntry] = []
        prefixes: list[str] = []
        if limit <= 0:
            self.head_bucket(bucket)
            return ListPage(entries, prefixes, False, None)
        base = f"{self.prefix}{bucket}/"
        upstream_prefix = base + encode_prefix(prefix)
        last: str | None = None
        skip: str | None = None  # the common prefix last returned: nothing under it counts
        start = ""
        if after:
            cut = after.find(delimiter, len(prefix)) if delimiter and after.startswith(prefix) else -1
            if cut >= 0:
                skip = after[:cut + len(delimiter)]
                start = base + encode_prefix(skip) + _AFTER_EVERY_KEY
            else:
                start = base + encode_key(after)
        if start < upstream_prefix:
            start = ""
        while True:
            room = limit - len(entries) - len(prefixes)
            params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": upstream_prefix,
                                      "MaxKeys": self.list_page if delimiter
                                      else min(self.list_page, room + 1)}
            if start:
                params["StartAfter"] = start
            try:
                response = self._call("list_objects_v2", retry=True, **params)
            except ClientError as exc:
                raise self._error(exc) from exc
            inside = False  # whether the page ended among keys under ``skip``
            for obj in response.get("Contents", ()):
                start = obj["Key"]
                text = decode_key(start[len(base):])
                inside = False
                if text is None or not text.startswith(prefix):
                    continue
                if skip is not None and text.startswith(skip):
                    inside = True
                    continue
                if after and skip is None and text <= after:
                    continue
                if len(entries) + len(prefixes) >= limit:
                    return ListPage(entries, prefixes, True, last)
                cut = text.find(delimiter, len(prefix)) if delimiter else -1
                if cut >= 0:
                    last = skip = text[:cut + len(delimiter)]
                    prefixes.append(skip)
                    inside = True
                    continue
                entries.append(ListEntry(text, int(obj["Size"]), _strip(obj.get("ETag", "")),
                                         float(_seconds(obj["LastModified"]))))
                last = text
            if not response.get("IsTruncated"):
                if not entries and not prefixes:
                    self.head_bucket(bucket)  # an empty page: is there a bucket at all?
                return ListPage(entries, prefixes, False, last)
            if inside and skip is not None:
                start = base + encode_prefix(skip) + _AFTER_EVERY_KEY

    # -- multipart ----------------------------------------------------------------

    def create_multipart(self, bucket: str, key: str, meta: ObjectMeta) -> UploadInfo:
        self.head_bucket(bucket)
        upload_id = secrets.token_hex(16)
        okey = self._okey(bucket, key)
        try:
            upstream = self._call("create_multipart_upload", Bucket=self.bucket, Key=okey,
                                  Metadata={META_NAME: _pack(meta, r=upload_id)})["UploadId"]
        except ClientError as exc:
            raise self._error(exc) from exc
        now = time.time()
        try:
            self._put_json(self._upload_name(bucket, key, upload_id),
                           {"upload": upstream, "initiated": now, "m": meta.to_dict()})
        except BaseException:
            self._abort_quietly(okey, upstream)
            raise
        return UploadInfo(bucket, key, upload_id, now, meta)

    def _upload(self, bucket: str, key: str, upload_id: str) -> tuple[UploadInfo, str]:
        """An upload in progress and its upstream upload id."""
        doc = None
        if _UPLOAD_ID.fullmatch(upload_id or ""):
            doc = self._get_json(self._upload_name(bucket, key, upload_id))
        if doc is None or not isinstance(doc.get("upload"), str):
            self.head_bucket(bucket)
            raise NoSuchUpload()
        info = UploadInfo(bucket, key, upload_id, float(doc.get("initiated") or 0), _meta(doc.get("m")))
        return info, doc["upload"]

    def get_upload(self, bucket: str, key: str, upload_id: str) -> UploadInfo:
        return self._upload(bucket, key, upload_id)[0]

    def upload_part(self, bucket: str, key: str, upload_id: str, part_number: int,
                    body: Readable, finalize: Finalizer | None = None,
                    size: int | None = None) -> PartInfo:
        """A part of known ``size`` streams to the upstream with its last bytes held back
        until the body ended and verified and the finalizer accepted it, so a failure
        leaves the upstream with a short request and no part. Without a size the body
        is read first (to memory up to ``spool_memory``, beyond that to a spool file)."""
        _, upstream = self._upload(bucket, key, upload_id)
        okey = self._okey(bucket, key)
        # (UploadPartCopy is not done server-side: SeaweedFS answers it with part ETags
        # that are not the MD5 of the range, so the object's ETag would differ.)
        if size is not None:
            feed = _HoldBack(body, size, finalize)
            etag = self._upload_stream(okey, upstream, part_number, feed)
            checksums = feed.checksums
        else:
            data, size, md5 = self._spool(body, self.spool_memory)
            try:
                checksums = _collect(finalize, None)  # before the part exists upstream
                etag = self._upload_bytes(okey, upstream, part_number, data, size, md5)
            finally:
                if not isinstance(data, bytes):
                    data.close()
        # Only parts with a record are listed or completed: SeaweedFS keeps an upload
        # whose body was cut short as an empty part, and a failed part leaves no record.
        try:
            self._call("put_object", retry=True, Bucket=self.bucket, Body=b"",
                       Key=self._parts_prefix(upload_id) + _part_record(part_number, etag, checksums))
        except ClientError as exc:
            raise self._error(exc) from exc
        return PartInfo(part_number, size, etag, time.time(), checksums)

    def _upload_stream(self, okey: str, upload: str, number: int, feed: _HoldBack) -> str:
        try:
            response = self._call("upload_part", Bucket=self.bucket, Key=okey, UploadId=upload,
                                  PartNumber=number, Body=feed, ContentLength=feed.size)
        except ClientError as exc:
            feed.reraise(whole=False)  # the body's own failure came first, if there was one
            raise self._error(exc) from exc
        except StoreError:
            feed.reraise(whole=False)  # BadDigest, a short body ...: not the upstream's failure
            raise
        feed.reraise()
        return _strip(response["ETag"])

    def _spool(self, body: Readable, memory: int) -> tuple[Any, int, bytes]:
        """A body read to its end, with its size and MD5: bytes up to ``memory``, beyond
        that an owner-only spool file (removed when closed)."""
        md5 = hashlib.md5()
        head = _read_up_to(body, memory + 1)
        md5.update(head)
        if len(head) <= memory:
            return head, len(head), md5.digest()
        spool = tempfile.TemporaryFile(dir=self.spool_dir)
        try:
            spool.write(head)
            size = len(head)
            while chunk := body.read(READ_CHUNK):
                md5.update(chunk)
                spool.write(chunk)
                size += len(chunk)
            spool.flush()
            spool.seek(0)
        except BaseException:
            spool.close()
            raise
        return spool, size, md5.digest()

    def _parts(self, bucket: str, key: str, upload_id: str, upstream: str) -> dict[int, PartInfo]:
        """The current upload of each part number: of the versions the upstream lists
        that arrived whole (they have a record), the one recorded last. (SeaweedFS
        lists every upload of a part number, not just the last, and completes with
        whichever one a Complete names.)"""
        records: dict[tuple[int, str], tuple[int, dict[str, str]]] = {}
        base = self._parts_prefix(upload_id)
        for item in self._names(base):
            parsed = _parse_part_record(item["Key"][len(base):])
            if parsed is not None:
                number, stamp, etag, checksums = parsed
                if stamp >= records.get((number, etag), (-1, {}))[0]:
                    records[(number, etag)] = (stamp, checksums)
        parts: dict[int, tuple[int, PartInfo]] = {}
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._okey(bucket, key),
                                  "UploadId": upstream}
        while True:
            try:
                response = self._call("list_parts", retry=True, **params)
            except ClientError as exc:
                raise self._error(exc) from exc
            for p in response.get("Parts", ()):
                etag, number = _strip(p["ETag"]), int(p["PartNumber"])
                record = records.get((number, etag))
                if record is not None and record[0] >= parts.get(number, (-1, None))[0]:
                    parts[number] = (record[0], PartInfo(number, int(p["Size"]), etag,
                                                         float(_seconds(p["LastModified"])), record[1]))
            marker = response.get("NextPartNumberMarker")
            if not response.get("IsTruncated") or not marker:
                return {number: part for number, (_, part) in parts.items()}
            params["PartNumberMarker"] = marker

    def list_parts(self, bucket: str, key: str, upload_id: str) -> list[PartInfo]:
        _, upstream = self._upload(bucket, key, upload_id)
        parts = self._parts(bucket, key, upload_id, upstream)
        return [parts[n] for n in sorted(parts)]

    def complete_multipart(self, bucket: str, key: str, upload_id: str,
                           parts: Sequence[tuple[int, str]],
                           condition: WriteCondition | None = None,
                           meta_update: MetaUpdate | None = None) -> ObjectInfo:
        try:
            upload, upstream = self._upload(bucket, key, upload_id)
            stored = self._parts(bucket, key, upload_id, upstream)
            try:
                chosen = check_parts(parts, stored)
            except (InvalidPart, InvalidPartOrder, EntityTooSmall):
                self._upload(bucket, key, upload_id)  # an Abort or Complete may have won
                raise
            meta = meta_update(upload.meta, chosen) if meta_update else upload.meta
            return self._complete(bucket, key, upload_id, upstream, chosen, meta, condition)
        except NoSuchUpload:
            # Completed already (this is a retry, or lost a race with an identical
            # Complete): answer with that object while it is current. Aborted: 404.
            return self._completed_before(bucket, key, upload_id, parts)

    def _complete(self, bucket: str, key: str, upload_id: str, upstream: str,
                  chosen: list[PartInfo], meta: ObjectMeta,
                  condition: WriteCondition | None) -> ObjectInfo:
        okey = self._okey(bucket, key)
        etag = _multipart_etag([p.etag for p in chosen])
        sizes = [p.size for p in chosen]
        done_name = self._done_name(bucket, key, upload_id)
        done = {"etag": etag, "m": meta.to_dict(), "ps": _rle(sizes), "at": time.time(),
                "pl": _part_list([(p.part_number, p.etag) for p in chosen])}
        self._put_json(done_name, done)
        request = [{"PartNumber": p.part_number, "ETag": f'"{p.etag}"'} for p in chosen]
        try:
            response = self._call("complete_multipart_upload", Bucket=self.bucket, Key=okey,
                                  UploadId=upstream, MultipartUpload={"Parts": request},
                                  **_condition_params(condition))
        except ClientError as exc:
            if _precondition(exc):
                self._delete_quietly(done_name)
                if condition is not None and condition.if_match:
                    try:
                        self._head(bucket, key)
                    except NoSuchKey:
                        raise NoSuchKey() from None
                raise PreconditionFailed() from None
            raise self._error(exc) from exc
        final = _strip(response.get("ETag", etag))
        if final != etag:
            self._put_json(done_name, {**done, "etag": final})
        self._delete_quietly(self._upload_name(bucket, key, upload_id))
        self._clear_parts(upload_id)
        return ObjectInfo(bucket, key, sum(sizes), final, time.time(), meta,
                          tuple(sizes) if len(sizes) > 1 else ())

    def _completed_before(self, bucket: str, key: str, upload_id: str,
                          parts: Sequence[tuple[int, str]]) -> ObjectInfo:
        """A retried Complete (its first response lost) gets the object it created, while
        that object is still the current one, and only for the same list of parts: another
        list names an upload that no longer exists (records from before the list was kept
        are taken at their word)."""
        if _UPLOAD_ID.fullmatch(upload_id or ""):
            done = self._get_json(self._done_name(bucket, key, upload_id))
            if done is not None and done.get("pl", _part_list(parts)) == _part_list(parts):
                try:
                    current = self._head(bucket, key)
                except NoSuchKey:
                    current = None
                if (current is not None and current.record == upload_id
                        and current.info.etag == done.get("etag")):
                    return current.info
        self.head_bucket(bucket)
        raise NoSuchUpload()

    def _clear_parts(self, upload_id: str) -> None:
        names = [item["Key"] for item in self._names(self._parts_prefix(upload_id))]
        for start in range(0, len(names), 1000):
            batch = names[start:start + 1000]
            try:
                self._call("delete_objects", retry=True, Bucket=self.bucket,
                           Delete={"Objects": [{"Key": n} for n in batch], "Quiet": True})
            except (ClientError, StoreError):
                pass

    def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        _, upstream = self._upload(bucket, key, upload_id)
        okey = self._okey(bucket, key)
        try:
            # ListParts first: some upstreams answer an Abort of an upload that is gone
            # (completed by another gateway a moment ago) with success.
            self._call("list_parts", retry=True, Bucket=self.bucket, Key=okey, UploadId=upstream,
                       MaxParts=1)
            self._call("abort_multipart_upload", retry=True, Bucket=self.bucket, Key=okey,
                       UploadId=upstream)
        except ClientError as exc:
            if _code(exc) == "NoSuchUpload" or _status(exc) == 404:
                # Completed (or aborted) elsewhere a moment ago.
                self._delete_quietly(self._upload_name(bucket, key, upload_id))
                raise NoSuchUpload() from None
            raise self._error(exc) from exc
        self._delete_quietly(self._upload_name(bucket, key, upload_id))
        self._clear_parts(upload_id)

    def _upload_names(self, base: str) -> Iterator[tuple[str, str, str, dict]]:
        """(bucket, key, upload id, listing entry) of each upload record under ``base``."""
        root = f"{self.prefix}_uploads/"
        for item in self._names(base):
            bucket, _, rest = item["Key"][len(root):].partition("/")
            encoded, bang, upload_id = rest.rpartition("!")
            key = decode_key(encoded) if bang else None
            if key is not None and bucket and _UPLOAD_ID.fullmatch(upload_id):
                yield bucket, key, upload_id, item

    def list_uploads(self, bucket: str, prefix: str = "") -> list[UploadInfo]:
        self.head_bucket(bucket)
        uploads = []
        for _, key, upload_id, _item in self._upload_names(
                f"{self.prefix}_uploads/{bucket}/{encode_prefix(prefix)}"):
            doc = self._get_json(self._upload_name(bucket, key, upload_id))
            if doc is not None and key.startswith(prefix):
                uploads.append(UploadInfo(bucket, key, upload_id, float(doc.get("initiated") or 0),
                                          _meta(doc.get("m"))))
        return sorted(uploads, key=lambda u: (u.key.encode("utf-8", "surrogatepass"), u.upload_id))

    def expire_uploads(self, older_than: float) -> int:
        """Abort uploads initiated before ``older_than`` (unix seconds), and any upstream
        upload this store began that was left behind (a gateway that died mid-PUT);
        then collect a batch of completion records no object refers to any more."""
        expired = 0
        for bucket, key, upload_id, item in list(self._upload_names(f"{self.prefix}_uploads/")):
            if item["LastModified"].timestamp() < older_than:
                try:
                    self.abort_multipart(bucket, key, upload_id)
                    expired += 1
                except (NoSuchUpload, NoSuchBucket):
                    pass
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix}
        while True:
            try:
                response = self._call("list_multipart_uploads", retry=True, **params)
            except ClientError as exc:
                raise self._error(exc) from exc
            for upload in response.get("Uploads", ()):
                if upload["Initiated"].timestamp() < older_than:
                    self._abort_quietly(upload["Key"], upload["UploadId"])
            if not response.get("IsTruncated"):
                break
            params["KeyMarker"] = response.get("NextKeyMarker", "")
            params["UploadIdMarker"] = response.get("NextUploadIdMarker", "")
            if not params["KeyMarker"]:
                break
        self._sweep_parts()
        self._sweep_done()
        return expired

    def _sweep_parts(self) -> None:
        """Delete part records of uploads that no longer exist, older than DONE_GRACE: a
        Complete or Abort clears them, but one the upstream refused just then left them."""
        live = {upload_id for _, _, upload_id, _ in self._upload_names(f"{self.prefix}_uploads/")}
        root = f"{self.prefix}_parts/"
        cutoff = time.time() - DONE_GRACE
        stale: dict[str, bool] = {}
        for item in self._names(root):
            upload_id = item["Key"][len(root):].partition("/")[0]
            if upload_id not in live:
                stale[upload_id] = stale.get(upload_id, True) and item["LastModified"].timestamp() < cutoff
        for upload_id, old in stale.items():
            if old:
                self._clear_parts(upload_id)

    def _sweep_done(self) -> None:
        """Delete completion records whose object is gone or was replaced, never one younger
        than DONE_GRACE: a batch at a time, resuming where the last one stopped, and another
        batch while the last one found any to delete (within DONE_SWEEP_SECONDS), so a
        workload that replaces many multipart objects does not outgrow the sweep."""
        if not self._sweep_lock.acquire(blocking=False):
            return
        try:
            deadline = time.monotonic() + DONE_SWEEP_SECONDS
            while self._sweep_done_batch() and time.monotonic() < deadline and self._sweep_after:
                pass
        finally:
            self._sweep_lock.release()

    def _sweep_done_batch(self) -> int:
        """One batch of :meth:`_sweep_done`; how many records it deleted."""
        root = f"{self.prefix}_done/"
        seen = deleted = 0
        cutoff = time.time() - DONE_GRACE
        for response in self._list(root, self._sweep_after):
            for item in response.get("Contents", ()):
                seen += 1
                if item["LastModified"].timestamp() < cutoff:
                    deleted += self._collect_done(root, item["Key"])
                if seen >= DONE_SWEEP_BATCH:
                    self._sweep_after = item["Key"]
                    return deleted
        self._sweep_after = ""
        return deleted

    def _collect_done(self, root: str, name: str) -> bool:
        bucket, _, rest = name[len(root):].partition("/")
        encoded, bang, record = rest.rpartition("!")
        key = decode_key(encoded) if bang else None
        if key is None:
            return False
        try:
            current = self._head(bucket, key)
        except (NoSuchKey, NoSuchBucket):
            current = None
        if current is None or current.record != record:
            return self._delete_quietly(name)  # a sweep goes on only while deletes go through
        return False

    def count_uploads(self) -> int:
        """Uploads in progress in every bucket (user and internal), for the metrics."""
        return sum(1 for _ in self._upload_names(f"{self.prefix}_uploads/"))

    # -- health -------------------------------------------------------------------

    def check(self) -> None:
        """Reachable, credentials accepted, bucket present: within a few seconds."""
        try:
            self._call("head_bucket", client=self._probe, Bucket=self.bucket)
        except ClientError as exc:
            if _status(exc) == 404:
                raise StoreUnavailable(f"The upstream bucket {self.bucket!r} does not exist"
                                       + (f" at {self.endpoint}" if self.endpoint else "")
                                       + "; create it first.") from None
            raise self._error(exc) from exc
        except StoreUnavailable as exc:
            raise StoreUnavailable(f"{exc.message} (upstream: {self.where})") from exc

    def learn_quirks(self) -> None:
        """Find out, with throwaway objects, two things services differ in.

        - Whether the upstream stores a backslash as "/" (SeaweedFS's filer does, then folds
          "//"). The key encoding cannot keep such a name apart from another key's, so there
          keys that would contain one (a backslash, or ESC, which encodes as ",\\") are
          refused rather than stored where another key lives.
        - Whether a CopyObject of a multipart object keeps its parts (``copy_keeps_parts``):
          where it does, a metadata change or a rewrap is one call."""
        token = secrets.token_hex(8)  # gateways that start together each probe their own name
        self.folds_backslash = self._probed(self._probe_backslash, token, unknown=True)
        self.copy_keeps_parts = self._probed(self._probe_copy_of_parts, token, unknown=False)

    def _probed(self, probe: Callable[[str, str], bool], token: str, unknown: bool) -> bool:
        """A probe's answer; when the upstream refuses the probe (a bucket policy, say), the
        safe one, ``unknown`` (refuse backslash keys, copy multipart objects by parts): the
        gateway still starts."""
        for attempt in range(2):  # once more: a passing hiccup should not decide it
            try:
                return probe(f"{self.prefix}_probes/", token)
            except (ClientError, StoreError) as exc:
                failure = exc
                if attempt == 0:
                    _sleep(0)
        log.warning("upstream_probe_failed", probe=probe.__name__.removeprefix("_probe_"),
                    error=failure.__class__.__name__, assumed=unknown)
        return unknown

    def _probe_backslash(self, base: str, token: str) -> bool:
        """Write ``a\\TOKEN``: can it be read back as ``a/TOKEN``?"""
        written, folded = f"{base}a\\{token}", f"{base}a/{token}"
        try:
            self._call("put_object", retry=True, Bucket=self.bucket, Key=written, Body=b"")
            try:
                self._head_call(folded)
                return True
            except ClientError as exc:
                if _status(exc) != 404:
                    raise
                return False
        finally:
            self._delete_quietly(written, folded)

    def _probe_copy_of_parts(self, base: str, token: str) -> bool:
        """Copy a throwaway one-part multipart object onto itself: does it stay multipart?"""
        name, upload = f"{base}parts-{token}", None
        try:
            upload = self._call("create_multipart_upload", Bucket=self.bucket, Key=name)["UploadId"]
            part = self._call("upload_part", Bucket=self.bucket, Key=name, UploadId=upload,
                              PartNumber=1, Body=b"probe")["ETag"]
            self._call("complete_multipart_upload", Bucket=self.bucket, Key=name, UploadId=upload,
                       MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part}]})
            upload = None
            copied = self._call("copy_object", Bucket=self.bucket, Key=name,
                                CopySource={"Bucket": self.bucket, "Key": name},
                                MetadataDirective="REPLACE", Metadata={"probe": "1"})
            return _etag_parts(_strip(copied["CopyObjectResult"]["ETag"])) == 1
        finally:
            if upload is not None:
                self._abort_quietly(name, upload)
            self._delete_quietly(name)

    def close(self) -> None:
        for client in (self._client, self._probe):
            try:
                client.close()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass


class _Direct:
    """HEAD and the metadata-only CopyObject without botocore's per-call machinery.

    botocore spends about 2.3 ms of CPU on each call (model-driven serialization, endpoint
    rules, a score of event hooks, its signer, model-driven parsing), under the GIL; rewrap
    makes two calls per object, so that alone held it near 200 objects/s. These requests are
    signed here (SigV4 with the signing key kept for the day, the payload always empty) with
    the client's own credentials (refreshed as the client's are) and sent through the
    client's own HTTP session (its connection pool, proxies, TLS settings and timeouts), for
    about 0.5 ms a call. Only for an explicit endpoint, where the client addresses path-style
    and a URL is simply ``endpoint/bucket/key``; on AWS's virtual hosts botocore does it all.
    Answers and failures take botocore's shapes (a response dict, ClientError, its transport
    exceptions), so callers handle both paths alike.
    """

    def __init__(self, credentials: Any, http: Any, base: str, bucket: str, region: str) -> None:
        self._credentials = credentials
        self._http = http
        self._base = f"{base.rstrip('/')}/{quote(bucket, safe='')}/"
        self._host = urlsplit(self._base).netloc
        self._bucket = bucket
        self._region = region
        self._signing_key: tuple[tuple[str, str], bytes] | None = None

    @classmethod
    def of(cls, client: Any, bucket: str, endpoint: str | None, region: str) -> _Direct | None:
        """For a path-style client with credentials; None where botocore must do it."""
        credentials = getattr(getattr(client, "_request_signer", None), "_credentials", None)
        http = getattr(getattr(client, "_endpoint", None), "http_session", None)
        if not endpoint or credentials is None or not hasattr(http, "send"):
            return None
        return cls(credentials, http, client.meta.endpoint_url, bucket, region)

    def _send(self, method: str, name: str, headers: dict[str, str]) -> Any:
        url = self._base + quote(name, safe="/~")
        signed = self.sign(method, urlsplit(url).path, headers, datetime.now(UTC))
        return self._http.send(AWSRequest(method=method, url=url, headers=signed, data=b"").prepare())

    def sign(self, method: str, path: str, headers: dict[str, str], now: datetime) -> dict[str, str]:
        """``headers`` and the SigV4 ones for a request without a query or a body to
        ``path`` (percent-encoded once, as S3 canonicalizes it)."""
        frozen = self._credentials.get_frozen_credentials()
        stamp = now.strftime("%Y%m%dT%H%M%SZ")
        day = stamp[:8]
        out = {k.lower(): " ".join(str(v).split()) for k, v in headers.items()}
        out.update({"host": self._host, "x-amz-date": stamp, "x-amz-content-sha256": _EMPTY_SHA256})
        if frozen.token:
            out["x-amz-security-token"] = frozen.token
        names = sorted(out)
        canonical = "\n".join([method, path, "", *(f"{n}:{out[n]}" for n in names), "",
                               ";".join(names), _EMPTY_SHA256])
        scope = f"{day}/{self._region}/s3/aws4_request"
        to_sign = (f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n"
                   f"{hashlib.sha256(canonical.encode()).hexdigest()}")
        signature = hmac.new(self._key(frozen.secret_key, day), to_sign.encode(),
                             hashlib.sha256).hexdigest()
        out["authorization"] = (f"AWS4-HMAC-SHA256 Credential={frozen.access_key}/{scope}, "
                                f"SignedHeaders={';'.join(names)}, Signature={signature}")
        return out

    def _key(self, secret: str, day: str) -> bytes:
        """The day's signing key (four HMACs), derived again when the day or secret changes."""
        cached = self._signing_key
        if cached is not None and cached[0] == (secret, day):
            return cached[1]
        key = ("AWS4" + secret).encode()
        for part in (day, self._region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        self._signing_key = ((secret, day), key)
        return key

    def head(self, name: str) -> dict:
        """HEAD as botocore's head_object answers it (the fields this module reads)."""
        response = self._send("HEAD", name, {})
        if response.status_code != 200:
            raise _client_error(response, "HeadObject")
        headers = response.headers
        try:
            modified = parsedate_to_datetime(headers["Last-Modified"])
            length = int(headers["Content-Length"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreUnavailable("The storage upstream answered a HEAD without a valid "
                                   "Last-Modified or Content-Length.") from exc
        return {"ETag": headers.get("ETag", ""), "LastModified": modified, "ContentLength": length,
                "Metadata": {k[11:].lower(): v for k, v in headers.items()
                             if k[:11].lower() == "x-amz-meta-"}}

    def copy_meta(self, name: str, etag: str, blob: str) -> dict:
        """CopyObject of ``name`` onto itself with metadata ``blob``, if its ETag is still
        ``etag`` (as source and as destination): botocore's CopyObjectResult."""
        quoted = f'"{etag}"'
        response = self._send("PUT", name, {
            "x-amz-copy-source": quote(f"{self._bucket}/{name}", safe="-._~/"),
            "x-amz-copy-source-if-match": quoted, "If-Match": quoted,
            "x-amz-metadata-directive": "REPLACE", f"x-amz-meta-{META_NAME}": blob})
        root = _xml(response.content)
        if response.status_code != 200 or root is None or _local(root.tag) != "CopyObjectResult":
            raise _client_error(response, "CopyObject", root)  # S3 may answer 200 with an Error
        found = {_local(child.tag): (child.text or "") for child in root}
        try:
            modified = datetime.fromisoformat(found["LastModified"])
        except (KeyError, ValueError) as exc:
            raise StoreUnavailable("The storage upstream answered a copy without a valid "
                                   "LastModified.") from exc
        return {"ETag": found.get("ETag", ""), "LastModified": modified}


def _xml(body: bytes) -> ElementTree.Element | None:
    try:
        return ElementTree.fromstring(body) if body else None
    except ElementTree.ParseError:
        return None


def _local(tag: str) -> str:
    """An element's name without its namespace (S3 answers in one, SeaweedFS in none)."""
    return tag.rpartition("}")[2]


def _client_error(response: Any, operation: str,
                  root: ElementTree.Element | None = None) -> ClientError:
    """The ClientError botocore raises for this answer: the code and message of its XML
    error document, else the status as the code (as for a HEAD, which has no body); an
    error inside a 200 is a 500, as botocore makes it, so that it is retried alike."""
    status = response.status_code
    code, message = str(status), ""
    if root is not None and _local(root.tag) == "Error":
        found = {_local(child.tag): (child.text or "") for child in root}
        code, message = found.get("Code") or code, found.get("Message", "")
    return ClientError({"Error": {"Code": code, "Message": message},
                        "ResponseMetadata": {"HTTPStatusCode": 500 if status == 200 else status}},
                       operation)


class _HoldBack:
    """A body of declared size for an upstream request, with its last bytes held back
    until the source ended (the point at which a verifying reader raises) and the
    finalizer ran: if either fails the upstream sees a short body and keeps nothing.
    Whatever this raised is kept, since the HTTP client may wrap it on the way out."""

    def __init__(self, body: Readable, size: int, finalize: Finalizer | None) -> None:
        self.size = size
        self.checksums: dict[str, str] = {}
        self._body = body
        self._left = size
        self._finalize = finalize
        self._error: BaseException | None = None
        self._done = False
        self._cursor = 0
        if size == 0:
            self._finish()

    def read(self, n: int = -1) -> bytes:
        if self._error is not None:
            raise self._error
        if self._cursor != self.size - self._left:
            raise OSError("a streamed upload body cannot seek")
        if self._left <= 0:
            return b""
        try:
            n = self._left if n < 0 else min(n, self._left)
            chunk = self._body.read(n)
            if not chunk:
                raise IncompleteBody("The body ended before its declared length; nothing was written.")
            self._left -= len(chunk)
            self._cursor += len(chunk)
            if self._left == 0:
                self._finish()
            return chunk
        except BaseException as exc:
            self._error = exc
            raise

    def tell(self) -> int:
        return self._cursor

    def seek(self, offset: int, whence: int = 0) -> int:
        """Signers probe a body's length by seeking to its end and back; that works.
        Reading anywhere but where the stream is does not: it cannot go back."""
        base = {0: 0, 1: self._cursor, 2: self.size}[whence]
        self._cursor = base + offset
        return self._cursor

    def _finish(self) -> None:
        try:
            if self._body.read(1):
                raise IncompleteBody("The body is longer than its declared length; nothing was written.")
            self.checksums = _collect(self._finalize, None)
            self._done = True
        except BaseException as exc:
            self._error = exc
            raise

    def reraise(self, whole: bool = True) -> None:
        """Raise what reading the body raised; with ``whole``, also if it was not all read."""
        if self._error is not None:
            raise self._error
        if whole and not self._done:
            raise StoreUnavailable("The storage upstream did not take the whole part; retry.")


class _SourceMoved(Exception):
    """The copy source changed between reading its metadata and copying it."""


def _part_record(number: int, etag: str, checksums: dict[str, str]) -> str:
    """``<part>.<microseconds, hex>.<etag>.<checksums>``: the time orders uploads of one
    part number (the last one received whole is the part)."""
    raw = json.dumps(checksums, separators=(",", ":")).encode()
    stamp = time.time_ns() // 1000
    return f"{number:05d}.{stamp:014x}.{etag}.{base64.urlsafe_b64encode(raw).decode()}"


def _parse_part_record(name: str) -> tuple[int, int, str, dict[str, str]] | None:
    try:
        number, stamp, etag, encoded = name.split(".", 3)
        checksums = json.loads(base64.urlsafe_b64decode(encoded))
        return int(number), int(stamp, 16), etag, {str(k): str(v) for k, v in checksums.items()}
    except (ValueError, AttributeError):
        return None


def _read_up_to(body: Readable, limit: int) -> bytes:
    """Up to ``limit`` bytes of a body (fewer only at its end)."""
    buf = bytearray()
    while len(buf) < limit:
        chunk = body.read(min(READ_CHUNK, limit - len(buf)))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def _file_size(fh) -> int:
    fh.seek(0, 2)
    return fh.tell()


def _condition_params(condition: WriteCondition | None) -> dict[str, str]:
    params = {}
    if condition is not None:
        if condition.if_none_match:
            params["IfNoneMatch"] = "*"
        if condition.if_match is not None:
            params["IfMatch"] = "*" if condition.if_match == "*" else f'"{condition.if_match}"'
    return params


def _conditional(condition: WriteCondition | None) -> bool:
    return condition is not None and (condition.if_none_match or condition.if_match is not None)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", ""))


def _precondition(exc: ClientError) -> bool:
    return _status(exc) == 412 or _code(exc) == "PreconditionFailed"


def _transient(exc: ClientError) -> bool:
    return _status(exc) >= 500 or _code(exc) in ("SlowDown", "ServiceUnavailable", "InternalError",
                                                   "RequestTimeout", "Throttling")


def _sleep(attempt: int) -> None:
    time.sleep(BACKOFF * (2 ** attempt) * (0.5 + random.random()))


def from_config(config, spool_dir: Path | None = None) -> S3Store:  # config: gateway.config.Config
    """The store a Config describes (``backend = "s3://..."``)."""
    location = parse_location(config.backend)
    return S3Store(location.bucket, location.prefix, config.backend_endpoint, config.backend_region,
                   threads=config.threads, spool_dir=spool_dir,
                   connect_timeout=min(3.0, config.backend_timeout),
                   read_timeout=float(config.backend_timeout))

