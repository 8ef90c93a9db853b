"""Two gateways on one upstream bucket hand the search index over without losing documents.

The index writer holds a lease; one that stalls past it (a long step, a pause) finishes its
step after another gateway took the lease and restored the last snapshot. Its publish must
not go over the new writer's work: the new writer would then read the log from its own,
older snapshot while compaction collects what the stale one's checkpoint said was indexed.
Driven step by step in-process, with a two-second lease standing for the fifteen-second one.
"""

from __future__ import annotations

import time

import pytest
from conftest import UPSTREAM_BUCKET

import gateway.indexing as indexing
from gateway.app import build
from gateway.config import Config
from gateway.memory.documents import Scope
from gateway.search.tokens import ROOT_TOKEN
from vault.keys import create_keyring

LEASE = 2.0


@pytest.fixture
def pair(seaweed, tmp_path, monkeypatch):
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(indexing, "PUBLISH_INTERVAL", 0.5)
    keyring = tmp_path / "keys" / "keyring.json"
    keyring.parent.mkdir()
    create_keyring(keyring)
    prefix = f"handover-{time.time_ns()}"
    gateways = []
    for name in ("a", "b"):
        config = Config.load(flags={"data": str(tmp_path / name), "backend": f"s3://{UPSTREAM_BUCKET}/{prefix}",
                                    "backend_endpoint": seaweed.endpoint, "kek": f"file:{keyring}",
                                    "compact_interval": 0}, env={})
        g = build(config, "AKIAHANDOVERTEST0001", "h" * 40)
        g.durable_log.start()
        g.search_index.lease.ttl = LEASE
        gateways.append(g)
    yield gateways
    for g in gateways:
        g.search_index.close()
        g.durable_log.close()
        g.executor.shutdown(wait=True)
        g.store.close()


def found(g, word: str) -> int:
    searcher = g.search_index._searcher
    searcher.reload()
    return searcher.search(word, tokens=[ROOT_TOKEN], limit=0).count


def remember(g, doc_id: str, body: str) -> None:
    g.search_index.sources.memory.put("root", Scope.parse("org"), doc_id,
                                      {"kind": "fact", "title": doc_id, "body": body})


def test_a_writer_that_lost_its_lease_cannot_publish_over_the_new_writer(pair):
    a, b = pair
    a.search_index.step()
    assert a.search_index.role == "writer"  # it built the index and published the first snapshot
    remember(a, "alpha", "zebrafish alpha")
    a.search_index._last_try = 0
    a.search_index.step()  # indexed and committed by a, not yet published
    time.sleep(LEASE + 0.5)  # a stalls past its lease
    b.search_index.step()
    assert b.search_index.role == "writer"  # b took the lease and restored the first snapshot
    remember(b, "beta", "zebrafish beta")
    time.sleep(0.6)
    b.search_index.step()  # b publishes the second snapshot
    a.search_index._last_renew = time.monotonic()  # a resumes inside its step, lease unchecked
    a.search_index.step()
    assert a.search_index.role == "follower"  # it could not publish: it stepped down
    b.biographies.compact()  # collects whatever log objects the index checkpoint has passed
    for _ in range(4):
        time.sleep(0.6)
        b.search_index.step()
    assert b.search_index.role == "writer"
    assert found(b, "alpha") == 1 and found(b, "beta") == 1
    a.search_index._last_try = 0
    a.search_index.step()  # a follows b's newest snapshot
    assert found(a, "alpha") == 1 and found(a, "beta") == 1


def test_a_stale_publish_is_refused_and_its_writer_restores_the_newer_snapshot(pair):
    """The other order: the stale writer publishes first (its snapshot is the latest then);
    the new writer, built on the snapshot before, may not publish over it, and takes the
    newer one over instead of reading the log from where its own left off."""
    a, b = pair
    a.search_index.step()
    b.search_index.step()
    assert (a.search_index.role, b.search_index.role) == ("writer", "follower")
    remember(a, "alpha", "zebrafish alpha")
    a.search_index._last_try = 0
    a.search_index.step()
    time.sleep(LEASE + 0.5)
    b.search_index._last_try = 0
    b.search_index.step()
    assert b.search_index.role == "writer"  # restored the first snapshot, without alpha
    a.search_index._last_renew = time.monotonic()
    a.search_index._last_publish = 0
    a.search_index.step()  # publishes the second snapshot, with alpha, and moves the checkpoint
    b.biographies.compact()  # so alpha's log object goes
    remember(b, "beta", "zebrafish beta")
    for _ in range(6):
        time.sleep(0.6)
        b.search_index.step()
    assert b.search_index.role == "writer"
    assert found(b, "alpha") == 1 and found(b, "beta") == 1
