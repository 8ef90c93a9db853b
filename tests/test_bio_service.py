"""The biography service in-process: how much of its CPU-bound work runs at once."""

from __future__ import annotations

import threading
import time

import orjson
import pytest

from gateway.app import build
from gateway.biography import prepare
from gateway.biography.events import validate_batch
from gateway.config import Config


@pytest.fixture
def gw(tmp_path):
    g = build(Config(data=str(tmp_path / "data")), "AKIABIOSERVICETEST01", "b" * 40)
    g.durable_log.start()
    yield g
    g.biographies.close()
    g.durable_log.close()
    g.executor.shutdown(wait=True)
    g.store.close()


def test_redaction_runs_in_at_most_two_threads_and_every_batch_is_appended(gw, monkeypatch):
    bios = gw.biographies
    inside, most, lock = [0], [0], threading.Lock()
    real = bios.redactor.redact_text

    def counting(text, *views):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.0005)  # let the other threads pile up at the slots
        try:
            return real(text, *views)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(bios.redactor, "redact_text", counting)
    errors: list[BaseException] = []
    acked: list[str] = []

    def client(n: int) -> None:
        body = b"\n".join(orjson.dumps({"session": f"s{n}", "kind": "note", "content": f"event {i}"})
                          for i in range(30))
        try:
            ids = bios.ingest(validate_batch(body, caller="agent-1", now_us=int(time.time() * 1e6)))
            with lock:
                acked.extend(ids)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(acked) == len(set(acked)) == 240
    assert 1 <= most[0] <= 2  # eight threads at once, held to two by the slots
    assert prepare.INGEST_SLOTS.free == 2  # every slot was given back


def test_a_validation_by_the_rest_api_takes_a_slot(gw, monkeypatch):
    from types import SimpleNamespace

    from gateway.api import bio as bio_api

    seen = []
    real = prepare.validate_batch

    def spying(*args, **kwargs):
        seen.append(prepare.INGEST_SLOTS.free)
        return real(*args, **kwargs)

    monkeypatch.setattr(prepare, "validate_batch", spying)
    call = SimpleNamespace(state={}, body=orjson.dumps({"session": "s", "kind": "note"}),
                           principal=SimpleNamespace(name="agent-1"))
    batch = bio_api.BioApi(gw.biographies)._batch(call)
    assert len(batch.ids) == 1 and seen == [1] and prepare.INGEST_SLOTS.free == 2


def test_slots_serve_waiters_in_turn():
    """A thread that releases and at once takes a slot again (a big batch, 1,000 events per
    hold) must not keep it from a thread already waiting: a plain semaphore lets it."""
    slots = prepare.Slots(1)
    holds, stop = [0], threading.Event()

    def hog() -> None:
        while not stop.is_set():
            with slots:
                holds[0] += 1
                time.sleep(0.001)

    waited_out: list[int] = []

    def waiter() -> None:
        before = holds[0]
        with slots:
            waited_out.append(holds[0] - before)

    thread = threading.Thread(target=hog)
    thread.start()
    try:
        while holds[0] < 5:
            time.sleep(0.001)
        turn = threading.Thread(target=waiter)
        turn.start()
        turn.join(30)  # a plain semaphore starves it for as long as the hog runs
        assert waited_out and waited_out[0] <= 1  # at most the hold in progress when it queued
    finally:
        stop.set()
        thread.join(10)
    turn.join(10)
    assert slots.free == 1


def test_a_batch_larger_than_a_slot_hold_is_redacted_in_several_holds(gw, monkeypatch):
    """A 50,000-event S3 object must not keep a slot for the whole of its redaction."""
    monkeypatch.setattr(prepare, "SLOT_EVENTS", 7)
    holds = [0]
    real = prepare.INGEST_SLOTS

    class Counting:
        def __enter__(self):
            holds[0] += 1
            return real.__enter__()

        def __exit__(self, *exc):
            return real.__exit__(*exc)

    monkeypatch.setattr(prepare, "INGEST_SLOTS", Counting())
    body = b"\n".join(orjson.dumps({"session": "big", "kind": "note", "content": f"e {i}"}) for i in range(30))
    ids = gw.biographies.ingest(validate_batch(body, caller="agent-1", now_us=int(time.time() * 1e6)))
    assert len(ids) == 30 and holds[0] == 5  # 7 + 7 + 7 + 7 + 2


def test_large_events_hold_a_slot_each_not_a_thousand_at_a_time(gw, monkeypatch):
    """Seven events of 2 MB each (dense with credential keywords, redacted at a few MB/s) held
    one slot for their whole redaction, and two such requests stalled every other agent's
    append for 25 s. A hold now ends after SLOT_CHARS of text."""
    holds = []
    real = prepare.INGEST_SLOTS

    class Counting:
        def __enter__(self):
            holds.append(0)
            return real.__enter__()

        def __exit__(self, *exc):
            return real.__exit__(*exc)

    real_redacted = gw.biographies.preparer.redacted

    def counted(e, *views):
        holds[-1] += 1
        return real_redacted(e, *views)

    monkeypatch.setattr(prepare, "INGEST_SLOTS", Counting())
    monkeypatch.setattr(gw.biographies.preparer, "redacted", counted)
    big = "word " * (prepare.SLOT_CHARS // 5 + 1)
    lines = [{"session": "big", "kind": "tool_result", "content": big} for _ in range(3)]
    lines += [{"session": "big", "kind": "note", "content": "small"} for _ in range(4)]
    body = b"\n".join(orjson.dumps(line) for line in lines)
    ids = gw.biographies.ingest(validate_batch(body, caller="agent-1", now_us=int(time.time() * 1e6),
                                               max_body=16 << 20))
    assert len(ids) == 7 and holds == [1, 1, 1, 4]


def test_background_compaction_runs_below_requests_in_cpu_priority(gw):
    import os

    own = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        niced = gw.compaction_thread.submit(os.getpriority, os.PRIO_PROCESS, 0).result(10)
    finally:
        gw.compaction_thread.shutdown(wait=True)
    assert niced == min(19, own + 10)
    assert os.getpriority(os.PRIO_PROCESS, 0) == own  # the caller's own priority is untouched
