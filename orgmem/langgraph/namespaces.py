"""Where a LangGraph store item lives in open memory, and what its document holds.

A namespace names its memory scope by its first labels; any other namespace is the
caller's own, so agents keep LangGraph's usual ``("memories", user_id)`` namespaces::

    ("org", ...)            scope org
    ("team", T, ...)        scope team:T
    ("agent", A, ...)       scope agent:A
    ("memories", "u1")      scope agent:<caller>, the same namespace as ("agent", <caller>, "memories", "u1")

Items are stored under the *canonical* namespace (the second form for the caller's own),
and shown in the form the caller asked in (see :func:`present`).

An item is one open-memory document (tag ``langgraph``). Its id is readable and fixed by
the namespace and key: ``lg-<slug>-<hash>``, the slug made of the labels and key (lowercase
letters, digits, hyphens; cut short), the hash 96 bits of SHA-256 over the exact canonical
namespace and key, so any labels and keys fit the gateway's id rules (1 to 128 of
``a-z0-9-``) and a get needs no lookup. The exact namespace and key travel in the body,
a JSON object, with the value::

    {"store": "langgraph", "id": "lg-...", "namespace": ["agent", "bot", "memories", "u1"],
     "key": "k1", "value": {...}}

Carrying the id in the body also keeps two items apart for the gateway's duplicate check
(title and body, compared without case or whitespace), which would otherwise see keys
that differ only in case as duplicates.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from langgraph.store.base import InvalidNamespaceError, Item, MatchCondition

#: the tag every store document carries (how the store finds its own documents)
TAG = "langgraph"
STORE = "langgraph"
SCOPE_LABELS = ("org", "team", "agent")
#: team and agent names, as the gateway checks them
NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,55}[a-z0-9])?$")
ID_PREFIX = "lg-"
HASH_CHARS = 24
MAX_ID = 128
MAX_TITLE = 300
#: the largest memory document the gateway accepts (the JSON the client sends)
MAX_DOCUMENT = 256 * 1024
KINDS = ("fact", "lesson", "preference", "decision")
OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")

Namespace = tuple[str, ...]


class InvalidValueError(ValueError):
    """A store value or filter that cannot be stored or used; nothing was written."""


# -- namespaces -------------------------------------------------------------------------


def check_labels(namespace: Any, what: str = "namespace") -> Namespace:
    """The namespace as a tuple of labels; InvalidNamespaceError naming the bad label."""
    if not isinstance(namespace, (tuple, list)):
        raise InvalidNamespaceError(f"{what}: must be a tuple of strings, not "
                                    f"{type(namespace).__name__}.")
    for label in namespace:
        if not isinstance(label, str):
            raise InvalidNamespaceError(f"{what} {tuple(namespace)!r}: labels are strings, not "
                                        f"{type(label).__name__} ({label!r}).")
        if not label:
            raise InvalidNamespaceError(f"{what} {tuple(namespace)!r}: a label cannot be empty.")
        if "." in label or "\x00" in label:
            raise InvalidNamespaceError(f"{what} {tuple(namespace)!r}: label {label!r} contains "
                                        "a period or a NUL byte, which labels cannot.")
    return tuple(namespace)


def _check_name(namespace: Namespace) -> None:
    kind = namespace[0]
    if len(namespace) < 2 or not NAME_RE.match(namespace[1]):
        shown = repr(namespace[1]) if len(namespace) > 1 else "nothing"
        raise InvalidNamespaceError(
            f"namespace {namespace!r}: a namespace starting with {kind!r} names a memory scope, "
            f"({kind!r}, <{kind} name>, ...), and the {kind} name is {shown}; names are 1 to 57 "
            "lowercase letters, digits and inner hyphens. (Namespaces starting with anything "
            "else are your own agent's.)")


def canonical(namespace: Namespace, me: str) -> Namespace:
    """The namespace with its scope spelled out (the caller's own ones get ``("agent", me)``)."""
    first = namespace[0] if namespace else ""
    if first == "org":
        return namespace
    if first in ("team", "agent"):
        _check_name(namespace)
        return namespace
    return ("agent", me, *namespace)


def scope_of(canon: Namespace) -> str:
    """``org``, ``team:T`` or ``agent:A`` of a canonical namespace."""
    return "org" if canon[0] == "org" else f"{canon[0]}:{canon[1]}"


def _inside(canon: Namespace) -> Namespace:
    """The labels after the scope's."""
    return canon[1:] if canon[0] == "org" else canon[2:]


def is_absolute(prefix: Namespace) -> bool:
    """Whether a request spells out its scope (then results are shown canonical)."""
    return bool(prefix) and prefix[0] in SCOPE_LABELS


def present(canon: Namespace, me: str, absolute: bool) -> Namespace:
    """How a stored namespace is shown: the caller's own in the short form unless the request
    spelled out its scope, every other one canonical.

    The short form is shown only when it names the same item again: not when it would be
    empty, nor when it starts with a scope's label (``("agent", me, "org")`` shortened to
    ``("org",)`` would name the org scope, and a get, put or delete through it another item)."""
    if not absolute and canon[:2] == ("agent", me):
        short = canon[2:]
        if short and short[0] not in SCOPE_LABELS:
            return short
    return canon


def prefix_scope(prefix: Namespace, me: str) -> str | None:
    """The one scope a search or listing under ``prefix`` can find anything in, or None when
    it may span several (then every scope the caller may read is listed)."""
    if not prefix or prefix[0] == "*":
        return None
    if prefix[0] == "org":
        return "org"
    if prefix[0] in ("team", "agent"):
        if len(prefix) < 2 or prefix[1] == "*":
            return None
        _check_name(prefix)
        return f"{prefix[0]}:{prefix[1]}"
    return f"agent:{me}"


def check_condition(condition: Any) -> MatchCondition:
    """A ListNamespacesOp condition, checked before anything is sent."""
    if not isinstance(condition, MatchCondition):
        raise InvalidValueError(f"match_conditions: MatchCondition values, not {type(condition).__name__}.")
    if condition.match_type not in ("prefix", "suffix"):
        raise InvalidValueError(f"match_type: {condition.match_type!r} is not prefix or suffix.")
    check_labels(condition.path, f"{condition.match_type} condition")
    return condition


def matches(namespace: Namespace, condition: MatchCondition) -> bool:
    """A ListNamespacesOp condition (``*`` matches any one label)."""
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    else:
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    return all(p == "*" or n == p for n, p in pairs)


# -- document ids -----------------------------------------------------------------------


def doc_id(canon: Namespace, key: str) -> str:
    digest = hashlib.sha256(json.dumps([list(canon), key], ensure_ascii=False).encode()).hexdigest()
    slug = re.sub(r"[^a-z0-9]+", "-", "-".join([*_inside(canon), key]).lower()).strip("-")
    room = MAX_ID - len(ID_PREFIX) - 1 - HASH_CHARS
    slug = slug[:room].strip("-")
    return f"{ID_PREFIX}{slug + '-' if slug else ''}{digest[:HASH_CHARS]}"


# -- values -----------------------------------------------------------------------------


def check_key(key: Any) -> str:
    if not isinstance(key, str):
        raise InvalidValueError(f"key: must be a string, not {type(key).__name__}.")
    return key


def check_value(value: Any) -> dict:
    """A value as JSON would give it back; InvalidValueError naming the first bad part."""
    if not isinstance(value, Mapping):
        raise InvalidValueError(f"value: must be a mapping (a dict), not {type(value).__name__}; "
                                "nothing was stored.")
    return _json_value(value, "value")


def _json_value(value: Any, path: str) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidValueError(f"{path}: {value!r} is not a JSON number; nothing was stored.")
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidValueError(f"{path}: key {k!r} is {type(k).__name__}; JSON object keys "
                                        "are strings. Nothing was stored.")
            out[k] = _json_value(v, f"{path}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_json_value(v, f"{path}[{i}]") for i, v in enumerate(value)]
    raise InvalidValueError(f"{path}: a {type(value).__name__} is not JSON-serializable; store "
                            "strings, numbers, booleans, None, lists and dicts. Nothing was stored.")


def document(canon: Namespace, key: str, value: dict, kind: str, tags: tuple[str, ...]) -> dict:
    """The memory document for an item (InvalidValueError when it would be too large)."""
    ident = doc_id(canon, key)
    body = json.dumps({"store": STORE, "id": ident, "namespace": list(canon), "key": key,
                       "value": value}, ensure_ascii=False)
    title = "/".join([*_inside(canon), key]) or f"{scope_of(canon)} item"
    if len(title) > MAX_TITLE:
        title = title[:MAX_TITLE - 1] + "…"
    doc = {"kind": kind, "title": title, "body": body, "tags": [TAG, *tags]}
    size = len(json.dumps(doc, ensure_ascii=False).encode())  # as the SDK sends it
    if size > MAX_DOCUMENT:
        raise InvalidValueError(
            f"value for {canon!r}/{key!r}: the memory document would be {size} bytes; the gateway "
            f"takes at most {MAX_DOCUMENT} (256 KiB). Store large data as a file in a workspace "
            "bucket and keep its key in the value. Nothing was stored.")
    return doc


def decode(doc: Mapping[str, Any]) -> tuple[Namespace, str, dict] | None:
    """(canonical namespace, key, value) of a store document; None for any other document."""
    try:
        body = json.loads(doc.get("body") or "")
    except (TypeError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("store") != STORE or body.get("id") != doc.get("id"):
        return None
    ns, key, value = body.get("namespace"), body.get("key"), body.get("value")
    if not (isinstance(ns, list) and ns and all(isinstance(x, str) and x for x in ns)
            and isinstance(key, str) and isinstance(value, dict)):
        return None
    canon = tuple(ns)
    if canon[0] not in SCOPE_LABELS or scope_of(canon) != doc.get("scope"):
        return None
    return canon, key, value


def stamp(doc: Mapping[str, Any], name: str) -> datetime:
    return datetime.fromisoformat(str(doc[name]).replace("Z", "+00:00"))


def item(doc: Mapping[str, Any], namespace: Namespace, key: str, value: dict) -> Item:
    return Item(value=value, key=key, namespace=namespace, created_at=stamp(doc, "created_at"),
                updated_at=stamp(doc, "updated_at"))


# -- filters ----------------------------------------------------------------------------


def check_filter(flt: Any) -> dict | None:
    """A SearchOp filter, checked before anything is sent."""
    if flt is None:
        return None
    if not isinstance(flt, Mapping):
        raise InvalidValueError(f"filter: must be a dict, not {type(flt).__name__}.")
    _check_operators(flt, "filter")
    return dict(flt)


def _check_operators(flt: Mapping, path: str) -> None:
    for k, v in flt.items():
        if isinstance(k, str) and k.startswith("$") and k not in OPERATORS:
            raise InvalidValueError(f"{path}: unknown operator {k!r}; use {', '.join(OPERATORS)}.")
        if isinstance(v, Mapping):
            _check_operators(v, f"{path}[{k!r}]")


def passes(value: Mapping[str, Any], flt: Mapping[str, Any] | None) -> bool:
    """Whether a value matches a filter, as LangGraph's stores match (nested dicts, lists
    element by element, and the comparison operators)."""
    return not flt or all(_compare(value.get(k), want) for k, want in flt.items())


def _compare(have: Any, want: Any) -> bool:
    if isinstance(want, Mapping):
        if any(isinstance(k, str) and k.startswith("$") for k in want):
            return all(_operator(have, op, arg) for op, arg in want.items())
        return isinstance(have, Mapping) and all(_compare(have.get(k), v) for k, v in want.items())
    if isinstance(want, (list, tuple)):
        return (isinstance(have, (list, tuple)) and len(have) == len(want)
                and all(_compare(h, w) for h, w in zip(have, want, strict=True)))
    return have == want


def _operator(have: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return have == arg
    if op == "$ne":
        return have != arg
    if isinstance(have, bool) or isinstance(arg, bool):
        return False
    numbers = isinstance(have, (int, float)) and isinstance(arg, (int, float))
    if not numbers and not (isinstance(have, str) and isinstance(arg, str)):
        return False
    return {"$gt": have > arg, "$gte": have >= arg, "$lt": have < arg, "$lte": have <= arg}[op]
