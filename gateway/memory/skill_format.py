"""The Agent Skills folder format: SKILL.md front matter and the paths a skill may hold.

One validator, used by the gateway before anything is stored and by ``orgmem skills push``
before anything is sent, so a bad skill is refused with the same message on both sides.
It follows the Agent Skills specification (agentskills.io): ``SKILL.md`` at the root with
YAML front matter (``name``, ``description``; optional ``license``, ``compatibility``,
``metadata``, ``allowed-tools``) and Markdown after it, plus any other files; the
conventional folders are ``scripts/``, ``references/`` and ``assets/``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import yaml

SKILL_FILE = "SKILL.md"
MAX_NAME = 64
MAX_DESCRIPTION = 1024
MAX_COMPATIBILITY = 500
#: The front matter is metadata, loaded into every agent's context: kept small.
MAX_FRONT_MATTER = 16 * 1024
#: A version's files together, decoded (the request carrying them is larger: base64).
MAX_TOTAL_BYTES = 8 * 1024 * 1024
MAX_FILES = 1000
MAX_PATH = 512
FIELDS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")
REQUIRED = ("name", "description")
#: Lowercase letters, digits and single inner hyphens (the spec's rule; its validator
#: also refuses ``--``).
_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*\Z")
_FRONT = re.compile(r"\A---[ \t]*\r?\n(.*?)(?:\r?\n)?^---[ \t]*(?:\r?\n|\Z)", re.S | re.M)
_BAD_PATH_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


class SkillError(ValueError):
    """A skill that cannot be published; the message names the file or field."""


def check_name(name: Any, what: str = "name") -> str:
    if not isinstance(name, str) or not name:
        raise SkillError(f"{what}: a skill name is required (a string).")
    if len(name) > MAX_NAME:
        raise SkillError(f"{what}: {name[:80]!r} is {len(name)} characters; a skill name is at most "
                         f"{MAX_NAME}.")
    if not _NAME.match(name):
        raise SkillError(f"{what}: {name!r} is not a valid skill name: use lowercase letters, digits "
                         "and hyphens, not starting or ending with a hyphen, no '--'.")
    return name


def parse_front_matter(text: bytes | str) -> tuple[dict[str, Any], str]:
    """The validated front matter of a SKILL.md and the Markdown body after it."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise SkillError(f"{SKILL_FILE}: is not UTF-8 text.") from None
    text = text.removeprefix("\ufeff")
    found = _FRONT.match(text)
    if not found:
        raise SkillError(f"{SKILL_FILE}: must start with YAML front matter between '---' lines "
                         "(name and description at least).")
    block = found.group(1)
    if len(block.encode()) > MAX_FRONT_MATTER:
        raise SkillError(f"{SKILL_FILE}: the front matter is over {MAX_FRONT_MATTER} bytes; keep it to "
                         "metadata and put the rest in the body.")
    try:
        data = yaml.safe_load(block)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 2})" if where is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise SkillError(f"{SKILL_FILE}: the front matter is not valid YAML{at}: {problem}.") from None
    if not isinstance(data, dict):
        raise SkillError(f"{SKILL_FILE}: the front matter must be a YAML mapping of fields "
                         f"({', '.join(FIELDS)}).")
    return check_fields(data), text[found.end():]


def check_fields(data: Mapping[Any, Any]) -> dict[str, Any]:
    unknown = sorted(str(k) for k in data if k not in FIELDS)
    if unknown:
        raise SkillError(f"{SKILL_FILE}: unknown front matter field {unknown[0]!r}; the fields are "
                         f"{', '.join(FIELDS)} (put anything else under metadata).")
    for field in REQUIRED:
        if data.get(field) in (None, ""):
            raise SkillError(f"{SKILL_FILE}: the front matter needs {field!r}.")
    out: dict[str, Any] = {"name": check_name(data["name"], f"{SKILL_FILE}: name")}
    description = data["description"]
    if not isinstance(description, str) or not description.strip():
        raise SkillError(f"{SKILL_FILE}: description must be non-empty text.")
    if len(description) > MAX_DESCRIPTION:
        raise SkillError(f"{SKILL_FILE}: description is {len(description)} characters; at most "
                         f"{MAX_DESCRIPTION}.")
    out["description"] = description
    for field in ("license", "compatibility", "allowed-tools"):
        value = data.get(field)
        if value is None:
            continue
        if not isinstance(value, str):
            raise SkillError(f"{SKILL_FILE}: {field} must be text, not {type(value).__name__}.")
        if field == "compatibility" and len(value) > MAX_COMPATIBILITY:
            raise SkillError(f"{SKILL_FILE}: compatibility is {len(value)} characters; at most "
                             f"{MAX_COMPATIBILITY}.")
        out[field] = value
    metadata = data.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SkillError(f"{SKILL_FILE}: metadata must be a mapping of text keys to text values "
                             "(quote numbers and dates).")
        out["metadata"] = dict(metadata)
    try:  # YAML's "\ud800" escapes make text no JSON writer takes: refuse it before any file is stored
        json.dumps(out, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise SkillError(f"{SKILL_FILE}: the front matter holds text that is not valid Unicode "
                         "(a lone surrogate escape).") from None
    return out


def check_path(path: Any) -> str:
    """A file's path inside the skill: relative, '/'-separated, no '.' or '..' segments."""
    if not isinstance(path, str) or not path:
        raise SkillError("files: a file path must be non-empty text.")
    shown = repr(path[:120])
    if len(path.encode()) > MAX_PATH:
        raise SkillError(f"files: the path {shown} is over {MAX_PATH} bytes.")
    if _BAD_PATH_CHARS.search(path):
        raise SkillError(f"files: the path {shown} has a backslash or control character; use '/' "
                         "between folders.")
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        raise SkillError(f"files: the path {shown} is absolute; paths are relative to the skill folder.")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise SkillError(f"files: the path {shown} has an empty, '.' or '..' segment; paths stay "
                         "inside the skill folder.")
    return path


def check_folder(name: str, files: Mapping[str, bytes]) -> dict[str, Any]:
    """Validate a whole version (paths, sizes, SKILL.md); returns the front matter."""
    check_name(name)
    if not files:
        raise SkillError("files: a skill needs at least SKILL.md.")
    if len(files) > MAX_FILES:
        raise SkillError(f"files: {len(files)} files; a skill has at most {MAX_FILES}.")
    total = 0
    lowered: dict[str, str] = {}
    for path, data in files.items():
        check_path(path)
        total += len(data)
        key = path.lower()
        if key in lowered:
            raise SkillError(f"files: {lowered[key]!r} and {path!r} differ only in case; they would "
                             "collide on many file systems.")
        lowered[key] = path
    folders = {path.rsplit("/", n)[0] for path in files for n in range(1, path.count("/") + 1)}
    clash = sorted(folders & files.keys())
    if clash:
        raise SkillError(f"files: {clash[0]!r} is both a file and a folder.")
    if total > MAX_TOTAL_BYTES:
        raise SkillError(f"files: the skill's files are {total} bytes together; at most "
                         f"{MAX_TOTAL_BYTES} (keep large data in a workspace bucket).")
    if SKILL_FILE not in files:
        other = lowered.get(SKILL_FILE.lower())
        hint = f" (found {other!r}: the name is case-sensitive)" if other else ""
        raise SkillError(f"files: a skill needs {SKILL_FILE} at the root of its folder{hint}.")
    front, _ = parse_front_matter(files[SKILL_FILE])
    if front["name"] != name:
        raise SkillError(f"{SKILL_FILE}: name {front['name']!r} must equal the skill's folder name "
                         f"{name!r}.")
    return front
