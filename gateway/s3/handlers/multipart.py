"""Multipart uploads: Create, UploadPart, UploadPartCopy, Complete, Abort, ListParts, ListMultipartUploads."""

from __future__ import annotations

import base64
from collections.abc import Sequence

from ...store.base import ObjectMeta, PartInfo
from ..body import LimitedReader, int_header, upload_stream
from ..checksums import ALGORITHMS, VerifyingReader, composite, full_object, header_name
from ..conditions import check_read, write_condition
from ..context import S3Context
from ..errors import S3Error
from ..message import Request, Response
from ..metadata import checksum_headers, meta_from_headers
from ..names import check_key
from ..xml import child_text, children, document, element, iso8601, parse
from .listing import encoder
from .objects import parse_copy_source

MAX_PART_NUMBER = 10_000
MAX_PART_SIZE = 5 * 1024**3


def create_upload(ctx: S3Context, req: Request) -> Response:
    check_key(req.key)
    meta = meta_from_headers(req.headers)
    algorithm = (req.header("x-amz-checksum-algorithm") or "").upper()
    headers = []
    if algorithm:
        if algorithm not in ALGORITHMS:
            raise S3Error("InvalidRequest", f"Checksum algorithm {algorithm} is not supported; use "
                          f"one of {', '.join(ALGORITHMS)}.")
        checksum_type = (req.header("x-amz-checksum-type") or _default_type(algorithm)).upper()
        if checksum_type not in ("COMPOSITE", "FULL_OBJECT"):
            raise S3Error("InvalidRequest", "x-amz-checksum-type must be COMPOSITE or FULL_OBJECT.")
        if checksum_type == "FULL_OBJECT" and algorithm not in FULL_OBJECT_ALGORITHMS:
            raise S3Error("InvalidRequest", f"The FULL_OBJECT checksum type needs a CRC algorithm "
                          f"({', '.join(FULL_OBJECT_ALGORITHMS)}), not {algorithm}.")
        meta.checksums = {algorithm: ""}
        meta.checksum_type = checksum_type
        headers += [("x-amz-checksum-algorithm", algorithm), ("x-amz-checksum-type", checksum_type)]
    upload = ctx.store.create_multipart(req.bucket, req.key, meta)
    return Response(200, [("content-type", "application/xml"), *headers], document(
        "InitiateMultipartUploadResult",
        [element("Bucket", req.bucket), element("Key", req.key), element("UploadId", upload.upload_id)]))


#: CRCs combine across parts without rereading the data, so they can cover the whole object.
FULL_OBJECT_ALGORITHMS = ("CRC32", "CRC32C", "CRC64NVME")


def _default_type(algorithm: str) -> str:
    """AWS's default: CRC64NVME is always FULL_OBJECT, the others COMPOSITE."""
    return "FULL_OBJECT" if algorithm == "CRC64NVME" else "COMPOSITE"


def _part_number(req: Request) -> int:
    try:
        number = int(req.query.get("partNumber", ""))
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_PART_NUMBER:
        raise S3Error("InvalidArgument", "Part number must be an integer between 1 and 10000, inclusive.",
                      ArgumentName="partNumber", ArgumentValue=req.query.get("partNumber", ""))
    return number


def upload_part(ctx: S3Context, req: Request) -> Response:
    number = _part_number(req)
    size = int_header(req, "x-amz-decoded-content-length")
    if size is None:
        size = int_header(req, "content-length")
    if size is not None and size > MAX_PART_SIZE:
        raise S3Error("EntityTooLarge", "A part may be at most 5 GiB.")
    upload = ctx.store.get_upload(req.bucket, req.key, req.query["uploadId"])
    # The upload's declared algorithm is computed even when a client sends no part checksum,
    # so the completed object always gets its composite checksum.
    req.extra_checksums = tuple(upload.meta.checksums)
    body, finalize = upload_stream(req)
    part = ctx.store.upload_part(req.bucket, req.key, req.query["uploadId"], number, body, finalize,
                                 size=size)
    headers = [("etag", f'"{part.etag}"')]
    headers += checksum_headers(part.checksums)
    return Response(200, headers)


def upload_part_copy(ctx: S3Context, req: Request) -> Response:
    number = _part_number(req)
    src_bucket, src_key = parse_copy_source(req.header("x-amz-copy-source", ""))
    upload = ctx.store.get_upload(req.bucket, req.key, req.query["uploadId"])
    reader, size = _open_source_range(ctx, req, src_bucket, src_key)
    # An upload created with a checksum algorithm needs every part's checksum to complete:
    # the copied range gets it here, as S3 computes it for UploadPartCopy.
    verifying = VerifyingReader(reader, content_md5=None, algorithms=tuple(upload.meta.checksums),
                                expected=dict, expected_size=size)
    try:
        part = ctx.store.upload_part(req.bucket, req.key, req.query["uploadId"], number, verifying,
                                     lambda: dict(verifying.checksums), size=size)
    finally:
        reader.close()
    return Response.xml(document("CopyPartResult", [
        element("LastModified", iso8601(part.last_modified)), element("ETag", f'"{part.etag}"'),
        *(element(f"Checksum{a}", v) for a, v in part.checksums.items())]))


def _open_source_range(ctx: S3Context, req: Request, bucket: str, key: str):
    """The requested range of the copy source, opened on the version its conditions and
    range were checked against; a source replaced in between is looked at again."""
    for _ in range(3):
        source = ctx.store.head_object(bucket, key)
        check_read(source, req.headers, prefix="x-amz-copy-source-")
        start, end = _copy_range(req.header("x-amz-copy-source-range"), source.size)
        if end - start > MAX_PART_SIZE:
            raise S3Error("EntityTooLarge", "A part may be at most 5 GiB.")
        reader = ctx.store.open_object(bucket, key, start, end)
        if reader.info.etag == source.etag:
            return reader, end - start
        reader.close()
    raise S3Error("SlowDown", "The copy source is being replaced too often to copy; retry.", 503)


def _copy_range(value: str | None, size: int) -> tuple[int, int]:
    if value is None:
        return 0, size
    spec = value.strip()
    try:
        if not spec.startswith("bytes="):
            raise ValueError
        first, last = spec[6:].split("-", 1)
        start, end = int(first), int(last) + 1
    except ValueError:
        raise S3Error("InvalidArgument", "The x-amz-copy-source-range value must be of the form "
                      "bytes=first-last where first and last are the zero-based offsets of the first "
                      "and last bytes to copy.") from None
    if start < 0 or end <= start or end > size:
        raise S3Error("InvalidRange", f"The x-amz-copy-source-range {spec} is not within the "
                      f"source object's {size} bytes.")
    return start, end


def complete_upload(ctx: S3Context, req: Request) -> Response:
    body, _ = upload_stream(req, header_checksums=False)
    root = parse(LimitedReader(body, 4 * 1024 * 1024).read_all())
    nodes = children(root, "Part")
    if not nodes:
        raise S3Error("MalformedXML", "CompleteMultipartUpload must list at least one Part.")
    parts, claimed = [], {}
    for node in nodes:
        try:
            number = int(child_text(node, "PartNumber") or "")
        except ValueError:
            raise S3Error("MalformedXML", "Every Part needs an integer PartNumber.") from None
        parts.append((number, (child_text(node, "ETag") or "").strip('"')))
        claimed[number] = {a: child_text(node, f"Checksum{a}") for a in ALGORITHMS
                           if child_text(node, f"Checksum{a}")}
    info = ctx.store.complete_multipart(
        req.bucket, req.key, req.query["uploadId"], parts, write_condition(req.headers, req.writer),
        meta_update=lambda meta, chosen: _with_checksum(meta, chosen, claimed, req.headers))
    headers = checksum_headers(info.meta.checksums)
    fields = [element("Location", f"/{req.bucket}/{req.key}"), element("Bucket", req.bucket),
              element("Key", req.key), element("ETag", f'"{info.etag}"')]
    fields += [element(f"Checksum{a}", v) for a, v in info.meta.checksums.items()]
    if info.meta.checksum_type:
        fields.append(element("ChecksumType", info.meta.checksum_type))
    return Response(200, [("content-type", "application/xml"), *headers],
                    document("CompleteMultipartUploadResult", fields))


def _with_checksum(meta: ObjectMeta, chosen: Sequence[PartInfo], claimed: dict,
                   headers: dict[str, str]) -> ObjectMeta:
    """The object's checksum from its chosen parts (COMPOSITE, or FULL_OBJECT for CRCs),
    after checking what the client claimed for each part and, if it sent one, the whole."""
    for part in chosen:
        for algorithm, value in claimed.get(part.part_number, {}).items():
            if part.checksums.get(algorithm) not in (None, value):
                raise S3Error("InvalidPart", f"The {algorithm} checksum of part {part.part_number} "
                              "does not match the part that was uploaded.")
    algorithms = [a for a in meta.checksums]
    meta.checksums = {}
    for algorithm in algorithms:
        digests = [p.checksums.get(algorithm) for p in chosen]
        if all(digests):
            raw = [base64.b64decode(d) for d in digests]
            if meta.checksum_type == "FULL_OBJECT":
                value = full_object(algorithm, [(d, p.size) for d, p in zip(raw, chosen, strict=True)])
                _check_claimed_whole(algorithm, value, headers)
            else:
                value = composite(algorithm, raw)
            meta.checksums[algorithm] = value
        else:
            raise S3Error("InvalidRequest", f"The upload was created with {algorithm} checksums, "
                          "but some parts were uploaded without one.")
    if not meta.checksums:
        meta.checksum_type = None
    return meta


def _check_claimed_whole(algorithm: str, value: str, headers: dict[str, str]) -> None:
    claimed = headers.get(header_name(algorithm))
    if claimed is not None and claimed != value:
        raise S3Error("BadDigest", f"The {algorithm} you specified for the whole object did not "
                      "match the checksum of its parts.")


def abort_upload(ctx: S3Context, req: Request) -> Response:
    ctx.store.abort_multipart(req.bucket, req.key, req.query["uploadId"])
    return Response(204)


def _int_param(req: Request, name: str, default: int, upper: int) -> int:
    try:
        value = int(req.query.get(name, default))
    except ValueError:
        raise S3Error("InvalidArgument", f"{name} must be an integer.") from None
    if value < 0:
        raise S3Error("InvalidArgument", f"{name} must not be negative.")
    return min(value, upper)


def list_parts(ctx: S3Context, req: Request) -> Response:
    upload_id = req.query["uploadId"]
    limit = _int_param(req, "max-parts", 1000, 1000)
    marker = _int_param(req, "part-number-marker", 0, MAX_PART_NUMBER)
    parts = [p for p in ctx.store.list_parts(req.bucket, req.key, upload_id) if p.part_number > marker]
    page, truncated = parts[:limit], len(parts) > limit and limit > 0
    body = [element("Bucket", req.bucket), element("Key", req.key), element("UploadId", upload_id),
            element("PartNumberMarker", marker),
            element("NextPartNumberMarker", page[-1].part_number if page else marker),
            element("MaxParts", limit), element("IsTruncated", str(truncated).lower()),
            "<Initiator>" + element("ID", ctx.owner_id) + element("DisplayName", ctx.owner_name)
            + "</Initiator>", ctx.owner_xml(), "<StorageClass>STANDARD</StorageClass>"]
    for p in page:
        body.append("<Part>" + element("PartNumber", p.part_number)
                    + element("LastModified", iso8601(p.last_modified))
                    + element("ETag", f'"{p.etag}"') + element("Size", p.size)
                    + "".join(element(f"Checksum{a}", v) for a, v in p.checksums.items()) + "</Part>")
    return Response.xml(document("ListPartsResult", body))


def list_uploads(ctx: S3Context, req: Request) -> Response:
    limit = _int_param(req, "max-uploads", 1000, 1000)
    key_marker = req.query.get("key-marker", "")
    id_marker = req.query.get("upload-id-marker", "")
    prefix, delimiter = req.query.get("prefix", ""), req.query.get("delimiter", "")
    enc = encoder(req)
    uploads = [u for u in ctx.store.list_uploads(req.bucket, prefix)
               if (u.key, u.upload_id if id_marker else "") > (key_marker, id_marker) or not key_marker]
    cut = key_marker.find(delimiter, len(prefix)) if delimiter and key_marker.startswith(prefix) else -1
    if cut >= 0:
        # The marker rolls up into a common prefix already returned: skip all of it. (A
        # marker that is the prefix itself, "dir/" under prefix "dir/", is a key: go on after it.)
        rolled = key_marker[:cut + len(delimiter)]
        uploads = [u for u in uploads if not u.key.startswith(rolled)]
    entries = _roll_up(uploads, prefix, delimiter)
    page, truncated = entries[:limit], len(entries) > limit and limit > 0
    last = page[-1] if truncated else None
    next_key = "" if last is None else last if isinstance(last, str) else last.key
    next_id = "" if last is None or isinstance(last, str) else last.upload_id
    body = [element("Bucket", req.bucket), f"<KeyMarker>{enc.key(key_marker)}</KeyMarker>",
            element("UploadIdMarker", id_marker),
            f"<NextKeyMarker>{enc.key(next_key)}</NextKeyMarker>", element("NextUploadIdMarker", next_id),
            f"<Prefix>{enc.key(prefix)}</Prefix>"]
    if delimiter:
        body.append(f"<Delimiter>{enc.key(delimiter)}</Delimiter>")
    if enc.url:
        body.append("<EncodingType>url</EncodingType>")
    body += [element("MaxUploads", limit), element("IsTruncated", str(truncated).lower())]
    for u in page:
        if isinstance(u, str):
            continue
        body.append("<Upload>" + f"<Key>{enc.key(u.key)}</Key>" + element("UploadId", u.upload_id)
                    + "<Initiator>" + element("ID", ctx.owner_id) + element("DisplayName", ctx.owner_name)
                    + "</Initiator>" + ctx.owner_xml() + "<StorageClass>STANDARD</StorageClass>"
                    + element("Initiated", iso8601(u.initiated)) + "</Upload>")
    body += [f"<CommonPrefixes><Prefix>{enc.key(p)}</Prefix></CommonPrefixes>"
             for p in page if isinstance(p, str)]
    return Response.xml(document("ListMultipartUploadsResult", body))


def _roll_up(uploads: list, prefix: str, delimiter: str) -> list:
    """Uploads in key order, with keys that hold the delimiter after the prefix rolled
    up into one common-prefix string each (which counts once toward max-uploads)."""
    if not delimiter:
        return uploads
    entries, seen = [], set()
    for upload in uploads:
        cut = upload.key.find(delimiter, len(prefix))
        if cut < 0:
            entries.append(upload)
            continue
        common = upload.key[:cut + len(delimiter)]
        if common not in seen:
            seen.add(common)
            entries.append(common)
    return entries
