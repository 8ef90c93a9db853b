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
* exact values registered with ``Redactor.replace_values`` (the vault keeps its secrets' values
  there) or ``add_values``, type ``vault``.

Why literal prefilters and one walk rather than one big alternation: CPython's ``re`` is a
backtracking engine, so a 15-branch alternation tries every branch at every position and
scans at 20-30 MB/s (~3 MB/s with the full rule patterns), while a pattern that starts with
a literal is found by a tight C loop at ~2 GB/s. So every rule starts with a short literal
(``AKIA``, ``ghp_``, ``eyJ``, ``://``, ``token`` ...) found by a cheap scanner; the rule's
full pattern and its checks run only at those positions, and one walk over the candidates,
in text order, produces the replacements. A string without any trigger costs one
``lower()`` and 18 literal searches (~55 MB/s on a realistic transcript on one core; see
``bench/redact_speed.py``).

Deliberately not flagged, so that ordinary prose and code stay clean: bare high-entropy
strings with no keyword or provider prefix (git SHAs, sha256 digests, UUIDs, base64 data
URIs); under a credential key, values that are code (``os.environ["X"]``, ``get_token()``,
``self.token``, ``db_password2``), references and placeholders (``${TOKEN}``, ``$TOKEN``,
``<your-token>``, ``xxxx``, ``changeme``, ``...``), plain words, numbers, paths and sentences
(``correct horse battery staple``), hex under 32 digits, values under 8 characters, values
with only two character classes under 16 characters, ARN/URN parts (``:secret:name``), the
SigV4 ``Authorization`` header's scope, and paging, idempotency and lock tokens
(``NextToken``, ``ClientToken``, ``--change-token``); URL passwords under 4 characters.
Dict keys are never redacted.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
import threading
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import accumulate
from re import _constants as _c  # the parsed form of our own scanners (triggers)
from re import _parser as _sre_parser
from typing import Any

import ahocorasick
import ahocorasick_rs
import orjson

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
    "vault": "an exact value registered with Redactor.replace_values or add_values (vault secrets)",
}
#: The type names, in the order of ``TYPES``.
RULE_NAMES: tuple[str, ...] = tuple(TYPES)

#: A marker as this module writes it; text inside a marker is never scanned again.
MARKER_RE = re.compile(r"\[REDACTED:[a-z_]+:[0-9a-f]{8}\]")
#: Shortest exact value ``replace_values``/``add_values`` accept: shorter ones would redact ordinary words.
MIN_VALUE_LEN = 8

#: (start, end, type) of one replacement inside the scanned string.
Span = tuple[int, int, str]
#: A rule's check: given its match, the replacements, or None when the candidate is rejected.
Check = Callable[[re.Match[str]], "list[Span] | None"]


# --- value heuristics -----------------------------------------------------------------------

_PLACEHOLDER_WORDS = (
    "changeme", "change_me", "change-me", "example", "placeholder", "redacted", "dummy",
    "sample", "your", "xxxx", "****", "1234", "abcd", "qwerty", "password",
    "passwd", "secret", "fake", "todo", "fixme", "replace", "insert",
)  # fmt: skip
# ${X}, $X, $(cmd), %X%, %s, %(x)s, {{ x }}, {x}, #{x}: references, not values.
_REFERENCE = re.compile(r"\$\{.*|\$\(.*|\$[A-Za-z_]\w*|%\w+%|%s|%\(\w+\)s|\{\{.*|\{[\w.]*\}|#\{.*")
# Dotted names, calls and indexing: code, not a value.
_CODE = re.compile(r"[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)+.*|[A-Za-z_$][\w$]*[(\[].*", re.S)
_PATH = re.compile(r"(?:\.{1,2}/|~/|/|[A-Za-z]:\\).*|.*://.*", re.S)
# A run that mixes upper, lower and digits: base64 that merely starts with "/" is no path.
_RANDOM_RUN = re.compile(
    r"(?=[A-Za-z0-9+=_-]*[A-Z])(?=[A-Za-z0-9+=_-]*[a-z])(?=[A-Za-z0-9+=_-]*\d)[A-Za-z0-9+=_-]{16,}"
)
# Separators inside plain-word values ("prod-db-2024", "user=jane", "a.b@c.d").
_SEPARATORS = re.compile(r"[-_./:@=,+\s]+")
_SCHEMES = r"bearer|basic|token|bot|aws4-hmac-sha256"
_AUTH_SCHEME = re.compile(rf"(?i)({_SCHEMES})[ \t]+")
# The credential scope of a SigV4 header (its access key id, if real, is caught on its own).
_SIGV4_SCOPE = re.compile(r"[^/\s]+/\d{8}/[^/\s]+/[^/\s]+/aws4_request,?")
_HEX = re.compile(r"[0-9a-f]+|[0-9A-F]+")
# A snake_case identifier with a credential word is code naming the thing it is assigned to
# (auth=session_auth, password=db_password2), not the secret itself.
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_SNAKE_ROOT = re.compile(r"(?i)(?:^|_)(?:pass|pwd|secret|token|key|auth|cred)")
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
    low = v.lower()  # (long random tokens contain "abcd" or "your" by chance: only short values)
    return len(v) <= 64 and any(word in low for word in _PLACEHOLDER_WORDS)


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

    Needs 8+ characters; no sentence, placeholder, reference, code or path shape; not
    only plain words and numbers; hex only from 32 digits (shorter hex is mostly hashes and
    ids); three character classes (two from 16 characters on, which admits hex and base64
    tokens); and Shannon entropy of at least min(3.0, log2(len) - 0.5) bits per character.
    """
    v = value.strip()
    if not 8 <= len(v) <= 4096 or v.count(" ") >= 2:  # a sentence
        return False
    if _CODE.fullmatch(v) or _SIGV4_SCOPE.fullmatch(v):
        return False
    if _PATH.fullmatch(v) and not _RANDOM_RUN.search(v):
        return False
    if "_" in v and _IDENTIFIER.fullmatch(v) and _SNAKE_ROOT.search(v):
        return False
    if _wordish(v) or is_placeholder(v) or (len(v) < 32 and _HEX.fullmatch(v)):
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
    scheme_name = scheme.group(1).lower() if scheme else ""
    if scheme_name == "aws4-hmac-sha256":  # SigV4: scope and signature, not a reusable secret
        return None
    kind = _assigned_kind(key, text[vstart:end], scheme_name == "basic")
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
# The same with groups: whether the key was quoted, and the operator.
_OPERATOR_GROUPS = r"(?P<q>\\?[\"'])?[ \t]*(?P<op>:=|=>|[:=])"
# The value: \"json in json\", "double", 'single', `backtick`, or bare. Only the start of a
# bare value is matched here; _BARE finds its end after the cheap checks, so that a run like
# token=token=token=... costs linear time, not one scan of the run per candidate.
_VALUE = (
    r"[ \t]*(?:\\\"(?P<ev>(?:[^\"\\\n]|\\[^\"\n]){0,4096})\\\""
    r"|\"(?P<dv>(?:[^\"\\\n]|\\.){0,4096})\""
    r"|'(?P<sv>(?:[^'\\\n]|\\.){0,4096})'"
    r"|`(?P<bv>[^`\n]{0,4096})`"
    rf"|(?P<scheme>(?i:{_SCHEMES})[ \t]+)?(?P<v>)(?=[^\s\"'`,;&<]))"
)
_VALUE_GROUPS = ("ev", "dv", "sv", "bv", "v")
# A bare value ends at whitespace, a quote, , ; < and at & or = that start a name=value pair
# (so base64 padding stays, and a=b&c=d or k=v=w splits).
_BARE = re.compile(r"(?:[^\s\"'`,;&<=]|&(?![\w.-]+=)|=(?![\w.-]))+")
_MAX_VALUE = 4096
_KEY_PATTERN = re.compile(rf"(?:{_KEYWORD}){_SUFFIX}$", re.I)
# Paging cursors, idempotency and lock tokens (AWS ClientToken, LockToken, --change-token,
# PolicyUpdateToken ...) are named like tokens but protect nothing; they are usually UUIDs.
#: A credential keyword anywhere (a key or a value): the cheap test before decoding JSON.
_ANY_KEYWORD = re.compile(_KEYWORD, re.I)
_NOT_SECRET_KEY = re.compile(
    r"(?i)(?:next|continuation|page|pagination|cursor|sync|resume|starting|marker|client|request"
    r"|idempotency|lock|change|update|action|sequence|output|input|max|total|count)[_.-]?token"
)
_TRAILING = ").,;:]}>"  # punctuation that ends a sentence or a bracket, not a bare value


def _key_name(text: str, start: int, end: int) -> str:
    """The whole identifier a keyword sits in (``AWS_SECRET_ACCESS_KEY``, ``NextToken``)."""
    i = start
    while i > 0 and start - i < 64 and (text[i - 1].isalnum() or text[i - 1] in "_.-"):
        i -= 1
    return text[i:end]


def _check_assignment(m: re.Match[str]) -> list[Span] | None:
    """``key <op> value``: redact the value when it looks like a credential."""
    name = _key_name(m.string, m.start(), m.end("key"))
    if _NOT_SECRET_KEY.search(name):
        return None
    g = next(g for g in _VALUE_GROUPS if m.group(g) is not None)
    start, end = m.start(g), m.end(g)
    if g == "v":
        start = m.start("scheme") if m.group("scheme") else start
        # key:value with no space and nothing quoted is an ARN/URN part, not YAML or JSON
        if m.group("op") == ":" and not m.group("q") and start == m.end("op"):
            return None
        bare = _BARE.match(m.string, m.end("v"), m.end("v") + _MAX_VALUE)
        if bare is None:
            return None
        end = bare.start() + len(bare.group().rstrip(_TRAILING))
        if bare.end() - bare.start() == _MAX_VALUE:  # judged on its head; redact all of it
            spans = assigned_value_spans(name, m.string, start, end)
            whole = _BARE.match(m.string, m.end("v"))
            if spans and spans[-1][1] == end and whole:
                spans[-1] = (spans[-1][0], whole.end(), spans[-1][2])
            return spans
    return assigned_value_spans(name, m.string, start, end)


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
    """Only the password of ``scheme://user:password@host``; placeholders and passwords
    under 4 characters (``abc:xyz@`` in docs) stay."""
    pw = m.group("pw")
    if len(pw) < 4 or is_placeholder(pw) or pw.lower() == "pass":
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
    #: a pattern whose match every scanner match contains, where the scanner itself starts
    #: too vaguely to give triggers (``--`` of ``--password VALUE``): its literals are used
    contains: str | None = None


def _rule(name: str, scanner: str, pattern: str, check: Check, back: int = 0) -> Rule:
    return Rule(name, re.compile(scanner), re.compile(pattern), check, back=back)


def _keyword_rule(scan_keyword: str) -> Rule:
    """An assignment rule whose scanner (over lowered text) starts at one keyword family."""
    scanner = rf"(?:{scan_keyword}){_SUFFIX}{_KEY_END}{_OPERATOR}"
    pattern = rf"(?P<key>(?i:{_KEYWORD}){_SUFFIX}){_KEY_END}{_OPERATOR_GROUPS}{_VALUE}"
    return Rule(
        "secret_assignment", re.compile(scanner), re.compile(pattern, re.I), _check_assignment,
        lowered=True, nested=False,
    )  # fmt: skip


_NB = r"(?<![A-Za-z0-9_-])"  # a token starts here, not inside a longer word
_NA = r"(?![A-Za-z0-9_-])"  # and ends here
# A PEM body: base64, whitespace, \n escapes, header lines (Proc-Type: 4,ENCRYPTED) and the
# quotes and pluses of a key pasted into code; never across another BEGIN.
_PEM_BODY = r"(?P<pk_body>(?:(?!-----BEGIN)[A-Za-z0-9+/=\s\"'\\:.,()-]){0,65536}?)"
_PEM_END = r"(?P<pk_end>-----END[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----)"
# No END line (a tool printed only the head): the header lines and base64 lines that follow.
_PEM_TAIL = r"(?P<pk_tail>(?:(?:\s|\\[nr])*(?:[A-Za-z0-9+/=]{16,}|(?:Proc-Type|DEK-Info):[^\n\\]*))+)"

#: All rules. At equal positions the earlier rule is tried first (markers before anything).
RULES: tuple[Rule, ...] = (
    _rule("marker", r"\[REDACTED:", MARKER_RE.pattern, _check_marker),
    _rule(
        "private_key",
        r"-----BEGIN",
        rf"-----BEGIN[A-Z0-9 ]{{0,40}} PRIVATE KEY(?: BLOCK)?-----(?:{_PEM_BODY}{_PEM_END}|{_PEM_TAIL})",
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
    # "\/" too (a JSON body written with escaped slashes: PHP, Slack's own answers); the
    # scanners also take "\\/", that spelling inside JSON text (``data``, before it is decoded)
    _rule(
        "slack_webhook",
        r"hooks\.slack\.com(?:/|\\/|\\\\/)",
        r"hooks\.slack\.com\\?/(?:services|workflows|triggers)\\?/(?P<hook>(?:[A-Za-z0-9_+-]|\\?/){20,})",
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
        r":(?://|\\/\\/|\\\\/\\\\/)",
        r"(?<=[A-Za-z0-9]):(?://|\\/\\/)[^\s:/\\?#@\"'<>\[\]{}]{0,256}:(?P<pw>[^\s/?#@\"'<>]{1,512})@"
        r"(?=[A-Za-z0-9\[])",
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
        re.compile(
            rf"--(?:[A-Za-z0-9]+-)*?(?P<key>(?i:{_KEYWORD}){_SUFFIX})(?P<q>(?!))?(?P<op>[ \t]+){_VALUE}", re.I
        ),
        _check_assignment,
        lowered=True,
        nested=False,
        # every flag it takes names a credential: a text with no keyword holds none (most
        # text, whose "--" in Markdown and shell would otherwise wake this rule every time)
        contains=_KEYWORD,
    ),
)


def _views(text: str) -> tuple[str | bytes, str | bytes]:
    """The text the scanners search, as is and lower-cased, with positions as in ``text``.

    Non-ASCII text is searched as ``encode("ascii", "replace")``: one byte per code point, so
    positions carry over, and lower-casing and scanning bytes stay fast, where ``str.lower``
    on wide strings is ~5x slower. All triggers are ASCII, so nothing is lost.
    """
    if text.isascii():
        return text, text.lower()
    raw = text.encode("ascii", "replace")
    return raw, raw.lower()


def _bound(rule: Rule) -> tuple[object, ...]:
    b = re.compile(rule.scanner.pattern.encode("ascii"))
    return (rule.scanner.search, rule.scanner.finditer, b.search, b.finditer, rule.lowered, rule.back)


# (str search, str finditer, bytes search, bytes finditer, lowered, back, rule index) per
# rule, bound once: _candidates runs for every string, and for short strings the lookups,
# not the searching, are most of the cost.
_SCANNERS = tuple((*_bound(r), i) for i, r in enumerate(RULES))
_NESTED = frozenset(i for i, r in enumerate(RULES) if r.nested)


# --- triggers: one pass that says which rules can fire at all ------------------------------

#: Shorter literals than this would fire on ordinary text (``--`` in Markdown); their rule
#: is always scanned instead.
_MIN_TRIGGER = 3
_MAX_TRIGGERS = 64


def _literal_prefixes(items: Any) -> tuple[list[str], bool] | None:
    """The literal strings a parsed pattern can start with, and whether they are all of it.

    Follows literals, small character classes, groups and alternations from the start and
    stops at the first anything else; None when the expansion grows past _MAX_TRIGGERS.
    Every match of the pattern starts with one of the returned strings.
    """
    out = [""]
    for op, av in items:
        if op is _c.LITERAL:
            out = [p + chr(av) for p in out]
        elif op is _c.IN and all(o is _c.LITERAL for o, _ in av):
            out = [p + chr(c) for p in out for _, c in av]
        elif op is _c.SUBPATTERN or op is _c.BRANCH:
            subs = [_literal_prefixes(b) for b in ([av[3]] if op is _c.SUBPATTERN else av[1])]
            if any(sub is None for sub in subs):
                return None
            out = [p + s for p in out for sub in subs for s in sub[0]]  # type: ignore[index]
            if not all(sub[1] for sub in subs):  # type: ignore[index]
                return out, False
        else:
            return out, False
        if len(out) > _MAX_TRIGGERS:
            return None
    return out, True


def _triggers(rule: Rule) -> list[str] | None:
    """Lower-cased literals, one of which occurs (in the lower-cased text) wherever the
    rule's scanner matches; None when the scanner has no usable literal start."""
    try:
        found = _literal_prefixes(_sre_parser.parse(rule.contains or rule.scanner.pattern))
    except Exception:  # noqa: BLE001 - an unexpected parse shape only costs speed
        return None
    if found is None or any(len(t) < _MIN_TRIGGER for t in found[0]):
        return None
    return sorted({t.lower() for t in found[0]})


class _Triggers:
    """Every trigger, the rules each one wakes, and the rules that always run.

    The trigger pass runs over all of every event's text, so a batch's events are searched
    with ``ahocorasick_rs`` (Rust; all matches come back from one call), about 3x faster
    here than walking pyahocorasick's matches from Python: 3 against 10 µs per event on
    the bench corpus. A single text (a JSON value's strings, a nested value) is searched
    with pyahocorasick, which keeps the GIL: ``ahocorasick_rs`` lets go of it for every
    search, and on a busy gateway the thread then waits its turn to get it back.
    """

    def __init__(self) -> None:
        by_trigger: dict[str, list[int]] = {}
        always = set()
        for i, rule in enumerate(RULES):
            triggers = _triggers(rule)
            if triggers is None:
                always.add(i)
                continue
            for t in triggers:
                by_trigger.setdefault(t, []).append(i)
        words = sorted(by_trigger)
        self.rules = tuple(tuple(by_trigger[t]) for t in words)
        self.always = frozenset(always)
        # overlapping: every trigger present is reported, even inside another ("passw", "passphrase")
        self._automaton = ahocorasick_rs.AhoCorasick(words, matchkind=ahocorasick_rs.MatchKind.Standard)
        self._one = ahocorasick.Automaton()
        for k, word in enumerate(words):
            self._one.add_word(word, k)
        self._one.make_automaton()

    def live(self, low: str) -> AbstractSet[int]:
        """The rules woken by the triggers in ``low`` (lower-cased), plus those always run."""
        return self._woken({k for _, k in self._one.iter(low)})

    def live_each(self, lows: list[str]) -> list[AbstractSet[int]]:
        """:meth:`live` of each of ``lows``, from one pass over them all.

        ``ahocorasick_rs`` lets go of the GIL for every search, and a request thread that
        lets go of it waits for its turn again behind every other thread that wants it: two
        searches per event made each event of a busy gateway wait twice, and cost it a
        third of its CPU in handing the interpreter around; one per batch costs nothing.
        The texts are joined with a NUL, which no trigger holds, so no trigger is found
        across two of them.
        """
        starts = list(accumulate([len(low) + 1 for low in lows], initial=0))
        hits: dict[int, set[int]] = {}
        for k, start, _ in self._automaton.find_matches_as_indexes("\0".join(lows), overlapping=True):
            hits.setdefault(bisect_right(starts, start) - 1, set()).add(k)
        # most texts hold no trigger: they share the one set of the rules that always run
        return [self._woken(hits[i]) if i in hits else self.always for i in range(len(lows))]

    def _woken(self, triggers: set[int]) -> AbstractSet[int]:
        if not triggers:
            return self.always
        live = set(self.always)
        for k in triggers:
            live.update(self.rules[k])
        return live


_TRIGGERS = _Triggers()
_KEYWORD_RULES = frozenset(i for i, r in enumerate(RULES) if r.check is _check_assignment)
_ANY_KEYWORD_LOWER = re.compile(_KEYWORD)


def _live_rules(low: str | bytes) -> AbstractSet[int]:
    """The rules whose scanner can match: their trigger occurs in ``low`` (lower-cased).

    Most event text holds none of the triggers, so the per-rule scans are skipped: one pass
    over the text instead of one per rule.
    """
    return _TRIGGERS.live(low if isinstance(low, str) else low.decode("ascii"))


def _candidates(text: str, nested_only: bool,
                views: Views | None = None) -> list[tuple[int, int]]:
    """Sorted (position, rule index) pairs where a rule's literal prefix occurs."""
    found: list[tuple[int, int]] = []
    raw, low, live = views or _scan_views(text)
    wide = isinstance(raw, bytes)
    # only the live rules (usually one or two of the eighteen): the loop is most of the cost
    for i in (live & _NESTED if nested_only else live):
        search, finditer, bsearch, bfinditer, lowered, back, _ = _SCANNERS[i]
        if wide:
            search, finditer = bsearch, bfinditer
        src = low if lowered else raw
        first = search(src)  # type: ignore[operator]
        if first is not None:
            found.append((first.start() - back, i))
            found += [(m.start() - back, i) for m in finditer(src, first.end())]  # type: ignore[operator]
    found.sort()
    return found


Views = tuple[str | bytes, str | bytes, AbstractSet[int]]


def _scan_views(text: str) -> Views:
    """:func:`_views` of ``text`` and the rules that can fire in it."""
    raw, low = _views(text)
    return raw, low, _live_rules(low)


def scan_views_each(texts: list[str]) -> list[Views]:
    """:func:`_scan_views` of each of ``texts``, with one trigger pass for them all (see
    :meth:`_Triggers.live_each`)."""
    views = [_views(text) for text in texts]
    lows = [low if isinstance(low, str) else low.decode("ascii") for _, low in views]
    return [(raw, low, live) for (raw, low), live in zip(views, _TRIGGERS.live_each(lows), strict=True)]


def _may_hold_secret(text: str, views: Views | None = None) -> bool:
    """Whether a rule or a credential-named key could fire anywhere in ``text`` (JSON):
    the cheap test before decoding it."""
    views = views or _scan_views(text)
    low, live = views[1], views[2]
    if live & _KEYWORD_RULES and _ANY_KEYWORD_LOWER.search(
            low if isinstance(low, str) else low.decode("ascii")):  # type: ignore[union-attr]
        return True
    return bool(_candidates(text, False, views))


def find_spans(text: str, nested_only: bool = False, views: Views | None = None) -> list[Span]:
    """Every secret in ``text`` as sorted, non-overlapping (start, end, type) spans.

    One walk over the candidates in text order: a candidate inside a match already taken
    (or inside an existing marker) is skipped; a rejected candidate takes nothing.
    """
    spans: list[Span] = []
    taken = 0
    for pos, i in _candidates(text, nested_only, views):
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
    """An immutable snapshot of the exact values to redact, swapped whole on change.

    An Aho-Corasick automaton finds all of them in one pass over the text, whatever their
    number: a vault with thousands of secrets costs each event one scan, not one per secret.
    """

    values: tuple[str, ...] = ()
    automaton: Any = None
    #: the values as JSON text spells them (quotes, backslashes, controls escaped)
    json_automaton: Any = None

    def in_json(self, text: str) -> bool:
        """Whether any value occurs in ``text``, JSON that holds it in a string."""
        return self.json_automaton is not None and next(self.json_automaton.iter(text), None) is not None

    def spans(self, text: str, in_json: bool = False) -> list[tuple[int, int, str]]:
        """Leftmost-longest, non-overlapping occurrences ``(start, end, value)`` outside
        existing markers; ``in_json``: as JSON text spells the values."""
        automaton = self.json_automaton if in_json else self.automaton
        if automaton is None:
            return []
        found = sorted(((end - n + 1, end + 1, value) for end, (n, value) in automaton.iter(text)),
                       key=lambda span: (span[0], -span[1]))
        if not found:
            return []
        markers = [m.span() for m in MARKER_RE.finditer(text)] if "[REDACTED:" in text else []
        out: list[tuple[int, int, str]] = []
        pos = 0
        for start, end, value in found:
            if start >= pos and not any(s < end and start < e for s, e in markers):
                out.append((start, end, value))
                pos = end
        return out


def _spellings(value: str) -> list[str]:
    """``value`` as text may hold it: as itself, and as a JSON string spells it, which is
    how a tool's output (``json.dumps``) carries it: non-ASCII as ``\\u00fc``, and with some
    serializers "/" as ``\\/``. Each is redacted as the value itself."""
    forms = [value]
    for ensure_ascii in (True, False):
        form = json.dumps(value, ensure_ascii=ensure_ascii)[1:-1]
        forms += [form, form.replace("/", "\\/")]
    return list(dict.fromkeys(forms))


def _automaton(pairs: list[tuple[str, str]]) -> Any:
    """An automaton finding each needle; its payload is (needle length, the value it spells)."""
    if not pairs:
        return None
    automaton = ahocorasick.Automaton()
    for needle, value in pairs:
        if automaton.get(needle, None) is None:  # the first (longest) value keeps a shared needle
            automaton.add_word(needle, (len(needle), value))
    automaton.make_automaton()
    return automaton


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
        with self._lock:
            self._install(set(self._values.values) | _usable(values))

    def replace_values(self, values: Iterable[str]) -> None:
        """Redact exactly these values from now on (a destroyed secret stops being one)."""
        with self._lock:
            self._install(_usable(values))

    def _install(self, values: set[str]) -> None:
        if values == set(self._values.values):
            return
        ordered = tuple(sorted(values, key=lambda v: (-len(v), v)))
        spelled = [(form, v) for v in ordered for form in _spellings(v)]
        escaped = [(orjson.dumps(form).decode()[1:-1], v) for form, v in spelled]
        self._values = _Values(ordered, _automaton(spelled), _automaton(escaped))

    def redact_text(self, text: str, views: Views | None = None) -> tuple[str, int]:
        """``text`` with every secret replaced by its marker, and the number replaced.
        ``views``: what :func:`scan_views_each` found for this ``text``."""
        text, hits = self._redact_values(text)
        spans = find_spans(text, views=None if hits else views)  # a value replaced: new text
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

    def redact_json_text(self, text: str, views: Views | None = None) -> tuple[str, int]:
        """Canonical JSON text (sorted keys) redacted as :meth:`redact_json` would.

        Most event data holds nothing a rule could fire on: when neither a rule's literal
        prefix nor a credential keyword occurs anywhere in the text (keys included), and
        no registered value occurs in it (as JSON writes it), the decode and the walk are
        skipped. The prefixes are ASCII that JSON never escapes, so the text shows them if
        any string holds them.
        """
        # exact values first, on the text itself: that reaches dict keys too, and a marker
        # is plain JSON string content (no quote, backslash or control character)
        text, found = self._redact_values(text, in_json=True)
        if not _may_hold_secret(text, None if found else views):
            return text, found
        value, hits = self.redact_json(orjson.loads(text))
        if not hits:
            return text, found
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode(), hits + found

    # -- internals --

    def _apply(self, text: str, spans: list[Span]) -> str:
        parts: list[str] = []
        pos = 0
        for start, end, kind in spans:
            parts += (text[pos:start], self.marker(kind, text[start:end]))
            pos = end
        parts.append(text[pos:])
        return "".join(parts)

    def redact_values(self, text: str) -> tuple[str, int]:
        """``text`` with only the registered exact values replaced (identifiers, URIs, tags:
        fields no pattern rule should touch, but where a pasted secret must not stay)."""
        return self._redact_values(text)

    @property
    def has_values(self) -> bool:
        """Whether any exact value is registered (else :meth:`redact_values` changes nothing)."""
        return self._values.automaton is not None

    def _redact_values(self, text: str, in_json: bool = False) -> tuple[str, int]:
        if not self.has_values:
            return text, 0
        spans = self._values.spans(text, in_json)
        if not spans:
            return text, 0
        parts: list[str] = []
        pos = 0
        for start, end, value in spans:
            parts += (text[pos:start], self.marker("vault", value))
            pos = end
        parts.append(text[pos:])
        return "".join(parts), len(spans)

    def _plan(self, leaves: list[str], keyed: dict[int, str]) -> dict[int, tuple[str, int]]:
        """New text and hit count for each leaf that changes, from one scan of all leaves.

        Leaves are joined with newlines, which only a private key's body crosses: a key
        split over several strings (a file as a list of lines) gets a marker in each string
        it touches. A leaf that holds a vault value is redone on its own with ``redact_text``.
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
            for i in range(bisect_right(starts, s) - 1, bisect_right(starts, e - 1)):
                lo, hi = max(s, starts[i]) - starts[i], min(e, starts[i] + len(leaves[i])) - starts[i]
                if hi > lo:
                    per_leaf.setdefault(i, []).append((lo, hi, kind))
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
        return {bisect_right(starts, start) - 1 for start, _, _ in self._values.spans(joined)}

    def _redact_assigned(self, key: str, value: str) -> tuple[str, int]:
        spans = assigned_value_spans(key, value, 0, len(value))
        return (self._apply(value, spans), len(spans)) if spans else (value, 0)


def _usable(values: Iterable[str]) -> set[str]:
    return {v for v in values if isinstance(v, str) and len(v) >= MIN_VALUE_LEN}


def _collect(value: object, key: object, leaves: list[str], keyed: dict[int, str]) -> None:
    """Every string in a JSON-like value, in walk order; ``keyed`` maps the index of each
    string held under a credential-named dict key to that key, or paired with one: HTTP
    clients log headers as ``[name, value]`` pairs (``[["Authorization", "Bearer …"], …]``),
    where the value's key is the string before it; Kubernetes and CI configs list variables as
    ``{"name": "DB_PASSWORD", "value": …}``; and a ``{"value": …}`` under a credential key
    (``{"password": {"value": …}}``) is that credential's value."""
    if isinstance(value, str):
        if isinstance(key, str) and credential_key(key):
            keyed[len(leaves)] = key
        leaves.append(value)
    elif isinstance(value, dict):
        named = _value_named(value, key)
        for k, v in value.items():
            _collect(v, named if k == "value" and named else k, leaves, keyed)
    elif isinstance(value, (list, tuple)):
        if len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], str):
            leaves.append(value[0])
            _collect(value[1], value[0], leaves, keyed)
            return
        for v in value:
            _collect(v, None, leaves, keyed)


def _value_named(d: dict, key: object) -> str | None:
    """The credential name a dict's ``"value"`` string is assigned to: its ``"name"`` (or
    ``"key"``) when that names a credential, else the credential key the dict is under."""
    if not isinstance(d.get("value"), str):
        return None
    for name in (d.get("name"), d.get("key"), key):
        if isinstance(name, str) and credential_key(name):
            return name
    return None


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
        hit = bool(_KEY_PATTERN.search(key)) and not _NOT_SECRET_KEY.search(key)
        if len(_KEY_CACHE) > 4096:
            _KEY_CACHE.clear()
        _KEY_CACHE[key] = hit
    return hit
