"""PutObject, GetObject, HeadObject, DeleteObject, DeleteObjects, CopyObject."""

from __future__ import annotations

from urllib.parse import unquote

from ...store.base import ObjectInfo, SourceChanged
from ..access import arn
from ..body import LimitedReader, int_header, upload_stream
from ..conditions import check_read, parse_range, write_condition
from ..context import S3Context
from ..errors import S3Error, from_exception
from ..message import Request, Response
from ..metadata import apply_overrides, checksum_headers, meta_from_headers, object_headers
from ..names import check_bucket_name, check_key
from ..xml import child_text, children, document, element, iso8601, parse

MAX_DELETE_KEYS = 1000


def put_object(ctx: S3Context, req: Request) -> Response:
    check_key(req.key)
    _check_size(ctx, req)
    meta = meta_from_headers(req.headers)
    condition = write_condition(req.headers, req.writer)
    body, finalize = upload_stream(req)
    info = ctx.store.put_object(req.bucket, req.key, body, meta, condition, finalize)
    return Response(200, [("etag", f'"{info.etag}"'), *checksum_headers(info.meta.checksums)])


def _check_size(ctx: S3Context, req: Request) -> None:
    size = int_header(req, "x-amz-decoded-content-length")
    if size is None:
        size = int_header(req, "content-length")
    if size is None and "chunked" not in (req.header("transfer-encoding") or ""):
        raise S3Error("MissingContentLength", "You must provide the Content-Length HTTP header.")
    if size is not None and size > ctx.max_object_size:
        raise S3Error("EntityTooLarge", "Your proposed upload exceeds the maximum allowed object "
                      "size of 5 GiB; use a multipart upload.")


def get_object(ctx: S3Context, req: Request) -> Response:
    return _read_object(ctx, req, with_body=True)


def head_object(ctx: S3Context, req: Request) -> Response:
    return _read_object(ctx, req, with_body=False)


#: Attempts at a ranged read while the object keeps being replaced under it.
RANGE_ATTEMPTS = 3


def _read_object(ctx: S3Context, req: Request, with_body: bool) -> Response:
    _check_version(req)
    check_key(req.key)
    for _ in range(RANGE_ATTEMPTS):
        try:
            return _read_object_once(ctx, req, with_body)
        except _Replaced:
            continue  # the range is worked out again against the new version
    raise S3Error("SlowDown", "The object is being replaced too often to read; retry.", 503)


class _Replaced(Exception):
    """The object changed between reading its size and opening the requested range."""


def _read_object_once(ctx: S3Context, req: Request, with_body: bool) -> Response:
    wants_range = "range" in req.headers or "partNumber" in req.query
    reader = None
    if with_body and not wants_range:
        reader = ctx.store.open_object(req.bucket, req.key)
        info = reader.info
    else:
        info = ctx.store.head_object(req.bucket, req.key)
    try:
        try:
            check_read(info, req.headers)
        except S3Error as err:
            if err.status != 304:
                raise
            if reader is not None:
                reader.close()
            # AWS repeats the validators on 304 so caches can refresh them.
            return Response(304, [(k, v) for k, v in object_headers(info, False)
                                  if k in ("etag", "last-modified")])
        if "partNumber" in req.query and "range" in req.headers:
            raise S3Error("InvalidRequest", "Cannot specify both Range header and partNumber "
                          "query parameter.")
        span = _requested_span(info, req)
        headers = object_headers(info, with_checksums=span is None and _checksum_mode(req))
        status, length = 200, info.size
        if span is not None:
            start, end = span
            status, length = 206, end - start
            headers.append(("content-range", f"bytes {start}-{end - 1}/{info.size}"))
            if with_body:
                reader = ctx.store.open_object(req.bucket, req.key, start, end)
                if reader.info.etag != info.etag:
                    reader.close()
                    raise _Replaced()
        elif with_body and reader is None:
            reader = ctx.store.open_object(req.bucket, req.key)
        parts = _parts_count(info)
        if "partNumber" in req.query and parts:
            headers.append(("x-amz-mp-parts-count", str(parts)))
        headers = apply_overrides(headers, req.query)
        headers.append(("content-length", str(length)))
    except BaseException:
        if reader is not None:
            reader.close()
        raise
    return Response(status, headers, stream=reader if with_body else None, length=length)


def _parts_count(info: ObjectInfo) -> int | None:
    """How many parts a multipart object has (its ETag ends in -N); None otherwise."""
    if info.part_sizes:
        return len(info.part_sizes)
    count = info.etag.rpartition("-")[2]
    return int(count) if "-" in info.etag and count.isascii() and count.isdigit() else None


def _checksum_mode(req: Request) -> bool:
    return (req.header("x-amz-checksum-mode") or "").upper() == "ENABLED"


def _requested_span(info: ObjectInfo, req: Request) -> tuple[int, int] | None:
    part = req.query.get("partNumber")
    if part is None:
        return parse_range(req.header("range"), info.size)
    try:
        number = int(part)
    except ValueError:
        raise S3Error("InvalidArgument", "Part number must be an integer between 1 and 10000.") from None
    sizes = list(info.part_sizes) or [info.size]
    if not 1 <= number <= len(sizes):
        raise S3Error("InvalidPartNumber" if number > 0 else "InvalidArgument",
                      "The requested partnumber is not satisfiable", 416)
    start = sum(sizes[:number - 1])
    if info.size == 0:
        return None
    # Even part 1 of a single-part object is a ranged read (206), as on AWS.
    return start, start + sizes[number - 1]


def _check_version(req: Request) -> None:
    version = req.query.get("versionId")
    if version not in (None, "null"):
        raise S3Error("InvalidArgument", "Invalid version id specified: versioning is not enabled "
                      "on this gateway.")


def delete_object(ctx: S3Context, req: Request) -> Response:
    _check_version(req)
    check_key(req.key)
    ctx.store.delete_object(req.bucket, req.key)
    return Response(204)


def delete_objects(ctx: S3Context, req: Request) -> Response:
    """Deletes up to 1000 keys; per-key failures are reported, not raised."""
    body, _ = upload_stream(req)
    root = parse(LimitedReader(body, 2 * 1024 * 1024).read_all())
    quiet = (child_text(root, "Quiet") or "").lower() == "true"
    objects = children(root, "Object")
    if not objects or len(objects) > MAX_DELETE_KEYS:
        raise S3Error("MalformedXML", "A Delete request names between 1 and 1000 objects.")
    ctx.store.head_bucket(req.bucket)
    keys = []
    for node in objects:
        key = child_text(node, "Key", strip=False)
        if not key:
            raise S3Error("MalformedXML", "Every Object in a Delete request needs a Key.")
        keys.append((key, child_text(node, "VersionId")))
    results, deleted = [], []
    for key, version in keys:
        result, ok = _delete_one(ctx, req, key, version, quiet)
        results.append(result)
        if ok:
            deleted.append(key)
    response = Response.xml(document("DeleteResult", results))
    response.changed_keys = deleted
    return response


def _delete_one(ctx: S3Context, req: Request, key: str, version: str | None,
                quiet: bool) -> tuple[str, bool]:
    """Each key needs s3:DeleteObject on itself; a refusal is reported for that key only.
    The key's XML result, and whether it was deleted. A version other than ``null`` names
    one this gateway never has (versioning is never enabled): that key is refused, and the
    current object is never deleted in its place."""
    try:
        check_key(key)
        if version not in (None, "null"):
            raise S3Error("NoSuchVersion", "The specified version does not exist: versioning is "
                          "not enabled on this gateway.")
        if not req.permits("s3:DeleteObject", arn(req.bucket, key)):
            raise S3Error("AccessDenied", f"User: {req.writer} is not authorized to perform: "
                          f"s3:DeleteObject on resource: {arn(req.bucket, key)}")
        ctx.store.delete_object(req.bucket, key)
    except Exception as exc:  # noqa: BLE001 - reported per key, as AWS does
        err = from_exception(exc)
        if err is None:
            raise
        return "<Error>" + element("Key", key) + element("Code", err.code) + \
            element("Message", err.message) + "</Error>", False
    return "" if quiet else "<Deleted>" + element("Key", key) + "</Deleted>", True


#: Headers that make a copy onto itself a change, as on AWS (`aws s3 cp --sse`, `rclone
#: settier`): everything is sealed anyway, so such a copy rewraps the object's data key.
_CHANGES_IN_PLACE = ("x-amz-server-side-encryption", "x-amz-storage-class")


def _has_source_conditions(req: Request) -> bool:
    return any(name.startswith("x-amz-copy-source-if-") for name in req.headers)


def parse_copy_source(value: str) -> tuple[str, str]:
    """``/bucket/key`` or ``bucket/key``, URL-encoded, optionally with ``?versionId=``."""
    path, _, query = value.partition("?")
    if query and query not in ("versionId=null",):
        raise S3Error("InvalidArgument", "Copying a specific version is not supported: versioning "
                      "is not enabled.")
    path = unquote(path).lstrip("/")
    bucket, _, key = path.partition("/")
    if not bucket or not key:
        raise S3Error("InvalidArgument", "Copy Source must mention the source bucket and key: "
                      "sourcebucket/sourcekey.")
    check_bucket_name(bucket)
    check_key(key)
    return bucket, key


def copy_object(ctx: S3Context, req: Request) -> Response:
    check_key(req.key)
    src_bucket, src_key = parse_copy_source(req.header("x-amz-copy-source", ""))
    directive = (req.header("x-amz-metadata-directive") or "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise S3Error("InvalidArgument", "Unknown metadata directive: use COPY or REPLACE.")
    for _ in range(3):
        try:
            return _copy_once(ctx, req, src_bucket, src_key, directive)
        except SourceChanged:
            if _has_source_conditions(req):
                raise
            # Replaced between HEAD and copy: look at the new version.
    raise S3Error("SlowDown", "The copy source is being replaced too often to copy; retry.", 503)


def _copy_once(ctx: S3Context, req: Request, src_bucket: str, src_key: str,
               directive: str) -> Response:
    """One attempt, pinned to the source version its conditions and checksums came from."""
    source = ctx.store.head_object(src_bucket, src_key)
    check_read(source, req.headers, prefix="x-amz-copy-source-")
    if (src_bucket, src_key) == (req.bucket, req.key) and directive == "COPY" \
            and not any(name in req.headers for name in _CHANGES_IN_PLACE):
        raise S3Error("InvalidRequest", "This copy request is illegal because it is trying to copy "
                      "an object to itself without changing the object's metadata, storage class, "
                      "website redirect location or encryption attributes.")
    meta = None
    if directive == "REPLACE":
        meta = meta_from_headers(req.headers)
        meta.checksums = dict(source.meta.checksums)
        meta.checksum_type = source.meta.checksum_type
    # No writer: a copy keeps the source's sealed bytes, so its ETag is the source's, and a
    # second copy by the same caller would pass for a retry of the first. Of concurrent
    # conditional copies exactly one wins; a retried one gets 412, as on AWS.
    info = ctx.store.copy_object(src_bucket, src_key, req.bucket, req.key, meta,
                                 write_condition(req.headers, None), source_etag=source.etag)
    return Response.xml(document("CopyObjectResult", [
        element("LastModified", iso8601(info.last_modified)), element("ETag", f'"{info.etag}"')]))
