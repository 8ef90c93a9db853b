"""What an S3 request asks permission for: IAM actions, S3 ARNs and condition keys.

The router names each operation's action; this module adds the resource ARN
and the request context a policy's conditions read (``s3:prefix``,
``s3:delimiter``, ``s3:max-keys``, ``aws:SourceIp``, ``aws:SecureTransport``),
and the second permission a copy needs: reading its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from .message import Request

ARN_PREFIX = "arn:aws:s3:::"

#: Operations that decide per item inside the handler instead of once up front:
#: ListBuckets shows only the buckets the caller may list, DeleteObjects reports
#: AccessDenied per key, as AWS does.
FILTERED = frozenset({"ListBuckets", "DeleteObjects"})
#: Actions of the service buckets decided per item inside their handlers: the biographies
#: bucket per agent and session, the skills bucket per scope and skill, the memory bucket
#: per scope and document.
PER_ITEM_SERVICES = ("bio:", "skills:", "memory:")
_LISTINGS = frozenset({"ListObjects", "ListObjectsV2", "ListMultipartUploads"})


@dataclass(frozen=True)
class Check:
    action: str
    resource: str


def arn(bucket: str | None, key: str | None = None) -> str:
    if bucket is None:
        return ARN_PREFIX + "*"
    return f"{ARN_PREFIX}{bucket}/{key}" if key is not None else ARN_PREFIX + bucket


def request_arn(req: Request) -> str:
    return arn(req.bucket, req.key)


def checks(req: Request, op_name: str, action: str, copy_source: tuple[str, str] | None) -> list[Check]:
    """Every permission the request needs, the request's own first."""
    if op_name in FILTERED or action.startswith(PER_ITEM_SERVICES):
        return []
    needed = [Check(action, request_arn(req))]
    if copy_source is not None:
        needed.append(Check("s3:GetObject", arn(*copy_source)))
    return needed


def context(req: Request, op_name: str | None) -> dict[str, str]:
    """The condition keys of this request, lowercase as policies are matched."""
    values = {"aws:sourceip": req.client_ip,
              "aws:securetransport": "true" if req.scheme == "https" else "false"}
    if op_name in _LISTINGS:
        values["s3:prefix"] = req.query.get("prefix", "")
        if "delimiter" in req.query:
            values["s3:delimiter"] = req.query["delimiter"]
        limit = req.query.get("max-keys", req.query.get("max-uploads"))
        if limit is not None:
            values["s3:max-keys"] = limit
    return values
