"""The ``biographies`` bucket: read the Parquet segments, write events as NDJSON objects.

Reads go through :class:`BiographyBucket`, a store view over the current manifest, so the
ordinary listing and GET handlers (ranges, conditional reads) serve it unchanged. A PUT
of an ``.ndjson``/``.jsonl`` object, single or multipart (the aws cli switches to
multipart above 8 MB), is staged in the internal bucket, validated whole, ingested as
the caller, and removed: the bucket stores no NDJSON, only the events it carried.
Permissions are the biography's: ``bio:GetEvents`` on ``AGENT/*`` (and no Deny on any of its
sessions) to read an agent's segments, ``bio:PutEvents`` on ``AGENT/SESSION`` for every event
written.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import replace

from ...biography import events as ev
from ...biography.bucket import BUCKET, BiographyBucket
from ...biography.service import Biographies
from ...store.base import INTERNAL_BUCKET
from ...store.objects import read_object
from ..context import S3Context
from ..errors import S3Error
from ..message import Request, Response
from . import listing, multipart, objects

ARN = "arn:orgmem:bio:::"
#: An NDJSON object ingested through S3 is at most this large (about 250k typical events).
MAX_OBJECT = 256 * 1024 * 1024
MAX_OBJECT_EVENTS = 1_000_000
STAGING = "ingest/"
#: the staging token a multipart upload id starts with (``TOKEN.ID``)
_TOKEN = re.compile(r"[0-9a-f]{16}")
SUFFIXES = (".ndjson", ".jsonl")


def _service(ctx: S3Context) -> Biographies:
    if ctx.biographies is None:
        raise S3Error("NotImplemented", "This gateway serves no biographies.", 501)
    return ctx.biographies


def _may_read(req: Request, agent: str) -> bool:
    """A segment holds every session of its agent and day, so reading it needs every
    session: ``bio:GetEvents`` on ``AGENT/*``, and no Deny on any session within."""
    return (req.permits("bio:GetEvents", f"{ARN}{agent}/*", counted=False)
            and not req.denies_under("bio:GetEvents", f"{ARN}{agent}/"))


def _view(ctx: S3Context, req: Request) -> S3Context:
    bios = _service(ctx)
    return replace(ctx, store=BiographyBucket(ctx.store, bios.snapshot(), lambda a: _may_read(req, a)))


# -- reading ---------------------------------------------------------------------------


def head_bucket(ctx: S3Context, req: Request) -> Response:
    _service(ctx)
    return Response(200, [("x-amz-bucket-region", ctx.region)])


def refuse_bucket_change(ctx: S3Context, req: Request) -> Response:
    raise S3Error("InvalidBucketName", f"The bucket name '{BUCKET}' is reserved for orgmem's memory "
                  "features: it serves every agent's biography and cannot be created or deleted.",
                  BucketName=BUCKET)


def list_v1(ctx: S3Context, req: Request) -> Response:
    return listing.list_objects_v1(_view(ctx, req), req)


def list_v2(ctx: S3Context, req: Request) -> Response:
    return listing.list_objects_v2(_view(ctx, req), req)


def get_object(ctx: S3Context, req: Request) -> Response:
    _check_read(req)
    return objects.get_object(_view(ctx, req), req)


def head_object(ctx: S3Context, req: Request) -> Response:
    _check_read(req)
    return objects.head_object(_view(ctx, req), req)


def _check_read(req: Request) -> None:
    agent = req.key.split("/", 1)[0].removeprefix("agent=") if req.key.startswith("agent=") else None
    if agent is None:
        return
    if not req.permits("bio:GetEvents", f"{ARN}{agent}/*"):
        raise S3Error("AccessDenied", f"You may not read the biography of {agent!r} "
                      f"(bio:GetEvents on {ARN}{agent}/*).")
    if req.denies_under("bio:GetEvents", f"{ARN}{agent}/"):
        raise S3Error("AccessDenied", f"A policy denies you some sessions of {agent!r}, and a segment "
                      "holds all of them: read the others through GET /v1/events.")


# -- writing ---------------------------------------------------------------------------


def _staged(req: Request, token: str | None = None) -> Request:
    """The request aimed at the staging area, in the internal bucket: one object per
    request (a PUT), or per multipart upload, whose id the client gets as ``TOKEN.ID``. Two
    uploads of one key at once (sandboxes sharing an identity and a file name) each ingest
    their own bytes; the key alone still names the events' derived ids."""
    _check_ingest_key(req.key)
    query = req.query
    if token is None and "uploadId" in query:
        token, upload_id = _split_upload_id(query["uploadId"])
        query = {**query, "uploadId": upload_id}
    folder = f"{token}/" if token else ""  # none: an upload begun before uploads had tokens
    return replace(req, bucket=INTERNAL_BUCKET, query=query,
                   key=f"{STAGING}{req.principal.name}/{folder}{req.key}")


def _split_upload_id(value: str) -> tuple[str | None, str]:
    token, dot, upload_id = value.partition(".")
    if dot and _TOKEN.fullmatch(token):
        return token, upload_id
    return None, value


def _check_ingest_key(key: str) -> None:
    if not key.endswith(SUFFIXES):
        raise S3Error("InvalidArgument", f"Objects written to the {BUCKET} bucket are events as NDJSON: "
                      f"the key must end in .ndjson or .jsonl, not {key!r}.")


def _check_write(req: Request, size: int | None = None) -> None:
    """Before anything is staged: the caller may write some events (each event's grant is
    checked at ingest), and the object is not already too large by its declared size."""
    if not req.allows_under("bio:PutEvents", ARN):
        raise S3Error("AccessDenied", "You may not write events (bio:PutEvents), so nothing is "
                      f"written to the {BUCKET} bucket.")
    if size is not None and size > MAX_OBJECT:
        raise S3Error("EntityTooLarge", f"An events object is at most {MAX_OBJECT} bytes; split it "
                      "into several objects.")


def _declared_size(req: Request) -> int | None:
    value = req.header("x-amz-decoded-content-length") or req.header("content-length")
    return int(value) if value is not None and value.isascii() and value.isdigit() else None


def put_object(ctx: S3Context, req: Request) -> Response:
    _check_write(req, _declared_size(req))
    staged = _staged(req, secrets.token_hex(8))
    response = objects.put_object(ctx, staged)
    _ingest(ctx, req, staged)
    return response


def create_upload(ctx: S3Context, req: Request) -> Response:
    _check_write(req)
    token = secrets.token_hex(8)
    staged = _staged(req, token)
    response = multipart.create_upload(ctx, staged)
    response.body = re.sub(rb"<UploadId>([^<]*)</UploadId>",
                           lambda m: b"<UploadId>" + token.encode() + b"." + m.group(1) + b"</UploadId>",
                           response.body)
    return _renamed(response, req, staged)


def upload_part(ctx: S3Context, req: Request) -> Response:
    staged = _staged(req)
    _check_write(req, _parts_size(ctx, staged, besides=req.query.get("partNumber"))
                 + (_declared_size(req) or 0))
    response = multipart.upload_part(ctx, staged)
    if _parts_size(ctx, staged) > MAX_OBJECT:
        # parts sent at once each passed the check alone: the upload can never complete,
        # so it goes now rather than holding the disk until it expires
        multipart.abort_upload(ctx, staged)
        raise S3Error("EntityTooLarge", f"An events object is at most {MAX_OBJECT} bytes; this "
                      "upload's parts came to more, and it was aborted.")
    return response


def _parts_size(ctx: S3Context, staged: Request, besides: str | None = None) -> int:
    """The bytes of the staged upload's parts (``besides`` one part number, being replaced)."""
    return sum(p.size for p in ctx.store.list_parts(INTERNAL_BUCKET, staged.key, staged.query["uploadId"])
               if str(p.part_number) != besides)


def complete_upload(ctx: S3Context, req: Request) -> Response:
    staged = _staged(req)
    response = multipart.complete_upload(ctx, staged)
    _ingest(ctx, req, staged)
    return _renamed(response, req, staged)


def abort_upload(ctx: S3Context, req: Request) -> Response:
    return multipart.abort_upload(ctx, _staged(req))


def list_parts(ctx: S3Context, req: Request) -> Response:
    staged = _staged(req)
    response = _renamed(multipart.list_parts(ctx, staged), req, staged)
    response.body = response.body.replace(f"<UploadId>{staged.query['uploadId']}</UploadId>".encode(),
                                          f"<UploadId>{req.query['uploadId']}</UploadId>".encode())
    return response


def refuse_delete(ctx: S3Context, req: Request) -> Response:
    raise S3Error("MethodNotAllowed", f"The {BUCKET} bucket is append-only: segments are replaced by "
                  "compaction and removed by retention (orgmem bio retain).", 405)


def _renamed(response: Response, req: Request, staged: Request) -> Response:
    """Answer with the names the client used, not the staging area's."""
    response.body = (response.body.replace(f"<Bucket>{INTERNAL_BUCKET}</Bucket>".encode(),
                                           f"<Bucket>{BUCKET}</Bucket>".encode())
                     .replace(f"<Key>{staged.key}</Key>".encode(), f"<Key>{req.key}</Key>".encode())
                     .replace(f"/{INTERNAL_BUCKET}/{staged.key}".encode(), f"/{BUCKET}/{req.key}".encode()))
    return response


def _ingest(ctx: S3Context, req: Request, staged: Request) -> None:
    """Validate the staged object whole, check every event's grant, append, remove the object."""
    try:
        found = read_object(ctx.store, INTERNAL_BUCKET, staged.key)
        if found is None:
            raise S3Error("InternalError", "The uploaded object vanished before it was ingested.", 500)
        body, info = found
        if info.size > MAX_OBJECT:
            raise S3Error("EntityTooLarge", f"An events object is at most {MAX_OBJECT} bytes; "
                          "split it into several objects.")
        namespace = f"s3:{BUCKET}/{req.key}"
        try:
            batch = _service(ctx).prepare(body, req.principal.name, int(time.time() * 1_000_000),
                                          id_namespace=namespace, max_body=MAX_OBJECT,
                                          max_events=MAX_OBJECT_EVENTS)
        except ev.EventError as exc:
            raise S3Error("InvalidArgument", f"{exc}; no event of this object was stored.") from None
        for agent, session in sorted({batch.first, *batch.others}):
            if not req.permits("bio:PutEvents", f"{ARN}{agent}/{session}"):
                raise S3Error("AccessDenied", f"You may not write events for {agent}/{session} "
                              f"(bio:PutEvents on {ARN}{agent}/{session}); no event was stored.")
        _service(ctx).append(batch)
    finally:
        try:
            ctx.store.delete_object(INTERNAL_BUCKET, staged.key)
        except Exception:  # noqa: BLE001 - staging leftovers are harmless and overwritten
            pass
