"""The four built-in policies every deployment has; admins attach them like any other policy.

They are plain policy documents (tests check that each one parses), so ``orgmem`` can show them as JSON.
"""

from __future__ import annotations

from typing import Any

_VERSION = "2012-10-17"
_ME = "${aws:username}"


def _allow(actions: list[str], resources: list[str] | str, sid: str | None = None) -> dict[str, Any]:
    statement: dict[str, Any] = {"Effect": "Allow", "Action": actions, "Resource": resources}
    return {"Sid": sid, **statement} if sid else statement


def _org_and_teams(service: str) -> list[str]:
    """The org scope and the scope of every team the caller belongs to."""
    return [f"arn:orgmem:{service}:::org/*", f"arn:orgmem:{service}:::team/${{orgmem:teams}}/*"]


_MEMORY_READ = ["memory:GetDocument", "memory:ListDocuments", "memory:GetHistory"]
_SKILLS_READ = ["skills:GetSkill", "skills:ListSkills"]

BUILTIN_POLICIES: dict[str, dict[str, Any]] = {
    "admin": {"Version": _VERSION, "Statement": [_allow(["*"], "*", "Everything")]},
    "readwrite": {"Version": _VERSION, "Statement": [
        _allow(["s3:*", "bio:*", "memory:*", "skills:*", "search:*"], "*", "AllDataExceptVaultAndAdmin"),
    ]},
    "readonly": {"Version": _VERSION, "Statement": [
        _allow(["s3:Get*", "s3:List*", "bio:Get*", "bio:List*", "memory:Get*", "memory:List*",
                "skills:Get*", "skills:List*", "search:*"], "*", "ReadAllData"),
    ]},
    "agent-default": {"Version": _VERSION, "Statement": [
        _allow(["s3:CreateBucket", "s3:ListBucket", "s3:ListBucketMultipartUploads", "s3:GetBucketLocation",
                "s3:GetBucketVersioning"], f"arn:aws:s3:::agent-{_ME}", "OwnWorkspaceBucket"),
        _allow(["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts", "s3:GetObjectAcl"], f"arn:aws:s3:::agent-{_ME}/*",
               "OwnWorkspaceObjects"),
        _allow(["memory:*"], f"arn:orgmem:memory:::agent/{_ME}/*", "OwnMemory"),
        _allow(_MEMORY_READ, _org_and_teams("memory"), "ReadOrgAndTeamMemory"),
        _allow(_SKILLS_READ, _org_and_teams("skills"), "ReadOrgAndTeamSkills"),
        _allow(["skills:*"], f"arn:orgmem:skills:::agent/{_ME}/*", "OwnSkills"),
        _allow(["bio:PutEvents", "bio:GetEvents", "bio:ListSessions", "bio:GetDigest"],
               f"arn:orgmem:bio:::{_ME}/*", "OwnBiography"),
        _allow(["search:Query", "search:GetContext"], "*", "Search"),
        _allow(["vault:GetSecret", "vault:ListSecrets"], f"arn:orgmem:vault:::agents/{_ME}/*", "OwnSecrets"),
    ]},
}

BUILTIN_NAMES: tuple[str, ...] = tuple(BUILTIN_POLICIES)
