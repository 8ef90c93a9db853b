"""Which S3 operation a request names, and the IAM action it needs.

A request names its operation by method, by whether it addresses the
service, a bucket or an object, and by its subresource query parameters.
A subresource we do not implement answers 501 and never falls through to a
plain GET or PUT: a client that sets tags must not overwrite the object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .context import S3Context
from .errors import S3Error, not_implemented
from .handlers import biographies as bio
from .handlers import buckets, listing, multipart, objects
from .handlers import memory_bucket as mem
from .handlers import skills_bucket as skills
from .message import Request, Response

Handler = Callable[[S3Context, Request], Response]


@dataclass(frozen=True)
class Operation:
    name: str  # AWS's operation name, for logs and audit
    action: str  # the IAM action a policy must allow
    handler: Handler
    reads_body: bool = False


#: Query parameters that select an S3 subresource (an operation of its own).
SUBRESOURCES = frozenset({
    "accelerate", "acl", "analytics", "attributes", "cors", "delete", "encryption",
    "intelligent-tiering", "inventory", "legal-hold", "lifecycle", "location", "logging",
    "metadataConfiguration", "metrics", "notification", "object-lock", "ownershipControls",
    "policy", "policyStatus", "publicAccessBlock", "renameObject", "replication", "requestPayment",
    "restore", "retention", "select", "session", "tagging", "torrent", "uploadId", "uploads",
    "versioning", "versions", "website",
})


def _op(name: str, action: str, handler: Handler, reads_body: bool = False) -> Operation:
    return Operation(name, action, handler, reads_body)


LIST_BUCKETS = _op("ListBuckets", "s3:ListAllMyBuckets", buckets.list_buckets)

_BUCKET_OPS = {
    ("PUT", None): _op("CreateBucket", "s3:CreateBucket", buckets.create_bucket, True),
    ("DELETE", None): _op("DeleteBucket", "s3:DeleteBucket", buckets.delete_bucket),
    ("HEAD", None): _op("HeadBucket", "s3:ListBucket", buckets.head_bucket),
    ("GET", None): _op("ListObjects", "s3:ListBucket", listing.list_objects_v1),
    ("GET", "list-type"): _op("ListObjectsV2", "s3:ListBucket", listing.list_objects_v2),
    ("GET", "location"): _op("GetBucketLocation", "s3:GetBucketLocation", buckets.get_location),
    ("GET", "versioning"): _op("GetBucketVersioning", "s3:GetBucketVersioning", buckets.get_versioning),
    ("GET", "acl"): _op("GetBucketAcl", "s3:GetBucketAcl", buckets.get_bucket_acl),
    ("GET", "uploads"): _op("ListMultipartUploads", "s3:ListBucketMultipartUploads", multipart.list_uploads),
    ("POST", "delete"): _op("DeleteObjects", "s3:DeleteObject", objects.delete_objects, True),
}

_OBJECT_OPS = {
    ("PUT", None): _op("PutObject", "s3:PutObject", objects.put_object, True),
    ("PUT", "copy"): _op("CopyObject", "s3:PutObject", objects.copy_object),
    ("PUT", "uploadId"): _op("UploadPart", "s3:PutObject", multipart.upload_part, True),
    ("PUT", "uploadId+copy"): _op("UploadPartCopy", "s3:PutObject", multipart.upload_part_copy),
    ("GET", None): _op("GetObject", "s3:GetObject", objects.get_object),
    ("HEAD", None): _op("HeadObject", "s3:GetObject", objects.head_object),
    ("GET", "acl"): _op("GetObjectAcl", "s3:GetObjectAcl", buckets.get_bucket_acl),
    ("GET", "uploadId"): _op("ListParts", "s3:ListMultipartUploadParts", multipart.list_parts),
    ("DELETE", None): _op("DeleteObject", "s3:DeleteObject", objects.delete_object),
    ("DELETE", "uploadId"): _op("AbortMultipartUpload", "s3:AbortMultipartUpload", multipart.abort_upload),
    ("POST", "uploads"): _op("CreateMultipartUpload", "s3:PutObject", multipart.create_upload),
    ("POST", "uploadId"): _op("CompleteMultipartUpload", "s3:PutObject", multipart.complete_upload, True),
}

#: The biographies bucket: Parquet segments to read, NDJSON events to write. Its
#: permissions are the biography's (decided per agent inside the handlers).
_BIO_BUCKET_OPS = {
    ("HEAD", None): _op("HeadBucket", "bio:GetEvents", bio.head_bucket),
    ("PUT", None): _op("CreateBucket", "bio:PutEvents", bio.refuse_bucket_change, True),
    ("DELETE", None): _op("DeleteBucket", "bio:PutEvents", bio.refuse_bucket_change),
    ("GET", None): _op("ListObjects", "bio:GetEvents", bio.list_v1),
    ("GET", "list-type"): _op("ListObjectsV2", "bio:GetEvents", bio.list_v2),
    ("GET", "location"): _op("GetBucketLocation", "bio:GetEvents", buckets.get_location),
}
_BIO_OBJECT_OPS = {
    ("PUT", None): _op("PutObject", "bio:PutEvents", bio.put_object, True),
    ("GET", None): _op("GetObject", "bio:GetEvents", bio.get_object),
    ("HEAD", None): _op("HeadObject", "bio:GetEvents", bio.head_object),
    ("POST", "uploads"): _op("CreateMultipartUpload", "bio:PutEvents", bio.create_upload),
    ("PUT", "uploadId"): _op("UploadPart", "bio:PutEvents", bio.upload_part, True),
    ("POST", "uploadId"): _op("CompleteMultipartUpload", "bio:PutEvents", bio.complete_upload, True),
    ("DELETE", "uploadId"): _op("AbortMultipartUpload", "bio:PutEvents", bio.abort_upload),
    ("GET", "uploadId"): _op("ListParts", "bio:PutEvents", bio.list_parts),
    ("DELETE", None): _op("DeleteObject", "bio:PutEvents", bio.refuse_delete),
}

#: The skills bucket: every skill's latest version, read-only (published by the REST API).
_SKILLS_BUCKET_OPS = {
    ("HEAD", None): _op("HeadBucket", "skills:ListSkills", skills.head_bucket),
    ("PUT", None): _op("CreateBucket", "skills:PutSkill", skills.refuse_bucket_change, True),
    ("DELETE", None): _op("DeleteBucket", "skills:DeleteSkill", skills.refuse_bucket_change),
    ("GET", None): _op("ListObjects", "skills:ListSkills", skills.list_v1),
    ("GET", "list-type"): _op("ListObjectsV2", "skills:ListSkills", skills.list_v2),
    ("GET", "location"): _op("GetBucketLocation", "skills:ListSkills", buckets.get_location),
}
_SKILLS_OBJECT_OPS = {
    ("GET", None): _op("GetObject", "skills:GetSkill", skills.get_object),
    ("HEAD", None): _op("HeadObject", "skills:GetSkill", skills.head_object),
    ("PUT", None): _op("PutObject", "skills:PutSkill", skills.refuse_write),
    ("PUT", "copy"): _op("CopyObject", "skills:PutSkill", skills.refuse_write),
    ("POST", "uploads"): _op("CreateMultipartUpload", "skills:PutSkill", skills.refuse_write),
    ("DELETE", None): _op("DeleteObject", "skills:DeleteSkill", skills.refuse_write),
}

#: The memory bucket: open-memory documents as JSON, written through the memory service.
_MEMORY_BUCKET_OPS = {
    ("HEAD", None): _op("HeadBucket", "memory:ListDocuments", mem.head_bucket),
    ("PUT", None): _op("CreateBucket", "memory:PutDocument", mem.refuse_bucket_change, True),
    ("DELETE", None): _op("DeleteBucket", "memory:DeleteDocument", mem.refuse_bucket_change),
    ("GET", None): _op("ListObjects", "memory:ListDocuments", mem.list_v1),
    ("GET", "list-type"): _op("ListObjectsV2", "memory:ListDocuments", mem.list_v2),
    ("GET", "location"): _op("GetBucketLocation", "memory:ListDocuments", buckets.get_location),
}
_MEMORY_OBJECT_OPS = {
    ("PUT", None): _op("PutObject", "memory:PutDocument", mem.put_object, True),
    ("GET", None): _op("GetObject", "memory:GetDocument", mem.get_object),
    ("HEAD", None): _op("HeadObject", "memory:GetDocument", mem.head_object),
    ("DELETE", None): _op("DeleteObject", "memory:DeleteDocument", mem.delete_object),
    ("POST", "uploads"): _op("CreateMultipartUpload", "memory:PutDocument", mem.refuse_multipart),
}

#: Buckets that are views of a memory service, with their own operation tables.
SERVICE_BUCKETS: dict[str, tuple[dict, dict]] = {
    bio.BUCKET: (_BIO_BUCKET_OPS, _BIO_OBJECT_OPS),
    mem.BUCKET: (_MEMORY_BUCKET_OPS, _MEMORY_OBJECT_OPS),
    skills.BUCKET: (_SKILLS_BUCKET_OPS, _SKILLS_OBJECT_OPS),
}


#: Request headers asking for features the gateway does not have. Ignoring them would
#: let a client believe its object is tagged, locked or encrypted under its own key.
UNSUPPORTED_HEADERS = {
    "x-amz-tagging": "Object tagging",
    "x-amz-object-lock-mode": "Object Lock",
    "x-amz-object-lock-retain-until-date": "Object Lock",
    "x-amz-object-lock-legal-hold": "Object Lock",
    "x-amz-server-side-encryption-aws-kms-key-id": "Choosing a KMS key per request (the gateway seals "
                                                   "everything under the organization's KEK)",
    "x-amz-server-side-encryption-customer-algorithm": "SSE-C (customer-provided keys)",
    "x-amz-copy-source-server-side-encryption-customer-algorithm": "SSE-C (customer-provided keys)",
    "x-amz-website-redirect-location": "Website redirects",
}


#: Server-side encryption a client may ask for: everything is sealed anyway, so both succeed.
SSE_VALUES = ("AES256", "aws:kms")
#: Responses that describe a stored object carry x-amz-server-side-encryption, as AWS's do.
SEALED_OPERATIONS = frozenset({"PutObject", "CopyObject", "GetObject", "HeadObject", "UploadPart",
                               "UploadPartCopy", "CreateMultipartUpload", "CompleteMultipartUpload"})


def route(req: Request) -> Operation:
    """The operation a request names, or an S3Error saying why there is none."""
    for header, feature in UNSUPPORTED_HEADERS.items():
        if header in req.headers:
            raise not_implemented(f"{feature} ({header})")
    sse = req.headers.get("x-amz-server-side-encryption")
    if sse is not None and sse not in SSE_VALUES:
        raise S3Error("InvalidArgument", f"x-amz-server-side-encryption must be AES256 or aws:kms, "
                      f"not {sse!r}; every object is sealed at rest either way.")
    if req.bucket is None:
        if req.method == "GET":
            return LIST_BUCKETS
        raise S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.")
    present = [name for name in req.query if name in SUBRESOURCES]
    bucket_ops, object_ops = SERVICE_BUCKETS.get(req.bucket, (_BUCKET_OPS, _OBJECT_OPS))
    if req.key is None:
        table, selector = bucket_ops, _bucket_selector(req, present)
    else:
        table, selector = object_ops, _object_selector(req, present)
    op = table.get((req.method, selector))
    if op is not None:
        return op
    if selector is None and req.method not in ("GET", "HEAD", "PUT", "POST", "DELETE"):
        raise S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.")
    what = f"{req.method} ?{selector}" if selector else f"{req.method} on this resource"
    raise not_implemented(what)


def _bucket_selector(req: Request, present: list[str]) -> str | None:
    if len(present) > 1:
        return "+".join(sorted(present))
    if present:
        return present[0]
    if req.method == "GET" and req.query.get("list-type") == "2":
        return "list-type"
    return None


def _object_selector(req: Request, present: list[str]) -> str | None:
    copy = req.method == "PUT" and "x-amz-copy-source" in req.headers
    if present == ["uploadId"]:
        return "uploadId+copy" if copy else "uploadId"
    if len(present) > 1:
        return "+".join(sorted(present))
    if present:
        return present[0]
    return "copy" if copy else None
