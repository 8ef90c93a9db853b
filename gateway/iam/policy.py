"""AWS IAM-style policies: parse and validate JSON documents, compile them per principal, evaluate requests.

Admins already read AWS IAM JSON, so orgmem uses the same language and the same evaluation logic: deny by
default, an explicit Deny anywhere beats any Allow, a statement applies when its action, resource and
condition all match. Policies are identity policies: they are attached to principals and teams, so a
statement never names a principal.

Parsing is strict and every refusal names the place (``Statement[1].Action: unknown action "s3:GetObjekt"``)
because a policy that silently means something else is a security bug. Evaluation runs on every request,
so :meth:`PolicySet.compile` does the work once per principal (variables substituted, regexes built) and
:meth:`PolicySet.evaluate` is a few regex matches.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from .actions import SERVICES, glob_source, is_known_action, matching_actions, wildcard_source

MAX_POLICY_BYTES = 20480
VERSIONS = ("2012-10-17", "2008-10-17")

_TOP_KEYS = ("Version", "Id", "Statement")
_STATEMENT_KEYS = ("Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition")
_SID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")

#: policy variables, lowercase; the escapes ${*} ${?} ${$} stand for the literal character
VARIABLES = ("aws:username", "orgmem:teams")
_ESCAPES = ("*", "?", "$")
_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_VARIABLE_HELP = "allowed: ${aws:username}, ${orgmem:teams}, and ${*} ${?} ${$} for a literal * ? $"

#: condition keys (lowercase) -> (spelling for messages, value type)
CONDITION_KEYS: dict[str, tuple[str, str]] = {
    "s3:prefix": ("s3:prefix", "string"),
    "s3:delimiter": ("s3:delimiter", "string"),
    "s3:max-keys": ("s3:max-keys", "numeric"),
    "aws:sourceip": ("aws:SourceIp", "ip"),
    "aws:username": ("aws:username", "string"),
    "aws:securetransport": ("aws:SecureTransport", "bool"),
    "orgmem:teams": ("orgmem:teams", "string"),
}


class PolicyError(ValueError):
    """A policy document that cannot be used; the message names the place and the problem."""


@dataclass(frozen=True)
class _Op:
    """How a condition operator compares: its value family, whether it is negated, the numeric comparison."""

    family: str  # string | string-ic | like | numeric | bool | ip | null
    negated: bool = False
    compare: Callable[[Any, Any], bool] | None = None


OPERATORS: dict[str, _Op] = {
    "StringEquals": _Op("string"),
    "StringNotEquals": _Op("string", True),
    "StringEqualsIgnoreCase": _Op("string-ic"),
    "StringNotEqualsIgnoreCase": _Op("string-ic", True),
    "StringLike": _Op("like"),
    "StringNotLike": _Op("like", True),
    "NumericEquals": _Op("numeric", False, operator.eq),
    "NumericNotEquals": _Op("numeric", True, operator.eq),
    "NumericLessThan": _Op("numeric", False, operator.lt),
    "NumericLessThanEquals": _Op("numeric", False, operator.le),
    "NumericGreaterThan": _Op("numeric", False, operator.gt),
    "NumericGreaterThanEquals": _Op("numeric", False, operator.ge),
    "Bool": _Op("bool"),
    "IpAddress": _Op("ip"),
    "NotIpAddress": _Op("ip", True),
    "Null": _Op("null"),
}


# ---------------------------------------------------------------------------------------------------------
# Documents


#: A resource pattern as units: ``None`` is ``*`` (any run), ``""`` is ``?`` (one character),
#: any other string is literal text.
Glob = tuple[str | None, ...]


@dataclass(frozen=True)
class Template:
    """A policy string split into text (where ``*``/``?`` may be wildcards), literal characters and variables.

    Parsed once so that compiling for each principal is only substitution.
    """

    text: str
    parts: tuple[tuple[str, str], ...]  # ("text", s) | ("char", c) | ("var", lowercase name)

    @property
    def has_variables(self) -> bool:
        return any(kind != "text" for kind, _ in self.parts)

    def _teams(self, teams: Sequence[str]) -> Sequence[str | None]:
        """One binding per team when ${orgmem:teams} occurs (none without teams), else a single one."""
        return teams if ("var", "orgmem:teams") in self.parts else (None,)

    def _literal(self, username: str, team: str | None) -> str:
        return "".join(value if kind == "text" else self._value(kind, value, username, team)
                       for kind, value in self.parts)

    def _glob_units(self, username: str, team: str | None) -> Iterable[str | None]:
        """Units for glob_source: wildcards from the text, substituted values always literal."""
        for kind, value in self.parts:
            if kind == "text":
                yield from (None if c == "*" else "." if c == "?" else re.escape(c) for c in value)
            else:
                yield re.escape(self._value(kind, value, username, team))

    @staticmethod
    def _value(kind: str, value: str, username: str, team: str | None) -> str:
        return value if kind == "char" else username if value == "aws:username" else team or ""

    def literals(self, username: str, teams: Sequence[str]) -> list[str]:
        """The strings this template stands for, wildcards kept as plain characters."""
        return [self._literal(username, team) for team in self._teams(teams)]

    def regex_sources(self, username: str, teams: Sequence[str]) -> list[str]:
        """Regex sources (for fullmatch) with ``*``/``?`` as wildcards and substituted values literal."""
        return [glob_source(self._glob_units(username, team)) for team in self._teams(teams)]

    def globs(self, username: str, teams: Sequence[str]) -> list[Glob]:
        """The patterns this template stands for, as :data:`Glob` units (for other matchers)."""
        return [tuple(self._plain_units(username, team)) for team in self._teams(teams)]

    def _plain_units(self, username: str, team: str | None) -> Iterable[str | None]:
        for kind, value in self.parts:
            if kind == "text":
                yield from (None if c == "*" else "" if c == "?" else c for c in value)
            else:
                yield self._value(kind, value, username, team)


@dataclass(frozen=True)
class ConditionClause:
    """One ``operator: {key: values}`` entry of a Condition block."""

    operator: str  # as written, e.g. "StringLikeIfExists"
    key: str  # lowercase
    values: tuple[str, ...]  # as written, normalised to strings
    family: str
    negated: bool
    if_exists: bool
    #: Templates (string families), Decimals, networks, or lowercase "true"/"false"
    parsed: tuple[Any, ...] = field(repr=False)
    compare: Callable[[Any, Any], bool] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Statement:
    index: int
    sid: str | None
    effect: str  # "Allow" | "Deny"
    actions: tuple[str, ...]
    not_action: bool
    resources: tuple[str, ...]
    not_resource: bool
    conditions: tuple[ConditionClause, ...]
    resource_templates: tuple[Template, ...] = field(repr=False)


@dataclass(frozen=True, eq=False)
class PolicyDocument:
    version: str
    id: str | None
    statements: tuple[Statement, ...]
    #: the document as the author wrote it (parsed JSON), for display
    source: dict[str, Any] = field(repr=False)

    def text(self) -> str:
        """The original document, pretty-printed for display."""
        return json.dumps(self.source, indent=2, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------------------
# Parsing


def parse_policy(text: str | bytes | Mapping[str, Any]) -> PolicyDocument:
    """Parse and validate a policy; raise PolicyError naming the first problem found.

    A mapping (e.g. a built-in policy) is serialised first so it gets exactly the same checks.
    """
    if isinstance(text, Mapping):
        text = json.dumps(text, ensure_ascii=False)
    raw = _load_json(text)
    if not isinstance(raw, dict):
        raise PolicyError(f"a policy must be a JSON object, got {_kind(raw)}")
    for key in raw:
        if key not in _TOP_KEYS:
            raise PolicyError(f"unknown top-level key {_q(key)}{_suggest(key, _TOP_KEYS)}; "
                              f"allowed: {', '.join(_TOP_KEYS)}")
    version = _parse_version(raw.get("Version"))
    policy_id = raw.get("Id")
    if policy_id is not None and not isinstance(policy_id, str):
        raise PolicyError(f"Id: expected a string, got {_kind(policy_id)}")
    statements = _parse_statements(raw.get("Statement"), version)
    return PolicyDocument(version, policy_id, statements, raw)


def _load_json(text: str | bytes) -> Any:
    """Decode and parse, refusing over-size text, duplicate keys and NaN/Infinity, with a line and column."""
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_POLICY_BYTES:
        raise PolicyError(f"policy is {size} bytes, over the {MAX_POLICY_BYTES}-byte limit")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise PolicyError(f"policy is not valid UTF-8 (byte {e.start})") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise PolicyError(f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise PolicyError("invalid JSON: nested too deeply") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON objects with a repeated key are refused: parsers disagree on which value wins."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise PolicyError(f"duplicate key {_q(key)} in a JSON object; each key may appear once")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise PolicyError(f"invalid JSON: {name} is not a JSON value")


def _parse_version(version: Any) -> str:
    if version is None:
        raise PolicyError(f'missing "Version"; use {_q(VERSIONS[0])}')
    if version not in VERSIONS:
        raise PolicyError(f"unsupported Version {_q(version)}; use {_q(VERSIONS[0])}")
    return version


def _parse_statements(raw: Any, version: str) -> tuple[Statement, ...]:
    if raw is None:
        raise PolicyError('missing "Statement"')
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise PolicyError(f"Statement: expected an object or a list of objects, got {_kind(raw)}")
    if not raw:
        raise PolicyError("Statement: empty list; a policy needs at least one statement")
    statements = tuple(_parse_statement(item, i, version) for i, item in enumerate(raw))
    seen: dict[str, int] = {}
    for st in statements:
        if st.sid is not None and st.sid in seen:
            raise PolicyError(f"Statement[{st.index}].Sid: duplicate Sid {_q(st.sid)} "
                              f"(also used by Statement[{seen[st.sid]}])")
        if st.sid is not None:
            seen[st.sid] = st.index
    return statements


def _parse_statement(raw: Any, index: int, version: str) -> Statement:
    where = f"Statement[{index}]"
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: expected an object, got {_kind(raw)}")
    _check_statement_keys(raw, where)
    sid = _parse_sid(raw.get("Sid"), where)
    effect = _parse_effect(raw.get("Effect"), where)
    action_key = _exactly_one(raw, "Action", "NotAction", where)
    actions = _string_list(raw[action_key], f"{where}.{action_key}")
    for action in actions:
        _check_action(action, f"{where}.{action_key}")
    resource_key = _exactly_one(raw, "Resource", "NotResource", where)
    resources = _string_list(raw[resource_key], f"{where}.{resource_key}")
    templates = tuple(_parse_resource(r, f"{where}.{resource_key}", version) for r in resources)
    conditions = ()
    if "Condition" in raw:
        conditions = _parse_condition(raw["Condition"], f"{where}.Condition", version)
    return Statement(index, sid, effect, actions, action_key == "NotAction", resources,
                     resource_key == "NotResource", conditions, templates)


def _check_statement_keys(raw: dict[str, Any], where: str) -> None:
    for key in raw:
        if key in ("Principal", "NotPrincipal"):
            raise PolicyError(f"{where}: {_q(key)} is not allowed: orgmem policies are identity policies, "
                              f"attached to principals and teams, and apply to whoever they are attached to")
        if key not in _STATEMENT_KEYS:
            raise PolicyError(f"{where}: unknown key {_q(key)}{_suggest(key, _STATEMENT_KEYS)}; "
                              f"allowed: {', '.join(_STATEMENT_KEYS)}")


def _parse_sid(sid: Any, where: str) -> str | None:
    if sid is None:
        return None
    if not isinstance(sid, str) or not _SID.fullmatch(sid):
        raise PolicyError(f"{where}.Sid: {_q(sid)} is not a valid Sid; "
                          f"use 1-128 letters, digits, '_', '-' or '.'")
    return sid


def _parse_effect(effect: Any, where: str) -> str:
    if effect is None:
        raise PolicyError(f'{where}: missing "Effect"; use "Allow" or "Deny"')
    if effect not in ("Allow", "Deny"):
        raise PolicyError(f'{where}.Effect: must be "Allow" or "Deny", got {_q(effect)}')
    return effect


def _exactly_one(raw: dict[str, Any], key: str, negated: str, where: str) -> str:
    """Which of ``key``/``Not<key>`` the statement uses; exactly one is required."""
    if key in raw and negated in raw:
        raise PolicyError(f"{where}: has both {_q(key)} and {_q(negated)}; use one")
    if key not in raw and negated not in raw:
        raise PolicyError(f"{where}: missing {_q(key)} (or {_q(negated)})")
    return key if key in raw else negated


def _string_list(value: Any, where: str) -> tuple[str, ...]:
    """A string or a non-empty list of strings, as AWS allows for Action and Resource."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list):
        raise PolicyError(f"{where}: expected a string or a list of strings, got {_kind(value)}")
    if not value:
        raise PolicyError(f"{where}: empty list; name at least one")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise PolicyError(f"{where}[{i}]: expected a string, got {_kind(item)}")
    return tuple(value)


def _check_action(action: str, where: str) -> None:
    """``*`` or ``service:Pattern`` for a known service, covering at least one catalogued action."""
    if action == "*":
        return
    service, _, name = action.partition(":")
    if not name:
        raise PolicyError(f'{where}: malformed action {_q(action)}; write "service:Action" such as '
                          f'"s3:GetObject", or "*"')
    if service.lower() not in SERVICES:
        hint = "wildcards are not allowed in the service prefix" if "*" in service or "?" in service \
            else f"known services: {', '.join(SERVICES)}"
        raise PolicyError(f"{where}: unknown service {_q(service)} in {_q(action)}; {hint}")
    if not matching_actions(action):
        if "*" in action or "?" in action:
            raise PolicyError(f"{where}: {_q(action)} matches no known action")
        known = [f"{service}:{n}" for n in SERVICES[service.lower()].actions]
        raise PolicyError(f"{where}: unknown action {_q(action)}{_suggest(action, known)}")


def _parse_resource(resource: str, where: str, version: str) -> Template:
    """``*`` or an ARN of a known service (with wildcards and variables after the ``:::``)."""
    if resource != "*" and not any(
        resource.startswith(s.arn_prefix) and len(resource) > len(s.arn_prefix) for s in SERVICES.values()
    ):
        services = ", ".join(p for p in SERVICES if p != "s3")
        raise PolicyError(f'{where}: malformed resource {_q(resource)}; use "*", "arn:aws:s3:::BUCKET[/KEY]" '
                          f'or "arn:orgmem:SERVICE:::PATH" with SERVICE one of {services}')
    return _template(resource, where, version)


def _template(text: str, where: str, version: str) -> Template:
    """Split ``text`` at its ``${...}`` variables, refusing unknown or unterminated ones."""
    parts: list[tuple[str, str]] = []
    pos = 0
    for m in _VARIABLE.finditer(text):
        _add_text(parts, text[pos:m.start()], text, where)
        name = m.group(1)
        if name in _ESCAPES:
            parts.append(("char", name))
        elif name.lower() in VARIABLES:
            parts.append(("var", name.lower()))
        else:
            raise PolicyError(f"{where}: unknown policy variable {_q(m.group(0))} in {_q(text)}; "
                              f"{_VARIABLE_HELP}")
        pos = m.end()
    _add_text(parts, text[pos:], text, where)
    template = Template(text, tuple(parts))
    if template.has_variables and version != "2012-10-17":
        raise PolicyError(f'{where}: policy variables in {_q(text)} need Version "2012-10-17" '
                          f'(under {_q(version)} they would be taken literally)')
    return template


def _add_text(parts: list[tuple[str, str]], chunk: str, text: str, where: str) -> None:
    if "${" in chunk:
        raise PolicyError(f"{where}: unterminated policy variable in {_q(text)}; {_VARIABLE_HELP}")
    if chunk:
        parts.append(("text", chunk))


# ---------------------------------------------------------------------------------------------------------
# Conditions


def _parse_condition(raw: Any, where: str, version: str) -> tuple[ConditionClause, ...]:
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: expected an object of operator: {{key: value}}, got {_kind(raw)}")
    if not raw:
        raise PolicyError(f"{where}: empty; remove it or add an operator")
    clauses = []
    for name, block in raw.items():
        op, if_exists = _parse_operator(name, where)
        here = f"{where}.{name}"
        if not isinstance(block, dict) or not block:
            raise PolicyError(f"{here}: expected a non-empty object of condition key: value(s)")
        seen: set[str] = set()
        for key, value in block.items():
            lowered = _parse_condition_key(key, op, here)
            if lowered in seen:
                raise PolicyError(f"{here}: condition key {_q(key)} given twice")
            seen.add(lowered)
            clauses.append(_parse_clause(name, op, if_exists, lowered, value, f"{here}.{key}", version))
    return tuple(clauses)


def _parse_operator(name: str, where: str) -> tuple[_Op, bool]:
    if name.startswith(("ForAnyValue:", "ForAllValues:")):
        raise PolicyError(f"{where}: set operator {_q(name)} is not supported; a multi-valued key such as "
                          f"orgmem:teams already matches when any of its values matches")
    base, if_exists = (name[: -len("IfExists")], True) if name.endswith("IfExists") else (name, False)
    if base not in OPERATORS:
        raise PolicyError(f"{where}: unknown condition operator {_q(name)}{_suggest(base, OPERATORS)}; "
                          f"known: {', '.join(OPERATORS)} (each optionally ...IfExists except Null)")
    if base == "Null" and if_exists:
        raise PolicyError(f'{where}: "NullIfExists" is not an operator; '
                          f'Null already tests whether a key exists')
    return OPERATORS[base], if_exists


def _parse_condition_key(key: str, op: _Op, where: str) -> str:
    lowered = key.lower()
    if lowered not in CONDITION_KEYS:
        known = [spelling for spelling, _ in CONDITION_KEYS.values()]
        raise PolicyError(f"{where}: unknown condition key {_q(key)}{_suggest(key, known)}; "
                          f"known: {', '.join(known)}")
    spelling, key_type = CONDITION_KEYS[lowered]
    if op.family in ("numeric", "bool", "ip") and key_type != op.family:
        raise PolicyError(f"{where}: {_q(spelling)} is a {key_type} key and cannot be tested "
                          f"with a {op.family} operator")
    return lowered


def _parse_clause(name: str, op: _Op, if_exists: bool, key: str, raw: Any, where: str,
                  version: str) -> ConditionClause:
    values = _condition_values(raw, where)
    parsed = tuple(_parse_condition_value(op, v, where, version) for v in values)
    return ConditionClause(name, key, values, op.family, op.negated, if_exists, parsed, op.compare)


def _condition_values(raw: Any, where: str) -> tuple[str, ...]:
    """One value or a non-empty list; JSON numbers and booleans are taken as their text, as AWS does."""
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise PolicyError(f"{where}: empty list; give at least one value")
    values = []
    for item in items:
        if isinstance(item, bool):
            values.append("true" if item else "false")
        elif isinstance(item, (str, int, float)):
            values.append(item if isinstance(item, str) else json.dumps(item))
        else:
            raise PolicyError(f"{where}: expected a string, number or boolean, got {_kind(item)}")
    return tuple(values)


def _parse_condition_value(op: _Op, value: str, where: str, version: str) -> Any:
    """Check a value against its operator now, so evaluation never meets a bad one."""
    if op.family in ("string", "string-ic", "like"):
        return _template(value, where, version)
    if op.family == "numeric":
        if not _NUMBER.fullmatch(value):
            raise PolicyError(f"{where}: {_q(value)} is not a number")
        return Decimal(value)
    if op.family == "ip":
        try:
            return ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise PolicyError(f"{where}: {_q(value)} is not an IP address or CIDR block") from None
    if value.lower() not in ("true", "false"):
        raise PolicyError(f'{where}: {_q(value)} must be "true" or "false"')
    return value.lower()


# ---------------------------------------------------------------------------------------------------------
# Compiled policies and decisions


@dataclass(frozen=True)
class StatementRef:
    """Which statement of which attached policy."""

    policy: str
    index: int
    sid: str | None
    effect: str

    @property
    def label(self) -> str:
        """The short audit form: ``policy#Sid``, or ``policy#index`` for a statement without a Sid."""
        return f"{self.policy}#{self.sid if self.sid is not None else self.index}"

    def describe(self) -> str:
        name = f'"{self.sid}" (#{self.index})' if self.sid is not None else f"#{self.index}"
        return f'statement {name} of policy "{self.policy}"'


@dataclass(frozen=True)
class Decision:
    allowed: bool
    decision: str  # "allow" | "explicit-deny" | "implicit-deny"
    #: the statement that decided; None for an implicit deny
    statement: StatementRef | None
    #: every statement whose action, resource and condition matched
    matched: list[StatementRef]
    explanation: str
    #: which kind of policy decided: "identity" (attached ones) or "session" (sandbox credentials')
    source: str = "identity"

    @property
    def reason(self) -> str:
        """The short form for audit records."""
        if self.statement is not None:
            return self.statement.label
        return "implicit-deny (session policy)" if self.source == "session" else "implicit-deny"


class _Test:
    """One compiled condition clause, with its values already substituted for the principal."""

    __slots__ = ("key", "match", "negated", "if_exists", "null")

    def __init__(self, clause: ConditionClause, username: str, teams: Sequence[str]) -> None:
        self.key = clause.key
        self.negated = clause.negated
        self.if_exists = clause.if_exists
        #: for Null: (result when the key is absent, result when present)
        self.null = ("true" in clause.parsed, "false" in clause.parsed) if clause.family == "null" else None
        self.match = _matcher(clause, username, teams)

    def holds(self, values: tuple[str, ...] | None) -> bool:
        """AWS semantics: any request value matching any policy value; absent keys fail unless negated."""
        if self.null is not None:
            return self.null[0] if values is None else self.null[1]
        if values is None:
            return self.negated or self.if_exists
        return any(map(self.match, values)) != self.negated


def _matcher(clause: ConditionClause, username: str, teams: Sequence[str]) -> Callable[[str], bool]:
    """The positive test for one request value (negation is applied by _Test)."""
    family = clause.family
    if family in ("string", "string-ic"):
        wanted = {s for t in clause.parsed for s in t.literals(username, teams)}
        if family == "string":
            return frozenset(wanted).__contains__
        folded = frozenset(s.casefold() for s in wanted)
        return lambda v: v.casefold() in folded
    if family == "like":
        regex = _alternation(s for t in clause.parsed for s in t.regex_sources(username, teams))
        return lambda v: regex.fullmatch(v) is not None
    if family == "numeric":
        return _numeric_matcher(clause.parsed, clause.compare)
    if family == "ip":
        networks = clause.parsed
        return lambda v: (ip := _ip(v)) is not None and any(ip in n for n in networks)
    booleans = frozenset(clause.parsed)
    return lambda v: v.lower() in booleans


def _numeric_matcher(numbers: tuple[Decimal, ...], compare: Any) -> Callable[[str], bool]:
    """Request value ``compare`` any policy value; a request value that is not a number never matches."""
    def match(value: str) -> bool:
        if _NUMBER.fullmatch(value) is None:
            return False
        number = Decimal(value)
        return any(compare(number, n) for n in numbers)
    return match


def _ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The request's address; an IPv4-mapped IPv6 address counts as the IPv4 one."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped or ip


class _Compiled:
    """A statement ready for evaluation: one action regex, one resource regex, compiled conditions."""

    __slots__ = ("ref", "deny", "action", "not_action", "resource", "not_resource", "tests", "explanation",
                 "globs")

    def __init__(self, ref: StatementRef, st: Statement, username: str, teams: Sequence[str]) -> None:
        self.ref = ref
        self.deny = st.effect == "Deny"
        self.action = _alternation(wildcard_source(a.lower()) for a in st.actions)
        self.not_action = st.not_action
        self.resource = _alternation(
            s for t in st.resource_templates for s in t.regex_sources(username, teams))
        self.not_resource = st.not_resource
        self.globs = tuple(g for t in st.resource_templates for g in t.globs(username, teams))
        self.tests = tuple(_Test(c, username, teams) for c in st.conditions)
        verb = "Denied explicitly by" if self.deny else "Allowed by"
        self.explanation = f"{verb} {ref.describe()}."


def _alternation(sources: Iterable[str]) -> re.Pattern[str]:
    """One regex for a list of patterns; a list that expanded to nothing matches nothing."""
    return re.compile("|".join(f"(?:{s})" for s in sources) or "(?!)", re.DOTALL)


class PolicySet:
    """The policies attached to one principal, compiled for that principal's name and teams."""

    def __init__(self, statements: tuple[_Compiled, ...], username: str, teams: tuple[str, ...],
                 policy_names: tuple[str, ...]) -> None:
        self._statements = statements
        self.username = username
        self.teams = teams
        self.policy_names = policy_names
        self._fixed: dict[str, tuple[str, ...] | None] = {
            "aws:username": (username,), "orgmem:teams": teams or None}
        #: action as given -> the statements whose Action/NotAction covers it
        self._by_action: dict[str, tuple[_Compiled, ...]] = {}

    @classmethod
    def compile(cls, policies: Sequence[tuple[str, PolicyDocument]], username: str,
                teams: Sequence[str]) -> PolicySet:
        """Substitute the principal's variables and build every regex once, for fast evaluation."""
        teams = tuple(dict.fromkeys(teams))
        compiled = tuple(
            _Compiled(StatementRef(name, st.index, st.sid, st.effect), st, username, teams)
            for name, doc in policies for st in doc.statements
        )
        return cls(compiled, username, teams, tuple(dict.fromkeys(name for name, _ in policies)))

    def evaluate(self, action: str, resource: str,
                 context: Mapping[str, str | Sequence[str]] | None = None) -> Decision:
        """Decide one request: explicit Deny wins, then any Allow, else deny by default.

        ``context`` keys are lowercase; aws:username and orgmem:teams come from the principal.
        """
        candidates = self._by_action.get(action)
        if candidates is None:
            candidates = self._candidates(action)
        context = context or {}
        matched = [st for st in candidates
                   if (st.resource.fullmatch(resource) is not None) != st.not_resource
                   and (not st.tests or all(t.holds(self._values(t.key, context)) for t in st.tests))]
        refs = [st.ref for st in matched]
        for st in matched:
            if st.deny:
                return Decision(False, "explicit-deny", st.ref, refs, st.explanation)
        if matched:
            return Decision(True, "allow", matched[0].ref, refs, matched[0].explanation)
        return Decision(False, "implicit-deny", None, refs, self._implicit(action, resource))

    def denials(self, action: str, context: Mapping[str, str | Sequence[str]] | None = None
                ) -> list[tuple[tuple[Glob, ...], bool]]:
        """What an explicit Deny takes from ``action`` in this request's ``context``, whatever the
        resource: ``(patterns, not_resource)`` per Deny statement that covers the action and
        whose conditions hold. Kept per statement: a NotResource Deny takes all but the union
        of its patterns (taking all but each one would leave only what they all match). A search
        turns them into exclusions, so a Deny inside a granted scope leaves no trace in counts."""
        return [(st.globs, st.not_resource) for st in self._applying(action, context, deny=True)]

    def allowances(self, action: str, context: Mapping[str, str | Sequence[str]] | None = None
                   ) -> list[tuple[Glob, bool]]:
        """Like :meth:`denials`, for the Allow statements: what ``action`` may reach at most."""
        return self._patterns(action, context, deny=False)

    def allowance_sets(self, action: str, context: Mapping[str, str | Sequence[str]] | None = None
                       ) -> list[list[tuple[Glob, bool]]]:
        """The Allows of each policy set that must all allow (one set here)."""
        return [self.allowances(action, context)]

    def _patterns(self, action: str, context: Mapping[str, str | Sequence[str]] | None,
                  deny: bool) -> list[tuple[Glob, bool]]:
        return [(glob, st.not_resource) for st in self._applying(action, context, deny) for glob in st.globs]

    def _applying(self, action: str, context: Mapping[str, str | Sequence[str]] | None,
                  deny: bool) -> list[_Compiled]:
        """The Deny (or Allow) statements covering ``action`` whose conditions hold in ``context``."""
        context = context or {}
        return [st for st in self._by_action.get(action) or self._candidates(action)
                if st.deny == deny and (not st.tests
                                        or all(t.holds(self._values(t.key, context)) for t in st.tests))]

    def _candidates(self, action: str) -> tuple[_Compiled, ...]:
        """Statements whose Action/NotAction covers ``action``; cached, so only known actions are accepted."""
        if not is_known_action(action):
            raise ValueError(f"unknown action {action!r}; add it to gateway/iam/actions.py")
        lowered = action.lower()
        found = tuple(st for st in self._statements
                      if (st.action.fullmatch(lowered) is None) == st.not_action)
        self._by_action[action] = found
        return found

    def _values(self, key: str, context: Mapping[str, str | Sequence[str]]) -> tuple[str, ...] | None:
        """A request key's values, None when absent (an empty list counts as absent)."""
        if key in self._fixed:
            return self._fixed[key]
        value = context.get(key)
        if value is None or isinstance(value, str):
            return None if value is None else (value,)
        return tuple(value) or None

    def _implicit(self, action: str, resource: str) -> str:
        if not self.policy_names:
            return (f"Denied: {self.username} has no policies attached, "
                    f"so nothing allows {action} on {resource}.")
        return (f"Denied: no statement of the policies attached to {self.username} "
                f"({', '.join(self.policy_names)}) allows {action} on {resource}.")


class SessionPolicySet:
    """The rights of sandbox credentials: what the principal's own policies allow AND what
    the session policy allows, as with AWS STS session policies.

    A session policy can only narrow: an explicit Deny in either set denies, and an action
    needs an Allow from both. The interface is PolicySet's, so the authorizer need not know.
    """

    def __init__(self, identity: PolicySet, session: PolicySet, label: str) -> None:
        self.identity = identity
        self.session = session
        self.label = label

    def denials(self, action: str, context: Mapping[str, str | Sequence[str]] | None = None
                ) -> list[tuple[tuple[Glob, ...], bool]]:
        return self.identity.denials(action, context) + self.session.denials(action, context)

    def allowance_sets(self, action: str, context: Mapping[str, str | Sequence[str]] | None = None
                       ) -> list[list[tuple[Glob, bool]]]:
        """The principal's Allows and the session policy's: an action needs both."""
        return [self.identity.allowances(action, context), self.session.allowances(action, context)]

    def evaluate(self, action: str, resource: str,
                 context: Mapping[str, str | Sequence[str]] | None = None) -> Decision:
        mine = self.identity.evaluate(action, resource, context)
        theirs = self.session.evaluate(action, resource, context)
        matched = mine.matched + theirs.matched
        if mine.decision == "explicit-deny":
            return Decision(False, "explicit-deny", mine.statement, matched, mine.explanation)
        if theirs.decision == "explicit-deny":
            return Decision(False, "explicit-deny", theirs.statement, matched, theirs.explanation,
                            "session")
        if not mine.allowed:
            return Decision(False, "implicit-deny", None, matched, mine.explanation)
        if not theirs.allowed:
            return Decision(False, "implicit-deny", None, matched,
                            f"Denied: the session policy of these sandbox credentials ({self.label}) "
                            f"does not allow {action} on {resource}.", "session")
        return Decision(True, "allow", mine.statement, matched,
                        f"{mine.explanation[:-1]}, within the session policy "
                        f"({theirs.statement.describe()}).")


def expand_variables(text: str, username: str, teams: Sequence[str]) -> list[str]:
    """What a resource or condition value means for one principal, for display (e.g. in a simulator).

    ``${orgmem:teams}`` gives one string per team, so the result may be empty.
    """
    return _template(text, "value", "2012-10-17").literals(username, tuple(dict.fromkeys(teams)))


# ---------------------------------------------------------------------------------------------------------
# Messages


def _q(value: Any) -> str:
    """A value quoted as JSON, so the offending text appears exactly and unambiguously."""
    return json.dumps(value, ensure_ascii=False)


def _kind(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    kinds = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


def _suggest(word: str, choices: Iterable[str]) -> str:
    """A 'did you mean' hint for near-miss spellings, compared without case."""
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.75)
    return f" (did you mean {_q(by_lower[close[0]])}?)" if close else ""
