"""The indexer library: schema, upserts, access-controlled search, snapshots.

The library never imports ``gateway``; the snapshot tests run over both the library's
in-memory BlobStore and the gateway's adapter (``StoreBlobs``) over its real local store.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.search.blobs import StoreBlobs
from gateway.store.local import LocalStore
from indexer import (
    MAX_QUERY_CHARS,
    Exclusion,
    IndexSearcher,
    IndexWriter,
    LocalCopy,
    MemoryBlobStore,
    PreconditionFailed,
    QueryError,
    SnapshotConflict,
    collect,
    event_entry,
    file_entry,
    is_indexable,
    latest,
    memory_entry,
    publish,
    regex_literal,
    restore,
    restore_latest,
    skill_entry,
    skip_reason,
)
from indexer.snapshot import _join

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC).timestamp()
DAY = 86400
ALL = ["org", "agent:a", "owner:a", "agent:b", "owner:b", "bucket:ws", "team:core"]


def corpus():
    return [
        event_entry("a", "ev-1", kind="note", session="s1", time=T0,
                    content="The nightly build runs the migration against staging"),
        event_entry("a", "ev-2", kind="question", session="s1", time=T0 + DAY,
                    content="Why does the canary flap after midnight?"),
        event_entry("b", "ev-9", kind="note", session="s9", time=T0 + 2 * DAY,
                    content="Private: the rollout password rotates weekly"),
        memory_entry("org", "deploy-day-old", kind="decision", title="Deploy day",
                     body="Production deploys happen on Fridays.", time=T0, status="superseded",
                     tags=["deploy"]),
        memory_entry("org", "deploy-day", kind="decision", title="Deploy day",
                     body="Production deploys happen on Thursdays, never on Fridays.", time=T0 + DAY,
                     tags=["deploy"]),
        memory_entry("team:core", "lint", kind="preference", title="Linting",
                     body="Prefer ruff over flake8 for linting.", time=T0 + 3 * DAY),
        skill_entry("org", "release", description="Cut a release", time=T0,
                    body="1. Tag the commit. 2. The pipeline publishes wheels."),
        file_entry("ws", "notes/incident.md", b"# Incident\nThe gateway crashed; the watchdog restarted it.",
                   time=T0 + 4 * DAY, content_type="text/markdown"),
    ]


@pytest.fixture
def index(tmp_path):
    writer = IndexWriter(tmp_path / "idx", heap_size=20_000_000, num_threads=1)
    writer.upsert(corpus())
    writer.commit()
    yield writer
    writer.close()


def ids(result):
    return [h.id for h in result.hits]


def test_each_type_found_by_a_body_word_with_stemming(index):
    s = IndexSearcher(index.index)
    cases = {"event": ("running", "ev-1"), "memory": ("lints", "lint"), "skill": ("publishing", "release"),
             "file": ("restarting", "notes/incident.md")}
    for type_, (word, expected) in cases.items():
        result = s.search(word, {"type": type_}, ALL)
        assert ids(result) == [expected], (type_, word, result)
        hit = result.hits[0]
        assert hit.type == type_ and hit.score > 0 and hit.time and hit.title
        assert "<b>" in hit.snippet_html and hit.highlights
        start, end = hit.highlights[0]
        assert hit.snippet[start:end].lower().startswith(word[:3])
    sources = {h.source for h in s.search("", None, ALL, limit=20).hits}
    assert {"bio:b/ev-9", "memory:teams/core/lint", "skill:org/release", "s3://ws/notes/incident.md"} <= sources


def test_upsert_twice_is_one_hit_and_delete_removes(index):
    s = IndexSearcher(index.index)
    entry = corpus()[0]
    index.upsert([entry, entry])
    index.commit()
    index.upsert(entry)
    index.commit()
    assert s.search("migration", None, ALL).count == 1
    entry.body = "The nightly build now skips migration"
    index.upsert(entry)
    index.commit()
    result = s.search("migration", None, ALL)
    assert result.count == 1 and "skips" in result.hits[0].snippet
    index.delete("bio:a/ev-1")
    index.commit()
    assert s.search("migration", None, ALL).count == 0
    assert s.search("", None, ALL, limit=100).count == len(corpus()) - 1


def test_access_tokens_bound_hits_and_counts(index):
    s = IndexSearcher(index.index)
    b_only = ["org", "agent:b", "owner:b"]
    assert s.search("rotates password", None, b_only).count == 1
    for query in ["canary", "migration", "nightly OR canary", "", "*", "agent:a", "session:s1", "NOT fridays"]:
        result = s.search(query, None, b_only, limit=100)
        assert all(h.agent != "a" for h in result.hits), query
        assert result.count == len(result.hits), query
    assert s.search("", {"agent": "a"}, b_only).count == 0
    assert s.search("linting", None, b_only).count == 0  # team:core only
    assert s.search("linting", None, ["team:core"]).count == 1
    assert s.search("", None, []).count == 0  # no tokens, nothing
    assert s.search("access:agent:a migration", None, b_only).count == 0


def test_superseded_ranks_below_replacement_and_is_marked(index):
    s = IndexSearcher(index.index)
    result = s.search("deploy fridays", {"type": "memory"}, ALL)
    assert ids(result) == ["deploy-day", "deploy-day-old"]
    assert [h.superseded for h in result.hits] == [False, True]
    assert result.hits[1].status == "superseded"
    assert result.hits[0].score > result.hits[1].score


def test_filters_and_time_ranges(index):
    s = IndexSearcher(index.index)
    assert ids(s.search("", {"session": "s1"}, ALL)) == ["ev-2", "ev-1"]  # newest first without words
    assert ids(s.search("", {"kind": ["preference", "question"]}, ALL)) == ["lint", "ev-2"]
    assert set(ids(s.search("", {"scope": "org", "type": "memory"}, ALL))) == {"deploy-day", "deploy-day-old"}
    assert ids(s.search("deploy", {"status": "active", "type": "memory"}, ALL)) == ["deploy-day"]
    assert ids(s.search("", {"tags": "deploy", "status": "superseded"}, ALL)) == ["deploy-day-old"]
    since, until = T0 + DAY, T0 + 3 * DAY
    assert set(ids(s.search("", {"since": since, "until": until}, ALL))) == {"ev-2", "deploy-day", "ev-9"}
    assert ids(s.search("", {"since": "2024-05-04T12:00:00Z"}, ALL)) == ["notes/incident.md", "lint"]
    assert ids(s.search("", {"until": "2024-05-01T12:00:01+00:00", "type": "event"}, ALL)) == ["ev-1"]
    # time ranges in the query text, bare dates included
    assert set(ids(s.search("time:[2024-05-04 TO 2024-05-06]", None, ALL))) == {"lint", "notes/incident.md"}
    assert ids(s.search("type:event time:>2024-05-02T13:00:00Z", None, ALL)) == ["ev-9"]
    assert ids(s.search("kind:question", None, ALL)) == ["ev-2"]
    # +/-, phrases
    assert ids(s.search('deploys -thursdays', {"type": "memory"}, ALL)) == ["deploy-day-old"]
    assert ids(s.search('deploys AND NOT thursdays', {"type": "memory"}, ALL)) == ["deploy-day-old"]
    assert ids(s.search('"never on fridays"', None, ALL)) == ["deploy-day"]
    assert ids(s.search("+canary +midnight", None, ALL)) == ["ev-2"]
    # paging: count is for all pages
    page = s.search("", None, ALL, limit=3, offset=3)
    assert page.count == len(corpus()) and len(page.hits) == 3
    with pytest.raises(QueryError):
        s.search("", {"type": "nope"}, ALL)
    with pytest.raises(QueryError):
        s.search("", {"colour": "red"}, ALL)
    with pytest.raises(QueryError):
        s.search("", {"since": "yesterday"}, ALL)
    with pytest.raises(QueryError):
        s.search("", None, ALL, limit=100_000)


HOSTILE = ['"unbalanced quote', "a" * 10_000, " ".join(["word"] * 2000)[:MAX_QUERY_CHARS], "nosuchfield:x",
           "*", "NOT", "NOT fridays", "AND", "OR OR", "(((", ")))", "time:[2024 TO", "time:[x TO y]", "time:>",
           "time:{2024-01-01 TO", "body:*", "type:*", "/regex/", "http://x.y/z", "title:", ":", "run^", "run~9",
           "+", "-", "\\", "\x00", "😀", '"' * 301, "run" + "(" * 500, "[", "{", "weight:[0 TO 1]", "IN [a b]"]


def test_since_a_hits_own_time_finds_it_and_the_rest_of_its_second(tmp_path):
    """The index keeps times to the second: since = a hit's own time (…00.8) once found
    nothing in that second, so a poller lost the items after it."""
    writer = IndexWriter(tmp_path / "ix", heap_size=20_000_000, num_threads=1)
    writer.upsert([event_entry("a", "early", kind="note", session="s", time=T0 + 0.2, content="tick"),
                   event_entry("a", "late", kind="note", session="s", time=T0 + 0.8, content="tick")])
    writer.commit()
    try:
        s = IndexSearcher(writer.index)
        assert sorted(ids(s.search("tick", {"since": T0 + 0.8}, ALL))) == ["early", "late"]
        assert sorted(ids(s.search("tick", {"since": T0 + 0.5}, ALL))) == ["early", "late"]
        assert ids(s.search("tick", {"since": T0 + 1}, ALL)) == []
    finally:
        writer.close()


def test_hostile_queries_raise_only_query_error(index):
    s = IndexSearcher(index.index)
    for query in HOSTILE:
        try:
            result = s.search(query, None, ["agent:b"], limit=50)
        except QueryError as e:
            assert str(e), query
            continue
        # whatever the text, nothing outside the caller's tokens
        assert all(h.agent == "b" for h in result.hits), query
        assert result.count == len(result.hits), query
    with pytest.raises(QueryError, match="characters"):
        s.search("a" * 10_000, None, ALL)


def test_indexability():
    assert is_indexable("src/app.py", "text/x-python", 100, b"print('hi')\n")
    assert is_indexable("README", None, 10, b"hello")
    assert is_indexable("data.json", "application/json", 10, b'{"a": 1}')
    assert is_indexable("notes.md", "binary/octet-stream", 5, "héllo".encode())  # sniffed as text
    assert is_indexable("x", "application/octet-stream", 4, b"text")
    assert skip_reason("big.txt", "text/plain", 5 * 1024 * 1024, b"x") == "too-large"
    assert skip_reason("big.txt", "text/plain", 2000, b"x", max_bytes=1000) == "too-large"
    assert skip_reason("a.png", "image/png", 10, b"\x89PNG") == "binary-type"
    assert skip_reason("a.bin", "application/octet-stream", 10, b"ab\x00cd") == "binary-content"
    assert skip_reason("a.txt", "text/plain", 10, b"ab\x00cd") == "binary-content"
    assert skip_reason("a.dat", "application/octet-stream", 10, b"\xff\xfe\xfa junk") == "binary-content"
    assert skip_reason("a.weird", "application/x-weird", 10, b"text") == "not-text"
    # a multi-byte character cut at the end of the sniffed head is still text
    assert is_indexable("a.txt", None, 9000, ("é" * 5000).encode()[:8191])
    assert file_entry("ws", "a.png", b"\x89PNG\x00", time=T0, content_type="image/png") is None
    assert file_entry("ws", "a.md", b"# hi", time=T0).access == ["bucket:ws"]


def test_exclusions_take_entries_out_of_hits_and_counts(tmp_path):
    w = IndexWriter(tmp_path / "x", heap_size=20_000_000, num_threads=1)
    arn = "arn:orgmem:memory:::org/"
    for slug in ("board-1", "board-2", "pub.lic", "other"):
        w.upsert(memory_entry("org", slug, kind="fact", title=slug, body="quarterly plan", time=T0,
                              resource=arn + slug))
    w.upsert(event_entry("a", "e1", kind="note", content="quarterly plan", time=T0, resource="arn:orgmem:bio:::a/s"))
    w.commit()
    s = IndexSearcher(w.index)
    tokens = ["org", "agent:a"]
    assert s.search("plan", None, tokens).count == 5
    board = Exclusion("memory", (regex_literal(arn + "board-") + "(?s:.*)",))
    result = s.search("plan", None, tokens, limit=0, exclusions=[board])
    assert result.count == 3
    assert {h.id for h in s.search("plan", None, tokens, exclusions=[board]).hits} == {"pub.lic", "other", "e1"}
    # a pattern is taken literally ("." is not any character) and only within its type
    dotted = Exclusion("memory", (regex_literal(arn + "pub.lic"),))
    assert s.search("plan", None, tokens, exclusions=[dotted]).count == 4
    assert s.search("plan", None, tokens, exclusions=[Exclusion("memory", ("(?s:.*)",))]).count == 1
    # inverted: everything of the type outside the pattern goes
    only_board = Exclusion("memory", (regex_literal(arn + "board-") + "(?s:.*)",), inverted=True)
    assert {h.id for h in s.search("plan", None, tokens, exclusions=[only_board]).hits} == {"board-1", "board-2", "e1"}
    with pytest.raises(QueryError):
        s.search("plan", None, tokens, exclusions=[Exclusion("nosuchtype", (".*",))])
    w.close()


# -- snapshots ----------------------------------------------------------------------------


@pytest.fixture(params=["memory", "local"])
def blobs(request, tmp_path):
    if request.param == "memory":
        yield MemoryBlobStore()
        return
    store = LocalStore(tmp_path / "store")
    store.create_bucket("snapshots")
    yield StoreBlobs(store, "snapshots")
    store.close()


def results(searcher):
    out = []
    for query in ["deploy", "running", "", "canary OR linting", "restarting"]:
        r = searcher.search(query, None, ALL, limit=50)
        out.append((r.count, [(h.id, round(h.score, 4), h.snippet) for h in r.hits]))
    return out


def test_publish_restore_same_results_and_checkpoint(index, blobs, tmp_path):
    assert restore(blobs, "index", tmp_path / "none") is None
    manifest = publish(blobs, "index", index.path, {"log": "000042", "offset": 7})
    assert manifest["seq"] == 1 and manifest["files"] and manifest["format"] == 1
    assert latest(blobs, "index")["checkpoint"] == {"log": "000042", "offset": 7}
    checkpoint = restore(blobs, "index", tmp_path / "copy")
    assert checkpoint == {"log": "000042", "offset": 7}
    copy = IndexSearcher(tmp_path / "copy")
    assert results(copy) == results(IndexSearcher(index.index))
    # a second snapshot reuses unchanged segment files and uploads only the new ones
    before = set(blobs.list("index/files/"))
    index.upsert(event_entry("a", "ev-3", kind="note", content="fresh words", time=T0, session="s1"))
    index.commit()
    second = publish(blobs, "index", index.path, {"log": "000043"})
    assert second["seq"] == 2
    reused = {f["key"] for f in second["files"]} & {f["key"] for f in manifest["files"]}
    assert reused and before <= set(blobs.list("index/files/"))
    assert restore(blobs, "index", tmp_path / "copy2") == {"log": "000043"}
    assert IndexSearcher(tmp_path / "copy2").search("fresh", None, ALL).count == 1
    # a restored copy can take over writing
    writer = IndexWriter(tmp_path / "copy2", heap_size=20_000_000, num_threads=1)
    writer.upsert(event_entry("a", "ev-4", kind="note", content="after restore", time=T0))
    writer.commit()
    assert IndexSearcher(writer.index).search("restore", None, ALL).count == 1
    writer.close()


def test_manifest_is_compare_and_swap(index, blobs):
    publish(blobs, "index", index.path, {"n": 1})
    blobs.put(_join("index", "manifests", f"{2:012d}.json"), b'{"format": 1, "seq": 2}', if_none_match=True)
    index.upsert(event_entry("a", "ev-5", kind="note", content="x", time=T0))
    index.commit()
    # the racing publisher's manifest 2 exists; ours is 3 now, so simulate a lost race directly
    with pytest.raises(PreconditionFailed):
        blobs.put(_join("index", "manifests", f"{2:012d}.json"), b"{}", if_none_match=True)
    assert publish(blobs, "index", index.path, {"n": 3})["seq"] == 3


def test_publish_conflict_when_number_taken(index, monkeypatch):
    blobs = MemoryBlobStore()
    publish(blobs, "p", index.path, {})
    import indexer.snapshot as snap
    monkeypatch.setattr(snap, "latest", lambda store, prefix: None)  # a publisher with a stale view
    with pytest.raises(SnapshotConflict):
        publish(blobs, "p", index.path, {})


def test_restore_falls_back_when_newest_is_broken(index, blobs, tmp_path):
    first = publish(blobs, "index", index.path, {"n": 1})
    index.upsert(event_entry("a", "ev-6", kind="note", content="newer", time=T0))
    index.commit()
    second = publish(blobs, "index", index.path, {"n": 2})
    only_new = sorted({f["key"] for f in second["files"]} - {f["key"] for f in first["files"]})
    assert only_new
    blobs.delete(only_new[0])
    assert restore(blobs, "index", tmp_path / "r") == {"n": 1}
    assert IndexSearcher(tmp_path / "r").search("newer", None, ALL).count == 0


class CountingBlobs:
    """A blob store that records which keys were fetched."""

    def __init__(self, inner) -> None:
        self.inner, self.fetched = inner, []

    def get(self, key):
        self.fetched.append(key)
        return self.inner.get(key)

    def open(self, key):
        self.fetched.append(key)
        return self.inner.open(key)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_restore_links_the_files_a_local_copy_shares_and_fetches_the_rest(index, blobs, tmp_path):
    publish(blobs, "index", index.path, {"n": 1})
    first = restore_latest(blobs, "index", tmp_path / "one")
    assert first.linked_files == 0 and first.fetched_files == len(first.manifest["files"]) > 0
    index.upsert(event_entry("a", "ev-9", kind="note", content="incremental words", time=T0))
    index.commit()
    second_manifest = publish(blobs, "index", index.path, {"n": 2})
    counting = CountingBlobs(blobs)
    second = restore_latest(counting, "index", tmp_path / "two", LocalCopy.of(tmp_path / "one", first.manifest))
    old = {(f["name"], f["sha256"]) for f in first.manifest["files"]}
    new_files = [f for f in second_manifest["files"] if (f["name"], f["sha256"]) not in old]
    assert new_files and second.linked_files == len(second_manifest["files"]) - len(new_files) > 0
    assert sorted(k for k in counting.fetched if "/files/" in k) == sorted(f["key"] for f in new_files)
    assert second.fetched_bytes == sum(f["size"] for f in new_files)
    assert second.checkpoint == {"n": 2}
    assert results(IndexSearcher(tmp_path / "two")) == results(IndexSearcher(index.index))
    assert IndexSearcher(tmp_path / "two").search("incremental", None, ALL).count == 1
    # linked, not copied: the same inode; removing the old copy leaves the new one whole
    shared = next(f["name"] for f in second_manifest["files"] if (f["name"], f["sha256"]) in old)
    assert (tmp_path / "one" / shared).stat().st_ino == (tmp_path / "two" / shared).stat().st_ino
    shutil.rmtree(tmp_path / "one")
    assert results(IndexSearcher(tmp_path / "two")) == results(IndexSearcher(index.index))


def test_restore_fetches_what_the_local_copy_lost_or_holds_otherwise(index, blobs, tmp_path):
    manifest = publish(blobs, "index", index.path, {"n": 1})
    restore_latest(blobs, "index", tmp_path / "one")
    names = [f["name"] for f in manifest["files"]]
    (tmp_path / "one" / names[0]).unlink()  # gone meanwhile (a merge retired it)
    claimed = {f["name"]: f["sha256"] for f in manifest["files"]}
    claimed[names[1]] = "0" * 64  # the copy's file is other bytes than the snapshot's
    with open(tmp_path / "one" / names[2], "ab") as fh:
        fh.write(b"!")  # the size no longer matches
    again = restore_latest(blobs, "index", tmp_path / "two", LocalCopy(tmp_path / "one", claimed))
    assert again.fetched_files == 3 and again.linked_files == len(names) - 3
    assert results(IndexSearcher(tmp_path / "two")) == results(IndexSearcher(index.index))


def test_restore_refuses_a_file_with_other_bytes_and_falls_back(index, blobs, tmp_path):
    publish(blobs, "index", index.path, {"n": 1})
    index.upsert(event_entry("a", "ev-7", kind="note", content="tampered later", time=T0))
    index.commit()
    first_keys = {f["key"] for f in json.loads(blobs.get(_join("index", "manifests", f"{1:012d}.json")))["files"]}
    second = publish(blobs, "index", index.path, {"n": 2})
    victim = next(f for f in second["files"] if f["key"] not in first_keys)
    data = bytearray(blobs.get(victim["key"]))
    data[len(data) // 2] ^= 1  # one flipped bit, same size
    blobs.delete(victim["key"])
    blobs.put(victim["key"], bytes(data))
    restored = restore_latest(blobs, "index", tmp_path / "r")
    assert restored.checkpoint == {"n": 1}
    assert IndexSearcher(tmp_path / "r").search("tampered", None, ALL).count == 0


def test_publish_keeps_a_diverged_writers_file_under_its_hash(index, blobs, tmp_path):
    """Two writers that diverged from one snapshot can name a segment file alike with other
    bytes: the second one's goes under ``<name>.<sha256[:16]>`` and both snapshots restore."""
    manifest = publish(blobs, "index", index.path, {"n": 1})
    entry = manifest["files"][0]
    blobs.delete(entry["key"])
    blobs.put(entry["key"], b"another writer's bytes")  # same name, other content
    blobs.delete(_join("index", "manifests", f"{1:012d}.json"))
    again = publish(blobs, "index", index.path, {"n": 2})
    moved = next(f for f in again["files"] if f["name"] == entry["name"])
    assert moved["key"] == f"{entry['key']}.{entry['sha256'][:16]}" and moved["sha256"] == entry["sha256"]
    assert blobs.get(entry["key"]) == b"another writer's bytes"
    assert restore_latest(blobs, "index", tmp_path / "r").checkpoint == {"n": 2}
    assert results(IndexSearcher(tmp_path / "r")) == results(IndexSearcher(index.index))


def test_publish_reuses_a_same_named_file_only_when_its_bytes_match(index, blobs, tmp_path):
    """Two writers diverged from one snapshot can write a delete file of the same name and size
    with other contents: name and size are not proof, the hash is."""
    first = publish(blobs, "index", index.path, {"n": 1})
    entry = first["files"][0]
    path = Path(index.path) / entry["name"]
    original = path.read_bytes()
    changed = bytearray(original)
    changed[0] ^= 0xFF  # same name, same size, other bytes
    path.write_bytes(bytes(changed))
    try:
        second = publish(blobs, "index", index.path, {"n": 2})
        moved = next(f for f in second["files"] if f["name"] == entry["name"])
        assert moved["sha256"] != entry["sha256"] and moved["key"] != entry["key"]
        assert blobs.get(moved["key"]) == bytes(changed) and blobs.get(entry["key"]) == original
        # with the copy's own record of what it holds, no hashing is needed and the record decides
        third = publish(blobs, "index", index.path, {"n": 3}, local=LocalCopy.of(index.path, second))
        assert next(f for f in third["files"] if f["name"] == entry["name"])["key"] == moved["key"]
    finally:
        path.write_bytes(original)


def test_collect_keeps_last_n(index, blobs, tmp_path):
    for n in range(1, 5):
        index.upsert(event_entry("a", f"gc-{n}", kind="note", content=f"round {n}", time=T0))
        index.commit()
        publish(blobs, "index", index.path, {"n": n})
    blobs.put("index/files/orphan", b"left by a failed publish")
    deleted = collect(blobs, "index", keep=2)
    assert "index/files/orphan" in deleted
    manifests = blobs.list("index/manifests/")
    assert [m.rsplit("/", 1)[1] for m in manifests] == [f"{3:012d}.json", f"{4:012d}.json"]
    named = set()
    for key in manifests:
        named |= {f["key"] for f in json.loads(blobs.get(key))["files"]}
    assert set(blobs.list("index/files/")) == named
    assert restore(blobs, "index", tmp_path / "after-gc") == {"n": 4}
    assert IndexSearcher(tmp_path / "after-gc").search("round", None, ALL).count == 4
    assert collect(blobs, "index", keep=2) == []


def test_a_delete_notice_applied_after_a_later_write_leaves_the_file_indexed(tmp_path):
    """Replicas' logs are applied in turn, not by time: a DELETE through one gateway can be
    applied after the re-PUT through another. The notice re-checks the object."""
    import io

    from gateway.log import DocChanged
    from gateway.search.entries import Sources
    from gateway.store.base import ObjectMeta

    store = LocalStore(tmp_path / "store")
    store.create_bucket("ws")
    sources = Sources(store, None, None)  # type: ignore[arg-type] - files need only the store
    store.put_object("ws", "notes.md", io.BytesIO(b"back again"), ObjectMeta(content_type="text/markdown"))
    assert sources.from_record(DocChanged("file", "ws/notes.md", "delete", 1.0)) is None
    store.delete_object("ws", "notes.md")
    op, _ = sources.from_record(DocChanged("file", "ws/notes.md", "delete", 2.0))
    assert op == "delete"
