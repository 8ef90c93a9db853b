"""Claude's memory tool on orgmem (``orgmem.claude_memory``) against a real gateway.

Commands go in as the Anthropic SDK's tool runner sends them (``tool.call(input_dict)``, or
``execute`` with the SDK's typed command objects); no model is called.  Answers are compared
with the SDK's own filesystem backend, objects are checked in the agent's workspace bucket
through the orgmem SDK, and every refused path or size leaves the bucket as it was."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from anthropic.lib.tools import ToolError
from anthropic.lib.tools._tool_dispatch import tool_error_content
from anthropic.tools.memory import BetaLocalFilesystemMemoryTool
from anthropic.types.beta import (
    BetaMemoryTool20250818CreateCommand,
    BetaMemoryTool20250818StrReplaceCommand,
    BetaMemoryTool20250818ViewCommand,
)
from servers import Gateway

from gateway.admin_client import AdminClient
from orgmem import AccessDenied, AsyncClient, Client
from orgmem.claude_memory import MAX_FILE_BYTES, AsyncOrgmemMemoryTool, OrgmemMemoryTool

PATIENCE = 30.0


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("claude-memory") / "data").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin(gw):
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


def new_client(gw, admin) -> Client:
    created = admin.create_agent(uid("claude"))
    return Client(gw.endpoint, created["access_key"], created["secret_key"])


@pytest.fixture
def client(gw, admin):
    c = new_client(gw, admin)
    yield c
    c.close()


@pytest.fixture
def tool(client):
    return OrgmemMemoryTool(client)


def keys(client: Client, bucket: str) -> dict[str, bytes]:
    return {o["key"]: bytes(client.read_file(bucket, o["key"])) for o in client.list_files(bucket)}


def outcome(tool, command: dict) -> str:
    """What the tool runner would put in the tool result: the answer or the error's text."""
    try:
        return tool.call(command)
    except ToolError as exc:
        return "ERROR: " + tool_error_content(exc)


# -- where memories live ---------------------------------------------------------------------


def test_memories_live_in_the_agents_own_workspace_bucket(client):
    me = client.whoami()["name"]
    assert not client.bucket_exists(f"agent-{me}")
    tool = OrgmemMemoryTool(client)
    assert tool.bucket == f"agent-{me}" and client.bucket_exists(tool.bucket)
    assert tool.to_dict() == {"type": "memory_20250818", "name": "memory"} and tool.name == "memory"
    assert OrgmemMemoryTool(client).bucket == tool.bucket  # an existing bucket is simply used

    assert tool.call({"command": "create", "path": "/memories/prefs.md",
                      "file_text": "# Preferences\n- short answers\n"}) == \
        "File created successfully at: /memories/prefs.md"
    data = client.read_file(tool.bucket, "memories/prefs.md")
    assert data == b"# Preferences\n- short answers\n" and data.content_type.startswith("text/markdown")
    assert [o["key"] for o in client.list_files(tool.bucket)] == ["memories/prefs.md"]


def test_a_bucket_the_agent_may_not_use_fails_at_construction(gw, admin, client):
    other = new_client(gw, admin)
    try:
        mine = OrgmemMemoryTool(client).bucket
        with pytest.raises(AccessDenied):
            OrgmemMemoryTool(other, bucket=mine)
    finally:
        other.close()


def test_every_command_through_call_and_execute(tool, client):
    bucket = tool.bucket
    tool.call({"command": "create", "path": "/memories/notes/todo.md", "file_text": "alpha\nbeta\ngamma\n"})
    assert tool.execute(BetaMemoryTool20250818CreateCommand(
        command="create", path="/memories/notes/done.md", file_text="shipped v1\n")) \
        == "File created successfully at: /memories/notes/done.md"

    listing = tool.call({"command": "view", "path": "/memories"})
    assert listing.splitlines()[0] == ("Here're the files and directories up to 2 levels deep in /memories, "
                                      "excluding hidden items:")
    assert [line.split("\t")[1] for line in listing.splitlines()[1:]] == [
        "/memories", "/memories/notes/", "/memories/notes/done.md", "/memories/notes/todo.md"]
    assert tool.execute(BetaMemoryTool20250818ViewCommand(command="view", path="/memories/notes/todo.md",
                                                          view_range=[2, 3])) == \
        "Here's the content of /memories/notes/todo.md with line numbers:\n     2\tbeta\n     3\tgamma"

    edited = tool.execute(BetaMemoryTool20250818StrReplaceCommand(
        command="str_replace", path="/memories/notes/todo.md", old_str="beta", new_str="BETA"))
    assert edited.startswith("The memory file has been edited.") and "     2\tBETA" in edited
    assert tool.call({"command": "insert", "path": "/memories/notes/todo.md", "insert_line": 0,
                      "insert_text": "zeroth\n"}) == "The file /memories/notes/todo.md has been edited."
    assert client.read_file(bucket, "memories/notes/todo.md") == b"zeroth\nalpha\nBETA\ngamma\n"

    assert tool.call({"command": "rename", "old_path": "/memories/notes/done.md",
                      "new_path": "/memories/archive/2026/done.md"}) == \
        "Successfully renamed /memories/notes/done.md to /memories/archive/2026/done.md"
    assert tool.call({"command": "rename", "old_path": "/memories/notes",
                      "new_path": "/memories/current"}) == \
        "Successfully renamed /memories/notes to /memories/current"
    assert keys(client, bucket) == {"memories/archive/2026/done.md": b"shipped v1\n",
                                    "memories/current/todo.md": b"zeroth\nalpha\nBETA\ngamma\n"}

    assert tool.call({"command": "delete", "path": "/memories/archive"}) == "Successfully deleted /memories/archive"
    assert tool.call({"command": "delete", "path": "/memories/current/todo.md"}) == \
        "Successfully deleted /memories/current/todo.md"
    assert keys(client, bucket) == {}
    tool.call({"command": "create", "path": "/memories/a.md", "file_text": "a"})
    assert tool.clear_all_memory() == "All memory cleared" and keys(client, bucket) == {}


# -- the same answers as the SDK's filesystem backend ----------------------------------------

SCRIPT = [
    {"command": "view", "path": "/memories/missing.md"},
    {"command": "create", "path": "/memories/log.md", "file_text": "one\ntwo\ntwo\nthree"},
    {"command": "create", "path": "/memories/log.md", "file_text": "again"},
    {"command": "view", "path": "/memories/log.md"},
    {"command": "view", "path": "/memories/log.md", "view_range": [2, -1]},
    {"command": "view", "path": "/memories/log.md", "view_range": [1, 2]},
    {"command": "str_replace", "path": "/memories/log.md", "old_str": "two", "new_str": "2"},
    {"command": "str_replace", "path": "/memories/log.md", "old_str": "four", "new_str": "4"},
    {"command": "str_replace", "path": "/memories/log.md", "old_str": "three", "new_str": "3\n3b"},
    {"command": "str_replace", "path": "/memories/nope.md", "old_str": "a", "new_str": "b"},
    {"command": "insert", "path": "/memories/log.md", "insert_line": 9, "insert_text": "x"},
    {"command": "insert", "path": "/memories/log.md", "insert_line": 2, "insert_text": "between\n"},
    {"command": "insert", "path": "/memories/log.md", "insert_line": 6, "insert_text": "end"},
    {"command": "view", "path": "/memories/log.md"},
    {"command": "create", "path": "/memories/sub/deeper/x.md", "file_text": "x"},
    {"command": "str_replace", "path": "/memories/sub", "old_str": "a", "new_str": "b"},
    {"command": "rename", "old_path": "/memories/log.md", "new_path": "/memories/sub/deeper/x.md"},
    {"command": "rename", "old_path": "/memories/gone.md", "new_path": "/memories/new.md"},
    {"command": "rename", "old_path": "/memories/log.md", "new_path": "/memories/sub/log.md"},
    {"command": "view", "path": "/memories/sub/log.md"},
    {"command": "delete", "path": "/memories/gone.md"},
    {"command": "delete", "path": "/memories"},
    {"command": "rename", "old_path": "/memories", "new_path": "/memories/elsewhere"},
    {"command": "view", "path": "/etc/passwd"},
    {"command": "view", "path": "/memories/../etc/passwd"},
    {"command": "delete", "path": "/memories/sub"},
    {"command": "view", "path": "/memories/sub/log.md"},
]


def test_answers_match_the_sdks_own_filesystem_backend(tool, tmp_path):
    local = BetaLocalFilesystemMemoryTool(str(tmp_path / "local"))
    for command in SCRIPT:
        assert outcome(tool, command) == outcome(local, command), command


def test_directory_views_list_what_the_filesystem_backend_lists(tool, tmp_path):
    local = BetaLocalFilesystemMemoryTool(str(tmp_path / "local"))
    files = {"/memories/a.md": "a", "/memories/b/c.md": "cc", "/memories/b/d/e.md": "e",
             "/memories/b/d/f/g.md": "deep", "/memories/.hidden/h.md": "h", "/memories/.dot.md": "d",
             "/memories/z/.secret.md": "s"}
    for path, text in files.items():
        for t in (tool, local):
            t.call({"command": "create", "path": path, "file_text": text})
    for path in ("/memories", "/memories/b", "/memories/b/d"):
        ours, theirs = (outcome(t, {"command": "view", "path": path}) for t in (tool, local))
        assert ours.splitlines()[0] == theirs.splitlines()[0]
        assert [line.split("\t")[1] for line in ours.splitlines()[1:]] == \
            [line.split("\t")[1] for line in theirs.splitlines()[1:]], path
    sizes = dict(reversed(line.split("\t")) for line in
                 tool.call({"command": "view", "path": "/memories"}).splitlines()[1:])
    assert sizes["/memories/a.md"] == "1B" and sizes["/memories/b/"] == "7B"


# -- what is refused -------------------------------------------------------------------------

BAD_PATHS = ["/memories/../escape.md", "/memories/a/../../escape.md", "/memories/./a.md", "/etc/passwd",
             "memories/a.md", "/memoriesx/a.md", "/memories\\a.md", "/memories/a\\..\\..\\b.md",
             "/memories/a\x00.md", "/memories/a\n.md", "/memories//a.md", "", "/", "/memories/" + "x" * 1100]


@pytest.mark.parametrize("path", BAD_PATHS)
def test_paths_outside_memories_are_refused_and_nothing_is_written(tool, client, path):
    client.write_file(tool.bucket, "memories/keep.md", b"keep")
    before = keys(client, tool.bucket)
    for command in ({"command": "create", "path": path, "file_text": "pwned"},
                    {"command": "view", "path": path},
                    {"command": "str_replace", "path": path, "old_str": "keep", "new_str": "x"},
                    {"command": "insert", "path": path, "insert_line": 0, "insert_text": "x"},
                    {"command": "delete", "path": path},
                    {"command": "rename", "old_path": "/memories/keep.md", "new_path": path},
                    {"command": "rename", "old_path": path, "new_path": "/memories/moved.md"}):
        with pytest.raises(ToolError) as refused:
            tool.call(command)
        assert str(refused.value), command
    assert keys(client, tool.bucket) == before


def test_oversized_files_are_refused_and_nothing_is_written(tool, client):
    with pytest.raises(ToolError) as too_big:
        tool.call({"command": "create", "path": "/memories/big.md", "file_text": "x" * (MAX_FILE_BYTES + 1)})
    assert f"at most {MAX_FILE_BYTES} bytes" in str(too_big.value)
    assert keys(client, tool.bucket) == {}

    small = OrgmemMemoryTool(client, max_file_bytes=100)
    small.call({"command": "create", "path": "/memories/n.md", "file_text": "x" * 90})
    for command in ({"command": "str_replace", "path": "/memories/n.md", "old_str": "x" * 90, "new_str": "y" * 101},
                    {"command": "insert", "path": "/memories/n.md", "insert_line": 1, "insert_text": "z" * 20},
                    {"command": "create", "path": "/memories/m.md", "file_text": "é" * 51}):
        with pytest.raises(ToolError) as refused:
            small.call(command)
        assert "Nothing was written" in str(refused.value)
    assert keys(client, tool.bucket) == {"memories/n.md": b"x" * 90}


def test_structure_mistakes_are_refused(tool, client):
    tool.call({"command": "create", "path": "/memories/file.md", "file_text": "f"})
    tool.call({"command": "create", "path": "/memories/dir/x.md", "file_text": "x"})
    for command, expected in (
            ({"command": "create", "path": "/memories/file.md/child.md", "file_text": "c"}, "is a file"),
            ({"command": "create", "path": "/memories/dir", "file_text": "c"}, "is a directory"),
            ({"command": "create", "path": "/memories", "file_text": "c"}, "directory itself"),
            ({"command": "rename", "old_path": "/memories/dir", "new_path": "/memories/dir/inner"}, "into itself"),
            ({"command": "rename", "old_path": "/memories/file.md", "new_path": "/memories/dir"}, "already exists"),
            ({"command": "view", "path": "/memories/dir/nothing"}, "does not exist"),
            ({"command": "create", "path": "/memories/odd.md", "file_text": "half \ud800 a pair"}, "not valid")):
        with pytest.raises(ToolError) as refused:
            tool.call(command)
        assert expected in str(refused.value), command
    assert set(keys(client, tool.bucket)) == {"memories/file.md", "memories/dir/x.md"}


def test_binary_content_is_reported_not_shown(tool, client):
    client.write_file(tool.bucket, "memories/blob.bin", b"\xff\xfe\x00")
    with pytest.raises(ToolError) as refused:
        tool.call({"command": "view", "path": "/memories/blob.bin"})
    assert "not UTF-8" in str(refused.value)


# -- sessions at once ------------------------------------------------------------------------


class Interleaved:
    """The real client, with another session's real write landing between a read and a write."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.done = False

    def __getattr__(self, name):
        return getattr(self.client, name)

    def write_file(self, bucket, key, data, content_type=None, **conditions):
        if conditions.get("if_match") and not self.done:
            self.done = True
            self.client.write_file(bucket, key, b"the other session's edit\n")
        return self.client.write_file(bucket, key, data, content_type, **conditions)


def test_an_edit_racing_another_session_loses_nothing_silently(tool, client):
    tool.call({"command": "create", "path": "/memories/shared.md", "file_text": "original\n"})
    racing = OrgmemMemoryTool(Interleaved(client), bucket=tool.bucket)
    with pytest.raises(ToolError) as lost:
        racing.call({"command": "str_replace", "path": "/memories/shared.md", "old_str": "original",
                     "new_str": "mine"})
    assert "changed by another session" in str(lost.value)
    assert client.read_file(tool.bucket, "memories/shared.md") == b"the other session's edit\n"


def test_two_sessions_creating_one_file_one_wins(tool, client):
    results: list[str] = []
    second = OrgmemMemoryTool(client)

    def create(t, text):
        results.append(outcome(t, {"command": "create", "path": "/memories/race.md", "file_text": text}))

    threads = [threading.Thread(target=create, args=(t, f"from {i}")) for i, t in enumerate((tool, second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["ERROR: File /memories/race.md already exists",
                               "File created successfully at: /memories/race.md"]


# -- found by search, and the async tool -----------------------------------------------------


def test_memory_files_are_searchable_as_workspace_files(tool, client):
    word = "mq" + uuid.uuid4().hex[:10]
    tool.call({"command": "create", "path": "/memories/projects/search.md",
               "file_text": f"# Notes\nThe {word} deploy needs a feature flag.\n"})
    end = time.monotonic() + PATIENCE
    hits = []
    while time.monotonic() < end and not hits:
        hits = client.search(word, type="file")["hits"]
        time.sleep(0.1)
    assert hits and hits[0]["source"] == f"s3://{tool.bucket}/memories/projects/search.md"


def test_the_async_tool(gw, admin):
    created = admin.create_agent(uid("claude-async"))

    async def main():
        async with AsyncClient(gw.endpoint, created["access_key"], created["secret_key"]) as client:
            tool = AsyncOrgmemMemoryTool(client)
            answers = [await tool.call({"command": "create", "path": "/memories/a.md", "file_text": "hello\n"}),
                       await tool.call({"command": "str_replace", "path": "/memories/a.md",
                                        "old_str": "hello", "new_str": "hi"}),
                       await tool.call({"command": "view", "path": "/memories/a.md"})]
            with pytest.raises(ToolError):
                await tool.call({"command": "view", "path": "/memories/../x"})
            stored = await client.read_file(tool.bucket, "memories/a.md")
            return tool.bucket, answers, stored

    bucket, answers, stored = asyncio.run(main())
    assert bucket == f"agent-{created['name']}" and stored == b"hi\n"
    assert answers[0] == "File created successfully at: /memories/a.md"
    assert answers[2] == "Here's the content of /memories/a.md with line numbers:\n     1\thi\n     2\t"
