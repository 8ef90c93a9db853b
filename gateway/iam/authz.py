"""Authorization: may this principal perform this action on this resource?

One service for every protocol: the S3 layer, the REST API and (later) MCP
ask it the same question with AWS-style action names and ARNs. The root is
never subject to policies; everyone else is denied unless a policy attached to
them or to one of their teams allows, and an explicit deny always wins. Sandbox
credentials with a session policy also need that policy's allow (the identity
store hands out the intersected set, so this module needs no special case).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence

from .identities import IdentityStore
from .policy import Decision, Glob
from .principals import Principal

ROOT_DECISION = Decision(allowed=True, decision="allow", statement=None, matched=[],
                         explanation="Allowed: the root is not subject to policies.")

#: Operations that decide per item (ListBuckets filters, DeleteObjects reports per key)
#: are let through whole; each item is then decided on its own.
PER_ITEM_DECISION = Decision(allowed=True, decision="allow", statement=None, matched=[],
                             explanation="Allowed through: each item is decided on its own.")

#: Asking who you are needs no permission, as with AWS's sts:GetCallerIdentity.
SELF_DECISION = Decision(allowed=True, decision="allow", statement=None, matched=[],
                         explanation="Allowed: every principal may ask who it is.")

#: What a condition context holds: lowercase key -> one value or several.
Context = Mapping[str, str | Sequence[str]]


class Authorizer:
    def __init__(self, identities: IdentityStore) -> None:
        self.identities = identities

    def decide(self, principal: Principal, action: str, resource: str, context: Context) -> Decision:
        if principal.is_root:
            return ROOT_DECISION
        return self.identities.policy_set(principal).evaluate(action, resource, context)

    def allows(self, principal: Principal, action: str, resource: str, context: Context) -> bool:
        return self.decide(principal, action, resource, context).allowed

    def denials(self, principal: Principal, action: str, context: Context
                ) -> list[tuple[tuple[Glob, ...], bool]]:
        """The explicit Denies of ``action`` that apply in ``context`` (see ``PolicySet.denials``)."""
        if principal.is_root:
            return []
        return self.identities.policy_set(principal).denials(action, context)

    def covers(self, principal: Principal, action: str, prefix: str, context: Context) -> bool:
        """Whether the Allows of every policy set that must agree (a sandbox session's too)
        reach every resource under ``prefix``: by a pattern covering it all, or by NotResource
        (what that leaves out is for :meth:`narrowings` to take out)."""
        if principal.is_root:
            return True
        return all(any(not_resource or covers_all_under(glob, prefix) for glob, not_resource in allows)
                   for allows in self.identities.policy_set(principal).allowance_sets(action, context))

    def narrowings(self, principal: Principal, action: str, context: Context
                   ) -> list[tuple[Glob, list[Glob]]]:
        """What Allows with NotResource leave out, each with the plain Allows of the same set
        (which may grant some of it back): ``(pattern, unless)``."""
        if principal.is_root:
            return []
        out = []
        for allows in self.identities.policy_set(principal).allowance_sets(action, context):
            plain = [glob for glob, not_resource in allows if not not_resource]
            out += [(glob, plain) for glob, not_resource in allows if not_resource]
        return out

    def allows_some_under(self, principal: Principal, action: str, prefix: str, context: Context) -> bool:
        """Whether the Allows of every policy set that must agree may reach some resource
        under ``prefix``: a cheap gate before work whose every item is authorized later (it
        errs towards yes)."""
        if principal.is_root:
            return True
        return all(any(not_resource or _may_match_under(glob, prefix) for glob, not_resource in allows)
                   for allows in self.identities.policy_set(principal).allowance_sets(action, context))

    def denies_some_under(self, principal: Principal, action: str, prefix: str, context: Context) -> bool:
        """Whether an explicit Deny of ``action`` may cover some resource under ``prefix``."""
        return denies_some_under(self.denials(principal, action, context), prefix)


def denies_some_under(denials: list[tuple[tuple[Glob, ...], bool]], prefix: str) -> bool:
    """Whether any of ``denials`` (see ``Authorizer.denials``) may take away some resource
    that starts with ``prefix``. Conservative: True whenever a statement might, so a caller
    that must serve all resources under ``prefix`` or none refuses rather than leaks."""
    for globs, not_resource in denials:
        if not_resource:  # it denies what its patterns leave out: nothing here if one covers it all
            if not any(covers_all_under(glob, prefix) for glob in globs):
                return True
        elif any(_may_match_under(glob, prefix) for glob in globs):
            return True
    return False


def _may_match_under(glob: Glob, prefix: str) -> bool:
    """Whether some resource starting with ``prefix`` may match ``glob``."""
    text = ""
    for unit in glob:
        if not unit:  # "*" or "?": anything after it may match
            return True
        text += unit
        if not (prefix.startswith(text) or text.startswith(prefix)):
            return False
    return text.startswith(prefix)


def covers_all_under(glob: Glob, prefix: str) -> bool:
    """Whether ``glob`` matches every resource starting with ``prefix``: it must end in ``*``
    (only that absorbs any rest), and what comes before must match some start of ``prefix``
    (``bio:::*/*`` covers ``bio:::alice/``, ``bio:::al*`` too, ``bio:::*/x*`` does not)."""
    if not glob or glob[-1] is not None:
        return False
    return _head_pattern(glob[:-1]).match(prefix) is not None


@functools.lru_cache(maxsize=4096)
def _head_pattern(units: Glob) -> re.Pattern[str]:
    """A regex whose ``match`` says whether ``units`` match some start of a string. Each
    segment between stars is placed at its leftmost occurrence, atomically: that never loses
    a match of a start, and a policy's ``*a*a*a*a*/?`` against a caller's bucket name of many
    ``a`` no longer backtracks for minutes with the GIL held (``.*`` per star did)."""
    segments: list[str] = [""]
    for unit in units:
        if unit is None:
            segments.append("")
        else:
            segments[-1] += "." if unit == "" else re.escape(unit)
    first, *rest = segments
    return re.compile(first + "".join(f"(?>.*?{segment})" for segment in rest if segment), re.DOTALL)


def reason(decision: Decision, items_denied: int = 0) -> str:
    """The short audit form of what decided: ``policy#sid``, ``root`` or ``implicit-deny``."""
    if decision is ROOT_DECISION:
        return "root"
    if decision is PER_ITEM_DECISION:
        return f"per-item: {items_denied} denied"
    if decision is SELF_DECISION:
        return "self"
    return decision.reason


def denial_message(principal: Principal, action: str, resource: str, decision: Decision) -> str:
    """AWS's wording, which names the action and resource but not the policy text."""
    kind = "session policy" if decision.source == "session" else "identity-based policy"
    article = "a" if decision.source == "session" else "an"
    why = (f"with an explicit deny in {article} {kind}" if decision.decision == "explicit-deny"
           else f"because no {kind} allows the {action} action")
    return f"User: {principal.name} is not authorized to perform: {action} on resource: {resource} {why}"
