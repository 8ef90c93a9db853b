"""The ``memory`` bucket: open-memory documents as JSON objects.

Reads go through :class:`~gateway.memory.bucket.MemoryBucket`, a store view over the current
documents, so the ordinary listing and GET handlers (ranges, conditional reads) serve it and
the ETag is the one the REST API shows. A PUT of ``org/<id>.json``, ``teams/<t>/<id>.json`` or
``agents/<a>/<id>.json`` is read whole (at most 256 KiB) and handed to the same validator and
service as ``PUT /v1/memory/{scope}/{id}``, with its If-Match / If-None-Match. A DELETE
retracts the document (a new version; the history stays). Permissions are memory's:
``memory:GetDocument``, ``PutDocument`` and ``DeleteDocument`` on ``arn:orgmem:memory:::SCOPE/ID``.
"""

from __future__ import annotations

from dataclasses import replace

from ...memory import documents as d
from ...memory.bucket import BUCKET, MemoryBucket, parse_key
from ...memory.documents import DocumentError, Scope
from ...memory.service import Memory
from ..body import int_header, upload_stream
from ..conditions import write_condition
from ..context import S3Context
from ..errors import S3Error
from ..message import Request, Response
from . import listing, objects

ARN = "arn:orgmem:memory:::"


def _service(ctx: S3Context) -> Memory:
    if ctx.memory is None:
        raise S3Error("NotImplemented", "This gateway serves no open memory.", 501)
    return ctx.memory


def _arn(scope: Scope, doc_id: str) -> str:
    return f"{ARN}{scope.arn_part}/{doc_id}"


def _where(req: Request) -> tuple[Scope, str]:
    try:
        return parse_key(req.key)
    except DocumentError as exc:
        raise S3Error("InvalidArgument", str(exc)) from None


def _check(req: Request, action: str, scope: Scope, doc_id: str, what: str) -> None:
    if not req.permits(action, _arn(scope, doc_id)):
        raise S3Error("AccessDenied", f"You may not {what} {scope}/{doc_id} "
                      f"({action} on {_arn(scope, doc_id)}).")


def _view(ctx: S3Context, req: Request, listing: bool = False) -> S3Context:
    """The bucket as the caller sees it: the documents it may read (and, in a listing, list)."""
    memory = _service(ctx)
    actions = ("memory:GetDocument", "memory:ListDocuments") if listing else ("memory:GetDocument",)

    def may_read(scope: Scope, doc_id: str) -> bool:
        return all(req.permits(action, _arn(scope, doc_id), counted=False) for action in actions)

    return replace(ctx, store=MemoryBucket(ctx.store, memory, may_read))


# -- reading ---------------------------------------------------------------------------


def head_bucket(ctx: S3Context, req: Request) -> Response:
    _service(ctx)
    return Response(200, [("x-amz-bucket-region", ctx.region)])


def refuse_bucket_change(ctx: S3Context, req: Request) -> Response:
    raise S3Error("InvalidBucketName", f"The bucket name '{BUCKET}' is reserved for orgmem's memory "
                  "features: it serves the organization's open-memory documents and cannot be created "
                  "or deleted.", BucketName=BUCKET)


def list_v1(ctx: S3Context, req: Request) -> Response:
    return listing.list_objects_v1(_view(ctx, req, listing=True), req)


def list_v2(ctx: S3Context, req: Request) -> Response:
    return listing.list_objects_v2(_view(ctx, req, listing=True), req)


def get_object(ctx: S3Context, req: Request) -> Response:
    _check(req, "memory:GetDocument", *_where(req), "read")
    return objects.get_object(_view(ctx, req), req)


def head_object(ctx: S3Context, req: Request) -> Response:
    _check(req, "memory:GetDocument", *_where(req), "read")
    return objects.head_object(_view(ctx, req), req)


# -- writing ---------------------------------------------------------------------------


def put_object(ctx: S3Context, req: Request) -> Response:
    memory = _service(ctx)
    scope, doc_id = _where(req)
    _check(req, "memory:PutDocument", scope, doc_id, "write")
    declared = int_header(req, "x-amz-decoded-content-length")
    if declared is None:
        declared = int_header(req, "content-length")
    if declared is not None and declared > d.MAX_DOCUMENT:
        raise S3Error("EntityTooLarge", f"A memory document is at most {d.MAX_DOCUMENT} bytes; this one "
                      f"is {declared}. Nothing was stored.")
    condition = write_condition(req.headers, req.writer)
    body, finalize = upload_stream(req)
    data = body.read(d.MAX_DOCUMENT + 1)
    if len(data) > d.MAX_DOCUMENT:
        raise S3Error("EntityTooLarge", f"A memory document is at most {d.MAX_DOCUMENT} bytes. "
                      "Nothing was stored.")
    while body.read(65536):  # to the end: signatures and checksums are verified there
        pass
    finalize()
    try:
        raw = d.parse_json(data)
        old = raw.get("supersedes")
        if isinstance(old, str) and d.ID_RE.match(old):
            _check(req, "memory:PutDocument", scope, old, "supersede")
        stored = memory.put(req.principal.name, scope, doc_id, raw, condition.if_match,
                            condition.if_none_match)
    except DocumentError as exc:
        if exc.status in (400, 413):
            raise S3Error("InvalidArgument" if exc.status == 400 else "EntityTooLarge",
                          f"{str(exc).rstrip('.')}; nothing was stored.", 400) from None
        if exc.names is not None and not req.permits("memory:GetDocument", _arn(*exc.names), counted=False):
            raise DocumentError(exc.hidden, exc.code, exc.status) from None
        raise
    return Response(200, [("etag", f'"{stored.etag}"')] if stored.etag else [])


def delete_object(ctx: S3Context, req: Request) -> Response:
    """Retract (memory:DeleteDocument): documents are never erased; S3's DELETE is idempotent,
    so a missing or already retracted document answers 204 too."""
    memory = _service(ctx)
    scope, doc_id = _where(req)
    _check(req, "memory:DeleteDocument", scope, doc_id, "retract")
    condition = write_condition(req.headers, req.writer)
    try:
        memory.retract(req.principal.name, scope, doc_id, condition.if_match)
    except DocumentError as exc:
        if exc.status not in (404, 409):
            raise
    return Response(204)


def refuse_multipart(ctx: S3Context, req: Request) -> Response:
    raise S3Error("EntityTooLarge", f"A memory document is at most {d.MAX_DOCUMENT} bytes, written with "
                  "one PUT; multipart uploads are not taken here. Nothing was stored.")
