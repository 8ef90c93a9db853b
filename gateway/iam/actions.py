"""The catalogue of actions a policy may name, one place for the engine, the README and later issues.

Each service has a prefix (``s3``, ``memory``...), the ARN forms of its resources and its actions with a
one-line description. Action names match case-insensitively, as in AWS. A few S3 actions are accepted only
so that policies pasted from AWS validate; they are flagged as not used by orgmem yet.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Service:
    """One service prefix: what its resources look like and what can be done to them."""

    prefix: str
    #: every resource ARN of this service starts with this
    arn_prefix: str
    #: the ARN forms, with placeholders in capitals, for documentation
    resources: tuple[str, ...]
    #: action name (canonical spelling) -> one-line description
    actions: dict[str, str]
    #: actions accepted for AWS compatibility that orgmem does not check yet
    unused: frozenset[str] = frozenset()


_S3_USED = {
    "ListAllMyBuckets": "List the buckets the caller can see (resource `*`).",
    "CreateBucket": "Create a bucket.",
    "DeleteBucket": "Delete an empty bucket.",
    "ListBucket": "List the objects of a bucket (conditions: `s3:prefix`, `s3:delimiter`, `s3:max-keys`).",
    "GetBucketLocation": "Read a bucket's region.",
    "GetBucketVersioning": "Read a bucket's versioning state.",
    "GetBucketAcl": "Read a bucket's access control list.",
    "ListBucketMultipartUploads": "List the multipart uploads in progress in a bucket.",
    "GetObject": "Read an object or its metadata (GET, HEAD).",
    "PutObject": "Write an object, including copies and multipart uploads.",
    "DeleteObject": "Delete an object.",
    "GetObjectAcl": "Read an object's access control list.",
    "ListMultipartUploadParts": "List the parts uploaded so far to a multipart upload.",
    "AbortMultipartUpload": "Abandon a multipart upload.",
}

_S3_AWS_ONLY = {
    "GetObjectVersion": "Read a specific version of an object.",
    "DeleteObjectVersion": "Delete a specific version of an object.",
    "GetObjectTagging": "Read an object's tags.",
    "PutObjectTagging": "Set an object's tags.",
    "DeleteObjectTagging": "Remove an object's tags.",
    "GetObjectAttributes": "Read an object's attributes.",
    "PutObjectAcl": "Set an object's access control list.",
    "PutBucketAcl": "Set a bucket's access control list.",
    "GetBucketPolicy": "Read a bucket policy.",
    "PutBucketPolicy": "Set a bucket policy.",
    "DeleteBucketPolicy": "Remove a bucket policy.",
    "GetBucketTagging": "Read a bucket's tags.",
    "PutBucketTagging": "Set a bucket's tags.",
    "GetLifecycleConfiguration": "Read a bucket's lifecycle rules.",
    "PutLifecycleConfiguration": "Set a bucket's lifecycle rules.",
    "GetBucketCORS": "Read a bucket's CORS rules.",
    "PutBucketCORS": "Set a bucket's CORS rules.",
    "ListBucketVersions": "List the object versions in a bucket.",
    "GetEncryptionConfiguration": "Read a bucket's default encryption.",
    "PutEncryptionConfiguration": "Set a bucket's default encryption.",
    "GetBucketObjectLockConfiguration": "Read a bucket's object lock configuration.",
    "PutBucketVersioning": "Set a bucket's versioning state.",
    "RestoreObject": "Restore an archived object.",
    "GetObjectRetention": "Read an object's retention settings.",
    "PutObjectRetention": "Set an object's retention settings.",
    "GetObjectLegalHold": "Read an object's legal hold.",
    "PutObjectLegalHold": "Set an object's legal hold.",
    "GetBucketNotification": "Read a bucket's event notifications.",
    "PutBucketNotification": "Set a bucket's event notifications.",
    "GetBucketPublicAccessBlock": "Read a bucket's public access block.",
    "PutBucketPublicAccessBlock": "Set a bucket's public access block.",
    "GetBucketLogging": "Read a bucket's access logging settings.",
    "GetBucketWebsite": "Read a bucket's website configuration.",
    "GetBucketOwnershipControls": "Read a bucket's object ownership settings.",
}

SERVICES: dict[str, Service] = {
    service.prefix: service
    for service in (
        Service(
            "s3", "arn:aws:s3:::", ("arn:aws:s3:::BUCKET", "arn:aws:s3:::BUCKET/KEY"),
            {**_S3_USED, **_S3_AWS_ONLY}, frozenset(_S3_AWS_ONLY),
        ),
        Service("bio", "arn:orgmem:bio:::", ("arn:orgmem:bio:::AGENT/SESSION",), {
            "PutEvents": "Append events to an agent's biography.",
            "GetEvents": "Read events from an agent's biography.",
            "ListSessions": "List the sessions of an agent's biography.",
            "GetDigest": "Read the compacted digest of an agent's biography.",
            "Compact": "Run a compaction of the biography and audit log now (resource `*`).",
            "GetRetention": "Read how long biographies are kept (`AGENT/*`, or `*` for the default).",
            "PutRetention": "Set how long biographies are kept (`AGENT/*`, or `*` for the default).",
        }),
        Service("memory", "arn:orgmem:memory:::", ("arn:orgmem:memory:::SCOPE/ID",), {
            "GetDocument": "Read an open-memory document (SCOPE is `org`, `team/NAME` or `agent/NAME`).",
            "ListDocuments": "List the documents of a memory scope.",
            "PutDocument": "Create or replace a memory document.",
            "DeleteDocument": "Delete a memory document.",
            "GetHistory": "Read the earlier versions of a memory document.",
        }),
        Service("skills", "arn:orgmem:skills:::", ("arn:orgmem:skills:::SCOPE/NAME",), {
            "GetSkill": "Read a skill.",
            "ListSkills": "List the skills of a scope.",
            "PutSkill": "Create or replace a skill.",
            "DeleteSkill": "Delete a skill.",
        }),
        Service("vault", "arn:orgmem:vault:::", ("arn:orgmem:vault:::PATH",), {
            "GetSecret": "Read a secret's value.",
            "PutSecret": "Create or update a secret.",
            "ListSecrets": "List secret paths (not values).",
            "DeleteSecret": "Delete a secret (recoverable).",
            "DestroySecret": "Destroy a secret's versions for good.",
        }),
        Service("search", "arn:orgmem:search:::",
                ("arn:orgmem:search:::TYPE", "arn:orgmem:search:::index"), {
            "Query": "Search an index (TYPE: `event`, `memory`, `skill`, `file`); results are per caller.",
            "GetContext": "Fetch assembled context for a task from the search indexes.",
            "GetIndexStatus": "Read the search index's checkpoint, lag, snapshot age and holder (`index`).",
            "RebuildIndex": "Rebuild the search index from its sources (`index`).",
        }),
        Service("admin", "arn:orgmem:admin:::", (
            "arn:orgmem:admin:::agent/NAME", "arn:orgmem:admin:::team/NAME", "arn:orgmem:admin:::policy/NAME",
            "arn:orgmem:admin:::audit", "arn:orgmem:admin:::metrics", "arn:orgmem:admin:::kek",
        ), {
            "CreateAgent": "Create an agent principal.",
            "ListAgents": "List agents.",
            "GetAgent": "Read an agent's settings.",
            "UpdateAgent": "Change an agent's settings or teams.",
            "DeleteAgent": "Delete an agent.",
            "CreateKey": "Issue an access key to an agent.",
            "RotateKey": "Replace an agent's access key.",
            "RevokeKey": "Disable an agent's access key.",
            "CreateTeam": "Create a team.",
            "ListTeams": "List teams.",
            "GetTeam": "Read a team and its members.",
            "UpdateTeam": "Change a team's members.",
            "DeleteTeam": "Delete a team.",
            "PutPolicy": "Create or replace a named policy.",
            "GetPolicy": "Read a named policy.",
            "ListPolicies": "List named policies.",
            "DeletePolicy": "Delete a named policy.",
            "AttachPolicy": "Attach a policy to an agent or team.",
            "DetachPolicy": "Detach a policy from an agent or team.",
            "SimulatePolicy": "Ask whether a principal may perform an action, and why.",
            "ReadAudit": "Read the audit log.",
            "SetAuditRetention": "Set how many days audit records are kept.",
            "GetMetrics": "Read the gateway's metrics.",
            "ManageKeys": "Rotate the key-encryption keys that seal stored data.",
        }),
    )
}

#: "s3:getobject" -> "s3:GetObject", for every known action
_CANONICAL: dict[str, str] = {
    f"{prefix}:{name}".lower(): f"{prefix}:{name}"
    for prefix, service in SERVICES.items() for name in service.actions
}


def all_actions() -> list[str]:
    """Every known action as ``service:Name``, in catalogue order."""
    return list(_CANONICAL.values())


def canonical_action(name: str) -> str | None:
    """The catalogue's spelling of an action named in any case; None when unknown."""
    return _CANONICAL.get(name.lower())


def is_known_action(name: str) -> bool:
    """Whether ``name`` is exactly one catalogued action, ignoring case (no wildcards)."""
    return name.lower() in _CANONICAL


def glob_source(units: Iterable[str | None]) -> str:
    """Regex source (fullmatch, DOTALL) of a wildcard pattern given as units: regex pieces, None for ``*``.

    A naive ``.*`` per star backtracks exponentially on patterns like ``*a*a*a*b``, and some matched values
    (``s3:prefix``, object keys) come from callers. Placing each segment between stars at its leftmost
    occurrence never loses a match, so each is an atomic lazy search and the whole stays near linear.
    """
    segments: list[list[str]] = [[]]
    for unit in units:
        if unit is None:
            segments.append([])
        else:
            segments[-1].append(unit)
    if len(segments) == 1:
        return "".join(segments[0])
    first, *middle, last = ("".join(segment) for segment in segments)
    return first + "".join(f"(?>.*?{m})" for m in middle if m) + ".*" + last


def wildcard_source(pattern: str) -> str:
    """An IAM wildcard (``*`` any run of characters, ``?`` one character) as regex source for fullmatch."""
    return glob_source(None if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)


@lru_cache(maxsize=1024)
def matching_actions(pattern: str) -> tuple[str, ...]:
    """The known actions an action pattern such as ``s3:Get*`` covers (case-insensitive)."""
    regex = re.compile(wildcard_source(pattern.lower()), re.DOTALL)
    return tuple(canonical for lowered, canonical in _CANONICAL.items() if regex.fullmatch(lowered))


def pattern_matches_any(pattern: str) -> bool:
    """Whether an action pattern covers at least one known action, so typos like s3:GetObjekt are refused."""
    return bool(matching_actions(pattern))


def markdown_table() -> str:
    """The catalogue as a Markdown table for the README; each service's resource forms head its group."""
    lines = ["| Service | Resource ARN | Action | Description |", "|---|---|---|---|"]
    for prefix, service in SERVICES.items():
        first = True
        for name, description in service.actions.items():
            if name in service.unused:
                description += " *Accepted for AWS compatibility; not used by orgmem yet.*"
            resources = "<br>".join(f"`{arn}`" for arn in service.resources) if first else ""
            label = f"`{prefix}`" if first else ""
            description = description.replace("|", "&#124;")
            lines.append(f"| {label} | {resources} | `{prefix}:{name}` | {description} |")
            first = False
    return "\n".join(lines) + "\n"
