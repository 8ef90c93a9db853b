"""The IAM policy engine: the action catalogue, parsing/validation, compilation and evaluation."""

from __future__ import annotations

import json
import random
import re
import time

import pytest

from gateway.iam import actions
from gateway.iam.builtin import BUILTIN_NAMES, BUILTIN_POLICIES
from gateway.iam.policy import (
    MAX_POLICY_BYTES,
    OPERATORS,
    Decision,
    PolicyError,
    PolicySet,
    StatementRef,
    expand_variables,
    parse_policy,
)

V = "2012-10-17"


def doc(*statements, **top):
    return {"Version": V, "Statement": list(statements), **top}


def allow(action, resource="*", **extra):
    return {"Effect": "Allow", "Action": action, "Resource": resource, **extra}


def deny(action, resource="*", **extra):
    return {"Effect": "Deny", "Action": action, "Resource": resource, **extra}


def compiled(policies, user="alice", teams=()):
    """policies: {name: policy dict} or a single policy dict (named "p")."""
    if "Statement" in policies:
        policies = {"p": policies}
    return PolicySet.compile([(name, parse_policy(json.dumps(p))) for name, p in policies.items()], user, teams)


def allowed(policies, action, resource, context=None, user="alice", teams=()):
    return compiled(policies, user, teams).evaluate(action, resource, context or {}).allowed


def refused(policy) -> str:
    text = policy if isinstance(policy, (str, bytes)) else json.dumps(policy)
    with pytest.raises(PolicyError) as info:
        parse_policy(text)
    return str(info.value)


# ---------------------------------------------------------------------------------------------------------
# The catalogue


def test_known_actions_match_without_case():
    assert actions.is_known_action("s3:GetObject")
    assert actions.is_known_action("S3:getobject")
    assert actions.is_known_action("admin:ManageKeys")
    assert not actions.is_known_action("s3:GetObjekt")
    assert not actions.is_known_action("s3:Get*")
    assert not actions.is_known_action("GetObject")
    assert actions.canonical_action("MEMORY:putdocument") == "memory:PutDocument"
    assert actions.canonical_action("nope:Nope") is None


def test_every_service_of_the_brief_is_catalogued():
    assert set(actions.SERVICES) == {"s3", "bio", "memory", "skills", "vault", "search", "admin"}
    counts = {prefix: len(s.actions) for prefix, s in actions.SERVICES.items()}
    assert counts == {"s3": 48, "bio": 7, "memory": 5, "skills": 4, "vault": 5, "search": 4, "admin": 24}
    assert "s3:GetObjectVersion" in actions.all_actions()
    assert "GetObjectVersion" in actions.SERVICES["s3"].unused
    assert "GetObject" not in actions.SERVICES["s3"].unused


@pytest.mark.parametrize("pattern, expected", [
    ("*", True), ("s3:*", True), ("s3:Get*", True), ("S3:GET*", True), ("s3:?etObject", True),
    ("vault:*Secret*", True), ("s3:GetObjekt", False), ("s3:Frob*", False), ("ec2:*", False),
])
def test_pattern_matches_any(pattern, expected):
    assert actions.pattern_matches_any(pattern) is expected


def test_wildcard_pattern_covers_the_right_actions():
    assert set(actions.matching_actions("bio:Get*")) == {"bio:GetEvents", "bio:GetDigest", "bio:GetRetention"}
    assert len(actions.matching_actions("*")) == len(actions.all_actions())


def test_markdown_table_lists_every_action_and_resource_form():
    table = actions.markdown_table()
    for action in actions.all_actions():
        assert f"`{action}`" in table
    for service in actions.SERVICES.values():
        for arn in service.resources:
            assert arn in table
    row = next(line for line in table.splitlines() if "`s3:GetObjectVersion`" in line)
    assert "not used by orgmem yet" in row
    row = next(line for line in table.splitlines() if "`s3:GetObject`" in line)
    assert "not used by orgmem yet" not in row
    assert all(line.count("|") == 5 for line in table.splitlines())


# ---------------------------------------------------------------------------------------------------------
# Built-in policies


def test_builtins_parse():
    assert BUILTIN_NAMES == ("admin", "readwrite", "readonly", "agent-default")
    for name, policy in BUILTIN_POLICIES.items():
        parsed = parse_policy(json.dumps(policy))
        assert parsed.statements, name
    sids = [st.sid for st in parse_policy(BUILTIN_POLICIES["agent-default"]).statements]
    assert all(sids) and len(set(sids)) == len(sids)


@pytest.mark.parametrize("action, resource, admin, readwrite, readonly", [
    ("s3:GetObject", "arn:aws:s3:::b/k", True, True, True),
    ("s3:PutObject", "arn:aws:s3:::b/k", True, True, False),
    ("s3:ListBucket", "arn:aws:s3:::b", True, True, True),
    ("s3:ListAllMyBuckets", "*", True, True, True),
    ("s3:DeleteBucket", "arn:aws:s3:::b", True, True, False),
    ("memory:GetDocument", "arn:orgmem:memory:::org/x", True, True, True),
    ("memory:PutDocument", "arn:orgmem:memory:::org/x", True, True, False),
    ("bio:PutEvents", "arn:orgmem:bio:::bob/s1", True, True, False),
    ("search:Query", "arn:orgmem:search:::memory", True, True, True),
    ("vault:GetSecret", "arn:orgmem:vault:::agents/bob/k", True, False, False),
    ("admin:CreateAgent", "arn:orgmem:admin:::agent/carol", True, False, False),
    ("admin:ManageKeys", "arn:orgmem:admin:::kek", True, False, False),
])
def test_builtin_admin_readwrite_readonly(action, resource, admin, readwrite, readonly):
    for name, expected in (("admin", admin), ("readwrite", readwrite), ("readonly", readonly)):
        assert allowed({name: BUILTIN_POLICIES[name]}, action, resource) is expected, name


AGENT_DEFAULT = {"agent-default": BUILTIN_POLICIES["agent-default"]}


@pytest.mark.parametrize("action, resource", [
    ("s3:CreateBucket", "arn:aws:s3:::agent-alice"),
    ("s3:ListBucket", "arn:aws:s3:::agent-alice"),
    ("s3:GetObject", "arn:aws:s3:::agent-alice/notes/today.md"),
    ("s3:PutObject", "arn:aws:s3:::agent-alice/x"),
    ("s3:AbortMultipartUpload", "arn:aws:s3:::agent-alice/x"),
    ("memory:PutDocument", "arn:orgmem:memory:::agent/alice/plan"),
    ("memory:GetDocument", "arn:orgmem:memory:::org/handbook"),
    ("memory:GetHistory", "arn:orgmem:memory:::team/red/runbook"),
    ("skills:GetSkill", "arn:orgmem:skills:::org/deploy"),
    ("skills:ListSkills", "arn:orgmem:skills:::team/blue/"),
    ("skills:DeleteSkill", "arn:orgmem:skills:::agent/alice/scratch"),
    ("bio:PutEvents", "arn:orgmem:bio:::alice/s-1"),
    ("bio:ListSessions", "arn:orgmem:bio:::alice/"),
    ("search:Query", "arn:orgmem:search:::memory"),
    ("search:GetContext", "arn:orgmem:search:::file"),
    ("vault:GetSecret", "arn:orgmem:vault:::agents/alice/github-token"),
])
def test_agent_default_allows_its_own_things(action, resource):
    assert allowed(AGENT_DEFAULT, action, resource, teams=["red", "blue"])


@pytest.mark.parametrize("action, resource", [
    ("s3:GetObject", "arn:aws:s3:::agent-bob/notes"),
    ("s3:ListBucket", "arn:aws:s3:::agent-bob"),
    ("s3:PutObject", "arn:aws:s3:::agent-alicex/x"),  # a prefix of another agent's name is not "own"
    ("s3:GetObject", "arn:aws:s3:::agent-alice"),  # bucket ARN is not an object ARN
    ("s3:DeleteBucket", "arn:aws:s3:::agent-alice"),
    ("s3:ListAllMyBuckets", "*"),
    ("s3:GetObject", "arn:aws:s3:::shared/x"),
    ("memory:PutDocument", "arn:orgmem:memory:::org/handbook"),
    ("memory:GetDocument", "arn:orgmem:memory:::team/green/runbook"),
    ("memory:GetDocument", "arn:orgmem:memory:::agent/bob/plan"),
    ("skills:PutSkill", "arn:orgmem:skills:::team/red/x"),
    ("bio:GetEvents", "arn:orgmem:bio:::bob/s-1"),
    ("vault:GetSecret", "arn:orgmem:vault:::agents/bob/github-token"),
    ("vault:PutSecret", "arn:orgmem:vault:::agents/alice/github-token"),
    ("admin:ListAgents", "arn:orgmem:admin:::agent/alice"),
])
def test_agent_default_refuses_other_agents_things(action, resource):
    decision = compiled(AGENT_DEFAULT, teams=["red", "blue"]).evaluate(action, resource, {})
    assert not decision.allowed and decision.decision == "implicit-deny"


def test_agent_default_is_per_principal():
    """Same policy, two principals, opposite answers."""
    alice = compiled(AGENT_DEFAULT, user="alice")
    bob = compiled(AGENT_DEFAULT, user="bob")
    assert alice.evaluate("s3:GetObject", "arn:aws:s3:::agent-alice/k").allowed
    assert not bob.evaluate("s3:GetObject", "arn:aws:s3:::agent-alice/k").allowed
    assert bob.evaluate("s3:GetObject", "arn:aws:s3:::agent-bob/k").allowed
    assert not alice.evaluate("s3:GetObject", "arn:aws:s3:::agent-bob/k").allowed


def test_agent_default_without_teams_reads_org_but_no_team():
    ps = compiled(AGENT_DEFAULT, teams=())
    assert ps.evaluate("memory:GetDocument", "arn:orgmem:memory:::org/x").allowed
    assert not ps.evaluate("memory:GetDocument", "arn:orgmem:memory:::team/red/x").allowed
    assert not ps.evaluate("memory:GetDocument", "arn:orgmem:memory:::team//x").allowed


# ---------------------------------------------------------------------------------------------------------
# Matching


def test_action_wildcards_ignore_case():
    p = doc(allow("S3:get*"), allow("memory:?etDocument"))
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::b/k")
    assert allowed(p, "s3:GetBucketAcl", "arn:aws:s3:::b")
    assert not allowed(p, "s3:PutObject", "arn:aws:s3:::b/k")
    assert allowed(p, "memory:GetDocument", "arn:orgmem:memory:::org/x")
    assert not allowed(p, "memory:PutDocument", "arn:orgmem:memory:::org/x")
    assert allowed(doc(allow("*")), "admin:ManageKeys", "arn:orgmem:admin:::kek")


def test_resource_matching_is_case_sensitive_and_star_crosses_slashes():
    p = doc(allow("s3:GetObject", "arn:aws:s3:::data/*"))
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::data/a/b/c.txt")
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::data/")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::Data/a")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::data")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::database/a")
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::data/line\nbreak")


def test_question_mark_is_exactly_one_character():
    p = doc(allow("s3:GetObject", "arn:aws:s3:::b/log-?.txt"))
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::b/log-1.txt")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::b/log-12.txt")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::b/log-.txt")


def test_regex_metacharacters_in_resources_are_literal():
    p = doc(allow("s3:GetObject", "arn:aws:s3:::b/a.b+(c)[d]"))
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::b/a.b+(c)[d]")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::b/aXb+(c)[d]")


def test_wildcards_agree_with_the_plain_translation():
    """The backtracking-safe regexes match exactly what ``*`` -> ``.*``, ``?`` -> ``.`` would."""
    rng = random.Random(7)
    for _ in range(5000):
        pattern = "".join(rng.choice("ab*?/") for _ in range(rng.randint(0, 8)))
        text = "".join(rng.choice("ab/") for _ in range(rng.randint(0, 9)))
        plain = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
        expected = re.fullmatch(plain, text, re.DOTALL) is not None
        assert (re.fullmatch(actions.wildcard_source(pattern), text, re.DOTALL) is not None) is expected, \
            (pattern, text)


def test_pathological_wildcards_do_not_backtrack():
    """A naive regex for this pattern would take longer than the age of the universe on this prefix."""
    pattern = "arn:aws:s3:::b/" + "*a" * 30 + "*b"
    p = doc(allow("s3:ListBucket", "arn:aws:s3:::b", Condition={"StringLike": {"s3:prefix": pattern[15:]}}),
            allow("s3:GetObject", pattern))
    ps = compiled(p)
    assert not ps.evaluate("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "a" * 1000}).allowed
    assert not ps.evaluate("s3:GetObject", "arn:aws:s3:::b/" + "a" * 1000).allowed
    assert ps.evaluate("s3:GetObject", "arn:aws:s3:::b/" + "a" * 1000 + "b").allowed


def test_covers_all_under_agrees_with_the_plain_translation_and_does_not_backtrack():
    """``covers_all_under`` (search and per-prefix answers) matched a glob's head with ``.*``
    per star: a policy's ``*a*a*a*a*/?`` against a bucket name of many ``a`` held the GIL for
    seconds to minutes. Its atomic form must answer exactly as the plain one."""
    from gateway.iam.authz import covers_all_under

    def units(pattern: str):
        return tuple(None if c == "*" else "" if c == "?" else c for c in pattern)

    rng = random.Random(11)
    for _ in range(5000):
        pattern = "".join(rng.choice("ab*?/") for _ in range(rng.randint(0, 8))) + "*"
        prefix = "".join(rng.choice("ab/") for _ in range(rng.randint(0, 9)))
        head = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern[:-1])
        expected = re.match(head, prefix, re.DOTALL) is not None
        assert covers_all_under(units(pattern), prefix) is expected, (pattern, prefix)
    evil = units("arn:aws:s3:::" + "*a" * 12 + "*/?*")
    assert covers_all_under(evil, "arn:aws:s3:::" + "a" * 60 + "/") is False


def test_not_action():
    p = doc({"Effect": "Allow", "NotAction": ["vault:*", "admin:*"], "Resource": "*"})
    assert allowed(p, "s3:PutObject", "arn:aws:s3:::b/k")
    assert allowed(p, "memory:DeleteDocument", "arn:orgmem:memory:::org/x")
    assert not allowed(p, "vault:GetSecret", "arn:orgmem:vault:::x")
    assert not allowed(p, "admin:CreateAgent", "arn:orgmem:admin:::agent/x")


def test_not_resource_with_deny():
    p = doc(allow("s3:*"), {"Effect": "Deny", "Action": "s3:*", "NotResource": ["arn:aws:s3:::safe", "arn:aws:s3:::safe/*"]})
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::safe/k")
    assert allowed(p, "s3:ListBucket", "arn:aws:s3:::safe")
    decision = compiled(p).evaluate("s3:GetObject", "arn:aws:s3:::other/k")
    assert decision.decision == "explicit-deny" and decision.statement.index == 1


def test_deny_wins_whatever_the_order():
    for order in ((("a", doc(allow("s3:*"))), ("b", doc(deny("s3:DeleteObject")))),
                  (("b", doc(deny("s3:DeleteObject"))), ("a", doc(allow("s3:*"))))):
        ps = compiled(dict(order))
        decision = ps.evaluate("s3:DeleteObject", "arn:aws:s3:::b/k")
        assert not decision.allowed and decision.decision == "explicit-deny"
        assert decision.statement == StatementRef("b", 0, None, "Deny")
        assert {ref.policy for ref in decision.matched} == {"a", "b"}
        assert ps.evaluate("s3:PutObject", "arn:aws:s3:::b/k").allowed


def test_implicit_deny_by_default():
    ps = compiled({"agent-default": BUILTIN_POLICIES["agent-default"], "readonly": BUILTIN_POLICIES["readonly"]})
    decision = ps.evaluate("s3:PutObject", "arn:aws:s3:::x/y")
    assert decision == Decision(False, "implicit-deny", None, [], decision.explanation)
    assert decision.explanation == ("Denied: no statement of the policies attached to alice "
                                    "(agent-default, readonly) allows s3:PutObject on arn:aws:s3:::x/y.")
    assert decision.reason == "implicit-deny"
    empty = PolicySet.compile([], "alice", [])
    decision = empty.evaluate("s3:GetObject", "arn:aws:s3:::b/k")
    assert not decision.allowed and "alice has no policies attached" in decision.explanation


def test_explanations_and_reasons_name_the_deciding_statement():
    policies = {
        "agent-default": BUILTIN_POLICIES["agent-default"],
        "no-secrets": doc(allow("s3:ListAllMyBuckets", Sid="Unrelated"), allow("s3:GetBucketAcl"),
                          deny("vault:*", Sid="DenySecrets")),
    }
    ps = compiled(policies)
    decision = ps.evaluate("s3:GetObject", "arn:aws:s3:::agent-alice/k")
    assert decision.allowed and decision.decision == "allow"
    assert decision.explanation == 'Allowed by statement "OwnWorkspaceObjects" (#1) of policy "agent-default".'
    assert decision.reason == "agent-default#OwnWorkspaceObjects"
    assert decision.statement == StatementRef("agent-default", 1, "OwnWorkspaceObjects", "Allow")

    decision = ps.evaluate("vault:GetSecret", "arn:orgmem:vault:::agents/alice/k")
    assert decision.decision == "explicit-deny"
    assert decision.explanation == 'Denied explicitly by statement "DenySecrets" (#2) of policy "no-secrets".'
    assert decision.reason == "no-secrets#DenySecrets"
    assert [ref.label for ref in decision.matched] == ["agent-default#OwnSecrets", "no-secrets#DenySecrets"]

    decision = ps.evaluate("s3:GetBucketAcl", "arn:aws:s3:::any")
    assert decision.reason == "no-secrets#1"
    assert decision.explanation == 'Allowed by statement #1 of policy "no-secrets".'


def test_evaluate_refuses_an_action_missing_from_the_catalogue():
    ps = compiled(doc(allow("*")))
    with pytest.raises(ValueError, match="s3:GetObjekt"):
        ps.evaluate("s3:GetObjekt", "arn:aws:s3:::b/k")


def test_evaluate_accepts_actions_in_any_case():
    assert compiled(doc(allow("s3:GetObject"))).evaluate("S3:GETOBJECT", "arn:aws:s3:::b/k").allowed


# ---------------------------------------------------------------------------------------------------------
# Variables


def test_username_variable_differs_per_principal():
    p = doc(allow("s3:*", "arn:aws:s3:::home/${aws:username}/*"))
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::home/alice/x", user="alice")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::home/alice/x", user="bob")
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::home/bob/x", user="bob")


def test_variable_names_ignore_case():
    p = doc(allow("s3:GetObject", "arn:aws:s3:::home/${AWS:UserName}/*"))
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::home/alice/x")


def test_substituted_values_are_literal_not_wildcards():
    p = doc(allow("s3:GetObject", "arn:aws:s3:::home/${aws:username}/*"))
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::home/a*/x", user="a*")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::home/anyone/x", user="a*")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::home/ab/x", user="a.")


def test_escape_variables_are_literal_characters():
    p = doc(allow("s3:GetObject", "arn:aws:s3:::b/${*}${?}${$}"))
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::b/*?$")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::b/xy$")


def test_teams_variable_expands_to_one_pattern_per_team():
    p = doc(allow("memory:GetDocument", "arn:orgmem:memory:::team/${orgmem:teams}/*"))
    for team in ("red", "blue", "green"):
        assert allowed(p, "memory:GetDocument", f"arn:orgmem:memory:::team/{team}/x", teams=["red", "blue", "green"])
    assert not allowed(p, "memory:GetDocument", "arn:orgmem:memory:::team/black/x", teams=["red", "blue"])
    assert not allowed(p, "memory:GetDocument", "arn:orgmem:memory:::team/red/x", teams=[])
    assert not allowed(p, "memory:GetDocument", "arn:orgmem:memory:::team//x", teams=[])


def test_teams_and_username_in_one_pattern():
    p = doc(allow("memory:PutDocument", "arn:orgmem:memory:::team/${orgmem:teams}/${aws:username}/*"))
    assert allowed(p, "memory:PutDocument", "arn:orgmem:memory:::team/blue/alice/x", teams=["red", "blue"])
    assert not allowed(p, "memory:PutDocument", "arn:orgmem:memory:::team/blue/bob/x", teams=["red", "blue"])


def test_not_resource_with_teams_and_no_teams():
    """A Deny on everything outside the caller's teams denies everything when there is no team."""
    p = doc(allow("memory:*"), {"Effect": "Deny", "Action": "memory:*",
                                "NotResource": "arn:orgmem:memory:::team/${orgmem:teams}/*"})
    assert allowed(p, "memory:GetDocument", "arn:orgmem:memory:::team/red/x", teams=["red"])
    assert not allowed(p, "memory:GetDocument", "arn:orgmem:memory:::team/blue/x", teams=["red"])
    assert not allowed(p, "memory:GetDocument", "arn:orgmem:memory:::team/red/x", teams=[])


def test_expand_variables():
    assert expand_variables("team/${orgmem:teams}/${aws:username}", "alice", ["a", "b", "a"]) == \
        ["team/a/alice", "team/b/alice"]
    assert expand_variables("team/${orgmem:teams}", "alice", []) == []
    assert expand_variables("x/${*}", "alice", []) == ["x/*"]
    with pytest.raises(PolicyError, match="aws:userid"):
        expand_variables("${aws:userid}", "alice", [])


def test_context_cannot_override_the_principal():
    p = doc(allow("s3:GetObject", Condition={"StringEquals": {"aws:username": "root"}}))
    ps = compiled(p, user="alice")
    assert not ps.evaluate("s3:GetObject", "arn:aws:s3:::b/k", {"aws:username": "root"}).allowed
    assert compiled(p, user="root").evaluate("s3:GetObject", "arn:aws:s3:::b/k", {}).allowed


# ---------------------------------------------------------------------------------------------------------
# Conditions


def cond(block, context, user="alice", teams=()):
    """Whether an Allow with this Condition block applies to the request context."""
    p = doc(allow("s3:ListBucket", "arn:aws:s3:::b", Condition=block))
    return allowed(p, "s3:ListBucket", "arn:aws:s3:::b", context, user=user, teams=teams)


@pytest.mark.parametrize("operator, value, request_value, expected", [
    ("StringEquals", "home/", "home/", True),
    ("StringEquals", "home/", "Home/", False),
    ("StringEquals", "home/*", "home/x", False),  # no wildcards in StringEquals
    ("StringEquals", ["a", "home/"], "home/", True),  # values OR
    ("StringNotEquals", "home/", "home/", False),
    ("StringNotEquals", "home/", "work/", True),
    ("StringEqualsIgnoreCase", "HOME/", "home/", True),
    ("StringEqualsIgnoreCase", "HOME/", "work/", False),
    ("StringNotEqualsIgnoreCase", "HOME/", "home/", False),
    ("StringNotEqualsIgnoreCase", "HOME/", "work/", True),
    ("StringLike", "home/*", "home/a/b", True),
    ("StringLike", "home/?", "home/ab", False),
    ("StringLike", "home/*", "HOME/a", False),
    ("StringLike", "", "", True),
    ("StringNotLike", "home/*", "home/a", False),
    ("StringNotLike", "home/*", "work/a", True),
])
def test_string_operators(operator, value, request_value, expected):
    assert cond({operator: {"s3:prefix": value}}, {"s3:prefix": request_value}) is expected


@pytest.mark.parametrize("operator, value, request_value, expected", [
    ("NumericEquals", "100", "100", True),
    ("NumericEquals", 100, "100.0", True),
    ("NumericEquals", "100", "99", False),
    ("NumericNotEquals", "100", "99", True),
    ("NumericNotEquals", "100", "100", False),
    ("NumericLessThan", "100", "99", True),
    ("NumericLessThan", "100", "100", False),
    ("NumericLessThanEquals", "100", "100", True),
    ("NumericLessThanEquals", "100", "101", False),
    ("NumericGreaterThan", "100", "101", True),
    ("NumericGreaterThan", "100", "100", False),
    ("NumericGreaterThanEquals", "100", "100", True),
    ("NumericGreaterThanEquals", "100", "99", False),
    ("NumericLessThan", ["10", "50"], "20", True),  # values OR
    ("NumericLessThan", "1.5", "1.25", True),
    ("NumericEquals", "100", "lots", False),  # a request value that is not a number never matches
    ("NumericNotEquals", "100", "lots", True),
])
def test_numeric_operators(operator, value, request_value, expected):
    assert cond({operator: {"s3:max-keys": value}}, {"s3:max-keys": request_value}) is expected


@pytest.mark.parametrize("value, request_value, expected", [
    ("true", "true", True), ("true", "false", False), ("false", "false", True),
    (True, "true", True), ("TRUE", "true", True), ("true", "True", True), ("true", "yes", False),
])
def test_bool_operator(value, request_value, expected):
    assert cond({"Bool": {"aws:SecureTransport": value}}, {"aws:securetransport": request_value}) is expected


@pytest.mark.parametrize("networks, ip, expected", [
    ("192.0.2.0/24", "192.0.2.77", True),
    ("192.0.2.0/24", "192.0.3.1", False),
    ("192.0.2.5", "192.0.2.5", True),  # a bare address is a /32
    ("192.0.2.5", "192.0.2.6", False),
    (["10.0.0.0/8", "192.0.2.0/24"], "10.200.1.1", True),
    ("2001:db8::/32", "2001:db8:1234::1", True),
    ("2001:db8::/32", "2001:db9::1", False),
    ("2001:db8::/32", "192.0.2.1", False),
    ("192.0.2.0/24", "::ffff:192.0.2.9", True),  # IPv4-mapped IPv6 counts as IPv4
    ("127.0.0.0/8", "not-an-ip", False),
    ("192.0.2.1/24", "192.0.2.200", True),  # host bits are ignored, as AWS does
])
def test_ip_address_operator(networks, ip, expected):
    assert cond({"IpAddress": {"aws:SourceIp": networks}}, {"aws:sourceip": ip}) is expected
    assert cond({"NotIpAddress": {"aws:SourceIp": networks}}, {"aws:sourceip": ip}) is (not expected)


@pytest.mark.parametrize("operator, expected", [
    ("StringEquals", False), ("StringNotEquals", True), ("StringEqualsIgnoreCase", False),
    ("StringNotEqualsIgnoreCase", True), ("StringLike", False), ("StringNotLike", True),
    ("StringEqualsIfExists", True), ("StringLikeIfExists", True), ("StringNotLikeIfExists", True),
])
def test_absent_string_key(operator, expected):
    assert cond({operator: {"s3:prefix": "home/*"}}, {}) is expected


@pytest.mark.parametrize("operator, key, value, expected", [
    ("NumericEquals", "s3:max-keys", "1", False),
    ("NumericNotEquals", "s3:max-keys", "1", True),
    ("NumericLessThan", "s3:max-keys", "1", False),
    ("NumericLessThanIfExists", "s3:max-keys", "1", True),
    ("NumericGreaterThanEqualsIfExists", "s3:max-keys", "1", True),
    ("Bool", "aws:SecureTransport", "true", False),
    ("BoolIfExists", "aws:SecureTransport", "true", True),
    ("IpAddress", "aws:SourceIp", "10.0.0.0/8", False),
    ("NotIpAddress", "aws:SourceIp", "10.0.0.0/8", True),
    ("IpAddressIfExists", "aws:SourceIp", "10.0.0.0/8", True),
])
def test_absent_key_for_other_operators(operator, key, value, expected):
    assert cond({operator: {key: value}}, {}) is expected


#: per operator family: a condition key, a policy value, a request value that the positive operator matches
#: and one it does not
_FAMILY_SAMPLES = {
    "string": ("s3:prefix", "a", "a", "b"), "string-ic": ("s3:prefix", "a", "A", "b"),
    "like": ("s3:prefix", "a*", "ab", "ba"), "numeric": ("s3:max-keys", "5", "5", "7"),
    "bool": ("aws:SecureTransport", "true", "true", "false"), "ip": ("aws:SourceIp", "10.0.0.0/8", "10.1.1.1", "11.0.0.1"),
}


@pytest.mark.parametrize("operator", [op for op in OPERATORS if op != "Null"])
def test_if_exists_variant_evaluates_normally_when_key_is_present(operator):
    key, value, hit, miss = _FAMILY_SAMPLES[OPERATORS[operator].family]
    if operator.startswith("Numeric") and operator not in ("NumericEquals", "NumericNotEquals"):
        hit, miss = {"NumericLessThan": ("4", "5"), "NumericLessThanEquals": ("5", "6"),
                     "NumericGreaterThan": ("6", "5"), "NumericGreaterThanEquals": ("5", "4")}[operator]
    negated = OPERATORS[operator].negated
    for request, positive in ((hit, True), (miss, False)):
        context = {key.lower(): request}
        assert cond({operator: {key: value}}, context) is (positive != negated)
        assert cond({operator + "IfExists": {key: value}}, context) is (positive != negated)


def test_null_operator():
    assert cond({"Null": {"s3:prefix": "true"}}, {}) is True
    assert cond({"Null": {"s3:prefix": "true"}}, {"s3:prefix": ""}) is False
    assert cond({"Null": {"s3:prefix": "false"}}, {"s3:prefix": "x"}) is True
    assert cond({"Null": {"s3:prefix": "false"}}, {}) is False
    assert cond({"Null": {"s3:prefix": False}}, {"s3:prefix": "x"}) is True
    assert cond({"Null": {"orgmem:teams": "true"}}, {}, teams=[]) is True
    assert cond({"Null": {"orgmem:teams": "true"}}, {}, teams=["red"]) is False
    assert cond({"Null": {"aws:username": "false"}}, {}) is True


def test_condition_block_is_and_of_operators_and_keys():
    block = {"StringEquals": {"s3:prefix": "home/", "s3:delimiter": "/"},
             "IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}
    good = {"s3:prefix": "home/", "s3:delimiter": "/", "aws:sourceip": "10.0.0.1"}
    assert cond(block, good)
    assert not cond(block, {**good, "s3:delimiter": "-"})
    assert not cond(block, {**good, "aws:sourceip": "192.0.2.1"})
    assert not cond(block, {k: v for k, v in good.items() if k != "s3:prefix"})


def test_multi_valued_request_keys_match_when_any_value_matches():
    assert cond({"StringEquals": {"orgmem:teams": "ops"}}, {}, teams=["dev", "ops"])
    assert not cond({"StringEquals": {"orgmem:teams": "ops"}}, {}, teams=["dev"])
    assert not cond({"StringEquals": {"orgmem:teams": "ops"}}, {}, teams=[])
    assert cond({"StringNotEquals": {"orgmem:teams": "ops"}}, {}, teams=[])
    assert not cond({"StringNotEquals": {"orgmem:teams": "ops"}}, {}, teams=["dev", "ops"])
    assert cond({"StringLike": {"s3:prefix": "a*"}}, {"s3:prefix": ["x", "ab"]})
    assert not cond({"StringLike": {"s3:prefix": "a*"}}, {"s3:prefix": []})  # empty list counts as absent


def test_variables_in_condition_values():
    block = {"StringLike": {"s3:prefix": "home/${aws:username}/*"}}
    assert cond(block, {"s3:prefix": "home/alice/x"}, user="alice")
    assert not cond(block, {"s3:prefix": "home/alice/x"}, user="bob")
    teams_block = {"StringEquals": {"s3:prefix": "team/${orgmem:teams}/"}}
    assert cond(teams_block, {"s3:prefix": "team/ops/"}, teams=["dev", "ops"])
    assert not cond(teams_block, {"s3:prefix": "team/qa/"}, teams=["dev", "ops"])
    assert not cond(teams_block, {"s3:prefix": "team/ops/"}, teams=[])
    assert cond({"StringEqualsIgnoreCase": {"s3:prefix": "${aws:username}"}}, {"s3:prefix": "ALICE"})
    assert cond({"StringEquals": {"s3:prefix": "${*}"}}, {"s3:prefix": "*"})


def test_condition_keys_ignore_case():
    assert cond({"IpAddress": {"AWS:SOURCEIP": "10.0.0.0/8"}}, {"aws:sourceip": "10.0.0.1"})
    assert cond({"StringEquals": {"S3:Prefix": "x"}}, {"s3:prefix": "x"})


def test_aws_docs_home_folder_listing():
    """The AWS documentation's "allow a user to list only their home folder" policy."""
    p = doc(
        {"Sid": "AllowRootAndHomeListingOfCompanyBucket", "Action": ["s3:ListBucket"], "Effect": "Allow",
         "Resource": ["arn:aws:s3:::my-company"],
         "Condition": {"StringEquals": {"s3:prefix": ["", "home/"], "s3:delimiter": ["/"]}}},
        {"Sid": "AllowListingOfUserFolder", "Action": ["s3:ListBucket"], "Effect": "Allow",
         "Resource": ["arn:aws:s3:::my-company"],
         "Condition": {"StringLike": {"s3:prefix": ["home/${aws:username}/*", "home/${aws:username}"]}}},
        {"Sid": "AllowAllS3ActionsInUserFolder", "Effect": "Allow", "Action": ["s3:*"],
         "Resource": ["arn:aws:s3:::my-company/home/${aws:username}/*"]},
    )
    ps = compiled(p, user="alice")
    bucket = "arn:aws:s3:::my-company"

    def listing(**context):
        return ps.evaluate("s3:ListBucket", bucket, context)

    assert listing(**{"s3:prefix": "", "s3:delimiter": "/"}).reason == "p#AllowRootAndHomeListingOfCompanyBucket"
    assert listing(**{"s3:prefix": "home/", "s3:delimiter": "/"}).allowed
    assert not listing(**{"s3:prefix": "home/"}).allowed  # delimiter required for the root listing
    assert listing(**{"s3:prefix": "home/alice/notes/"}).reason == "p#AllowListingOfUserFolder"
    assert listing(**{"s3:prefix": "home/alice"}).allowed
    assert not listing(**{"s3:prefix": "home/bob/"}).allowed
    assert not listing().allowed  # listing the whole bucket: no prefix, no match
    assert ps.evaluate("s3:PutObject", bucket + "/home/alice/x").allowed
    assert not ps.evaluate("s3:PutObject", bucket + "/home/bob/x").allowed


def test_aws_docs_deny_listing_outside_prefix():
    """Deny with StringNotLike also denies when s3:prefix is absent (a negated operator on a missing key)."""
    p = doc(allow("s3:ListBucket", "arn:aws:s3:::b"),
            deny("s3:ListBucket", "arn:aws:s3:::b", Sid="OnlyProjects",
                 Condition={"StringNotLike": {"s3:prefix": "projects/*"}}))
    ps = compiled(p)
    assert ps.evaluate("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "projects/x/"}).allowed
    assert ps.evaluate("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "secret/"}).reason == "p#OnlyProjects"
    assert ps.evaluate("s3:ListBucket", "arn:aws:s3:::b", {}).decision == "explicit-deny"


def test_max_keys_and_secure_transport():
    p = doc(allow("s3:ListBucket", "arn:aws:s3:::b", Condition={"NumericLessThanEquals": {"s3:max-keys": 100}}),
            deny("*", Sid="RequireTLS", Condition={"Bool": {"aws:SecureTransport": "false"}}))
    ps = compiled(p)
    assert ps.evaluate("s3:ListBucket", "arn:aws:s3:::b", {"s3:max-keys": "50", "aws:securetransport": "true"}).allowed
    assert not ps.evaluate("s3:ListBucket", "arn:aws:s3:::b", {"s3:max-keys": "500"}).allowed
    decision = ps.evaluate("s3:ListBucket", "arn:aws:s3:::b", {"s3:max-keys": "50", "aws:securetransport": "false"})
    assert decision.reason == "p#RequireTLS"


def test_source_ip_restriction_v4_and_v6():
    p = doc(allow("s3:*"), deny("s3:*", Sid="OfficeOnly",
                                Condition={"NotIpAddress": {"aws:SourceIp": ["192.0.2.0/24", "2001:db8::/32"]}}))
    ps = compiled(p)
    assert ps.evaluate("s3:GetObject", "arn:aws:s3:::b/k", {"aws:sourceip": "192.0.2.10"}).allowed
    assert ps.evaluate("s3:GetObject", "arn:aws:s3:::b/k", {"aws:sourceip": "2001:db8::7"}).allowed
    assert not ps.evaluate("s3:GetObject", "arn:aws:s3:::b/k", {"aws:sourceip": "198.51.100.1"}).allowed
    assert not ps.evaluate("s3:GetObject", "arn:aws:s3:::b/k", {}).allowed  # unknown source: denied


# ---------------------------------------------------------------------------------------------------------
# Good input


def test_accepted_forms():
    single = parse_policy(json.dumps({"Version": "2008-10-17", "Id": "x", "Statement": allow("s3:GetObject")}))
    assert single.version == "2008-10-17" and single.id == "x" and len(single.statements) == 1
    st = single.statements[0]
    assert (st.index, st.sid, st.effect, st.actions, st.resources) == (0, None, "Allow", ("s3:GetObject",), ("*",))
    from_bytes = parse_policy(b"\xef\xbb\xbf" + json.dumps(doc(allow("s3:*"))).encode())
    assert from_bytes.statements[0].actions == ("s3:*",)
    assert parse_policy(doc(allow("s3:*"))).version == V  # a mapping is accepted too


def test_source_is_kept_for_display():
    source = doc(allow(["s3:GetObject", "s3:PutObject"], "arn:aws:s3:::b/*", Sid="RW"))
    parsed = parse_policy(json.dumps(source))
    assert parsed.source == source
    assert json.loads(parsed.text()) == source


def test_condition_values_may_be_json_numbers_and_booleans():
    parsed = parse_policy(doc(allow("s3:ListBucket", Condition={
        "NumericLessThan": {"s3:max-keys": [10, 2.5]}, "Bool": {"aws:SecureTransport": True}})))
    clauses = parsed.statements[0].conditions
    assert [c.values for c in clauses] == [("10", "2.5"), ("true",)]
    assert clauses[0].key == "s3:max-keys" and clauses[1].key == "aws:securetransport"


def test_policy_pasted_from_aws_validates():
    parse_policy(doc(
        allow(["s3:GetObjectVersion", "s3:GetObjectTagging", "s3:PutBucketPolicy", "s3:ListBucketVersions",
               "s3:GetBucketCORS", "s3:PutObjectLegalHold", "s3:GetBucketOwnershipControls"],
              ["arn:aws:s3:::b", "arn:aws:s3:::b/*"], Sid="Pasted"),
        deny("s3:Delete*", "arn:aws:s3:::b/*", Condition={"StringNotEqualsIfExists": {"aws:username": "ops"}}),
    ))


# ---------------------------------------------------------------------------------------------------------
# Bad input: every refusal names the offending thing


@pytest.mark.parametrize("text, fragments", [
    ('{"Version": "2012-10-17", "Statement": [}', ["invalid JSON", "line 1, column 41"]),
    ('{"Version": "2012-10-17",\n "Statement": [\n  {"Effect": "Allow",}\n]}', ["invalid JSON", "line 3"]),
    ("", ["invalid JSON", "line 1, column 1"]),
    (b"\xff\xfe{}", ["not valid UTF-8", "byte 0"]),
    ('{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*", '
     '"Condition": {"NumericEquals": {"s3:max-keys": NaN}}}]}', ["NaN"]),
    ("[" * 5000 + "]" * 5000, ["nested too deeply"]),
    ('{"Version": "2012-10-17", "Version": "2012-10-17", "Statement": []}', ['duplicate key "Version"']),
])
def test_refuses_bad_json(text, fragments):
    message = refused(text)
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("policy, fragments", [
    ([], ["must be a JSON object", "a list"]),
    ('"just a string"', ["must be a JSON object", "a string"]),
    ({"Statement": [allow("*")]}, ['missing "Version"', "2012-10-17"]),
    ({"Version": "2020-01-01", "Statement": [allow("*")]}, ['unsupported Version "2020-01-01"']),
    ({"Version": 2012, "Statement": [allow("*")]}, ["unsupported Version 2012"]),
    ({"Version": V, "Statment": [allow("*")]}, ['unknown top-level key "Statment"', 'did you mean "Statement"']),
    ({"Version": V, "Id": 5, "Statement": [allow("*")]}, ["Id: expected a string"]),
    ({"Version": V}, ['missing "Statement"']),
    ({"Version": V, "Statement": []}, ["Statement: empty list"]),
    ({"Version": V, "Statement": "allow everything"}, ["Statement: expected an object or a list"]),
    (doc("Allow *"), ["Statement[0]: expected an object, got a string"]),
    (doc(allow("*", Principal={"AWS": "*"})), ['"Principal" is not allowed', "identity policies",
                                                "attached to principals and teams"]),
    (doc(allow("*", NotPrincipal="*")), ['"NotPrincipal" is not allowed', "identity policies"]),
    (doc(allow("*", Actions=["s3:*"])), ['Statement[0]: unknown key "Actions"', 'did you mean "Action"']),
    (doc({"Action": "*", "Resource": "*"}), ['Statement[0]: missing "Effect"']),
    (doc(allow("*", Effect="allow")), ['Statement[0].Effect: must be "Allow" or "Deny", got "allow"']),
    (doc(allow("*", NotAction="s3:*")), ['Statement[0]: has both "Action" and "NotAction"']),
    (doc({"Effect": "Allow", "Resource": "*"}), ['Statement[0]: missing "Action" (or "NotAction")']),
    (doc(allow("*", NotResource="*")), ['Statement[0]: has both "Resource" and "NotResource"']),
    (doc({"Effect": "Allow", "Action": "*"}), ['Statement[0]: missing "Resource" (or "NotResource")']),
    (doc(allow(5)), ["Statement[0].Action: expected a string or a list of strings, got a number"]),
    (doc(allow(["s3:GetObject", None])), ["Statement[0].Action[1]: expected a string, got null"]),
    (doc(allow([])), ["Statement[0].Action: empty list"]),
    (doc(allow("s3:GetObject", [])), ["Statement[0].Resource: empty list"]),
    (doc(allow("s3:GetObject"), allow("s3:GetObjekt")),
     ['Statement[1].Action: unknown action "s3:GetObjekt"', 'did you mean "s3:GetObject"']),
    (doc(allow("s3:Frobnicate*")), ['Statement[0].Action: "s3:Frobnicate*" matches no known action']),
    (doc(allow("ec2:RunInstances")), ['unknown service "ec2" in "ec2:RunInstances"', "known services: s3"]),
    (doc(allow("s*:GetObject")), ['unknown service "s*"', "wildcards are not allowed in the service"]),
    (doc(allow("GetObject")), ['malformed action "GetObject"', '"service:Action"']),
    (doc(allow("s3:")), ['malformed action "s3:"']),
    (doc({"Effect": "Allow", "NotAction": "s3:GetObjekt", "Resource": "*"}),
     ['Statement[0].NotAction: unknown action "s3:GetObjekt"']),
    (doc(allow("s3:GetObject", "arn:aws:s3:us-east-1:123456789012:b/k")),
     ['Statement[0].Resource: malformed resource "arn:aws:s3:us-east-1:123456789012:b/k"', "arn:aws:s3:::BUCKET"]),
    (doc(allow("s3:GetObject", "bucket/key")), ['malformed resource "bucket/key"']),
    (doc(allow("s3:GetObject", "arn:aws:s3:::")), ['malformed resource "arn:aws:s3:::"']),
    (doc(allow("s3:GetObject", "arn:orgmem:nothing:::x")), ['malformed resource "arn:orgmem:nothing:::x"',
                                                             "bio, memory, skills, vault, search, admin"]),
    (doc({"Effect": "Allow", "Action": "*", "NotResource": "arn:orgmem:*:::x"}),
     ['Statement[0].NotResource: malformed resource "arn:orgmem:*:::x"']),
    (doc(allow("*", ["*", 7])), ["Statement[0].Resource[1]: expected a string, got a number"]),
    (doc(allow("s3:*", "arn:aws:s3:::home/${aws:userid}/*")),
     ['unknown policy variable "${aws:userid}"', "${aws:username}", "${orgmem:teams}"]),
    (doc(allow("s3:*", "arn:aws:s3:::home/${aws:username")), ["unterminated policy variable",
                                                              '"arn:aws:s3:::home/${aws:username"']),
    (doc(allow("s3:*", "arn:aws:s3:::home/${aws:username, 'x'}/*")), ["unknown policy variable"]),
    ({"Version": "2008-10-17", "Statement": [allow("s3:*", "arn:aws:s3:::home/${aws:username}/*")]},
     ['need Version "2012-10-17"']),
    (doc(allow("*", Sid="A"), allow("*", Sid="B"), allow("*", Sid="A")),
     ['Statement[2].Sid: duplicate Sid "A" (also used by Statement[0])']),
    (doc(allow("*", Sid="has space")), ['Statement[0].Sid: "has space" is not a valid Sid']),
    (doc(allow("*", Sid=3)), ["Statement[0].Sid: 3 is not a valid Sid"]),
])
def test_refuses_bad_documents(policy, fragments):
    message = refused(policy)
    for fragment in fragments:
        assert fragment in message, message


def with_condition(block):
    return doc(allow("s3:ListBucket"), allow("s3:ListBucket", "arn:aws:s3:::b", Condition=block))


@pytest.mark.parametrize("block, fragments", [
    ("yes", ["Statement[1].Condition: expected an object"]),
    ({}, ["Statement[1].Condition: empty"]),
    ({"StringEqualz": {"s3:prefix": "x"}}, ['unknown condition operator "StringEqualz"',
                                            'did you mean "StringEquals"']),
    ({"stringequals": {"s3:prefix": "x"}}, ['unknown condition operator "stringequals"',
                                            'did you mean "StringEquals"']),
    ({"DateGreaterThan": {"s3:prefix": "x"}}, ['unknown condition operator "DateGreaterThan"']),
    ({"ForAnyValue:StringEquals": {"orgmem:teams": "x"}}, ['set operator "ForAnyValue:StringEquals"',
                                                           "not supported"]),
    ({"NullIfExists": {"s3:prefix": "true"}}, ['"NullIfExists" is not an operator']),
    ({"StringEquals": {}}, ["Statement[1].Condition.StringEquals: expected a non-empty object"]),
    ({"StringEquals": "s3:prefix"}, ["Statement[1].Condition.StringEquals: expected a non-empty object"]),
    ({"StringEquals": {"s3:prefx": "x"}}, ['unknown condition key "s3:prefx"', 'did you mean "s3:prefix"']),
    ({"StringEquals": {"aws:userid": "x"}}, ['unknown condition key "aws:userid"', "aws:username"]),
    ({"StringEquals": {"s3:prefix": "x", "S3:PREFIX": "y"}}, ['condition key "S3:PREFIX" given twice']),
    ({"StringEquals": {"s3:prefix": []}}, ["Statement[1].Condition.StringEquals.s3:prefix: empty list"]),
    ({"StringEquals": {"s3:prefix": {"a": "b"}}}, ["expected a string, number or boolean, got an object"]),
    ({"StringEquals": {"s3:prefix": ["a", None]}}, ["expected a string, number or boolean, got null"]),
    ({"StringLike": {"s3:prefix": "home/${aws:userid}/"}}, ['unknown policy variable "${aws:userid}"',
                                                            "Condition.StringLike.s3:prefix"]),
    ({"NumericLessThan": {"s3:max-keys": "ten"}}, ['Condition.NumericLessThan.s3:max-keys: "ten" is not a number']),
    ({"NumericLessThan": {"s3:max-keys": "${aws:username}"}}, ['"${aws:username}" is not a number']),
    ({"NumericLessThan": {"s3:max-keys": "1e"}}, ['"1e" is not a number']),
    ({"Bool": {"aws:SecureTransport": "yes"}}, ['"yes" must be "true" or "false"']),
    ({"Null": {"s3:prefix": "maybe"}}, ['"maybe" must be "true" or "false"']),
    ({"IpAddress": {"aws:SourceIp": "10.0.0.300/8"}}, ['"10.0.0.300/8" is not an IP address or CIDR block']),
    ({"IpAddress": {"aws:SourceIp": "10.0.0.0/33"}}, ['"10.0.0.0/33" is not an IP address or CIDR block']),
    ({"NotIpAddress": {"aws:SourceIp": ["2001:db8::/32", "2001:zz8::/32"]}}, ['"2001:zz8::/32" is not an IP']),
    ({"NumericEquals": {"s3:prefix": "1"}}, ['"s3:prefix" is a string key', "numeric operator"]),
    ({"IpAddress": {"s3:prefix": "10.0.0.0/8"}}, ['"s3:prefix" is a string key', "ip operator"]),
    ({"Bool": {"aws:SourceIp": "true"}}, ['"aws:SourceIp" is a ip key', "bool operator"]),
])
def test_refuses_bad_conditions(block, fragments):
    message = refused(with_condition(block))
    for fragment in fragments:
        assert fragment in message, message


def test_refuses_over_size_documents():
    statements = [allow("s3:GetObject", f"arn:aws:s3:::bucket-{i:04d}/*", Sid=f"S{i}") for i in range(400)]
    text = json.dumps(doc(*statements))
    assert len(text) > MAX_POLICY_BYTES
    message = refused(text)
    assert f"policy is {len(text)} bytes" in message and "20480-byte limit" in message
    assert "bytes" in refused(text.encode())
    multibyte = json.dumps(doc(allow("s3:GetObject", "arn:aws:s3:::b/" + "é" * 10300)), ensure_ascii=False)
    assert len(multibyte) < MAX_POLICY_BYTES < len(multibyte.encode())
    assert "20480-byte limit" in refused(multibyte)


def test_just_under_the_size_limit_is_accepted():
    statements = [allow("s3:GetObject", f"arn:aws:s3:::bucket-{i:04d}/*") for i in range(400)]
    text = json.dumps(doc(*statements))
    while len(text) > MAX_POLICY_BYTES:
        statements.pop()
        text = json.dumps(doc(*statements))
    parse_policy(text + " " * (MAX_POLICY_BYTES - len(text)))


# ---------------------------------------------------------------------------------------------------------
# Speed: evaluate runs on every request


def test_evaluate_is_cheap_enough_per_request():
    policies = [(name, parse_policy(BUILTIN_POLICIES[name])) for name in ("agent-default", "readonly")]
    start = time.perf_counter()
    ps = PolicySet.compile(policies, "alice", ["red", "blue"])
    compile_us = (time.perf_counter() - start) * 1e6
    requests = [
        ("s3:GetObject", "arn:aws:s3:::agent-alice/notes/2024/today.md", {}),
        ("s3:PutObject", "arn:aws:s3:::agent-bob/x", {}),
        ("s3:ListBucket", "arn:aws:s3:::agent-alice", {"s3:prefix": "notes/", "aws:sourceip": "10.0.0.1"}),
        ("memory:GetDocument", "arn:orgmem:memory:::team/blue/runbook", {}),
    ]
    n = 20000
    for action, resource, context in requests:
        ps.evaluate(action, resource, context)
        start = time.perf_counter()
        for _ in range(n):
            ps.evaluate(action, resource, context)
        per_call = (time.perf_counter() - start) / n * 1e6
        print(f"\n  evaluate {action} on {resource}: {per_call:.2f} us/call")
    print(f"  compile agent-default + readonly: {compile_us:.0f} us")


def _glob(pattern: str) -> tuple:
    return tuple(None if c == "*" else "" if c == "?" else c for c in pattern)


@pytest.mark.parametrize("deny, not_resource, expected", [
    ("arn:orgmem:bio:::alice/hr-*", False, True),     # some sessions of alice
    ("arn:orgmem:bio:::alice/hr-1", False, True),     # one session
    ("arn:orgmem:bio:::*", False, True),              # everything
    ("arn:orgmem:bio:::al?ce/x", False, True),        # may match
    ("arn:orgmem:bio:::bob/*", False, False),         # another agent
    ("arn:orgmem:bio:::alice", False, False),         # not a session of alice
    ("arn:orgmem:bio:::alicex/*", False, False),      # an agent whose name starts alike
    ("arn:orgmem:bio:::alice/*", True, False),        # NotResource keeping all of alice
    ("*", True, False),
    ("arn:orgmem:bio:::bob/*", True, True),           # NotResource: denies alice's sessions
    ("arn:orgmem:bio:::alice/public-*", True, True),  # ... and alice's other ones
])
def test_a_deny_that_may_take_some_resource_under_a_prefix_is_found(deny, not_resource, expected):
    from gateway.iam.authz import denies_some_under

    assert denies_some_under([((_glob(deny),), not_resource)], "arn:orgmem:bio:::alice/") is expected
    assert denies_some_under([], "arn:orgmem:bio:::alice/") is False


def test_a_not_resource_deny_of_several_patterns_keeps_what_any_of_them_covers():
    """A NotResource Deny takes all but the union of its patterns: ``alice/*`` among them keeps
    all of alice (it was judged pattern by pattern, and ``bob/*`` alone "denied some")."""
    from gateway.iam.authz import denies_some_under

    both = ((_glob("arn:orgmem:bio:::bob/*"), _glob("arn:orgmem:bio:::alice/*")), True)
    assert denies_some_under([both], "arn:orgmem:bio:::alice/") is False
    assert denies_some_under([both], "arn:orgmem:bio:::carol/") is True
    assert denies_some_under([((), True)], "arn:orgmem:bio:::alice/") is True  # no pattern left
