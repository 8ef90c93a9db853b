"""The ``skills`` bucket: every skill's latest version as folders, read-only.

Reads go through :class:`~gateway.memory.skills_view.SkillsBucket`, a store view, so the
ordinary listing and GET handlers (ranges, conditional reads) serve it unchanged and a
sandbox can mount the bucket read-only (s3fs, mountpoint-s3, rclone). Writes are refused:
a skill is published whole, as one version, by ``orgmem skills push`` (the REST API).
Permissions are the skills': ``skills:ListSkills`` to see a skill in a listing,
``skills:GetSkill`` to read its files, on ``arn:orgmem:skills:::SCOPE/NAME``.
"""

from __future__ import annotations

from dataclasses import replace

from ...memory.skills import Skills
from ...memory.skills_view import BUCKET, SkillsBucket, split_key
from ..context import S3Context
from ..errors import S3Error
from ..message import Request, Response
from . import listing, objects

_READ_ONLY = (f"The {BUCKET} bucket is read-only: publish a skill as a new version with "
              "`orgmem skills push DIR [--scope S]` (POST /v1/skills/NAME/versions).")


def _service(ctx: S3Context) -> Skills:
    if ctx.skills is None:
        raise S3Error("NotImplemented", "This gateway serves no skills.", 501)
    return ctx.skills


def _view(ctx: S3Context, req: Request) -> S3Context:
    skills = _service(ctx)
    view = SkillsBucket(
        skills,
        lambda scope, name: req.permits("skills:ListSkills", scope.arn(name), counted=False),
        lambda scope, name: req.permits("skills:GetSkill", scope.arn(name), counted=False))
    return replace(ctx, store=view)


def head_bucket(ctx: S3Context, req: Request) -> Response:
    _service(ctx)
    return Response(200, [("x-amz-bucket-region", ctx.region)])


def refuse_bucket_change(ctx: S3Context, req: Request) -> Response:
    raise S3Error("InvalidBucketName", f"The bucket name '{BUCKET}' is reserved for orgmem's memory "
                  "features: it serves the organization's skills and cannot be created or deleted.",
                  BucketName=BUCKET)


def list_v1(ctx: S3Context, req: Request) -> Response:
    return listing.list_objects_v1(_view(ctx, req), req)


def list_v2(ctx: S3Context, req: Request) -> Response:
    return listing.list_objects_v2(_view(ctx, req), req)


def _check_read(req: Request) -> None:
    found = split_key(req.key or "")
    if found is None:
        return  # answered NoSuchKey by the view
    scope, name, _ = found
    if not req.permits("skills:GetSkill", scope.arn(name)):
        raise S3Error("AccessDenied", f"You may not read skill {name!r} of {scope} "
                      f"(skills:GetSkill on {scope.arn(name)}).")


def get_object(ctx: S3Context, req: Request) -> Response:
    _check_read(req)
    return objects.get_object(_view(ctx, req), req)


def head_object(ctx: S3Context, req: Request) -> Response:
    _check_read(req)
    return objects.head_object(_view(ctx, req), req)


def refuse_write(ctx: S3Context, req: Request) -> Response:
    raise S3Error("MethodNotAllowed", _READ_ONLY, 405)
