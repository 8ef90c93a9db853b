"""LangGraph on orgmem against a real gateway: the BaseStore over open memory (sync, async,
batch, search, namespaces, scopes, bad input) and the checkpointer (a graph interrupted in one
process and resumed in another, history, the langgraph-checkpoint-conformance suite, bad input)."""

from __future__ import annotations

import asyncio
import json
import operator
import os
import subprocess
import sys
import time
import uuid
from typing import Annotated, TypedDict

import ormsgpack
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from langgraph.types import Command, interrupt
from servers import ROOT, Gateway

import orgmem
from gateway.admin_client import AdminClient
from orgmem.langgraph import InvalidValueError, LayoutError, OrgmemSaver, OrgmemStore
from orgmem.langgraph.layout import CONTENT_TYPE
from orgmem.langgraph.namespaces import doc_id

# -- the gateway and its principals ---------------------------------------------------------


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("langgraph") / "data").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin(gw):
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


@pytest.fixture(scope="module")
def root(gw):
    client = orgmem.Client(gw.endpoint, gw.access_key, gw.secret_key)
    yield client
    client.close()


@pytest.fixture(scope="module")
def team(admin):
    name = uid("team")
    admin.create_team(name)
    return name


@pytest.fixture(scope="module")
def agent(gw, admin, team):
    """(name, credentials, client) of an agent in ``team``."""
    name = uid("bot")
    created = admin.create_agent(name, teams=[team])
    client = orgmem.Client(gw.endpoint, created["access_key"], created["secret_key"])
    yield name, created, client
    client.close()


@pytest.fixture
def store(agent):
    with OrgmemStore(agent[2]) as s:
        yield s


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def mine(client, name: str) -> list[dict]:
    """Every store document in the agent's own scope, whatever its status."""
    return client.list_memory(scope=f"agent:{name}", tag="langgraph", status="any")


def eventually(find, what: str, seconds: float = 20.0):
    """Poll ``find`` until it returns something truthy (the search index follows writes)."""
    deadline = time.monotonic() + seconds
    while True:
        found = find()
        if found or time.monotonic() > deadline:
            assert found, f"{what} did not show up"
            return found
        time.sleep(0.2)


# -- the store: put, get, delete ------------------------------------------------------------


def test_store_item_is_an_open_memory_document(store, agent):
    name, _, client = agent
    ns = ("memories", uid("user"))
    store.put(ns, "diet", {"text": "vegetarian", "since": 2019})
    item = store.get(ns, "diet")
    assert (item.namespace, item.key, item.value) == (ns, "diet", {"text": "vegetarian", "since": 2019})
    assert item.created_at.tzinfo is not None and item.updated_at >= item.created_at
    # the short namespace is the agent's own scope, spelled out or not
    assert store.get(("agent", name, *ns), "diet").value == item.value

    doc = client.get_memory(f"agent:{name}", doc_id(("agent", name, *ns), "diet"))
    assert doc["kind"] == "fact" and "langgraph" in doc["tags"] and doc["created_by"] == name
    assert doc["title"] == f"{ns[0]}/{ns[1]}/diet" and doc["id"].startswith(f"lg-memories-{ns[1]}-diet-")
    body = json.loads(doc["body"])
    assert body["value"] == item.value and body["namespace"] == ["agent", name, *ns] and body["key"] == "diet"

    store.put(ns, "diet", {"text": "vegan"})
    assert store.get(ns, "diet").value == {"text": "vegan"}
    assert [v["version"] for v in client.memory_history(doc["scope"], doc["id"])] == [1, 2]
    assert store.get(ns, "nothing-here") is None


def test_store_keys_differing_only_in_case_are_separate_items(store):
    ns = (uid("case"),)
    store.put(ns, "Key", {"v": "same"})
    store.put(ns, "key", {"v": "same"})
    store.put(ns, "key ", {"v": "same"})
    assert sorted(i.key for i in store.search(ns)) == ["Key", "key", "key "]


def test_store_takes_any_labels_and_keys(store, agent):
    odd = ("Notizen", "Jürgen/Ä", "x" * 200, "-- ~%20 --")
    keys = ["a/b c?", "", "ü" * 300, "../..", "lg-taken"]
    for key in keys:
        store.put(odd, key, {"key": key})
    assert {i.key for i in store.search(odd, limit=100)} == set(keys)
    for key in keys:
        ident = doc_id(("agent", agent[0], *odd), key)
        assert len(ident) <= 128 and ident.startswith("lg-") and ident == ident.lower()
        assert store.get(odd, key).value == {"key": key}


def test_store_delete_retracts_and_keeps_history(store, agent):
    name, _, client = agent
    ns = (uid("del"),)
    store.put(ns, "k", {"v": 1})
    store.delete(ns, "k")
    assert store.get(ns, "k") is None and store.search(ns) == []
    scope, ident = f"agent:{name}", doc_id(("agent", name, *ns), "k")
    assert client.get_memory(scope, ident)["status"] == "retracted"
    store.delete(ns, "k")  # already gone: no error
    store.delete(ns, "never-there")
    store.put(ns, "k", {"v": 2})  # a write makes it active again
    assert store.get(ns, "k").value == {"v": 2}
    assert [v["status"] for v in client.memory_history(scope, ident)] == ["active", "retracted", "active"]


def test_store_scopes_follow_the_gateway_policies(store, agent, root, team):
    name, _, client = agent
    with OrgmemStore(root) as admin_store:
        admin_store.put(("team", team, "faq"), "refunds", {"answer": "within 30 days"})
        admin_store.put(("org", "handbook"), "holidays", {"days": 30})
    # an agent reads its team's and the org's items, and writes neither (agent-default)
    assert store.get(("team", team, "faq"), "refunds").value == {"answer": "within 30 days"}
    assert store.get(("org", "handbook"), "holidays").value == {"days": 30}
    before = mine(client, name)
    with pytest.raises(orgmem.AccessDenied):
        store.put(("org", "handbook"), "holidays", {"days": 365})
    assert store.get(("org", "handbook"), "holidays").value == {"days": 30}
    assert mine(client, name) == before
    # another agent's scope is not readable
    other = uid("other")
    with pytest.raises(orgmem.AccessDenied):
        store.get(("agent", other, "notes"), "k")


# -- the store: search and namespaces -------------------------------------------------------


def test_store_search_filters_pages_and_prefixes(store):
    base = uid("shop")
    for i in range(6):
        store.put((base, "orders", f"c{i % 2}"), f"o{i}",
                  {"total": i * 10, "status": "open" if i % 3 else "paid", "tags": ["a", "b"],
                   "customer": {"tier": "gold" if i < 3 else "silver"}})
    everything = store.search((base,), limit=100)
    assert len(everything) == 6 and all(i.score is None for i in everything)
    assert [i.key for i in everything] == [f"o{i}" for i in reversed(range(6))]  # newest first
    assert {i.key for i in store.search((base, "orders", "c1"))} == {"o1", "o3", "o5"}
    assert {i.key for i in store.search((base,), filter={"status": "paid"})} == {"o0", "o3"}
    assert {i.key for i in store.search((base,), filter={"total": {"$gte": 20, "$lt": 50}})} == {"o2", "o3", "o4"}
    assert {i.key for i in store.search((base,), filter={"status": {"$ne": "open"}})} == {"o0", "o3"}
    assert {i.key for i in store.search((base,), filter={"customer": {"tier": "gold"}})} == {"o0", "o1", "o2"}
    assert len(store.search((base,), filter={"tags": ["a", "b"]})) == 6
    assert store.search((base,), filter={"tags": ["a"]}) == []
    pages = [store.search((base,), limit=4, offset=o) for o in (0, 4)]
    assert [len(p) for p in pages] == [4, 2] and {i.key for p in pages for i in p} == {f"o{i}" for i in range(6)}
    assert store.search((uid("nothing"),)) == []


def test_store_namespaces_it_shows_name_the_same_items_again(store, agent, team):
    """The caller's own namespaces are shown short, but never in a short form that names
    something else: ("agent", me, "org") is not ("org",), and ("agent", me) is not ()."""
    me = agent[0]
    base = uid("shadow")
    own = [("agent", me, "agent", me, base), ("agent", me, "org", base), ("agent", me),
           ("agent", me, "team", team, base)]
    for ns in own:
        store.put(ns, "k", {"v": "nested", "at": list(ns)})
    store.put((base,), "k", {"v": "plain"})
    shown = [i for i in store.search((), limit=100) if i.value.get("v") == "nested"]
    assert len(shown) == len(own)
    for item in shown:
        assert item.namespace and store.get(item.namespace, "k").value == item.value
    assert () not in store.list_namespaces()
    victim = next(i for i in shown if i.value["at"] == ["agent", me, "agent", me, base])
    store.delete(victim.namespace, "k")  # deletes that item, not ("<base>",)'s
    assert store.get((base,), "k").value == {"v": "plain"}


def test_store_query_search_ranks_with_the_index(store):
    base = uid("kb")
    store.put((base, "howto"), "deploy", {"text": "Deploy with the blue green rollout on Fridays"})
    store.put((base, "howto"), "rollback", {"text": "Rollback: revert the release tag", "level": 2})
    store.put((base, "other"), "lunch", {"text": "Lunch is served at noon"})
    hits = eventually(lambda: store.search((base,), query="rollout fridays"), "the deploy item")
    assert hits[0].key == "deploy" and hits[0].score > 0 and hits[0].namespace == (base, "howto")
    eventually(lambda: store.search((base,), query="rollback"), "the rollback item")
    assert store.search((base, "other"), query="rollback") == []
    assert store.search((base,), query="rollback", filter={"level": 3}) == []
    assert [i.key for i in store.search((base,), query="rollback revert", filter={"level": 2})] == ["rollback"]


def test_store_list_namespaces(store, agent):
    name = agent[0]
    base = uid("tree")
    for ns in [(base, "b", "c"), (base, "b", "d", "e"), (base, "b", "d", "i"), (base, "b", "f"),
               (base, "c", "f")]:
        store.put(ns, "k", {"v": 1})
    assert store.list_namespaces(prefix=(base,)) == sorted(
        [(base, "b", "c"), (base, "b", "d", "e"), (base, "b", "d", "i"), (base, "b", "f"), (base, "c", "f")])
    assert store.list_namespaces(prefix=(base, "b"), max_depth=3) == [
        (base, "b", "c"), (base, "b", "d"), (base, "b", "f")]
    assert store.list_namespaces(prefix=(base,), suffix=("f",)) == [(base, "b", "f"), (base, "c", "f")]
    assert store.list_namespaces(prefix=(base, "*", "f")) == [(base, "b", "f"), (base, "c", "f")]
    assert store.list_namespaces(prefix=(base,), limit=2, offset=1) == [(base, "b", "d", "e"),
                                                                       (base, "b", "d", "i")]
    # spelled out, the scope shows: the same namespaces under ("agent", name)
    assert ("agent", name, base, "c", "f") in store.list_namespaces(prefix=("agent", name, base))
    assert (base, "c", "f") in store.list_namespaces(limit=1000)


def test_store_batch_checks_reads_then_writes(store, agent):
    name, _, client = agent
    ns = (uid("batch"),)
    store.put(ns, "old", {"v": 0})
    results = store.batch([
        PutOp(ns, "new", {"v": 1}),
        GetOp(ns, "old"),
        GetOp(ns, "new"),  # reads see the store as it was before the batch's writes
        PutOp(ns, "new", {"v": 2}),  # of two writes to one item, the last wins
        PutOp(ns, "old", None),
        SearchOp(ns, limit=10),
        ListNamespacesOp(limit=1000),
    ])
    assert results[0] is None and results[1].value == {"v": 0} and results[2] is None
    assert [i.key for i in results[5]] == ["old"] and ns in results[6]
    assert store.get(ns, "new").value == {"v": 2} and store.get(ns, "old") is None
    ident = doc_id(("agent", name, *ns), "new")
    assert len(client.memory_history(f"agent:{name}", ident)) == 1


def test_store_async_with_either_client(gw, agent):
    name, created, client = agent

    async def run(store: OrgmemStore) -> None:
        ns = (uid("async"),)
        await store.aput(ns, "a", {"n": 1})
        await store.aput(ns, "b", {"n": 2})
        assert (await store.aget(ns, "a")).value == {"n": 1}
        assert {i.key for i in await store.asearch(ns, filter={"n": {"$gt": 1}})} == {"b"}
        assert await store.alist_namespaces(prefix=ns) == [ns]
        results = await store.abatch([GetOp(ns, "b"), PutOp(ns, "c", {"n": 3})])
        assert results[0].value == {"n": 2} and (await store.aget(ns, "c")).value == {"n": 3}
        await store.adelete(ns, "a")
        assert await store.aget(ns, "a") is None

    async def native() -> None:
        aclient = orgmem.AsyncClient(gw.endpoint, created["access_key"], created["secret_key"])
        try:
            await run(OrgmemStore(async_client=aclient))
        finally:
            await aclient.close()

    asyncio.run(native())
    with OrgmemStore(client) as threaded:  # a sync client only: its calls run in worker threads
        asyncio.run(run(threaded))
    with pytest.raises(TypeError, match="async methods"):
        OrgmemStore(async_client=object()).get(("x",), "k")


# -- the store: bad input -------------------------------------------------------------------


class Opaque:
    pass


BAD_NAMESPACES = [("a.b",), ("",), ("ok", 3), (), ("team",), ("team", "Not A Name"), ("agent", "x" * 60),
                  ("langgraph", "x")]
BAD_VALUES = [{"s": {1, 2}}, {"f": float("nan")}, {"b": b"bytes"}, {"o": Opaque()}, {1: "int key"},
              {"deep": [{"x": float("inf")}]}, ["not", "a", "dict"], "text"]


@pytest.mark.parametrize("namespace", BAD_NAMESPACES, ids=repr)
def test_store_refuses_bad_namespaces(store, agent, namespace):
    name, _, client = agent
    before = mine(client, name)
    with pytest.raises(InvalidNamespaceError):
        store.batch([PutOp(("fine",), uid("k"), {"v": 1}), PutOp(namespace, "k", {"v": 1})])
    assert mine(client, name) == before


@pytest.mark.parametrize("value", BAD_VALUES, ids=repr)
def test_store_refuses_non_json_values(store, agent, value):
    name, _, client = agent
    before = mine(client, name)
    with pytest.raises(InvalidValueError, match="nothing was stored|Nothing was stored"):
        store.batch([PutOp(("fine",), uid("k"), {"v": 1}), PutOp(("fine",), "bad", value)])
    assert mine(client, name) == before


def test_store_refuses_oversized_values_and_other_bad_input(store, agent):
    name, _, client = agent
    before = mine(client, name)
    with pytest.raises(InvalidValueError, match="256 KiB"):
        store.put(("big",), "k", {"text": "x" * (300 * 1024)})
    with pytest.raises(InvalidValueError, match="256 KiB"):  # JSON escaping counts too
        store.put(("big",), "k", {"text": '"' * (130 * 1024)})
    with pytest.raises(InvalidValueError, match="unknown operator"):
        store.search(("big",), filter={"n": {"$near": 1}})
    with pytest.raises(InvalidValueError, match="limit"):
        store.search(("big",), limit=-1)
    with pytest.raises(InvalidValueError, match="key"):
        store.batch([PutOp(("big",), 42, {"v": 1})])
    with pytest.raises(NotImplementedError, match="TTL"):
        store.put(("big",), "k", {"v": 1}, ttl=5)
    with pytest.raises(InvalidValueError, match="max_depth"):
        store.list_namespaces(max_depth=0)
    with pytest.raises(InvalidValueError, match="match_type"):
        store.batch([ListNamespacesOp(match_conditions=(MatchCondition("middle", ("a",)),))])
    with pytest.raises(InvalidNamespaceError):
        store.list_namespaces(prefix=("a.b",))
    with pytest.raises(ValueError, match="kind"):
        OrgmemStore(client, kind="rumour")
    assert mine(client, name) == before
    store.put(("big",), "k", {"text": "x" * (200 * 1024)})  # under the limit: stored
    assert len(store.get(("big",), "k").value["text"]) == 200 * 1024


# -- the checkpointer: a graph interrupted here, resumed elsewhere --------------------------

GRAPH = '''
"""An approval graph: draft, then a human's verdict (interrupt), then publish."""
import json, operator, os, sys
from typing import Annotated, TypedDict

import orgmem
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from orgmem.langgraph import OrgmemSaver, OrgmemStore


class State(TypedDict, total=False):
    topic: str
    draft: str
    verdict: str
    ran: Annotated[list, operator.add]


def draft(state):
    return {"draft": f"A post about {state['topic']}", "ran": [["draft", os.getpid()]]}


def review(state):
    verdict = interrupt({"question": "Publish this?", "draft": state["draft"]})
    return {"verdict": verdict, "ran": [["review", os.getpid()]]}


def publish(state):
    get_store().put(("posts",), state["topic"], {"draft": state["draft"], "verdict": state["verdict"]})
    return {"ran": [["publish", os.getpid()]]}


builder = StateGraph(State)
builder.add_node("draft", draft)
builder.add_node("review", review)
builder.add_node("publish", publish)
builder.add_edge(START, "draft")
builder.add_edge("draft", "review")
builder.add_edge("review", "publish")
builder.add_edge("publish", END)

client = orgmem.Client()  # ORGMEM_ENDPOINT, ORGMEM_ACCESS_KEY, ORGMEM_SECRET_KEY
graph = builder.compile(checkpointer=OrgmemSaver(client), store=OrgmemStore(client))
step, thread, arg = sys.argv[1:4]
config = {"configurable": {"thread_id": thread}}
if step == "start":
    out = graph.invoke({"topic": arg}, config)
    print(json.dumps({"interrupts": [i.value for i in out["__interrupt__"]], "pid": os.getpid()}))
else:
    out = graph.invoke(Command(resume=arg), config)
    print(json.dumps({"state": out, "pid": os.getpid()}))
client.close()
'''


def run_graph(script, gw, created, *args: str) -> dict:
    env = {**os.environ, "ORGMEM_ENDPOINT": gw.endpoint, "ORGMEM_ACCESS_KEY": created["access_key"],
           "ORGMEM_SECRET_KEY": created["secret_key"], "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script), *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_graph_interrupted_in_one_process_resumes_in_another(gw, agent, tmp_path):
    name, created, client = agent
    script = tmp_path / "approval_graph.py"
    script.write_text(GRAPH)
    thread = uid("ticket")
    first = run_graph(script, gw, created, "start", thread, "release notes")
    assert first["interrupts"] == [{"question": "Publish this?", "draft": "A post about release notes"}]

    second = run_graph(script, gw, created, "resume", thread, "approved")
    state = second["state"]
    assert state["draft"] == "A post about release notes" and state["verdict"] == "approved"
    assert [node for node, _ in state["ran"]] == ["draft", "review", "publish"]
    pids = {node: pid for node, pid in state["ran"]}
    assert pids["draft"] == first["pid"] and pids["publish"] == second["pid"] != first["pid"]
    # the node's store write is open memory of the agent
    with OrgmemStore(client) as store:
        assert store.get(("posts",), "release notes").value == {"draft": "A post about release notes",
                                                                 "verdict": "approved"}

    # a third "machine" reads the thread's history from the gateway
    with OrgmemSaver(client) as saver:
        config = {"configurable": {"thread_id": thread}}
        history = list(saver.list(config))
        assert [t.metadata["step"] for t in history] == list(range(len(history) - 2, -2, -1))
        assert history[0].checkpoint["channel_values"]["verdict"] == "approved"
        assert all(t.parent_config["configurable"]["checkpoint_id"] == history[i + 1].config[
            "configurable"]["checkpoint_id"] for i, t in enumerate(history[:-1]))
        assert saver.get_tuple(config).config == history[0].config
        assert [t.config for t in saver.list(config, limit=2)] == [t.config for t in history[:2]]
        older = list(saver.list(config, before=history[1].config))
        assert [t.config for t in older] == [t.config for t in history[2:]]
        assert [t.metadata["source"] for t in saver.list(config, filter={"source": "input"})] == ["input"]
        resumed = list(saver.list(config, filter={"step": history[2].metadata["step"]}))
        assert [t.config for t in resumed] == [history[2].config]
        # the checkpoint that waited for the verdict holds the interrupt as a pending write
        waiting = next(t for t in history if t.checkpoint["channel_values"].get("draft")
                       and "verdict" not in t.checkpoint["channel_values"])
        assert any(channel == "__interrupt__" for _, channel, _ in waiting.pending_writes)

        files = client.list_files(f"agent-{name}", f"langgraph/{thread}/")
        assert files and all(f["key"].startswith(f"langgraph/{thread}/~/") for f in files)
        sample = client.read_file(f"agent-{name}", files[0]["key"])
        assert sample.content_type == CONTENT_TYPE and ormsgpack.unpackb(bytes(sample))["format"] == 1

        saver.delete_thread(thread)
        assert saver.get_tuple(config) is None and list(saver.list(config)) == []
        assert client.list_files(f"agent-{name}", f"langgraph/{thread}/") == []


class Counter(TypedDict, total=False):
    n: int
    log: Annotated[list, operator.add]


def counter_graph(saver):
    def bump(state):
        got = interrupt("how much?")
        return {"n": state.get("n", 0) + got, "log": [got]}

    builder = StateGraph(Counter)
    builder.add_node("bump", bump)
    builder.add_edge(START, "bump")
    builder.add_edge("bump", END)
    return builder.compile(checkpointer=saver)


def test_async_saver_resumes_a_thread_with_a_fresh_client(gw, agent):
    _, created, _ = agent
    thread = {"configurable": {"thread_id": uid("async"), "checkpoint_ns": ""}}

    async def step(resume=None):
        aclient = orgmem.AsyncClient(gw.endpoint, created["access_key"], created["secret_key"])
        try:
            graph = counter_graph(OrgmemSaver(async_client=aclient))
            if resume is None:
                return await graph.ainvoke({"n": 40}, thread)
            return await graph.ainvoke(Command(resume=resume), thread)
        finally:
            await aclient.close()

    assert asyncio.run(step())["__interrupt__"][0].value == "how much?"
    assert asyncio.run(step(2)) == {"n": 42, "log": [2]}


def test_saver_passes_the_langgraph_conformance_suite(agent):
    client = agent[2]

    @checkpointer_test(name="OrgmemSaver")
    async def saver():
        with OrgmemSaver(client, prefix=f"{uid('conformance')}/") as made:
            yield made

    report = asyncio.run(validate(saver))
    assert report.passed_all_base(), report.to_dict()


def test_saver_keys_hold_any_thread_and_namespace(agent):
    client = agent[2]
    with OrgmemSaver(client, prefix=f"{uid('keys')}/") as saver:
        check_odd_keys(saver)


def test_saver_keeps_the_last_of_several_special_writes_in_one_call(agent):
    """A node's interrupts resumed in turn come back as several writes to one special channel
    in one call; the last is kept, as LangGraph's own savers keep it (they raced)."""
    with OrgmemSaver(agent[2], prefix=f"{uid('special')}/") as saver:
        for run in range(3):
            config = {"configurable": {"thread_id": f"t{run}", "checkpoint_ns": ""}}
            stored = saver.put(config, empty_checkpoint(), {"source": "loop", "step": 0}, {})
            saver.put_writes(stored, [("__interrupt__", "first"), ("__interrupt__", "second"),
                                      ("__interrupt__", "third"), ("out", 1)], "task-1")
            writes = saver.get_tuple(config).pending_writes
            assert ("task-1", "__interrupt__", "third") in writes and ("task-1", "out", 1) in writes
            assert [w for w in writes if w[1] == "__interrupt__"] == [("task-1", "__interrupt__", "third")]


def check_odd_keys(saver):
    thread, namespaces = "a/b ~7E:ü", ["", "parent:1|child:2", "~"]
    stored = {}
    for ns in namespaces:
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
        checkpoint = empty_checkpoint()
        stored[ns] = saver.put(config, checkpoint, {"source": "loop", "step": 0, "ns": ns}, {})
        saver.put_writes(stored[ns], [("ch", ns)], "task/1:ü")
    for ns in namespaces:
        found = saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ns}})
        assert found.config == stored[ns] and found.metadata["ns"] == ns
        assert found.pending_writes == [("task/1:ü", "ch", ns)]
        assert [t.config for t in saver.list({"configurable": {"thread_id": thread, "checkpoint_ns": ns}})] \
            == [stored[ns]]
    assert len(list(saver.list({"configurable": {"thread_id": thread}}))) == 3
    assert list(saver.list({"configurable": {"thread_id": "a/b"}})) == []
    saver.delete_thread(thread)
    assert list(saver.list(None)) == []


def test_checkpoints_stay_out_of_search(agent, store):
    client = agent[2]
    word, marker = uid("zebrafish").replace("-", ""), uid("marker").replace("-", "")
    with OrgmemSaver(client, prefix=f"{uid('quiet')}/") as saver:
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"note": f"{word} in a checkpoint"}
        saver.put({"configurable": {"thread_id": "t"}}, checkpoint, {}, {"note": 1})
    store.put((uid("later"),), "k", {"text": marker})  # logged after the checkpoint
    eventually(lambda: client.search(marker)["hits"], "the later memory")
    assert client.search(word)["hits"] == []


# -- the checkpointer: bad input ------------------------------------------------------------


def test_saver_refuses_bad_input_and_writes_nothing(agent, gw, admin):
    name, _, client = agent
    bucket = f"agent-{name}"
    prefix = f"{uid('bad')}/"
    with OrgmemSaver(client, prefix=prefix) as saver:
        check_bad_input(saver, client, bucket, prefix)

    # another agent cannot read this agent's threads
    other = admin.create_agent(uid("peer"))
    with orgmem.Client(gw.endpoint, other["access_key"], other["secret_key"]) as peer:
        with pytest.raises(orgmem.AccessDenied):
            OrgmemSaver(peer, bucket=bucket, prefix=prefix).get_tuple(
                {"configurable": {"thread_id": "t1"}})


def check_bad_input(saver, client, bucket, prefix):
    good = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    with pytest.raises(ValueError, match="thread_id"):
        saver.put({"configurable": {}}, checkpoint, {}, {})
    with pytest.raises(ValueError, match="configurable"):
        saver.put({}, checkpoint, {}, {})
    with pytest.raises(LayoutError, match="at most 1024"):
        saver.put({"configurable": {"thread_id": "t" * 1100}}, checkpoint, {}, {})
    with pytest.raises(ValueError, match="no id"):
        saver.put(good, {**checkpoint, "id": ""}, {}, {})
    with pytest.raises(ValueError, match="checkpoint_ns"):
        saver.put({"configurable": {"thread_id": "t1", "checkpoint_ns": 5}}, checkpoint, {}, {})
    unserializable = {**checkpoint, "channel_values": {"x": Opaque()}}
    with pytest.raises(TypeError):
        saver.put(good, unserializable, {}, {"x": 1})
    with pytest.raises(ValueError, match="checkpoint_id"):
        saver.put_writes(good, [("ch", 1)], "task-1")
    stored = saver.put(good, checkpoint, {"source": "input", "step": -1}, {})
    with pytest.raises(TypeError):
        saver.put_writes(stored, [("ok", 1), ("bad", Opaque())], "task-1")
    with pytest.raises(ValueError, match="limit"):
        list(saver.list(good, limit=-1))
    keys = [f["key"] for f in client.list_files(bucket, prefix)]
    assert keys == [f"{prefix}t1/~/checkpoints/{checkpoint['id']}"]  # only the good checkpoint
    assert saver.get_tuple(stored).pending_writes == []
