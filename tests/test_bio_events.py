"""Biography events: validation messages, batch framing, ids, ordering, and Parquet round trips.

Pure unit tests (no server): they pin the contract clients see in a 400, and that
an event survives the log record and the Parquet segment unchanged.
"""

from __future__ import annotations

import io
import re

import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from gateway.biography import events as ev
from gateway.biography.events import (
    KINDS,
    MAX_EVENTS,
    MAX_LINE,
    Event,
    EventError,
    derived_event_id,
    new_event_id,
    order_key,
    parse_batch,
    time_key,
    validate,
    validate_batch,
)
from gateway.biography.schema import (
    EVENT_SCHEMA,
    FORMAT_VERSION,
    date_of,
    events_to_table,
    partition_of,
    table_to_events,
    write_segment,
    write_table,
)

NOW = 1_796_040_000_000_000  # 2026-11-30T12:00:00Z
CALLER = "agent-1"
ULID = re.compile(r"^ev_[0-9A-HJKMNP-TV-Z]{26}$")


def one(raw: dict, line: int = 1, **kw) -> Event:
    return validate(raw, line, caller=CALLER, now_us=NOW, **kw)


def batch(body: bytes, **kw) -> list[Event]:
    return validate_batch(body, caller=CALLER, now_us=NOW, **kw)


def ndjson(*objs) -> bytes:
    return b"\n".join(orjson.dumps(o) for o in objs) + b"\n"


def error_of(body: bytes, **kw) -> EventError:
    with pytest.raises(EventError) as info:
        batch(body, **kw)
    return info.value


FULL = {
    "event_id": "call-1", "agent": "agent-2", "session": "sess 1 ✓", "seq": 7,
    "ts": "2026-11-30T13:00:00.123456+01:00", "kind": "tool_call", "role": "assistant",
    "parent_id": "ev_01ABC", "tool": "web.search", "content": "héllo 世界 🚀\nline two",
    "data": {"z": 1, "a": [1, 2.5, None, True], "nested": {"k": "v"}},
    "artifact_uri": "s3://bucket/path/report.pdf", "model": "claude-x", "tokens_in": 1200,
    "tokens_out": 45, "tags": ["t1", "zwei"], "trace_id": "4BF92F3577B34DA6A3CE929D0E0E4736",
    "span_id": "00f067aa0ba902b7",
}


# --------------------------------------------------------------------------- good events


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_is_accepted(kind):
    e = one({"session": "s", "kind": kind, "content": "x"})
    assert (e.kind, e.agent, e.ts, e.session, e.content) == (kind, CALLER, NOW, "s", "x")
    assert ULID.match(e.event_id)
    assert e.tags == [] and e.redactions == 0 and e.seq is None


def test_every_field_is_kept_and_normalised():
    e = one(FULL)
    assert e.event_id == "call-1" and e.agent == "agent-2" and e.seq == 7
    assert e.ts == NOW + 123456  # 13:00+01:00 is 12:00Z
    assert e.data == '{"a":[1,2.5,null,true],"nested":{"k":"v"},"z":1}'  # sorted keys
    assert e.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert e.content == FULL["content"] and e.tags == ["t1", "zwei"]


def test_record_and_api_forms():
    e = one(FULL)
    rec = e.to_record()
    assert Event.from_record(orjson.loads(orjson.dumps(rec))) == e
    minimal = one({"session": "s", "kind": "note"})
    assert set(minimal.to_record()) == {"event_id", "agent", "session", "ts", "kind"}
    e.redactions = 2
    assert Event.from_record(e.to_record()) == e
    api = e.to_api()
    assert api["ts"] == "2026-11-30T12:00:00.123456Z"
    assert api["data"] == FULL["data"] and api["redactions"] == 2
    assert set(api) == set(Event.__slots__) - {"id_assigned", "id_resent"}  # bookkeeping
    assert one({"session": "s", "kind": "note", "content": ""}).to_record()["content"] == ""


def test_null_optional_fields_are_absent():
    e = one({"session": "s", "kind": "note", "seq": None, "ts": None, "tags": None,
             "data": None, "event_id": None, "agent": None})
    assert e.seq is None and e.ts == NOW and e.tags == [] and e.data is None
    assert e.agent == CALLER


@pytest.mark.parametrize("ts, us", [
    ("2026-11-30T12:00:00Z", NOW),
    ("2026-11-30T12:00:00.5Z", NOW + 500_000),
    ("2026-11-30T12:00:00.123456789Z", NOW + 123_456),  # nanoseconds truncated
    ("2026-11-30T14:00:00+02:00", NOW),
    ("2026-11-30 12:00:00z", NOW),
    (1796040000, NOW),
    (1796040000.25, NOW + 250_000),
    (1796040000.123456, NOW + 123_456),  # not ...455 (binary floats)
    (1796040000.9999997, NOW + 999_999),  # truncated like RFC 3339: not the next second
    (86399.9999999, 86_399_999_999),  # nor the next day's partition
    (1e-7, 0),
    (0, 0),
])
def test_timestamps(ts, us):
    assert one({"session": "s", "kind": "note", "ts": ts}).ts == us


# --------------------------------------------------------------------------- bad events


BASE = {"session": "s", "kind": "note"}


@pytest.mark.parametrize("patch, field, words", [
    ({"kind": None}, "kind", "is required"),
    ({"session": None}, "session", "is required"),
    ({"kind": "promt"}, "kind", 'did you mean "prompt"'),
    ({"kind": 3}, "kind", "must be one of prompt, response"),
    ({"kind": ["note"]}, "kind", "got an array"),
    ({"session": ""}, "session", "must not be empty"),
    ({"session": "a\nb"}, "session", "printable"),
    ({"session": "x" * 257}, "session", "at most 256 characters"),
    ({"session": 5}, "session", "must be a string (got 5)"),
    ({"seq": True}, "seq", "must be an integer (got true)"),
    ({"seq": -1}, "seq", "between 0 and"),
    ({"seq": 2**63}, "seq", "between 0 and 9223372036854775807"),
    ({"seq": 1.0}, "seq", "must be an integer"),
    ({"tokens_in": False}, "tokens_in", "must be an integer (got false)"),
    ({"tokens_out": 2**53 + 1}, "tokens_out", "between 0 and 9007199254740992"),
    ({"tokens_in": "12"}, "tokens_in", 'must be an integer (got "12")'),
    ({"event_id": "has space"}, "event_id", "letters, digits"),
    ({"event_id": "x" * 129}, "event_id", "at most 128"),
    ({"event_id": ""}, "event_id", "must not be empty"),
    ({"parent_id": {"id": "x"}}, "parent_id", "got an object"),
    ({"agent": "Bad_Name"}, "agent", "not valid"),
    ({"agent": "root"}, "agent", "reserved"),
    ({"agent": 7}, "agent", "must be a string"),
    ({"ts": "2026-11-30T12:00:00"}, "ts", "add Z for UTC"),
    ({"ts": "2026-11-30"}, "ts", "add Z for UTC"),
    ({"ts": "yesterday"}, "ts", "RFC 3339"),
    ({"ts": 1796040000000}, "ts", "looks like milliseconds"),
    ({"ts": 1e305}, "ts", "after year 9999"),
    ({"ts": -1e305}, "ts", "between 1970-01-01"),
    ({"ts": 253402300800}, "ts", "between 1970-01-01"),
    ({"ts": "9999-12-31T23:59:59-01:00"}, "ts", "between 1970-01-01"),
    ({"ts": -1}, "ts", "between 1970-01-01"),
    ({"ts": "1969-12-31T23:59:59Z"}, "ts", "between 1970-01-01"),
    ({"ts": True}, "ts", "must be an RFC 3339 string or unix seconds"),
    ({"ts": float("nan")}, "ts", "finite"),
    ({"role": "r" * 65}, "role", "at most 64"),
    ({"tool": "t" * 257}, "tool", "at most 256"),
    ({"model": ""}, "model", "must not be empty"),
    ({"content": {"text": "x"}}, "content", "put structured values in data"),
    ({"content": "é" * (ev.MAX_CONTENT // 2 + 1)}, "content", "at most 1048576 bytes of UTF-8"),
    ({"data": "x" * ev.MAX_DATA}, "data", "at most 1048576 bytes as JSON"),
    ({"artifact_uri": "not a uri"}, "artifact_uri", "must be a URI"),
    ({"artifact_uri": "s3://b/" + "k" * 2048}, "artifact_uri", "at most 2048"),
    ({"tags": "a,b"}, "tags", "must be an array of strings"),
    ({"tags": ["ok", ""]}, "tags", "entry 1 must be 1 to 128"),
    ({"tags": ["ok", 3]}, "tags", "entry 1"),
    ({"tags": [str(i) for i in range(65)]}, "tags", "at most 64 entries"),
    ({"trace_id": "xyz"}, "trace_id", "32 hexadecimal digits"),
    ({"trace_id": "0" * 32}, "trace_id", "all zeros"),
    ({"span_id": "4bf92f3577b34da6a3ce929d0e0e4736"}, "span_id", "16 hexadecimal digits"),
    ({"redactions": 0}, "redactions", "is set by the server"),
    ({"knd": "x"}, "knd", 'unknown field "knd" (did you mean "kind"?)'),
    ({"timestamp": "x"}, "timestamp", 'did you mean "ts"'),
])
def test_field_errors_name_line_and_field(patch, field, words):
    raw = {**BASE, **patch}
    raw = {k: v for k, v in raw.items() if not (v is None and k in ("kind", "session"))}
    with pytest.raises(EventError) as info:
        one(raw, line=3)
    err = info.value
    assert (err.line, err.field) == (3, field), str(err)
    assert words in err.message, err.message
    assert str(err).startswith(f'line 3, field "{field}": ')


def test_error_message_format():
    err = error_of(ndjson(BASE, BASE, {"session": "s", "kind": "promt"}))
    assert str(err) == ('line 3, field "kind": must be one of prompt, response, tool_call, '
                        "tool_result, artifact, question, answer, decision, note, error, state, "
                        'handoff (got "promt"; did you mean "prompt"?)')
    assert isinstance(err, ValueError)


def test_long_values_are_not_echoed_whole():
    err = error_of(ndjson({**BASE, "kind": "k" * 10_000}))
    assert len(str(err)) < 400


def test_unknown_fields_are_all_named():
    err = error_of(ndjson({**BASE, "type": "x", "sesion": "y"}))
    assert err.field == "sesion"
    assert '"sesion" (did you mean "session"?)' in err.message
    assert '"type" (did you mean "kind"?)' in err.message


# --------------------------------------------------------------------------- framing


def test_ndjson_array_and_single_object_agree():
    objs = [{**BASE, "event_id": f"e{i}", "content": f"c{i}"} for i in range(3)]
    as_nd = batch(ndjson(*objs))
    as_array = batch(orjson.dumps(objs))
    as_crlf = batch(b"\r\n".join(orjson.dumps(o) for o in objs))
    assert [e.event_id for e in as_nd] == [e.event_id for e in as_array] == ["e0", "e1", "e2"]
    assert [e.content for e in as_crlf] == ["c0", "c1", "c2"]
    assert [e.event_id for e in batch(orjson.dumps(objs[0]))] == ["e0"]
    pretty = orjson.dumps(objs[1], option=orjson.OPT_INDENT_2)
    assert b"\n" in pretty and [e.event_id for e in batch(pretty)] == ["e1"]
    assert [e.event_id for e in batch(b"\xef\xbb\xbf" + ndjson(objs[2]))] == ["e2"]


def test_blank_lines_are_skipped_but_counted():
    body = b"\n" + orjson.dumps(BASE) + b"\n   \n\r\n" + orjson.dumps({"kind": "note"}) + b"\n"
    assert [n for n, _ in parse_batch(body)[:1]] == [2]
    err = error_of(body)
    assert (err.line, err.field) == (5, "session")


def test_array_lines_are_indexes():
    err = error_of(orjson.dumps([BASE, BASE, {"session": "s"}]))
    assert (err.line, err.field) == (3, "kind")
    err = error_of(orjson.dumps([BASE, "note"]))
    assert (err.line, err.field) == (2, None) and "JSON object" in err.message


@pytest.mark.parametrize("body, line, words", [
    (b"", None, "no events"),
    (b" \n\n\t", None, "no events"),
    (b"[]", None, "no events"),
    (b"[{]", None, "not valid JSON"),
    (orjson.dumps(BASE) + b"\n{\"session\": \"s\",\n", 2, "invalid JSON"),
    (orjson.dumps(BASE) + b"\n[1, 2]\n", 2, "one JSON object (got an array)"),
    (orjson.dumps(BASE) + b"\n42\n", 2, "one JSON object (got 42)"),
    (b"\xff\xfe{}", 1, "invalid JSON"),
])
def test_framing_errors(body, line, words):
    err = error_of(body)
    assert err.line == line and words in err.message, str(err)


def test_too_many_events():
    body = orjson.dumps(BASE) + b"\n"
    err = error_of(body * (MAX_EVENTS + 1))
    assert err.line is None and "more than 10000 events" in err.message
    assert len(batch(body * MAX_EVENTS)) == MAX_EVENTS
    err = error_of(orjson.dumps([BASE] * (MAX_EVENTS + 1)))
    assert "more than 10000 events" in err.message


def test_body_and_line_limits():
    big = (b'{"session":"s","kind":"note","content":"' + b"x" * (20 * 1024 * 1024)
           + b'"}')
    body = ndjson(*[BASE] * 6) + big + b"\n"
    err = error_of(body)
    assert err.line is None and "a batch is at most 16777216 bytes" in err.message
    err = error_of(body, max_body=64 * 1024 * 1024)
    assert err.line == 7 and err.field is None
    assert err.message == (f"the line is {len(big)} bytes; one event is at most "
                           f"{MAX_LINE} bytes")


def test_duplicate_ids_collapse_or_conflict():
    a = {**BASE, "event_id": "same", "content": "a"}
    out = batch(ndjson(a, {**BASE, "event_id": "other"}, a))
    assert [e.event_id for e in out] == ["same", "other"]
    err = error_of(ndjson(a, BASE, {**a, "content": "b"}))
    assert (err.line, err.field) == (3, "event_id") and "line 1" in err.message


def test_batch_without_times_keeps_its_order():
    out = batch(ndjson(*[{**BASE, "content": str(i)} for i in range(50)]))
    assert [e.ts for e in out] == [NOW + i for i in range(50)]
    assert [e.content for e in sorted(out, key=order_key)] == [str(i) for i in range(50)]


def test_agent_other_than_caller():
    assert one({**BASE, "agent": "agent-9"}).agent == "agent-9"
    assert one({**BASE, "agent": CALLER}).agent == CALLER


# --------------------------------------------------------------------------- ids


def test_derived_ids_are_deterministic():
    body = ndjson(BASE, {**BASE, "content": "x"}, BASE)
    first = batch(body, id_namespace="s3:bucket/key.ndjson")
    again = validate_batch(body, caller=CALLER, now_us=NOW + 99, id_namespace="s3:bucket/key.ndjson")
    assert [e.event_id for e in first] == [e.event_id for e in again]
    assert len({e.event_id for e in first}) == 3  # the same line twice is two events
    other = batch(body, id_namespace="s3:bucket/other.ndjson")
    assert not {e.event_id for e in first} & {e.event_id for e in other}
    assert all(ULID.match(e.event_id) for e in first)
    assert derived_event_id("ns", 1, b"{}") == derived_event_id("ns", 1, b"{}")
    assert derived_event_id("ns", 1, b"{}") != derived_event_id("ns", 2, b"{}")
    assert derived_event_id("ns", 1, b"{}") != derived_event_id("ns", 1, b"{ }")
    kept = batch(ndjson({**BASE, "event_id": "mine"}), id_namespace="s3:b/k")
    assert kept[0].event_id == "mine"
    assert batch(orjson.dumps([BASE]), id_namespace="ns")[0].event_id == \
        batch(orjson.dumps([BASE]), id_namespace="ns")[0].event_id


def test_only_ids_the_gateway_made_in_this_batch_are_marked_assigned():
    """``id_assigned`` lets the search index add an event without deleting an earlier copy:
    only an id made here and now is certain to have none."""
    out = batch(ndjson(BASE, {**BASE, "event_id": "mine"}, {**BASE, "content": "x"}))
    assert [e.id_assigned for e in out] == [True, False, True]
    assert not any(e.id_assigned for e in batch(ndjson(BASE, BASE), id_namespace="s3:b/k"))
    assert not any(e.id_assigned for e in batch(ndjson(BASE), default_id=lambda n: f"line-{n}"))
    assert not Event.from_record(out[0].to_record()).id_assigned  # never a record field
    assert "id_assigned" not in out[0].to_record()


def test_an_id_of_the_gateways_form_sent_by_a_client_is_marked_resent():
    """Such an id may repeat one the gateway assigned (a re-import): the search index then
    fences what waits in the log, where the fresh record may still be."""
    assigned = batch(ndjson(BASE))[0].event_id
    out = batch(ndjson({**BASE, "event_id": assigned}, {**BASE, "event_id": "mine"}, BASE))
    assert [(e.id_resent, e.id_assigned) for e in out] == [(True, False), (False, False), (False, True)]
    uploaded = batch(ndjson({**BASE, "event_id": assigned}, BASE), id_namespace="s3:b/k")
    assert [(e.id_resent, e.id_assigned) for e in uploaded] == [(True, False), (False, False)]
    assert "id_resent" not in out[0].to_record()


def test_default_id_callable():
    e = one(BASE, line=4, default_id=lambda n: f"line-{n}")
    assert e.event_id == "line-4"


def test_new_ids_sort_by_time_and_within_a_millisecond():
    ids = [new_event_id(NOW + i * 1000) for i in range(5)]
    same_ms = [new_event_id(NOW + 10_000_000) for _ in range(3000)]
    assert ids == sorted(ids) and same_ms == sorted(same_ms)
    assert len(set(same_ms)) == 3000 and all(ULID.match(i) for i in ids + same_ms)
    assert ids[-1] < same_ms[0]
    # the first 10 characters are the millisecond, as in ULID
    ms = 0
    for ch in ids[0][3:13]:
        ms = ms * 32 + "0123456789ABCDEFGHJKMNPQRSTVWXYZ".index(ch)
    assert ms == NOW // 1000


def test_crockford_matches_a_plain_encoder():
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    for value in (0, 1, 2**128 - 1, 0x0123456789ABCDEF0123456789ABCDEF):
        plain = "".join(alphabet[(value >> (5 * i)) & 31] for i in range(25, -1, -1))
        assert ev._crockford128(value) == plain


# --------------------------------------------------------------------------- ordering


def test_order_key_and_time_key():
    def e(eid, ts, seq=None):
        return Event(eid, CALLER, "s", ts, "note", seq=seq)

    events = [e("d", 5), e("c", 1, seq=2), e("b", 9, seq=1), e("a", 5), e("z", 0),
              e("y", 3, seq=2)]
    assert [x.event_id for x in sorted(events, key=order_key)] == ["b", "c", "y", "z", "a", "d"]
    assert [x.event_id for x in sorted(events, key=time_key)] == ["z", "c", "y", "a", "d", "b"]


# --------------------------------------------------------------------------- Parquet


def sample_events() -> list[Event]:
    raws = [
        FULL | {"agent": None},
        {"session": "b-session", "kind": "prompt", "content": "Ünïcödé ✓ 日本語 🚀", "seq": 2},
        {"session": "b-session", "kind": "response", "content": "first", "seq": 1},
        {"session": "b-session", "kind": "note", "ts": "2026-11-30T23:59:59.999999Z"},
        {"session": "a-session", "kind": "tool_result", "parent_id": "call-1",
         "data": [1, {"b": 2}], "tags": []},
    ]
    out = [one({k: v for k, v in r.items() if v is not None}, line=i + 1)
           for i, r in enumerate(raws)]
    out[2].redactions = 3
    return out


def test_parquet_round_trip_preserves_every_field(tmp_path):
    events = sample_events()
    path = tmp_path / "seg.parquet"
    info = write_segment(events, path)
    assert info["rows"] == 5 and info["bytes"] == path.stat().st_size
    assert (info["min_ts"], info["max_ts"]) == (min(e.ts for e in events), max(e.ts for e in events))
    table = pq.read_table(path)
    assert table.schema.equals(EVENT_SCHEMA, check_metadata=False)
    assert "agent" not in table.column_names
    meta = table.schema.metadata
    assert meta[b"orgmem.format_version"] == str(FORMAT_VERSION).encode()
    back = table_to_events(table, CALLER)
    assert back == sorted(events, key=lambda e: (e.session, *order_key(e)))
    assert [e.session for e in back] == ["a-session", "b-session", "b-session", "b-session",
                                         "sess 1 ✓"]
    assert [e.seq for e in back[1:4]] == [1, 2, None]
    md = pq.ParquetFile(path).metadata
    assert md.row_group(0).column(0).compression == "ZSTD"
    assert md.row_group(0).sorting_columns[0].column_index == 1


def test_parquet_to_file_object_and_small_row_groups():
    events = [one({**BASE, "session": f"s{i % 3}", "seq": i}) for i in range(100)]
    buf = io.BytesIO()
    info = write_segment(events, buf, row_group_rows=16)
    assert info["bytes"] == len(buf.getvalue()) and info["row_groups"] == 7
    buf.seek(0)
    f = pq.ParquetFile(buf)
    assert f.metadata.num_row_groups == 7
    assert table_to_events(f.read(), CALLER) == events_to_table_order(events)


def events_to_table_order(events):
    return table_to_events(events_to_table(events), CALLER)


def test_hive_layout_reads_agent_and_date_from_the_path(tmp_path):
    events = sample_events()[1:]
    agent, day = partition_of(events[0])
    assert (agent, day) == (CALLER, "2026-11-30")
    d = tmp_path / f"agent={agent}" / f"date={day}"
    d.mkdir(parents=True)
    write_segment(events, d / "part-0.parquet")
    table = ds.dataset(tmp_path, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 4
    assert set(table.column("agent").to_pylist()) == {CALLER}
    assert sorted(table_to_events(table, CALLER), key=time_key) == sorted(events, key=time_key)


def test_segment_holds_one_partition():
    a = one(BASE)
    b = one({**BASE, "ts": "2026-12-01T00:00:00Z"})
    with pytest.raises(ValueError, match="one partition"):
        write_segment([a, b], io.BytesIO())
    with pytest.raises(ValueError, match="at least one event"):
        write_segment([], io.BytesIO())


def test_date_of():
    assert date_of(0) == "1970-01-01"
    assert date_of(NOW - 1) == "2026-11-30"
    assert date_of(NOW + 12 * 3600 * 10**6 - 1) == "2026-11-30"
    assert date_of(NOW + 12 * 3600 * 10**6) == "2026-12-01"


def test_write_table_after_a_merge_sorted_by_arrow():
    """The compactor concatenates tables and re-sorts them with Arrow: Arrow's order
    (UTF-8 bytes, nulls last) must be the same as order_key's."""
    events = [one({**BASE, "session": s, "seq": q, "ts": t})
              for s, q, t in [("é", None, 5), ("z", 2, 1), ("é", 1, 9), ("Z", None, 3),
                              ("é", None, 4), ("日本", 0, 0), ("z", 2, 0)]]
    merged = pa.concat_tables([events_to_table(events[:3]), events_to_table(events[3:])])
    merged = merged.sort_by([("session", "ascending", "at_end"), ("seq", "ascending", "at_end"),
                             ("ts", "ascending", "at_end"), ("event_id", "ascending", "at_end")])
    buf = io.BytesIO()
    info = write_table(merged.replace_schema_metadata(None), buf)
    assert info["rows"] == 7 and (info["min_ts"], info["max_ts"]) == (0, 9_000_000)
    back = table_to_events(pq.read_table(io.BytesIO(buf.getvalue())), CALLER)
    assert back == table_to_events(events_to_table(events), CALLER)
    assert pq.read_schema(io.BytesIO(buf.getvalue())).metadata[b"orgmem.format_version"] == b"1"
