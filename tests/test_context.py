"""The context pack (POST /v1/context, orgmem context) against a real gateway: budgets, the
session's last state, which decisions apply, permissions, and bad input."""

from __future__ import annotations

import base64
import uuid

import pytest
from click.testing import CliRunner
from servers import Gateway

from gateway.admin_client import AdminClient, AdminError
from gateway.bio_client import BioClient
from gateway.cli import main
from gateway.context import count_tokens
from gateway.context_cli import ContextClient
from gateway.memory_client import MemoryClient
from gateway.skills_client import SkillsClient


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("context") / "data").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin(gw):
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Agent:
    def __init__(self, gw, admin, teams=()) -> None:
        self.name = uid("ag")
        created = admin.create_agent(self.name, teams=list(teams))
        self.keys = created["access_key"], created["secret_key"]
        transport = AdminClient(gw.endpoint, *self.keys)
        self.bio = BioClient.over(transport)
        self.memory = MemoryClient.over(transport)
        self.skills = SkillsClient(gw.endpoint, *self.keys)
        self.context = ContextClient(transport)


def decision(title: str, body: str, kind: str = "decision", **extra) -> dict:
    return {"kind": kind, "title": title, "body": body, **extra}


@pytest.fixture(scope="module")
def world(gw, admin):
    """Two teams; agent A (team one) with a long session, agent B (team two), and memory of
    every scope, some of which applies to A and some of which does not."""
    one, two = uid("tm"), uid("tm")
    admin.create_team(one)
    admin.create_team(two)
    a, b = Agent(gw, admin, [one]), Agent(gw, admin, [two])
    root = MemoryClient(gw.endpoint, gw.access_key, gw.secret_key)
    tag = uuid.uuid4().hex[:6]
    docs = {
        "org-all": ("org", decision(f"Deploys happen on weekdays {tag}", "Never deploy on a Friday.")),
        "org-only-b": ("org", decision(f"B writes the weekly report {tag}", "Only B.",
                                       applies_to={"agents": [b.name], "teams": []})),
        "team-one": (f"team:{one}", decision(f"Team one prefers Parquet {tag}", "Columnar output.",
                                             kind="preference")),
        "team-two": (f"team:{two}", decision(f"Team two uses CSV {tag}", "Rows, not columns.")),
        "own-a": (f"agent:{a.name}", decision(f"A reviews uploads {tag}", "A checks each upload.")),
        "own-b": (f"agent:{b.name}", decision(f"B owns billing {tag}", "Private to B.")),
        "lesson-a": (f"agent:{a.name}", decision("Retry flaky uploads with backoff",
                                                  "Uploads to the archive fail under load; retry with "
                                                  "exponential backoff and jitter.", kind="lesson")),
    }
    refs = {}
    for doc_id, (scope, doc) in docs.items():
        root.put(scope, f"{doc_id}-{tag}", doc)
        path = "org" if scope == "org" else scope.replace(":", "s/", 1)
        refs[doc_id] = f"memory:{path}/{doc_id}-{tag}"
    skill = uid("sk")
    a.skills.publish(skill, [{"path": "SKILL.md", "content": base64.b64encode(
        f"---\nname: {skill}\ndescription: Resume archive uploads after a failure.\n---\n\nSteps.\n"
        .encode()).decode()}], scope=f"agent:{a.name}")
    session = "investigation-1"
    filler = "Looked at the build log and the archive listing again; nothing new there. " * 12
    events = [{"session": session, "kind": "prompt", "content": "Find why nightly uploads fail."}]
    events += [{"session": session, "kind": "note", "content": f"step {i}: {filler}"} for i in range(30)]
    events += [
        {"session": session, "kind": "question", "event_id": "q-answered", "content": "Which bucket?"},
        {"session": session, "kind": "answer", "parent_id": "q-answered", "content": "archive-main."},
        {"session": session, "kind": "question", "event_id": "q-open",
         "content": "Should we raise the upload timeout to 120 seconds? " + filler},
        {"session": session, "kind": "error", "event_id": "err-old", "content": "old failure"},
        {"session": session, "kind": "artifact", "event_id": "art-old",
         "artifact_uri": f"s3://agent-{a.name}/reports/draft.md", "content": "first draft"},
        {"session": session, "kind": "artifact", "event_id": "art-last",
         "artifact_uri": f"s3://agent-{a.name}/reports/summary.md", "content": "summary of findings"},
        {"session": session, "kind": "error", "event_id": "err-last",
         "content": "TimeoutError: upload of part 7 took 95 s " + filler},
    ]
    events += [{"session": session, "kind": "note", "content": f"later {i}: {filler}"} for i in range(10)]
    for i, event in enumerate(events):
        event["seq"] = i + 1
    a.bio.put_events(events)
    # B has a session too, with a question of its own
    b.bio.put_events([{"session": session, "kind": "question", "event_id": "q-b",
                       "content": "B's private question"}])
    return {"a": a, "b": b, "refs": refs, "session": session, "skill": skill, "teams": (one, two)}


def items(pack: dict, section: str) -> list[dict]:
    return next(s for s in pack["sections"] if s["name"] == section)["items"]


def sources(pack: dict, section: str | None = None) -> set[str]:
    return {i["source"] for s in pack["sections"] if section in (None, s["name"]) for i in s["items"]}


def check_budget(pack: dict, budget: int) -> None:
    assert pack["budget_tokens"] == budget
    assert pack["used_tokens"] <= budget
    assert pack["used_tokens"] == count_tokens(pack["markdown"])


@pytest.mark.parametrize("budget", [100, 250, 1000, 4000, 200_000])
def test_pack_fits_its_budget_and_keeps_the_session_state(world, budget):
    a = world["a"]
    pack = a.context.pack(a.name, budget, session=world["session"])
    check_budget(pack, budget)
    session = sources(pack, "session")
    open_q, last_error = f"bio:{a.name}/q-open", f"bio:{a.name}/err-last"
    last_artifact = f"s3://agent-{a.name}/reports/summary.md"
    assert {open_q, last_error, last_artifact} <= session, pack["markdown"]
    assert f"bio:{a.name}/q-answered" not in session  # answered later: not open
    for ref in (open_q, last_error, last_artifact):
        assert ref in pack["markdown"]
    kinds = {i["source"]: i["type"] for i in items(pack, "session")}
    assert kinds[open_q] == "open_question" and kinds[last_error] == "last_error"
    assert kinds[last_artifact] == "artifact"
    if budget >= 4000:
        assert world["refs"]["org-all"] in sources(pack, "decisions")
        assert pack["used_tokens"] > 1000  # a large budget is used, not wasted
    if budget == 200_000:
        assert pack["truncated"] == [] or pack["truncated"] == ["recent"] or "recent" not in pack["truncated"]
        assert f"s3://agent-{a.name}/reports/draft.md" in session
        assert f"bio:{a.name}/err-old" not in session  # only the last error
        assert items(pack, "recent") and all(i["source"].startswith(f"bio:{a.name}/")
                                             for i in items(pack, "recent"))
    if budget <= 250:
        assert pack["truncated"]  # something had to give, and it says what


def test_tight_budget_cuts_text_rather_than_dropping_required_items(world):
    a = world["a"]
    pack = a.context.pack(a.name, 250, session=world["session"])
    question = next(i for i in items(pack, "session") if i["type"] == "open_question")
    assert question["truncated"] or len(question["text"]) < 400
    assert "session" in pack["truncated"] or "decisions" in pack["truncated"]


@pytest.mark.parametrize("questions", [3, 6, 10])
def test_the_last_error_and_artifact_survive_the_tightest_budget_beside_many_questions(world, questions):
    a = world["a"]
    session = uid("many-questions")
    a.bio.put_events([{"session": session, "kind": "question", "event_id": f"{session}-q{i}",
                       "content": f"Is cause {i} the quota?"} for i in range(questions)] + [
        {"session": session, "kind": "error", "content": "upload failed: 507 quota exceeded"},
        {"session": session, "kind": "artifact", "artifact_uri": f"s3://agent-{a.name}/r.md",
         "content": "report"}])
    pack = a.context.pack(a.name, 100, session=session)
    check_budget(pack, 100)
    kinds = [i["type"] for i in items(pack, "session")]
    assert "last_error" in kinds and "artifact" in kinds and "open_question" in kinds


def test_decisions_that_apply_are_included_and_others_are_not(world):
    a, refs = world["a"], world["refs"]
    pack = a.context.pack(a.name, 20_000)
    decided = sources(pack, "decisions")
    assert {refs["org-all"], refs["team-one"], refs["own-a"]} <= decided
    everything = sources(pack)
    for other in ("org-only-b", "team-two", "own-b"):
        assert refs[other] not in everything
    types = {i["source"]: i["type"] for i in items(pack, "decisions")}
    assert types[refs["team-one"]] == "preference" and types[refs["own-a"]] == "decision"
    # the agent's own come before the org's
    order = [i["source"] for i in items(pack, "decisions")]
    assert order.index(refs["own-a"]) < order.index(refs["org-all"])
    assert pack["session"] is None and items(pack, "session") == [] and items(pack, "recent") == []


def test_relevant_memories_and_skills_follow_the_query(world):
    a = world["a"]
    pack = a.context.pack(a.name, 20_000, query="why do archive uploads fail")
    relevant = sources(pack, "relevant")
    assert world["refs"]["lesson-a"] in relevant
    assert f"skill:agents/{a.name}/{world['skill']}" in relevant
    assert pack["query_from"] == "request" and pack["relevance"] in ("words", "search")
    # without a query, a session's open question and last error stand in for one
    pack = a.context.pack(a.name, 20_000, session=world["session"])
    assert pack["query_from"] == "session" and world["refs"]["lesson-a"] in sources(pack, "relevant")
    # and what matches nothing is not included
    pack = a.context.pack(a.name, 20_000, query="zebra xylophone")
    assert sources(pack, "relevant") == set()


def test_a_caller_without_rights_to_a_biography_cannot_get_its_pack(world, gw, admin):
    a, b = world["a"], world["b"]
    with pytest.raises(AdminError) as denied:
        b.context.pack(a.name, 1000, session=world["session"])
    assert denied.value.status == 403 and "bio:GetEvents" in denied.value.message
    with pytest.raises(AdminError) as denied:
        b.context.pack(a.name, 1000)
    assert denied.value.status == 403
    # B's own pack has none of A's
    pack = b.context.pack(b.name, 20_000, session=world["session"], query="uploads archive")
    assert f"bio:{b.name}/q-b" in sources(pack, "session")
    assert not any(a.name in ref for ref in sources(pack))
    # a reader granted A's biography and A's own memory listing, but no org or team memory,
    # gets A's session and nothing it could not read itself
    reader = Agent(gw, admin)
    policy = uid("pol")
    admin.put_policy(policy, {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["search:GetContext"], "Resource": "*"},
        {"Effect": "Allow", "Action": ["bio:GetEvents"], "Resource": f"arn:orgmem:bio:::{a.name}/*"},
        {"Effect": "Allow", "Action": ["memory:ListDocuments"],
         "Resource": f"arn:orgmem:memory:::agent/{a.name}/*"},
        {"Effect": "Deny", "Action": ["memory:*"], "Resource": "arn:orgmem:memory:::org/*"}]})
    admin.attach_policy(policy, agent=reader.name)
    pack = reader.context.pack(a.name, 20_000, session=world["session"], query="uploads")
    assert f"bio:{a.name}/q-open" in sources(pack, "session")
    assert not any(ref.startswith("memory:") or ref.startswith("skill:") for ref in sources(pack))
    # without search:GetContext nothing at all
    nobody = Agent(gw, admin)
    admin.put_policy(policy + "-x", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Deny", "Action": ["search:GetContext"], "Resource": "*"}]})
    admin.attach_policy(policy + "-x", agent=nobody.name)
    with pytest.raises(AdminError) as denied:
        nobody.context.pack(nobody.name, 1000)
    assert denied.value.status == 403 and "search:GetContext" in denied.value.message


@pytest.mark.parametrize("body, field", [
    ({"agent": "x", "budget_tokens": 0}, "budget_tokens"),
    ({"agent": "x", "budget_tokens": 99}, "budget_tokens"),
    ({"agent": "x", "budget_tokens": 10**9}, "budget_tokens"),
    ({"agent": "x", "budget_tokens": "1000"}, "budget_tokens"),
    ({"agent": "x", "budget_tokens": True}, "budget_tokens"),
    ({"agent": "x", "budget_tokens": 1000.5}, "budget_tokens"),
    ({"agent": "x"}, "budget_tokens"),
    ({"agent": "x", "budget_tokens": 1000, "tokens": 5}, "tokens"),
    ({"agent": "Bad Agent!", "budget_tokens": 1000}, "agent"),
    ({"agent": "", "budget_tokens": 1000}, "agent"),
    ({"agent": 5, "budget_tokens": 1000}, "agent"),
    ({"budget_tokens": 1000}, "agent"),
    ({"agent": "x", "budget_tokens": 1000, "session": ""}, "session"),
    ({"agent": "x", "budget_tokens": 1000, "session": "s" * 257}, "session"),
    ({"agent": "x", "budget_tokens": 1000, "session": "a\nb"}, "session"),
    ({"agent": "x", "budget_tokens": 1000, "query": "q" * 5000}, "query"),
    ([1, 2], "body"),
    (b"{not json", "JSON"),
    (b"", "body"),
])
def test_bad_input_is_a_clear_400(world, body, field):
    with pytest.raises(AdminError) as bad:
        world["a"].context.post(body)
    assert bad.value.status == 400, bad.value
    assert field in bad.value.message


def test_cli_prints_markdown_with_sources(world, gw):
    a = world["a"]
    env = {"ORGMEM_ENDPOINT": gw.endpoint, "ORGMEM_ACCESS_KEY": a.keys[0], "ORGMEM_SECRET_KEY": a.keys[1]}
    out = CliRunner().invoke(main, ["context", "--agent", a.name, "--session", world["session"],
                                    "--budget", "3000"], env=env)
    assert out.exit_code == 0, out.output
    text = out.stdout
    assert text.startswith(f"# Context for {a.name}")
    assert "## Decisions and preferences" in text and "## Session state" in text
    assert f"`bio:{a.name}/q-open`" in text and f"`s3://agent-{a.name}/reports/summary.md`" in text
    assert world["refs"]["own-a"] in text
    assert count_tokens(text) <= 3000
    out = CliRunner().invoke(main, ["context", "--agent", world["b"].name, "--session", "x"], env=env)
    assert out.exit_code == 1 and "AccessDenied" in out.output


def test_fitting_never_exceeds_the_budget_whatever_the_text():
    """The fitter alone: many required items, CJK, punctuation-dense and huge texts, any budget."""
    import random

    from gateway.context import Item, Section, _fit

    rng = random.Random(7)
    alphabet = ["word ", "数据", "🙂", "{}[]();", "x" * 40, " ", "\n", "é"]
    for _ in range(60):
        sections = []
        for name, n, required in (("decisions", 5, False), ("session", 12, True), ("recent", 20, False)):
            section = Section(name, name.title())
            for i in range(rng.randrange(n)):
                text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 3000)))
                section.items.append(Item("x", f"item {i} {rng.choice(alphabet)}", text,
                                          f"bio:agent/ev-{i}", "2026-03-02T09:30:00.000000Z",
                                          required=required and i < 6))
            sections.append(section)
        budget = rng.choice([100, 101, 150, 400, 2000, 20_000])
        markdown, used = _fit("# Context for agent\n", sections, budget)
        assert used == count_tokens(markdown) <= budget
        kept = [i for s in sections for i in s.kept]
        assert all(i.source in markdown for i in kept)


def test_the_header_names_session_and_query_on_their_own_line():
    from gateway.context import _header

    assert _header("scout", None, "why did the deploy fail") == \
        "# Context for scout\n\nQuery: why did the deploy fail\n"
    assert _header("scout", "s1", "q") == "# Context for scout\n\nSession `s1`. Query: q\n"
    assert _header("scout", None, None) == "# Context for scout\n\n"
