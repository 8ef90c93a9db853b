"""Biographies against real gateways: REST and S3 ingestion, reads, Parquet, DuckDB, crashes, replicas."""

from __future__ import annotations

import base64
import json
import os
import sysconfig
import threading
import time
import uuid
from pathlib import Path

import boto3
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from clients import clean_env, run, wait_until
from rawhttp import error_code, request, sign
from servers import Gateway

from gateway.admin_client import AdminClient, AdminError
from gateway.bio_client import BioClient

AWS = Path(os.path.dirname(os.sys.executable)) / "aws"
HTTPFS = os.path.join(sysconfig.get_paths()["purelib"], "duckdb_ext", "extensions")


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("bio") / "data").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin(gw):
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


@pytest.fixture(scope="module")
def root(gw):
    return BioClient(gw.endpoint, gw.access_key, gw.secret_key)


def new_agent(admin, gw, **kwargs) -> tuple[str, BioClient, dict]:
    name = f"ag-{uuid.uuid4().hex[:8]}"
    created = admin.create_agent(name, **kwargs)
    return name, BioClient(gw.endpoint, created["access_key"], created["secret_key"]), created


def s3_client(gw, access_key, secret_key):
    return boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=access_key,
                        aws_secret_access_key=secret_key, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def all_events(client: BioClient, **query) -> list[dict]:
    return list(client.iter_events(**query))


def duck(gw, access_key: str, secret_key: str) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(config={"extension_directory": HTTPFS, "autoinstall_known_extensions": "false"})
    con.execute("LOAD httpfs")
    host = gw.endpoint.removeprefix("http://")
    con.execute(f"CREATE SECRET gw (TYPE s3, KEY_ID '{access_key}', SECRET '{secret_key}', "
                f"ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false, REGION 'us-east-1')")
    return con


def transcript(n: int, session: str = "s1") -> list[dict]:
    kinds = ["prompt", "response", "tool_call", "tool_result", "note"]
    return [{"session": session, "kind": kinds[i % 5], "content": f"step {i}: looked at the build log",
             "tool": "shell" if kinds[i % 5].startswith("tool") else None} for i in range(n)]


# -- REST ----------------------------------------------------------------------------------


def test_rest_events_are_readable_right_after_the_acknowledgement(admin, gw):
    name, agent, _ = new_agent(admin, gw)
    answer = agent.put_events([{**e, "seq": i} for i, e in enumerate(transcript(30))])
    assert answer["count"] == 30
    got = all_events(agent, session="s1")
    assert [e["event_id"] for e in got] == answer["event_ids"]
    assert [e["seq"] for e in got] == list(range(30))
    assert {e["agent"] for e in got} == {name}


def test_session_order_follows_seq_and_time_order_follows_ts(admin, gw):
    _, agent, _ = new_agent(admin, gw)
    agent.put_events([{"session": "s", "kind": "note", "seq": 2, "ts": "2026-11-30T10:00:00Z", "event_id": "b"},
                      {"session": "s", "kind": "note", "seq": 1, "ts": "2026-11-30T11:00:00Z", "event_id": "a"},
                      {"session": "s", "kind": "note", "ts": "2026-11-30T09:00:00Z", "event_id": "c"}])
    assert [e["event_id"] for e in all_events(agent, session="s")] == ["a", "b", "c"]
    assert [e["event_id"] for e in all_events(agent)] == ["c", "b", "a"]


def test_pages_filters_and_cursors(admin, gw, root):
    name, agent, _ = new_agent(admin, gw)
    agent.put_events(transcript(250))
    root.compact()  # half compacted, half in the log tail
    agent.put_events(transcript(50, session="s2"))
    first = agent.events(limit=100)
    assert len(first["events"]) == 100 and first["next_cursor"]
    ids = [e["event_id"] for e in all_events(agent, page_size=100)]
    assert len(ids) == len(set(ids)) == 300
    assert len(all_events(agent, session="s2")) == 50
    assert {e["kind"] for e in all_events(agent, kinds=["tool_call"])} == {"tool_call"}
    assert all_events(agent, since="2099-01-01T00:00:00Z") == []
    assert len(all_events(agent, since="1h")) == 300
    with pytest.raises(AdminError) as bad:
        agent.events(cursor="not-a-cursor")
    assert bad.value.status == 400 and "cursor" in bad.value.message


def test_sessions_list_open_questions(admin, gw):
    _, agent, _ = new_agent(admin, gw)
    agent.put_events([
        {"session": "q", "kind": "question", "event_id": "q1", "content": "Which region?"},
        {"session": "q", "kind": "question", "event_id": "q2", "content": "Who approves?"},
        {"session": "q", "kind": "answer", "parent_id": "q1", "content": "eu-west-1"},
        {"session": "other", "kind": "note"}])
    sessions = {s["session"]: s for s in agent.sessions()["sessions"]}
    assert sessions["q"]["events"] == 3 and sessions["other"]["events"] == 1
    assert [q["event_id"] for q in sessions["q"]["open_questions"]] == ["q2"]


def test_an_answer_closes_only_a_question_asked_before_it(admin, gw):
    _, agent, _ = new_agent(admin, gw)
    agent.put_events([
        {"session": "a", "kind": "question", "event_id": "qa", "content": "Ship it?"},
        {"session": "a", "kind": "answer", "parent_id": "qa", "ts": "2020-01-01T00:00:00Z"}])
    (session,) = agent.sessions()["sessions"]
    assert [q["event_id"] for q in session["open_questions"]] == ["qa"]


@pytest.mark.parametrize("compact_between", [True, False])
def test_an_id_used_again_days_later_is_another_event(admin, gw, root, compact_between):
    """Short ids (q1) reused in sessions weeks apart are two events, before and after
    compaction; only a copy within a day either side is a retry."""
    _, agent, _ = new_agent(admin, gw)
    agent.put_events([
        {"session": "inv-1", "kind": "question", "event_id": "q1", "ts": "2026-11-01T10:00:00Z",
         "content": "Approve invoice 1?"},
        {"session": "inv-1", "kind": "answer", "parent_id": "q1", "ts": "2026-11-01T11:00:00Z"}])
    if compact_between:
        root.compact()
    agent.put_events([{"session": "inv-2", "kind": "question", "event_id": "q1",
                       "ts": "2026-11-20T10:00:00Z", "content": "Approve payment?"}])
    for _ in range(2):
        sessions = {s["session"]: s for s in agent.sessions()["sessions"]}
        assert [q["content"] for q in sessions["inv-2"]["open_questions"]] == ["Approve payment?"]
        assert sessions["inv-1"]["open_questions"] == []
        timeline = all_events(agent)
        assert [(e["session"], e["event_id"]) for e in timeline if e["kind"] == "question"] == [
            ("inv-1", "q1"), ("inv-2", "q1")]
        assert [e["session"] for e in all_events(agent, page_size=1)] == [e["session"] for e in timeline]
        root.compact()


def test_an_event_on_the_last_day_reads_back(admin, gw):
    _, agent, _ = new_agent(admin, gw)
    agent.put_events([{"session": "end", "kind": "note", "ts": "9999-12-31T12:00:00Z"}])
    assert [e["ts"] for e in all_events(agent)] == ["9999-12-31T12:00:00.000000Z"]
    assert agent.sessions()["sessions"][0]["events"] == 1


@pytest.mark.parametrize("body, status, needle", [
    ([{"session": "s"}], 400, 'field "kind"'),
    ([{"session": "s", "kind": "note", "seq": "one"}], 400, 'field "seq"'),
    ([{"session": "s", "kind": "note", "tokens_in": True}], 400, 'field "tokens_in"'),
    ([{"session": "s", "kind": "note"}, {"session": "s", "kind": "note", "content": "x" * (1024 * 1024 + 1)}],
     400, 'line 2, field "content"'),
    (b'{"session": "s", "kind": "note"}\n{"session": "s", "kind": note}\n', 400, "line 2"),
    ([{"session": "s", "kind": "note", "colour": "red"}], 400, "colour"),
    (b'{"session": "s", "kind": "tool_result", "data": {"order_id": 123456789012345678901234567890}}',
     400, 'field "data": holds the integer'),
    (b"", 400, "no events"),
    (b"x" * (20 * 1024 * 1024), 413, "at most"),
])
def test_bad_events_are_refused_and_nothing_is_stored(admin, gw, body, status, needle):
    _, agent, _ = new_agent(admin, gw)
    with pytest.raises(AdminError) as refused:
        agent.put_events(body)
    assert refused.value.status == status
    assert needle in refused.value.message
    assert all_events(agent) == []


def test_an_agent_reads_and_writes_only_its_own_biography(admin, gw, root):
    name, agent, created = new_agent(admin, gw)
    other, other_client, _ = new_agent(admin, gw)
    other_client.put_events(transcript(3))
    with pytest.raises(AdminError) as refused:
        agent.put_events([{"agent": other, "session": "s", "kind": "note"}])
    assert refused.value.status == 403 and f"{other}/s" in refused.value.message
    with pytest.raises(AdminError) as refused:
        agent.events(agent=other)
    assert refused.value.status == 403
    admin.put_policy(f"read-{other}", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["bio:GetEvents", "bio:PutEvents"], "Resource": f"arn:orgmem:bio:::{other}/*"}]})
    admin.attach_policy(f"read-{other}", agent=name)
    time.sleep(1.2)
    agent.put_events([{"agent": other, "session": "handoff", "kind": "handoff", "content": "over to you"}])
    assert len(all_events(agent, agent=other)) == 4
    # the S3 view shows only the biographies one may read
    root.compact()
    s3 = s3_client(gw, created["access_key"], created["secret_key"])
    agents = {o["Key"].split("/")[0] for o in s3.list_objects_v2(Bucket="biographies").get("Contents", [])}
    assert agents <= {f"agent={name}", f"agent={other}"} and f"agent={other}" in agents


def test_a_deny_on_one_session_holds_in_timelines_session_lists_and_segments(admin, gw, root):
    """An auditor granted all of an agent's biography but denied its hr-* sessions: the
    agent's timeline, its session list and its open questions leave them out, and its
    Parquet segments (which hold every session of a day) are refused whole."""
    name, auditor, created = new_agent(admin, gw)
    other, other_client, owner = new_agent(admin, gw)
    other_client.put_events(transcript(150, "build") + [
        {"session": "hr-review", "kind": "question", "content": "MARKER-SALARY: raise for the CEO?"},
        {"session": "hr-review", "kind": "note", "content": "MARKER-SALARY figures"}] + transcript(150, "deploy"))
    admin.put_policy(f"audit-{other}", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["bio:GetEvents", "bio:ListSessions"],
         "Resource": f"arn:orgmem:bio:::{other}/*"},
        {"Effect": "Deny", "Action": "bio:*", "Resource": f"arn:orgmem:bio:::{other}/hr-*"}]})
    admin.attach_policy(f"audit-{other}", agent=name)
    time.sleep(1.2)
    for _before_and_after_compaction in range(2):
        pages = [auditor.events(agent=other, limit=40)]
        while pages[-1]["next_cursor"]:
            pages.append(auditor.events(agent=other, limit=40, cursor=pages[-1]["next_cursor"]))
        seen = [e for p in pages for e in p["events"]]
        assert len(seen) == 300 and {e["session"] for e in seen} == {"build", "deploy"}
        assert all(len(p["events"]) == 40 for p in pages[:-1])  # a hidden session leaves no short page
        assert [s["session"] for s in auditor.sessions(agent=other)["sessions"]] in (
            ["deploy", "build"], ["build", "deploy"])
        with pytest.raises(AdminError) as refused:
            auditor.events(agent=other, session="hr-review")
        assert refused.value.status == 403
        root.compact()
    s3 = s3_client(gw, created["access_key"], created["secret_key"])
    listed = s3.list_objects_v2(Bucket="biographies", Prefix=f"agent={other}/").get("Contents", [])
    assert listed == []
    segment = next(o["Key"] for o in root_s3(gw).list_objects_v2(
        Bucket="biographies", Prefix=f"agent={other}/")["Contents"])
    with pytest.raises(ClientError) as refused:
        s3.get_object(Bucket="biographies", Key=segment)
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    # the agent itself still reads its own segments whole
    mine = s3_client(gw, owner["access_key"], owner["secret_key"])
    assert mine.get_object(Bucket="biographies", Key=segment)["Body"].read(4) == b"PAR1"


def root_s3(gw):
    return s3_client(gw, gw.access_key, gw.secret_key)


def test_planted_secrets_are_redacted_before_anything_is_stored(admin, gw):
    _, agent, _ = new_agent(admin, gw)
    key = "AKIA" + "Z7QW3RT5YU8IOPAS"
    token = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
    agent.put_events([{"session": "s", "kind": "tool_result", "content": f"export AWS_ACCESS_KEY_ID={key}",
                       "data": {"headers": {"Authorization": f"token {token}"}}},
                      {"session": "s", "kind": "note", "content": "The build passed after fixing the import."}])
    secret_event, plain = all_events(agent)
    assert key not in json.dumps(secret_event) and token not in json.dumps(secret_event)
    assert "[REDACTED:aws_access_key:" in secret_event["content"]
    assert secret_event["redactions"] == 2
    assert plain["redactions"] == 0 and plain["content"] == "The build passed after fixing the import."


def test_workspace_changes_become_artifact_events(admin, gw):
    name, agent, created = new_agent(admin, gw)
    s3 = s3_client(gw, created["access_key"], created["secret_key"])
    bucket = f"agent-{name}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="report.md", Body=b"# findings")
    s3.copy_object(Bucket=bucket, Key="report-v2.md", CopySource={"Bucket": bucket, "Key": "report.md"})
    s3.delete_object(Bucket=bucket, Key="report.md")
    deadline = time.time() + 10
    while time.time() < deadline:
        found = all_events(agent, kinds=["artifact"])
        if len(found) == 3:
            break
        time.sleep(0.3)
    ops = [(json.loads(json.dumps(e["data"]))["op"], e["artifact_uri"]) for e in found]
    assert ops == [("put", f"s3://{bucket}/report.md"), ("copy", f"s3://{bucket}/report-v2.md"),
                   ("delete", f"s3://{bucket}/report.md")]
    assert found[0]["data"]["size"] == 10
    # a key a URI cannot hold as is: percent-encoded, so the event reads back in as it came out
    # (an exported biography posted again was refused: "must be a URI ... no spaces")
    s3.put_object(Bucket=bucket, Key="notes/a b%20\tc.txt", Body=b"x")
    assert wait_until(lambda: len(all_events(agent, kinds=["artifact"])) == 4, 10)
    spaced = all_events(agent, kinds=["artifact"])[-1]
    assert spaced["artifact_uri"] == f"s3://{bucket}/notes/a%20b%2520%09c.txt"
    assert spaced["data"]["key"] == "notes/a b%20\tc.txt"
    again = {k: v for k, v in spaced.items() if k not in ("agent", "redactions")}
    agent.put_events([{**again, "event_id": "reposted-" + uuid.uuid4().hex[:8]}])


# -- S3 ------------------------------------------------------------------------------------


def aws(gw, access_key, secret_key, home: Path, *args: str, check: bool = True):
    config = home / "config"
    config.write_text("[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n")
    env = clean_env(AWS_ACCESS_KEY_ID=access_key, AWS_SECRET_ACCESS_KEY=secret_key,
                    AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=str(config),
                    AWS_SHARED_CREDENTIALS_FILE=str(home / "none"), AWS_EC2_METADATA_DISABLED="true",
                    HOME=str(home))
    return run([AWS, *args, "--endpoint-url", gw.endpoint], env, check=check)


@pytest.mark.parametrize("events", [20, 12_000], ids=["small", "multipart"])
def test_aws_cli_upload_ingests_events_once_even_when_retried(admin, gw, tmp_path, events):
    name, agent, created = new_agent(admin, gw)
    lines = [json.dumps({"session": "cli", "kind": "note", "content": f"line {i} " + "x" * 700})
             for i in range(events)]
    path = tmp_path / "events.ndjson"
    path.write_text("\n".join(lines) + "\n")
    assert (events < 100) == (path.stat().st_size < 8 * 1024 * 1024)
    for _ in range(2):  # a retried upload adds nothing twice
        aws(gw, created["access_key"], created["secret_key"], tmp_path, "s3", "cp", str(path),
            "s3://biographies/uploads/events.ndjson")
    got = all_events(agent, session="cli", page_size=1000)
    assert len(got) == events
    assert got[0]["content"].startswith("line 0 ")


def test_bad_s3_uploads_are_refused_with_nothing_stored(admin, gw, tmp_path):
    _, agent, created = new_agent(admin, gw)
    s3 = s3_client(gw, created["access_key"], created["secret_key"])
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket="biographies", Key="e.ndjson",
                      Body=b'{"session":"s","kind":"note"}\n{"session":"s","kind":"notes"}\n')
    assert refused.value.response["Error"]["Code"] == "InvalidArgument"
    assert 'line 2, field "kind"' in refused.value.response["Error"]["Message"]
    big = b'{"session":"s","kind":"note","content":"' + b"y" * (20 * 1024 * 1024) + b'"}\n'
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket="biographies", Key="big.ndjson", Body=big)
    assert "line 1" in refused.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket="biographies", Key="notes.txt", Body=b"{}")
    assert ".ndjson" in refused.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as refused:
        s3.delete_object(Bucket="biographies", Key="agent=x/date=2026-11-30/a.parquet")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 405
    assert all_events(agent) == []
    # Refused before anything is staged: too large by its declared size, or from a caller
    # who may write no events at all (it could otherwise fill the disk with parts).
    headers = sign("PUT", "/biographies/huge.ndjson", {}, {"host": f"127.0.0.1:{gw.port}",
                   "content-length": str(300 * 1024 * 1024), "expect": "100-continue"}, "UNSIGNED-PAYLOAD",
                   created["access_key"], created["secret_key"])
    status, _, body = request(gw.port, "PUT", "/biographies/huge.ndjson", headers)
    assert status == 400 and error_code(body) == "EntityTooLarge"
    nobody = admin.create_agent(f"nobody-{uuid.uuid4().hex[:6]}", policies=[])
    s3_nobody = s3_client(gw, nobody["access_key"], nobody["secret_key"])
    for attempt in (lambda: s3_nobody.put_object(Bucket="biographies", Key="junk.ndjson", Body=b"x" * 100),
                    lambda: s3_nobody.create_multipart_upload(Bucket="biographies", Key="junk.ndjson")):
        with pytest.raises(ClientError) as refused:
            attempt()
        assert refused.value.response["Error"]["Code"] == "AccessDenied"


def test_uploads_of_one_key_at_once_each_ingest_their_own_events(admin, gw):
    """Sandboxes sharing an identity and a file name upload at the same moment: every
    acknowledged upload's events are stored (they once shared one staging object)."""
    name, agent, created = new_agent(admin, gw)
    acked, lock = [], threading.Lock()

    def upload(worker: int) -> None:
        s3 = s3_client(gw, created["access_key"], created["secret_key"])
        for n in range(5):
            ids = [f"w{worker}-u{n}-{i}" for i in range(500)]
            body = "".join(json.dumps({"event_id": i, "session": "race", "kind": "note",
                                       "content": f"worker {worker} upload {n}"}) + "\n" for i in ids)
            s3.put_object(Bucket="biographies", Key="uploads/events.ndjson", Body=body.encode())
            with lock:
                acked.extend(ids)

    workers = [threading.Thread(target=upload, args=(w,)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(acked) == 10_000
    assert sorted(e["event_id"] for e in all_events(agent, session="race")) == sorted(acked)
    # a multipart upload answers ids of its own shape, and takes them back everywhere
    s3 = s3_client(gw, created["access_key"], created["secret_key"])
    up = s3.create_multipart_upload(Bucket="biographies", Key="mp.ndjson")["UploadId"]
    part = s3.upload_part(Bucket="biographies", Key="mp.ndjson", UploadId=up, PartNumber=1,
                          Body=b'{"event_id":"mp-1","session":"mp","kind":"note"}\n')["ETag"]
    listed = s3.list_parts(Bucket="biographies", Key="mp.ndjson", UploadId=up)
    assert listed["UploadId"] == up and listed["Key"] == "mp.ndjson" and len(listed["Parts"]) == 1
    s3.complete_multipart_upload(Bucket="biographies", Key="mp.ndjson", UploadId=up,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part}]})
    assert [e["event_id"] for e in all_events(agent, session="mp")] == ["mp-1"]
    dropped = s3.create_multipart_upload(Bucket="biographies", Key="mp.ndjson")["UploadId"]
    s3.abort_multipart_upload(Bucket="biographies", Key="mp.ndjson", UploadId=dropped)
    with pytest.raises(ClientError) as gone:
        s3.list_parts(Bucket="biographies", Key="mp.ndjson", UploadId=dropped)
    assert gone.value.response["Error"]["Code"] == "NoSuchUpload"


def test_parts_sent_at_once_never_leave_more_than_the_limit_staged(admin, gw):
    """Each of two 129 MiB parts fits the 256 MiB limit alone; together they do not. At
    most one is kept, whatever the timing: the upload never holds more than the limit."""
    _, _, created = new_agent(admin, gw)
    s3 = s3_client(gw, created["access_key"], created["secret_key"])
    upload = s3.create_multipart_upload(Bucket="biographies", Key="big.ndjson")["UploadId"]
    body, outcomes = b"x" * (129 * 1024 * 1024), []

    def send(number: int) -> None:
        try:
            s3.upload_part(Bucket="biographies", Key="big.ndjson", UploadId=upload, PartNumber=number,
                           Body=body)
            outcomes.append("stored")
        except ClientError as exc:
            outcomes.append(exc.response["Error"]["Code"])

    senders = [threading.Thread(target=send, args=(n,)) for n in (1, 2)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    assert outcomes.count("stored") <= 1 and "EntityTooLarge" in outcomes
    try:
        parts = s3.list_parts(Bucket="biographies", Key="big.ndjson", UploadId=upload).get("Parts", [])
    except ClientError as exc:  # aborted: both were stored at once
        assert exc.response["Error"]["Code"] == "NoSuchUpload"
        parts = []
    assert sum(p["Size"] for p in parts) <= 256 * 1024 * 1024


def test_parquet_reads_back_with_pyarrow_and_duckdb_through_the_gateway(admin, gw, root, tmp_path):
    name, agent, created = new_agent(admin, gw)
    agent.put_events(transcript(40) + [{"session": "s9", "kind": "decision", "data": {"approved": True}}])
    root.compact()
    s3 = s3_client(gw, created["access_key"], created["secret_key"])
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="biographies", Prefix=f"agent={name}/")["Contents"]]
    assert keys and all(k.endswith(".parquet") for k in keys)
    local = tmp_path / "seg.parquet"
    s3.download_file("biographies", keys[0], str(local))
    table = pq.read_table(local)
    assert table.num_rows == 41
    assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert table.schema.metadata[b"orgmem.format_version"] == b"1"
    con = duck(gw, created["access_key"], created["secret_key"])
    rows = con.execute("SELECT agent, count(*), count(DISTINCT event_id) FROM read_parquet("
                       "'s3://biographies/**/*.parquet', hive_partitioning=1) GROUP BY agent").fetchall()
    assert rows == [(name, 41, 41)]
    decided = con.execute("SELECT data FROM read_parquet('s3://biographies/**/*.parquet', "
                          "hive_partitioning=1) WHERE kind = 'decision'").fetchone()
    assert json.loads(decided[0]) == {"approved": True}


def test_a_listed_segment_still_reads_after_a_merge_replaced_it(admin, gw, root):
    """A query lists the segments, a compaction merges some of them, then the query reads
    what it listed: a replaced segment stays readable (not listed) for its grace period.
    It answered NoSuchKey, and DuckDB's glob failed mid-query."""
    name, agent, created = new_agent(admin, gw)
    agent.put_events(transcript(5))
    root.compact()
    s3 = s3_client(gw, created["access_key"], created["secret_key"])
    listed = {o["Key"]: o["ETag"] for o in
              s3.list_objects_v2(Bucket="biographies", Prefix=f"agent={name}/")["Contents"]}
    merged = 0
    for i in range(12):
        agent.put_events([{"session": "merge", "kind": "note", "content": f"m{i}"}])
        merged += root.compact()["segments_merged"]
        now = {o["Key"] for o in s3.list_objects_v2(Bucket="biographies", Prefix=f"agent={name}/")["Contents"]}
        if not set(listed) <= now:
            break
    assert not set(listed) <= now, "no merge replaced the listed segment"
    for key, etag in listed.items():
        got = s3.get_object(Bucket="biographies", Key=key)
        assert got["ETag"] == etag and pq.read_table(pa.BufferReader(got["Body"].read())).num_rows
        assert s3.head_object(Bucket="biographies", Key=key)["ETag"] == etag
    other_name, _, other = new_agent(admin, gw)
    with pytest.raises(ClientError):  # still only for those who may read the agent
        s3_client(gw, other["access_key"], other["secret_key"]).get_object(
            Bucket="biographies", Key=next(iter(listed)))


def test_retention_drops_old_partitions(admin, gw, root):
    """Expired days go from reads and from search alike (search once kept finding them)."""
    from gateway.search_cli import SearchClient

    name, agent, _ = new_agent(admin, gw)
    word = f"salaryword{uuid.uuid4().hex[:8]}"
    agent.put_events([{"session": "old", "kind": "note", "ts": "2026-01-02T00:00:00Z", "content": word},
                      {"session": "new", "kind": "note", "content": word}])
    search = SearchClient(admin)
    assert wait_until(lambda: search.search(word)["count"] == 2, 20)
    root.compact()
    root.set_retention(30, agent=name)
    try:
        root.compact()
        assert [e["session"] for e in all_events(agent)] == ["new"]
        assert wait_until(lambda: search.search(word)["count"] == 1, 20)
        assert [h["session"] for h in search.search(word)["hits"]] == ["new"]
    finally:
        root.set_retention(None, agent=name, reset=True)


def test_since_and_until_keep_microseconds_far_in_the_future(admin, gw):
    """They went through float seconds: past about 2255 a microsecond was lost, so a since at
    an event's own time missed it and an until let it in."""
    _, agent, _ = new_agent(admin, gw)
    times = ["2300-01-01T00:00:00.000001Z", "2300-01-01T00:00:00.000002Z", "2300-01-01T00:00:00.000003Z",
             "9999-12-31T23:59:59.999999Z"]
    agent.put_events([{"session": "far", "kind": "note", "ts": t, "event_id": f"f{i}"}
                      for i, t in enumerate(times)])

    def ids(**q):
        return [e["event_id"] for e in all_events(agent, session="far", **q)]
    assert ids(since=times[0]) == ["f0", "f1", "f2", "f3"]
    assert ids(since=times[1], until=times[2]) == ["f1"]
    assert ids(since=times[3]) == ["f3"]
    assert ids(since="10413792000.000002") == ["f1", "f2", "f3"]  # unix seconds, exactly


def test_bad_query_input_is_a_clear_error(admin, gw):
    _, agent, _ = new_agent(admin, gw)
    for query, needle in [({"kinds": ["prompts"]}, "unknown kind"), ({"since": "yesterday-ish"}, "since"),
                          ({"agent": "Not_A_Name"}, "not valid"), ({"limit": 0}, "limit")]:
        with pytest.raises(AdminError) as bad:
            agent.events(**query)
        assert bad.value.status == 400 and needle in bad.value.message
    # what the client library would never send: a digit that is not ASCII
    with pytest.raises(AdminError) as bad:
        admin._request("GET", "/v1/events", query={"limit": "\u00b2"})
    assert bad.value.status == 400 and "limit" in bad.value.message
    for since in ("9" * 400 + "d", "9" * 5000):  # beyond a float, beyond int64
        with pytest.raises(AdminError) as bad:
            admin._request("GET", "/v1/events", query={"since": since})
        assert bad.value.status == 400 and "out of range" in bad.value.message
    for kinds in (",", " ", ", ,"):  # answered 200 with nothing
        with pytest.raises(AdminError) as bad:
            admin._request("GET", "/v1/events", query={"kind": kinds})
        assert bad.value.status == 400 and "kind" in bad.value.message
    for body in ({"days": True}, {"days": "7"}, {"agent": "", "days": 3}):
        with pytest.raises(AdminError) as bad:
            admin._request("PUT", "/v1/bio/retention", body=json.dumps(body).encode(),
                           content_type="application/json")
        assert bad.value.status == 400


def forged(key: list, session: str | None = None) -> str:
    return base64.urlsafe_b64encode(json.dumps({"k": key, "s": session}).encode()).decode().rstrip("=")


@pytest.mark.parametrize("session,key", [
    (None, ["x", "y"]), (None, [None, "y"]), (None, [1, 2]), (None, [2**70, "y"]), (None, [2**63, "y"]),
    (None, [True, "y"]), (None, [1.5, "y"]), (None, "ab"), (None, [1, "y", 3]),
    ("s1", [0, 3, 5, "x"]), ("s1", [False, True, 5, "x"]), ("s1", [False, 3, "5", "x"]),
    ("s1", [False, 3, 2**64, "x"]), ("s1", [False, 3, 5, 7]), ("s1", [5, "x"]),
])
def test_a_forged_cursor_is_a_400(admin, gw, root, session, key):
    _, agent, _ = new_agent(admin, gw)
    agent.put_events(transcript(6))
    root.compact()  # the timeline cursor is compared with Parquet columns too
    agent.put_events(transcript(3))
    with pytest.raises(AdminError) as bad:
        agent.events(session=session, limit=2, cursor=forged(key, session))
    assert bad.value.status == 400 and bad.value.code == "InvalidArgument"
    assert bad.value.message.startswith("cursor: cursor is not one this query handed out")


@pytest.mark.parametrize("name,value", [("until", "99999999999999999999"), ("since", "9" * 400),
                                        ("since", "9223372036855"), ("until", "999999999999999d")])
def test_a_time_out_of_range_is_a_400_naming_the_parameter(admin, gw, name, value):
    _, agent, _ = new_agent(admin, gw)
    agent.put_events(transcript(2))
    with pytest.raises(AdminError) as bad:
        agent.events(**{name: value})
    assert bad.value.status == 400 and bad.value.code == "InvalidArgument"
    assert bad.value.message.startswith(f"{name}: ") and "out of range" in bad.value.message
    assert len(bad.value.message) < 200  # a long value is not echoed whole
    assert all_events(agent, **{name: "9223372036854"}) == ([] if name == "since" else all_events(agent))


def test_a_retried_batch_without_times_is_read_once(admin, gw, root):
    """A retry gets a new server time: the first stored copy wins on every page, before and after
    compaction, even where a filter keeps only the retry's time."""
    _, agent, _ = new_agent(admin, gw)
    batch = [{"session": "s", "kind": "note", "event_id": f"retried-{i}", "content": f"try {i}"} for i in range(3)]
    agent.put_events(batch)
    root.compact()
    agent.put_events([{"session": "s", "kind": "note", "event_id": "other"}])
    agent.put_events(batch)  # the retry: in the log tail, later than "other"
    agent.put_events([{"session": "s", "kind": "note", "event_id": "tail-only"}])
    agent.put_events([batch[0], {"session": "s", "kind": "note", "event_id": "tail-only"}])
    want = ["retried-0", "retried-1", "retried-2", "other", "tail-only"]
    for _ in range(2):
        first = all_events(agent)
        assert [e["event_id"] for e in first] == want
        for size in (1, 2):
            assert all_events(agent, page_size=size) == first
            assert all_events(agent, session="s", page_size=size) == first
        later = all_events(agent, since=first[3]["ts"])
        assert [e["event_id"] for e in later] == ["other", "tail-only"]
        root.compact()


# -- crashes and replicas ---------------------------------------------------------------------


def write_until(stop: threading.Event, client: BioClient, tag: str, acked: list, lock: threading.Lock) -> None:
    n = 0
    while not stop.is_set():
        batch = [{"event_id": f"{tag}-{n}-{i}", "session": tag, "kind": "note", "content": f"{tag} {n} {i}"}
                 for i in range(10)]
        try:
            client.put_events(batch)
        except AdminError:
            return  # the gateway went away: this batch was not acknowledged
        with lock:
            acked.extend(e["event_id"] for e in batch)
        n += 1


def test_sigkill_under_load_loses_no_acknowledged_event(tmp_path):
    gw = Gateway(tmp_path / "data", extra_args=["--compact-interval", "1"]).start()
    client = lambda: BioClient(gw.endpoint, gw.access_key, gw.secret_key, timeout=5)  # noqa: E731
    acked, lock, stop = [], threading.Lock(), threading.Event()
    threads = [threading.Thread(target=write_until, args=(stop, client(), f"w{i}", acked, lock)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(3)
    gw.kill()
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert len(acked) > 100
    gw.start()
    try:
        reader = client()
        ids = [e["event_id"] for e in reader.iter_events(page_size=1000)]
        assert set(acked) <= set(ids) and len(ids) == len(set(ids))
        reader.compact()
        after = [e["event_id"] for e in reader.iter_events(page_size=1000)]
        assert sorted(after) == sorted(ids)
    finally:
        gw.stop()


def test_two_gateways_on_one_seaweedfs_bucket_keep_every_event_once(tmp_path, seaweed):
    prefix = f"bio-{uuid.uuid4().hex[:6]}"
    args = ["--backend", f"s3://orgmem-upstream/{prefix}", "--backend-endpoint", seaweed.endpoint,
            "--compact-interval", "1"]
    one = Gateway(tmp_path / "one", extra_args=args, env=seaweed.env).start()
    # the second replica uses the keyring the first one created (the same KEK)
    kek = ["--kek", f"file:{tmp_path / 'one.keyring.json'}"]
    two = Gateway(tmp_path / "two", extra_args=args + kek, env=seaweed.env).start()
    try:
        clients = [BioClient(g.endpoint, g.access_key, g.secret_key) for g in (one, two)]
        acked, lock, stop = [], threading.Lock(), threading.Event()
        writers = [threading.Thread(target=write_until, args=(stop, clients[i % 2], f"r{i}", acked, lock))
                   for i in range(4)]
        for t in writers:
            t.start()
        time.sleep(0.5)
        clients[0].compact()  # DuckDB refuses an empty glob: let the first segments exist
        con = duck(one, one.access_key, one.secret_key)
        queries = 0
        deadline = time.time() + 6
        while time.time() < deadline:  # DuckDB never fails mid-merge
            con.execute("SELECT count(*) FROM read_parquet('s3://biographies/**/*.parquet', "
                        "hive_partitioning=1)").fetchone()
            queries += 1
        stop.set()
        for t in writers:
            t.join(timeout=30)
        assert queries > 3 and len(acked) > 100
        for c in clients:
            c.compact()
        for c in clients:  # both replicas see every event, once
            ids = [e["event_id"] for e in c.iter_events(page_size=1000)]
            assert sorted(ids) == sorted(acked)
        total, distinct = con.execute("SELECT count(*), count(DISTINCT event_id) FROM read_parquet("
                                      "'s3://biographies/**/*.parquet', hive_partitioning=1)").fetchone()
        assert total == distinct == len(acked)
    finally:
        one.stop()
        two.stop()


def test_the_biographies_bucket_cannot_be_created_or_deleted(gw):
    s3 = s3_client(gw, gw.access_key, gw.secret_key)
    for call in (lambda: s3.create_bucket(Bucket="biographies"), lambda: s3.delete_bucket(Bucket="biographies")):
        with pytest.raises(ClientError) as refused:
            call()
        assert refused.value.response["Error"]["Code"] == "InvalidBucketName"
        assert "reserved" in refused.value.response["Error"]["Message"]
    s3.head_bucket(Bucket="biographies")


def test_a_large_events_body_is_refused_before_it_is_read_when_unsigned(gw):
    import http.client

    conn = http.client.HTTPConnection(gw.endpoint.removeprefix("http://"), timeout=10)
    conn.putrequest("POST", "/v1/events")
    conn.putheader("Authorization", "Bearer AKNOBODY0000000000000:not-a-secret")
    conn.putheader("Content-Length", str(8 * 1024 * 1024))
    conn.endheaders()
    try:
        conn.send(b"x" * 65536)  # the rest is never needed: the answer comes first
    except OSError:
        pass
    answer = conn.getresponse()
    assert answer.status == 403
    assert b"InvalidAccessKeyId" in answer.read()
    conn.close()
