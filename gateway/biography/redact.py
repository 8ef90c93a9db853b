"""Secret redaction for biography events, run on every event before anything is stored.

A biography is kept for years and read by many agents, so a credential that an agent pasted
into a prompt or that a tool printed must never reach it. Each secret found in an event's
content or data becomes ``[REDACTED:<type>:<hash8>]``, where ``hash8`` is the first 8 hex
digits of HMAC-SHA256(deployment key, secret): the same secret always gets the same marker
within one deployment (so readers can see "the same token again"), but nobody without the key
can confirm a guessed secret from its marker.

What is detected (``TYPES`` lists each type with an example shape):

* provider tokens with a recognisable prefix: AWS access key ids, GitHub, GitLab, Slack
  (tokens and webhook URLs), Stripe, OpenAI, Anthropic, Google API keys;
* JWTs (three base64url segments whose header decodes to a JSON object with ``alg``/``typ``);
* whole ``-----BEGIN ... PRIVATE KEY-----`` blocks, also with ``\\n`` escapes or truncated;
* the password in ``scheme://user:password@host`` (user and host stay readable);
* assignments to credential-named keys (``password = ...``, ``"api_key": ...``,
  ``Authorization: Bearer ...``, ``--token ...``) whose value looks like a real credential:
  long enough, not a placeholder or code, several character classes, enough Shannon entropy.
  A 40-character AWS secret access key in such an assignment gets its own type;
* exact values registered with ``Redactor.add_values`` (vault secrets), type ``vault``.

Why literal prefilters and one walk rather than one big alternation: CPython's ``re`` is a
backtracking engine, so a 15-branch alternation tries every branch at every position and
scans at ~30 MB/s, while a pattern that starts with a literal is found by a tight C loop at
~2 GB/s. So every rule starts with a short literal (``AKIA``, ``ghp_``, ``eyJ``, ``://``,
``token`` ...) found by a cheap scanner; the rule's full pattern and its checks run only at
those positions, and one walk over the candidates, in text order, produces the replacements.
A string without any trigger costs one ``lower()`` and ~18 literal searches. Numbers:
``bench/redact_speed.py``.

Deliberately not flagged, so that ordinary prose and code stay clean: bare high-entropy
strings with no keyword or provider prefix (git SHAs, sha256 digests, UUIDs, base64 data
URIs), values that are code (``os.environ["X"]``, ``get_token()``, ``self.token``),
references and placeholders (``${TOKEN}``, ``$TOKEN``, ``<your-token>``, ``xxxx``,
``changeme``, ``...``), plain words and numbers (``correct horse battery staple``), values
under 8 characters, and paging cursors (``NextToken``, ``ContinuationToken``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import re
import threading
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

#: Every type that can appear in a marker, with an (obviously fake) example of what it catches.
TYPES: dict[str, str] = {
    "aws_access_key": "AKIA… / ASIA… (20 characters)",
    "aws_secret_key": "aws_secret_access_key = <40 base64 characters>",
    "github_token": "ghp_… gho_… ghu_… ghs_… ghr_… github_pat_…",
    "gitlab_token": "glpat-… (also gldt-, glrt-, glptt-)",
    "slack_token": "xoxb-… xoxp-… xapp-…, https://hooks.slack.com/services/…",
    "stripe_key": "sk_live_… rk_live_… sk_test_… rk_test_…",
    "openai_key": "sk-… sk-proj-… sk-svcacct-…",
    "anthropic_key": "sk-ant-…",
    "google_api_key": "AIza… (39 characters)",
    "jwt": "eyJ….eyJ….<signature>",
    "private_key": "-----BEGIN … PRIVATE KEY----- … -----END … PRIVATE KEY-----",
    "url_password": "scheme://user:<password>@host (only the password is replaced)",
    "secret_assignment": 'password = "…", "api_key": "…", Authorization: Bearer …, --token …',
    "vault": "an exact value registered with Redactor.add_values",
}
#: The type names, in the order of ``TYPES``.
RULE_NAMES: tuple[str, ...] = tuple(TYPES)

#: A marker as this module writes it; text inside a marker is never scanned again.
MARKER_RE = re.compile(r"\[REDACTED:[a-z_]+:[0-9a-f]{8}\]")
#: Shortest exact value ``add_values`` accepts: shorter ones would redact ordinary words.
MIN_VALUE_LEN = 8

#: (start, end, type) of one replacement inside the scanned string.
Span = tuple[int, int, str]
#: A rule's check: given its match, the replacements, or None when the candidate is rejected.
Check = Callable[[re.Match[str]], "list[Span] | None"]


# --- value heuristics -----------------------------------------------------------------------

_PLACEHOLDER_WORDS = (
    "changeme", "change_me", "change-me", "example", "placeholder", "redacted", "dummy",
    "sample", "your", "xxxx", "****", "....", "…", "1234", "abcd", "qwerty", "password",
    "passwd", "secret", "fake", "todo", "fixme", "replace", "insert",
)  # fmt: skip
# ${X}, $X, $(cmd), %X%, %s, %(x)s, {{ x }}, {x}, #{x}: references, not values.
_REFERENCE = re.compile(r"\$\{.*|\$\(.*|\$[A-Za-z_]\w*|%\w+%|%s|%\(\w+\)s|\{\{.*|\{[\w.]*\}|#\{.*")
# Dotted names, calls and indexing: code, not a value.
_CODE = re.compile(r"[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)+.*|[A-Za-z_$][\w$]*[(\[].*", re.S)
_PATH = re.compile(r"(?:\.{1,2}/|~/|/|[A-Za-z]:\\).*|.*://.*", re.S)
# Separators inside plain-word values ("prod-db-2024", "user=jane", "a.b@c.d").
_SEPARATORS = re.compile(r"[-_./:@=,+\s]+")
_AUTH_SCHEME = re.compile(r"(?i)(bearer|basic|token|bot)[ \t]+")
_AWS_SECRET = re.compile(r"[A-Za-z0-9/+]{40}")
_AWS_SECRET_KEY = re.compile(r"(?i)aws.?secret|secret.?access.?key")


def shannon_entropy(value: str) -> float:
    """Bits per character of ``value`` (0 for an empty string)."""
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values()) if n else 0.0


def is_placeholder(value: str) -> bool:
    """True for references, templates, masks and example values that are not secrets."""
    v = value.strip()
    if not v or v[0] in "{[(<" or len(set(v)) <= 2 or "${" in v or "{{" in v:
        return True
    if MARKER_RE.search(v) or _REFERENCE.fullmatch(v):
        return True
    low = v.lower()
    return any(word in low for word in _PLACEHOLDER_WORDS)


def _wordish(value: str) -> bool:
    """True when every separator-delimited part is letters only or digits only."""
    for part in _SEPARATORS.split(value):
        if part and not ((part.isalpha() and part.isascii()) or part.isdigit()):
            return False
    return True


def _char_classes(value: str) -> int:
    """How many of lower, upper, digit and (non-separator) symbol ``value`` uses."""
    symbol = any(not (c.isalnum() or _SEPARATORS.fullmatch(c)) for c in value)
    return (
        any(c.islower() for c in value)
        + any(c.isupper() for c in value)
        + any(c.isdigit() for c in value)
        + symbol
    )


def credential_like(value: str) -> bool:
    """Whether an assigned value looks like a real credential rather than code or prose.

    Needs 8+ characters, no placeholder/reference/code/path shape, not only plain words and
    numbers, three character classes (two from 16 characters on, which admits hex and base64
    tokens) and Shannon entropy of at least min(3.0, log2(len) - 0.5) bits per character.
    """
    v = value.strip()
    if not 8 <= len(v) <= 4096 or _CODE.fullmatch(v) or _PATH.fullmatch(v):
        return False
    if _wordish(v) or is_placeholder(v):
        return False
    if _char_classes(v) < (2 if len(v) >= 16 else 3):
        return False
    return shannon_entropy(v) >= min(3.0, math.log2(len(v)) - 0.5)


def _basic_credential(value: str) -> bool:
    """True when ``value`` is base64 of ``user:password`` (HTTP Basic)."""
    try:
        raw = base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in raw and len(raw) >= 3 and not is_placeholder(value)


def _assigned_kind(key: str, value: str, basic: bool) -> str | None:
    """The type for a value assigned to credential key ``key``, or None if it is no secret."""
    if basic:
        return "secret_assignment" if _basic_credential(value) else None
    if _AWS_SECRET_KEY.search(key) and _AWS_SECRET.fullmatch(value) and not is_placeholder(value):
        return "aws_secret_key"
    return "secret_assignment" if credential_like(value) else None


def assigned_value_spans(key: str, text: str, start: int, end: int) -> list[Span] | None:
    """Spans to redact in ``text[start:end]``, the value assigned to credential key ``key``.

    An HTTP auth scheme word (``Bearer``/``Basic``/``token``) stays readable, and provider
    tokens inside an accepted value keep their own, more precise type. None when the value
    is not a secret (the provider rules still see it: a rejected candidate takes nothing).
    """
    scheme = _AUTH_SCHEME.match(text, start, end)
    vstart = scheme.end() if scheme else start
    basic = bool(scheme) and scheme.group(1).lower() == "basic"  # type: ignore[union-attr]
    kind = _assigned_kind(key, text[vstart:end], basic)
    if kind is None:
        return None
    inner = find_spans(text[vstart:end], nested_only=True)
    if inner:
        return [(s + vstart, e + vstart, k) for s, e, k in inner]
    return [(vstart, end, kind)]


# --- rules ----------------------------------------------------------------------------------

# Credential-named keys: the keyword may sit anywhere in a longer name (DB_PASSWORD,
# clientSecret, X-Api-Key), but only these suffixes may follow it, so token_count,
# max_tokens, password_field, secret_name, author and tokenizer are not keys.
_KEYWORD = (
    r"passw(?:or)?d|passphrase|pwd|secret|token|api[_.-]?key|access[_.-]?key"
    r"|auth(?:orization)?|credentials?"
)
_SUFFIX = r"(?:[_.-]?(?:access[_.-]?)?(?:key|token|secret|value|string|str|pass(?:word)?|phrase))?"
_KEY_END = r"(?![A-Za-z0-9_])"
_OPERATOR = r"\\?[\"']?[ \t]*(?::=|=>|[:=])"
# The value: \"json in json\", "double", 'single', `backtick`, or bare up to a delimiter
# (a bare value stops at & only when a query-string name= follows).
_VALUE = (
    r"[ \t]*(?:\\\"(?P<ev>(?:[^\"\\\n]|\\[^\"\n]){0,4096})\\\""
    r"|\"(?P<dv>(?:[^\"\\\n]|\\.){0,4096})\""
    r"|'(?P<sv>(?:[^'\\\n]|\\.){0,4096})'"
    r"|`(?P<bv>[^`\n]{0,4096})`"
    r"|(?P<scheme>(?i:bearer|basic|token|bot)[ \t]+)?(?P<v>(?:[^\s\"'`,;&]|&(?![\w.-]+=)){1,4096}))"
)
_VALUE_GROUPS = ("ev", "dv", "sv", "bv", "v")
_KEY_PATTERN = re.compile(rf"(?:{_KEYWORD}){_SUFFIX}$", re.I)
# Opaque paging cursors are named like tokens but protect nothing.
_PAGING_KEY = re.compile(r"(?i)(?:next|continuation|page|pagination|cursor|sync|resume)[_.-]?token")


def _key_name(text: str, start: int, end: int) -> str:
    """The whole identifier a keyword sits in (``AWS_SECRET_ACCESS_KEY``, ``NextToken``)."""
    i = start
    while i > 0 and start - i < 64 and (text[i - 1].isalnum() or text[i - 1] in "_.-"):
        i -= 1
    return text[i:end]


def _check_assignment(m: re.Match[str]) -> list[Span] | None:
    """``key <op> value``: redact the value when it looks like a credential."""
    name = _key_name(m.string, m.start(), m.end("key"))
    if _PAGING_KEY.search(name):
        return None
    g = next(g for g in _VALUE_GROUPS if m.group(g) is not None)
    start = m.start("scheme") if g == "v" and m.group("scheme") else m.start(g)
    return assigned_value_spans(name, m.string, start, m.end(g))


def _check_marker(m: re.Match[str]) -> list[Span] | None:
    """An existing marker: keep it and skip everything inside it (idempotence)."""
    return []


def _check_private_key(m: re.Match[str]) -> list[Span] | None:
    """A PEM block with a base64 body; without an END line, the header plus its body."""
    closed = m.group("pk_end") is not None
    body = m.group("pk_body") if closed else m.group("pk_tail")
    if not body or not re.search(r"[A-Za-z0-9+/=]{40}", body):
        return None
    return [(m.start(), m.end() if closed else m.end("pk_tail"), "private_key")]


def _check_url_password(m: re.Match[str]) -> list[Span] | None:
    """Only the password of ``scheme://user:password@host``; placeholders stay."""
    pw = m.group("pw")
    if is_placeholder(pw) or pw.lower() in ("pass", "pw", "pwd"):
        return None
    return [(m.start("pw"), m.end("pw"), "url_password")]


def _check_jwt(m: re.Match[str]) -> list[Span] | None:
    """A JWT only if its header decodes to a JSON object naming ``alg`` or ``typ``."""
    head = m.group("jwt_head")
    try:
        raw = base64.urlsafe_b64decode(head + "=" * (-len(head) % 4))
    except (binascii.Error, ValueError):
        return None
    if raw.startswith(b"{") and (b'"alg"' in raw or b'"typ"' in raw):
        return [(m.start(), m.end(), "jwt")]
    return None


def _random_looking(s: str) -> bool:
    """Random tokens mix digits, lower and upper case; words and identifiers rarely do."""
    mixed = any(c.isdigit() for c in s) and any(c.islower() for c in s) and any(c.isupper() for c in s)
    return mixed and shannon_entropy(s) >= 3.5


def _check_sk(m: re.Match[str]) -> list[Span] | None:
    """``sk-``: Anthropic when ``sk-ant-``, else OpenAI; the random part must look random."""
    body = m.group("sk_body")
    if m.group("sk_ant"):
        ok = any(c.isdigit() for c in body) and shannon_entropy(body) >= 3.5
        return [(m.start(), m.end(), "anthropic_key")] if ok else None
    return [(m.start(), m.end(), "openai_key")] if _random_looking(body) else None


def _whole(kind: str, need_digit: bool = False) -> Check:
    """A check that redacts the whole match as ``kind`` (optionally only if it has a digit)."""

    def check(m: re.Match[str]) -> list[Span] | None:
        if need_digit and not any(c.isdigit() for c in m.group()):
            return None
        return [(m.start(), m.end(), kind)]

    return check


def _group(kind: str, group: str) -> Check:
    """A check that redacts only ``group`` of the match as ``kind``."""
    return lambda m: [(m.start(group), m.end(group), kind)]


@dataclass(frozen=True)
class Rule:
    """One detector: a cheap literal-prefixed scanner, then a full pattern checked in place.

    ``scanner`` runs over the whole string (over its lower-cased copy when ``lowered``); at
    each hit ``pattern.match`` is tried on the original text, and ``check`` decides what, if
    anything, is replaced. ``nested`` rules also run inside an accepted assignment value, to
    give ``token = "ghp_…"`` the type ``github_token`` rather than ``secret_assignment``.
    """

    name: str
    scanner: re.Pattern[str]
    pattern: re.Pattern[str]
    check: Check
    lowered: bool = False
    nested: bool = True
    back: int = 0  # the pattern starts this many characters before the scanner's hit


def _rule(name: str, scanner: str, pattern: str, check: Check, back: int = 0) -> Rule:
    return Rule(name, re.compile(scanner), re.compile(pattern), check, back=back)


def _keyword_rule(scan_keyword: str) -> Rule:
    """An assignment rule whose scanner (over lowered text) starts at one keyword family."""
    scanner = rf"(?:{scan_keyword}){_SUFFIX}{_KEY_END}{_OPERATOR}"
    pattern = rf"(?P<key>(?i:{_KEYWORD}){_SUFFIX}){_KEY_END}{_OPERATOR}{_VALUE}"
    return Rule(
        "secret_assignment", re.compile(scanner), re.compile(pattern, re.I), _check_assignment,
        lowered=True, nested=False,
    )  # fmt: skip


_NB = r"(?<![A-Za-z0-9_-])"  # a token starts here, not inside a longer word
_NA = r"(?![A-Za-z0-9_-])"  # and ends here
_PEM_END = r"-----END[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----"

#: All rules. At equal positions the earlier rule is tried first (markers before anything).
RULES: tuple[Rule, ...] = (
    _rule("marker", r"\[REDACTED:", MARKER_RE.pattern, _check_marker),
    _rule(
        "private_key",
        r"-----BEGIN",
        r"-----BEGIN[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----"
        rf"(?:(?P<pk_body>[\s\S]{{0,65536}}?)(?P<pk_end>{_PEM_END})"
        r"|(?P<pk_tail>(?:\s|\\[nr]|[A-Za-z0-9+/=:,-]){0,65536}))",
        _check_private_key,
    ),
    _rule(
        "aws_access_key",
        r"A(?:KIA|SIA)",
        r"(?<![A-Za-z0-9])A(?:KIA|SIA)[A-Z0-9]{16}(?![A-Za-z0-9])",
        _whole("aws_access_key"),
    ),
    _rule(
        "github_token",
        r"g(?:h[pousr]_|ithub_pat_)",
        _NB + r"(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{36,251})(?![A-Za-z0-9_])",
        _whole("github_token"),
    ),
    _rule(
        "gitlab_token",
        r"gl(?:pat|dt|rt|ptt)-",
        _NB + r"gl(?:pat|dt|rt|ptt)-[A-Za-z0-9_-]{20,}(?:\.[A-Za-z0-9_-]+)*" + _NA,
        _whole("gitlab_token", need_digit=True),
    ),
    _rule(
        "slack_token",
        r"x(?:ox[abeoprs]|app)-",
        _NB + r"(?:xox[abeoprs]-[A-Za-z0-9-]{10,250}|xapp-\d-[A-Za-z0-9-]{10,250})" + _NA,
        _whole("slack_token", need_digit=True),
    ),
    _rule(
        "slack_webhook",
        r"hooks\.slack\.com/",
        r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<hook>[A-Za-z0-9_/+-]{20,})",
        _group("slack_token", "hook"),
    ),
    _rule(
        "stripe_key",
        r"k_(?:live|test)_",  # one literal prefix (fast); back up 1 to the "s"/"r"
        r"(?<![A-Za-z0-9_])[sr]k_(?:live|test)_[A-Za-z0-9]{10,247}(?![A-Za-z0-9_])",
        _whole("stripe_key", need_digit=True),
        back=1,
    ),
    _rule(
        "sk_key",
        r"sk-",
        _NB + r"sk-(?:(?P<sk_ant>ant-)|(?:proj|svcacct|admin)-)?(?P<sk_body>[A-Za-z0-9_-]{20,})" + _NA,
        _check_sk,
    ),
    _rule("google_api_key", r"AIza", _NB + r"AIza[0-9A-Za-z_-]{35}" + _NA, _whole("google_api_key")),
    _rule(
        "jwt",
        r"eyJ",
        _NB + r"(?P<jwt_head>eyJ[A-Za-z0-9_-]{8,})\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*" + _NA,
        _check_jwt,
    ),
    _rule(
        "url_password",
        r"://",
        r"(?<=[A-Za-z0-9])://[^\s:/?#@\"'<>\[\]{}]{0,256}:(?P<pw>[^\s/?#@\"'<>]{1,512})@(?=[A-Za-z0-9\[])",
        _check_url_password,
    ),
    _keyword_rule(r"p(?:ass(?:w(?:or)?d|phrase)|wd)"),
    _keyword_rule(r"secret"),
    _keyword_rule(r"token"),
    _keyword_rule(r"a(?:pi[_.-]?key|ccess[_.-]?key|uth(?:orization)?)"),
    _keyword_rule(r"credentials?"),
    # --password VALUE / --api-key VALUE on a command line (the = form is an assignment).
    Rule(
        "secret_assignment",
        re.compile(rf"--(?:[a-z0-9]+-)*?(?:{_KEYWORD}){_SUFFIX}[ \t]+"),
        re.compile(rf"--(?:[A-Za-z0-9]+-)*?(?P<key>(?i:{_KEYWORD}){_SUFFIX})[ \t]+{_VALUE}", re.I),
        _check_assignment,
        lowered=True,
        nested=False,
    ),
)
_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def _lowered(text: str) -> str:
    """A lower-cased copy with the same length, so positions carry over."""
    low = text.lower()
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


# (search, finditer, lowered, back, rule index) per rule, bound once: _candidates runs for
# every string, and for short strings this loop, not the searching, is most of the cost.
_SCANNERS = tuple((r.scanner.search, r.scanner.finditer, r.lowered, r.back, i) for i, r in enumerate(RULES))
_NESTED_SCANNERS = tuple(s for s in _SCANNERS if RULES[s[4]].nested)


def _candidates(text: str, nested_only: bool) -> list[tuple[int, int]]:
    """Sorted (position, rule index) pairs where a rule's literal prefix occurs."""
    found: list[tuple[int, int]] = []
    low = _lowered(text)
    for search, finditer, lowered, back, i in _NESTED_SCANNERS if nested_only else _SCANNERS:
        src = low if lowered else text
        first = search(src)
        if first is not None:
            found.append((first.start() - back, i))
            found += [(m.start() - back, i) for m in finditer(src, first.end())]
    found.sort()
    return found


def find_spans(text: str, nested_only: bool = False) -> list[Span]:
    """Every secret in ``text`` as sorted, non-overlapping (start, end, type) spans.

    One walk over the candidates in text order: a candidate inside a match already taken
    (or inside an existing marker) is skipped; a rejected candidate takes nothing.
    """
    spans: list[Span] = []
    taken = 0
    for pos, i in _candidates(text, nested_only):
        if pos < taken:
            continue
        rule = RULES[i]
        m = rule.pattern.match(text, pos)
        found = None if m is None else rule.check(m)
        if found is None:
            continue
        spans.extend(found)
        taken = max(m.end(), found[-1][1]) if found else m.end()  # type: ignore[union-attr]
    return spans


# --- the redactor ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Values:
    """An immutable snapshot of the exact values to redact, swapped whole on change."""

    values: tuple[str, ...] = ()  # longest first
    pattern: re.Pattern[str] | None = None


def _values_pattern(values: tuple[str, ...]) -> re.Pattern[str]:
    """Existing markers first (kept as they are), then the values, longest first."""
    alternatives = "|".join(re.escape(v) for v in values)
    return re.compile(rf"(?P<marker>{MARKER_RE.pattern})|{alternatives}")


class Redactor:
    """Replaces secrets with ``[REDACTED:<type>:<hash8>]`` markers; safe to share across threads.

    ``key`` is the per-deployment HMAC key: the same secret gives the same marker under one
    key and unrelated markers under another. Nothing here logs or returns a secret value.
    """

    def __init__(self, key: bytes) -> None:
        if not key:
            raise ValueError("redaction key must not be empty")
        self._key = bytes(key)
        self._lock = threading.Lock()
        self._values = _Values()

    def marker(self, kind: str, secret: str) -> str:
        """The marker that replaces ``secret`` found as ``kind``."""
        digest = hmac.new(self._key, secret.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return f"[REDACTED:{kind}:{digest.hexdigest()[:8]}]"

    def add_values(self, values: Iterable[str]) -> None:
        """Redact these exact values (type ``vault``) wherever they appear from now on.

        Values shorter than ``MIN_VALUE_LEN`` are ignored. The matcher is rebuilt under a
        lock and swapped in whole, so a concurrent scan sees either the old or the new set.
        """
        new = {v for v in values if isinstance(v, str) and len(v) >= MIN_VALUE_LEN}
        with self._lock:
            current = set(self._values.values)
            if new <= current:
                return
            merged = tuple(sorted(new | current, key=lambda v: (-len(v), v)))
            self._values = _Values(merged, _values_pattern(merged))

    def redact_text(self, text: str) -> tuple[str, int]:
        """``text`` with every secret replaced by its marker, and the number replaced."""
        text, hits = self._redact_values(text)
        spans = find_spans(text)
        if not spans:
            return text, hits
        return self._apply(text, spans), hits + len(spans)

    def redact_json(self, value: object) -> tuple[object, int]:
        """A copy of a JSON-like value with secrets in its strings redacted, and the count.

        Dict keys are kept; a string under a credential-named key (``"password"``,
        ``"api_key"``, ``"Authorization"`` ...) is redacted when it looks like a credential.
        All strings are scanned in one pass over their concatenation. The input is never
        modified; when nothing is redacted it is returned as it is.
        """
        leaves: list[str] = []
        keyed: dict[int, str] = {}
        _collect(value, None, leaves, keyed)
        plan = self._plan(leaves, keyed) if leaves else {}
        if not plan:
            return value, 0
        out = _JsonWalk(plan).rebuild(value)
        return out, sum(n for _, n in plan.values())

    # -- internals --

    def _apply(self, text: str, spans: list[Span]) -> str:
        parts: list[str] = []
        pos = 0
        for start, end, kind in spans:
            parts += (text[pos:start], self.marker(kind, text[start:end]))
            pos = end
        parts.append(text[pos:])
        return "".join(parts)

    def _redact_values(self, text: str) -> tuple[str, int]:
        snap = self._values
        if snap.pattern is None or not any(v in text for v in snap.values):
            return text, 0
        hits = 0

        def replace(m: re.Match[str]) -> str:
            nonlocal hits
            if m.group("marker"):
                return m.group()
            hits += 1
            return self.marker("vault", m.group())

        return snap.pattern.sub(replace, text), hits

    def _plan(self, leaves: list[str], keyed: dict[int, str]) -> dict[int, tuple[str, int]]:
        """New text and hit count for each leaf that changes, from one scan of all leaves.

        Leaves are joined with newlines, which no rule's match crosses except a private key
        body; a leaf that holds a vault value or a span crossing into another leaf is redone
        on its own with ``redact_text``.
        """
        joined = "\n".join(leaves)
        starts: list[int] = []
        pos = 0
        for leaf in leaves:
            starts.append(pos)
            pos += len(leaf) + 1
        alone = self._vault_leaves(joined, starts)
        per_leaf: dict[int, list[Span]] = {}
        for s, e, kind in find_spans(joined):
            i, j = bisect_right(starts, s) - 1, bisect_right(starts, e - 1) - 1
            if i != j:
                alone.update(range(i, j + 1))
            else:
                per_leaf.setdefault(i, []).append((s - starts[i], e - starts[i], kind))
        plan = {i: self.redact_text(leaves[i]) for i in alone}
        for i, spans in per_leaf.items():
            if i not in alone:
                plan[i] = (self._apply(leaves[i], spans), len(spans))
        for i, key in keyed.items():
            if i not in plan or not plan[i][1]:
                plan[i] = self._redact_assigned(key, leaves[i])
        return {i: p for i, p in plan.items() if p[1]}

    def _vault_leaves(self, joined: str, starts: list[int]) -> set[int]:
        """Indices of the leaves that contain a registered exact value."""
        snap = self._values
        if snap.pattern is None or not any(v in joined for v in snap.values):
            return set()
        return {bisect_right(starts, m.start()) - 1 for m in snap.pattern.finditer(joined)}

    def _redact_assigned(self, key: str, value: str) -> tuple[str, int]:
        spans = assigned_value_spans(key, value, 0, len(value))
        return (self._apply(value, spans), len(spans)) if spans else (value, 0)


def _collect(value: object, key: object, leaves: list[str], keyed: dict[int, str]) -> None:
    """Every string in a JSON-like value, in walk order; ``keyed`` maps the index of each
    string held under a credential-named dict key to that key."""
    if isinstance(value, str):
        if isinstance(key, str) and credential_key(key):
            keyed[len(leaves)] = key
        leaves.append(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _collect(v, k, leaves, keyed)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect(v, None, leaves, keyed)


class _JsonWalk:
    """The same walk as ``_collect``, rebuilding the value with the planned leaves replaced."""

    def __init__(self, plan: dict[int, tuple[str, int]]) -> None:
        self.plan = plan
        self.index = 0

    def rebuild(self, value: object) -> object:
        if isinstance(value, str):
            i, self.index = self.index, self.index + 1
            return self.plan[i][0] if i in self.plan else value
        if isinstance(value, dict):
            return {k: self.rebuild(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [self.rebuild(v) for v in value]
            return items if isinstance(value, list) else tuple(items)
        return value


_KEY_CACHE: dict[str, bool] = {}


def credential_key(key: str) -> bool:
    """Whether a dict key names a credential (``password``, ``clientSecret``, ``X-Api-Key``).

    Cached, because event data repeats the same few keys.
    """
    hit = _KEY_CACHE.get(key)
    if hit is None:
        hit = bool(_KEY_PATTERN.search(key)) and not _PAGING_KEY.search(key)
        if len(_KEY_CACHE) > 4096:
            _KEY_CACHE.clear()
        _KEY_CACHE[key] = hit
    return hit
