"""ListBuckets, CreateBucket, DeleteBucket, HeadBucket, GetBucketLocation, GetBucketVersioning."""

from __future__ import annotations

from ...store.base import INTERNAL_PREFIX
from ..access import arn
from ..body import LimitedReader, upload_stream
from ..context import S3Context
from ..message import Request, Response
from ..names import check_new_bucket_name
from ..xml import child_text, document, element, iso8601, parse


def list_buckets(ctx: S3Context, req: Request) -> Response:
    """All buckets for a caller allowed s3:ListAllMyBuckets; otherwise those it may list."""
    everything = req.permits("s3:ListAllMyBuckets", arn(None), counted=False)
    buckets = "".join(
        "<Bucket>" + element("Name", b.name) + element("CreationDate", iso8601(b.created)) + "</Bucket>"
        for b in ctx.store.list_buckets() if not b.name.startswith(INTERNAL_PREFIX)
        and (everything or req.permits("s3:ListBucket", arn(b.name)))
    )
    return Response.xml(document("ListAllMyBucketsResult", [
        ctx.owner_xml(), "<Buckets>", buckets, "</Buckets>"]))


def create_bucket(ctx: S3Context, req: Request) -> Response:
    check_new_bucket_name(req.bucket)
    stream, _ = upload_stream(req)  # verifies a signed x-amz-content-sha256 too
    body = LimitedReader(stream, 64 * 1024).read_all()
    if body.strip():
        location = child_text(parse(body), "LocationConstraint")
        ctx.check_region(location)
    ctx.store.create_bucket(req.bucket)
    return Response(200, [("location", f"/{req.bucket}")])


def delete_bucket(ctx: S3Context, req: Request) -> Response:
    ctx.store.delete_bucket(req.bucket)
    return Response(204)


def head_bucket(ctx: S3Context, req: Request) -> Response:
    ctx.store.head_bucket(req.bucket)
    return Response(200, [("x-amz-bucket-region", ctx.region)])


def get_location(ctx: S3Context, req: Request) -> Response:
    ctx.store.head_bucket(req.bucket)
    # AWS answers an empty constraint for us-east-1.
    region = "" if ctx.region == "us-east-1" else ctx.region
    return Response.xml(document("LocationConstraint", [region]))


def get_versioning(ctx: S3Context, req: Request) -> Response:
    """Versioning is not enabled, and cannot be: an empty configuration says so."""
    ctx.store.head_bucket(req.bucket)
    return Response.xml(document("VersioningConfiguration", []))


def get_bucket_acl(ctx: S3Context, req: Request) -> Response:
    """The owner has full control; access is decided by orgmem's policies, not ACLs."""
    if req.key is None:
        ctx.store.head_bucket(req.bucket)
    else:
        ctx.store.head_object(req.bucket, req.key)
    grant = ('<Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
             'xsi:type="CanonicalUser">' + element("ID", ctx.owner_id) +
             element("DisplayName", ctx.owner_name) + "</Grantee>"
             "<Permission>FULL_CONTROL</Permission></Grant>")
    return Response.xml(document("AccessControlPolicy", [
        ctx.owner_xml(), "<AccessControlList>", grant, "</AccessControlList>"]))
