"""The skills API (``/v1/skills``): publish versions, list, read manifests and files.

Thin: parse, check grants, call :class:`~gateway.memory.skills.Skills`, shape the JSON.
Resources are ``arn:orgmem:skills:::org/NAME``, ``.../team/T/NAME`` and ``.../agent/A/NAME``;
listings show only the skills the caller may list, and a name asked for without a scope
is the first one the caller may read of its own, its teams' (by name) and the org's.

    POST /v1/skills/{name}/versions?scope=S   {"files": [{"path", "content" (base64), "executable"}]}
    GET  /v1/skills?scope=S&q=WORDS           [{"scope", "name", "description", "version", "author"}]
    GET  /v1/skills/{name}?scope=S&version=N  the version's manifest
    GET  /v1/skills/{name}/versions?scope=S   every version, oldest first
    GET  /v1/skills/{name}/file?path=P&scope=S&version=N   one file's bytes
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..iam.principals import Principal
from ..memory import skill_format as fmt
from ..memory.skills import ARN, Scope, SkillError, SkillNotFound, Skills, decode_files, summary
from .rest import ApiError, Call, PerItem, Reply, Router

#: A push carries its files base64-encoded: 8 MiB of files is about 10.7 MiB of JSON.
MAX_PUSH_BODY = fmt.MAX_TOTAL_BYTES * 4 // 3 + 512 * 1024


class FileBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(max_length=fmt.MAX_PATH)
    content: str
    executable: bool = False


class PushBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: list[FileBody] = Field(max_length=fmt.MAX_FILES)


def add_routes(r: Router, skills: Skills) -> None:
    api = SkillsApi(skills)
    r.add("GET", "/v1/skills", "ListSkills", "skills:ListSkills", api.list_arn, api.list_skills)
    r.add("POST", "/v1/skills/{name}/versions", "PutSkill", "skills:PutSkill", api.write_arn, api.push,
          max_body=MAX_PUSH_BODY)
    r.add("GET", "/v1/skills/{name}/versions", "ListSkillVersions", "skills:GetSkill", api.read_arn,
          api.list_versions)
    r.add("GET", "/v1/skills/{name}", "GetSkill", "skills:GetSkill", api.read_arn, api.get_manifest)
    r.add("GET", "/v1/skills/{name}/file", "GetSkillFile", "skills:GetSkill", api.read_arn, api.get_file)


def default_scope(principal: Principal) -> Scope:
    """Where a push without a scope goes: an agent's own scope; the org for root and humans."""
    if principal.is_root or principal.kind != "agent":
        return Scope("org")
    return Scope("agent", principal.name)


def candidate_scopes(principal: Principal) -> list[Scope]:
    """Where a name without a scope is looked for, most specific first."""
    out = []
    if not principal.is_root and principal.kind == "agent":
        out.append(Scope("agent", principal.name))
    out.extend(Scope("team", t) for t in sorted(principal.teams))
    out.append(Scope("org"))
    return out


class SkillsApi:
    def __init__(self, skills: Skills) -> None:
        self.skills = skills

    # -- parameters -------------------------------------------------------------

    @staticmethod
    def _scope(call: Call) -> Scope | None:
        text = call.query.get("scope")
        if not text:
            return None
        try:
            return Scope.parse(text)
        except SkillError as exc:
            raise ApiError("InvalidArgument", str(exc)) from None

    @staticmethod
    def _name(call: Call) -> str:
        try:
            return fmt.check_name(call.params["name"])
        except SkillError as exc:
            raise ApiError("InvalidArgument", str(exc)) from None

    @staticmethod
    def _version(call: Call) -> int | None:
        value = call.query.get("version")
        if value is None or value == "" or value == "latest":
            return None
        if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 999_999:
            raise ApiError("InvalidArgument", "version: must be a whole number from 1 (or 'latest').")
        return int(value)

    def list_arn(self, call: Call) -> str:
        scope = self._scope(call)
        return PerItem(scope.arn("*") if scope else ARN + "*")

    def write_arn(self, call: Call) -> str:
        scope = self._scope(call) or default_scope(call.principal)
        return scope.arn(self._name(call))

    def read_arn(self, call: Call) -> str:
        scope, name = self._scope(call), self._name(call)
        return scope.arn(name) if scope else PerItem(ARN + f"*/{name}")

    def _manifest(self, call: Call) -> dict:
        scope, name, version = self._scope(call), self._name(call), self._version(call)
        try:
            if scope is not None:
                return self.skills.manifest(scope, name, version)
            return self.skills.resolve(
                name, candidate_scopes(call.principal),
                lambda s: call.permits("skills:GetSkill", s.arn(name)), version)
        except SkillNotFound as exc:
            raise ApiError("NoSuchSkill", str(exc), 404) from None

    # -- handlers ---------------------------------------------------------------

    def push(self, call: Call) -> Reply:
        scope = self._scope(call) or default_scope(call.principal)
        name = self._name(call)
        body = call.model(PushBody)
        try:
            files = decode_files([f.model_dump() for f in body.files])
            manifest = self.skills.publish(scope, name, files, call.principal.name)
        except SkillError as exc:
            raise ApiError("InvalidSkill", f"{exc} Nothing was stored.") from None
        return Reply(201, manifest)

    def list_skills(self, call: Call) -> Reply:
        scope = self._scope(call)
        if scope is not None and not call.permits("skills:ListSkills", scope.arn("*")) \
                and not any(True for _ in self.skills.latest(
                    lambda s, n: call.permits("skills:ListSkills", s.arn(n)), scope)):
            raise ApiError("AccessDenied", f"You may not list the skills of {scope} "
                           f"(skills:ListSkills on {scope.arn('*')}).", 403)
        rows = self.skills.search(lambda s, n: call.permits("skills:ListSkills", s.arn(n)), scope,
                                  call.query.get("q"))
        return Reply(200, {"skills": rows})

    def get_manifest(self, call: Call) -> Reply:
        return Reply(200, self._manifest(call))

    def list_versions(self, call: Call) -> Reply:
        latest = self._manifest(call)
        scope = Scope.parse(latest["scope"])
        rows = [summary(self.skills.manifest(scope, latest["name"], v))
                for v in self.skills.versions(scope, latest["name"])]
        return Reply(200, {"scope": latest["scope"], "name": latest["name"], "versions": rows})

    def get_file(self, call: Call) -> Reply:
        path = call.query.get("path")
        if not path:
            raise ApiError("InvalidArgument", "path: which file of the skill (e.g. SKILL.md).")
        manifest = self._manifest(call)
        try:
            entry, data = self.skills.read_file(manifest, path)
        except SkillNotFound as exc:
            raise ApiError("NoSuchKey", str(exc), 404) from None
        return Reply(200, raw=data, content_type="application/octet-stream")
