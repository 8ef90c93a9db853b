"""Identities, policies and audit against a real gateway, with boto3 and the aws cli as agents."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from prometheus_client.parser import text_string_to_metric_families
from servers import BIN, Gateway

from gateway.admin_client import AdminClient, AdminError


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("iam") / "data").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin(gw):
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


@pytest.fixture(scope="module")
def secrets_seen():
    """Every secret key handed out in this module, to check none leaks anywhere."""
    return []


def client(gw, access_key, secret_key):
    cfg = Config(signature_version="s3v4", s3={"addressing_style": "path"},
                 retries={"max_attempts": 1, "mode": "standard"})
    return boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=access_key,
                        aws_secret_access_key=secret_key, region_name="us-east-1", config=cfg)


def new_agent(admin, secrets_seen, name, **kwargs):
    created = admin.create_agent(name, **kwargs)
    secrets_seen.append(created["secret_key"])
    return created


def agent_client(gw, created):
    return client(gw, created["access_key"], created["secret_key"])


def denied(call) -> ClientError:
    with pytest.raises(ClientError) as info:
        call()
    assert info.value.response["Error"]["Code"] == "AccessDenied", info.value.response
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    return info.value


def root_s3(gw):
    return client(gw, gw.access_key, gw.secret_key)


def aws_cli(gw, created, *args):
    env = {**os.environ, "AWS_ACCESS_KEY_ID": created["access_key"],
           "AWS_SECRET_ACCESS_KEY": created["secret_key"], "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
    return subprocess.run([str(BIN / "aws"), "--endpoint-url", gw.endpoint, *args], env=env,
                          capture_output=True, text=True, timeout=60)


# -- agent-default ---------------------------------------------------------------------------------


def test_agent_default_owns_its_workspace_bucket_and_nothing_else(gw, admin, secrets_seen):
    ada = new_agent(admin, secrets_seen, "ada")
    bob = new_agent(admin, secrets_seen, "bob")
    s3_ada, s3_bob = agent_client(gw, ada), agent_client(gw, bob)
    s3_ada.create_bucket(Bucket="agent-ada")
    s3_bob.create_bucket(Bucket="agent-bob")
    s3_ada.put_object(Bucket="agent-ada", Key="notes/today.md", Body=b"ship it")
    assert s3_ada.get_object(Bucket="agent-ada", Key="notes/today.md")["Body"].read() == b"ship it"
    assert [o["Key"] for o in s3_ada.list_objects_v2(Bucket="agent-ada")["Contents"]] == ["notes/today.md"]

    err = denied(lambda: s3_ada.get_object(Bucket="agent-bob", Key="anything"))
    assert "s3:GetObject" in str(err) and "arn:aws:s3:::agent-bob/anything" in str(err)
    denied(lambda: s3_ada.put_object(Bucket="agent-bob", Key="x", Body=b"intrusion"))
    denied(lambda: s3_ada.list_objects_v2(Bucket="agent-bob"))
    denied(lambda: s3_ada.delete_bucket(Bucket="agent-bob"))
    denied(lambda: s3_ada.create_bucket(Bucket="agent-carol"))
    denied(lambda: s3_ada.copy_object(Bucket="agent-ada", Key="stolen", CopySource="agent-bob/x"))
    # ListBuckets shows only what the agent may list.
    names = [b["Name"] for b in s3_ada.list_buckets()["Buckets"]]
    assert "agent-ada" in names and "agent-bob" not in names
    assert {"agent-ada", "agent-bob"} <= {b["Name"] for b in root_s3(gw).list_buckets()["Buckets"]}


def test_aws_cli_with_an_agents_keys(gw, admin, secrets_seen, tmp_path):
    cli = new_agent(admin, secrets_seen, "cli-agent")
    other = new_agent(admin, secrets_seen, "cli-other")
    agent_client(gw, other).create_bucket(Bucket="agent-cli-other")
    assert aws_cli(gw, cli, "s3", "mb", "s3://agent-cli-agent").returncode == 0
    src = tmp_path / "report.md"
    src.write_text("findings")
    done = aws_cli(gw, cli, "s3", "cp", str(src), "s3://agent-cli-agent/report.md")
    assert done.returncode == 0, done.stderr
    listed = aws_cli(gw, cli, "s3", "ls", "s3://agent-cli-agent/")
    assert "report.md" in listed.stdout
    refused = aws_cli(gw, cli, "s3", "cp", str(src), "s3://agent-cli-other/report.md")
    assert refused.returncode != 0 and "AccessDenied" in refused.stderr
    refused = aws_cli(gw, cli, "s3", "ls", "s3://agent-cli-other/")
    assert refused.returncode != 0 and "AccessDenied" in refused.stderr
    assert cli["secret_key"] not in refused.stderr + refused.stdout


def test_delete_objects_reports_access_denied_per_key(gw, admin, secrets_seen):
    root = root_s3(gw)
    root.create_bucket(Bucket="mixed")
    root.put_object(Bucket="mixed", Key="mine/a", Body=b"a")
    root.put_object(Bucket="mixed", Key="theirs/b", Body=b"b")
    admin.put_policy("mixed-deleter", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:DeleteObject", "Resource": "arn:aws:s3:::mixed/mine/*"}]})
    agent = new_agent(admin, secrets_seen, "deleter", policies=["mixed-deleter"])
    result = agent_client(gw, agent).delete_objects(
        Bucket="mixed", Delete={"Objects": [{"Key": "mine/a"}, {"Key": "theirs/b"}]})
    assert [d["Key"] for d in result["Deleted"]] == ["mine/a"]
    assert [(e["Key"], e["Code"]) for e in result["Errors"]] == [("theirs/b", "AccessDenied")]
    assert root.get_object(Bucket="mixed", Key="theirs/b")["Body"].read() == b"b"


def test_presigned_urls_and_bearer_tokens_carry_the_agents_rights(gw, admin, secrets_seen):
    agent = new_agent(admin, secrets_seen, "presigner")
    s3 = agent_client(gw, agent)
    s3.create_bucket(Bucket="agent-presigner")
    s3.put_object(Bucket="agent-presigner", Key="k", Body=b"v")
    root_s3(gw).create_bucket(Bucket="private-presign")
    good = s3.generate_presigned_url("get_object", Params={"Bucket": "agent-presigner", "Key": "k"})
    assert urllib.request.urlopen(good).read() == b"v"
    bad = s3.generate_presigned_url("get_object", Params={"Bucket": "private-presign", "Key": "k"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(bad)
    assert info.value.code == 403 and b"AccessDenied" in info.value.read()
    bearer = {"Authorization": f"Bearer {agent['access_key']}:{agent['secret_key']}"}
    ok = urllib.request.urlopen(urllib.request.Request(f"{gw.endpoint}/agent-presigner/k", headers=bearer))
    assert ok.read() == b"v"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(urllib.request.Request(f"{gw.endpoint}/admin/v1/agents", headers=bearer))
    assert info.value.code == 403
    assert json.loads(info.value.read())["error"]["code"] == "AccessDenied"


# -- built-in and custom policies --------------------------------------------------------------------


def test_readonly_reads_but_cannot_write(gw, admin, secrets_seen):
    root = root_s3(gw)
    root.create_bucket(Bucket="library")
    root.put_object(Bucket="library", Key="book.txt", Body=b"words")
    reader = agent_client(gw, new_agent(admin, secrets_seen, "reader", policies=["readonly"]))
    assert reader.get_object(Bucket="library", Key="book.txt")["Body"].read() == b"words"
    assert reader.head_object(Bucket="library", Key="book.txt")["ContentLength"] == 5
    assert reader.list_objects_v2(Bucket="library")["KeyCount"] == 1
    denied(lambda: reader.put_object(Bucket="library", Key="graffiti", Body=b"x"))
    denied(lambda: reader.delete_object(Bucket="library", Key="book.txt"))
    denied(lambda: reader.create_bucket(Bucket="reader-bucket"))
    assert root.get_object(Bucket="library", Key="book.txt")["Body"].read() == b"words"


def test_explicit_deny_beats_an_allow_from_a_team(gw, admin, secrets_seen):
    root_s3(gw).create_bucket(Bucket="finance")
    admin.create_team("finance-team", policies=["readwrite"])
    admin.put_policy("no-payroll", {"Version": "2012-10-17", "Statement": [
        {"Sid": "NoPayroll", "Effect": "Deny", "Action": "s3:*", "Resource": "arn:aws:s3:::finance/payroll/*"}]})
    clerk = new_agent(admin, secrets_seen, "clerk", teams=["finance-team"], policies=["no-payroll"])
    s3 = agent_client(gw, clerk)
    s3.put_object(Bucket="finance", Key="invoices/1.json", Body=b"{}")
    err = denied(lambda: s3.put_object(Bucket="finance", Key="payroll/march.csv", Body=b"x"))
    assert "explicit deny" in str(err)
    sim = admin.simulate("clerk", "s3:PutObject", "arn:aws:s3:::finance/payroll/march.csv")
    assert sim["allowed"] is False and sim["decision"] == "explicit-deny"
    assert sim["statement"]["policy"] == "no-payroll" and sim["statement"]["sid"] == "NoPayroll"
    assert any(m["policy"] == "readwrite" for m in sim["matched"])
    # Leaving the team takes its allow away.
    admin.remove_member("finance-team", "clerk")
    denied(lambda: s3.put_object(Bucket="finance", Key="invoices/2.json", Body=b"{}"))


def test_s3_prefix_condition_restricts_listing(gw, admin, secrets_seen):
    root = root_s3(gw)
    root.create_bucket(Bucket="homes")
    for key in ("home/pat/a.txt", "home/sam/b.txt", "shared/c.txt"):
        root.put_object(Bucket="homes", Key=key, Body=b"x")
    admin.put_policy("home-dirs", {"Version": "2012-10-17", "Statement": [
        {"Sid": "ListOwnHome", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::homes",
         "Condition": {"StringLike": {"s3:prefix": ["home/${aws:username}/*"]},
                       "StringEquals": {"s3:delimiter": ["/"]}}},
        {"Sid": "OwnHomeObjects", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
         "Resource": "arn:aws:s3:::homes/home/${aws:username}/*"}]})
    pat = agent_client(gw, new_agent(admin, secrets_seen, "pat", policies=["home-dirs"]))
    sam = agent_client(gw, new_agent(admin, secrets_seen, "sam", policies=["home-dirs"]))
    listed = pat.list_objects_v2(Bucket="homes", Prefix="home/pat/", Delimiter="/")
    assert [o["Key"] for o in listed["Contents"]] == ["home/pat/a.txt"]
    denied(lambda: pat.list_objects_v2(Bucket="homes", Prefix="home/sam/", Delimiter="/"))
    denied(lambda: pat.list_objects_v2(Bucket="homes", Prefix="home/pat/"))  # no delimiter
    denied(lambda: pat.list_objects_v2(Bucket="homes"))
    # The same policy resolves ${aws:username} per principal.
    assert sam.get_object(Bucket="homes", Key="home/sam/b.txt")["Body"].read() == b"x"
    denied(lambda: sam.get_object(Bucket="homes", Key="home/pat/a.txt"))
    pat.put_object(Bucket="homes", Key="home/pat/new.txt", Body=b"n")
    denied(lambda: pat.put_object(Bucket="homes", Key="shared/new.txt", Body=b"n"))


def test_team_variable_expands_to_each_team(gw, admin, secrets_seen):
    root = root_s3(gw)
    root.create_bucket(Bucket="teams")
    for team in ("red", "blue", "green"):
        root.put_object(Bucket="teams", Key=f"{team}/plan.md", Body=team.encode())
    admin.create_team("red")
    admin.create_team("blue")
    admin.put_policy("team-folders", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::teams/${orgmem:teams}/*"}]})
    admin.create_team("everyone", policies=["team-folders"])
    member = agent_client(gw, new_agent(admin, secrets_seen, "member", teams=["red", "blue", "everyone"]))
    assert member.get_object(Bucket="teams", Key="red/plan.md")["Body"].read() == b"red"
    assert member.get_object(Bucket="teams", Key="blue/plan.md")["Body"].read() == b"blue"
    denied(lambda: member.get_object(Bucket="teams", Key="green/plan.md"))


def test_source_ip_condition(gw, admin, secrets_seen):
    root_s3(gw).create_bucket(Bucket="ip-guarded")
    admin.put_policy("from-elsewhere", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*",
         "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}}]})
    admin.put_policy("from-loopback", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::ip-guarded",
         "Condition": {"IpAddress": {"aws:SourceIp": ["127.0.0.0/8", "::1/128"]}}}]})
    far = agent_client(gw, new_agent(admin, secrets_seen, "far", policies=["from-elsewhere"]))
    near = agent_client(gw, new_agent(admin, secrets_seen, "near", policies=["from-loopback"]))
    denied(lambda: far.list_objects_v2(Bucket="ip-guarded"))
    assert near.list_objects_v2(Bucket="ip-guarded")["KeyCount"] == 0


def test_root_is_never_subject_to_policies(gw, admin):
    assert admin.whoami()["is_root"] is True
    sim = admin.simulate("root", "s3:DeleteBucket", "arn:aws:s3:::anything")
    assert sim["allowed"] is True and "root" in sim["explanation"]


# -- keys and principals ------------------------------------------------------------------------------


def test_disabled_agent_is_refused_everywhere_until_enabled(gw, admin, secrets_seen):
    agent = new_agent(admin, secrets_seen, "sleeper")
    s3 = agent_client(gw, agent)
    s3.create_bucket(Bucket="agent-sleeper")
    admin.disable_agent("sleeper")
    err = denied(lambda: s3.list_objects_v2(Bucket="agent-sleeper"))
    assert "disabled" in str(err)
    bearer = {"Authorization": f"Bearer {agent['access_key']}:{agent['secret_key']}"}
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(urllib.request.Request(f"{gw.endpoint}/admin/v1/whoami", headers=bearer))
    assert info.value.code == 403
    admin.enable_agent("sleeper")
    assert s3.list_objects_v2(Bucket="agent-sleeper")["KeyCount"] == 0


def test_rotation_with_and_without_grace(gw, admin, secrets_seen):
    first = new_agent(admin, secrets_seen, "rotor")
    agent_client(gw, first).create_bucket(Bucket="agent-rotor")
    second = admin.rotate_key("rotor")  # no grace: the old key stops at once
    secrets_seen.append(second["secret_key"])
    assert second["replaced"] == first["access_key"] and second["old_key_expires_at"] is None
    with pytest.raises(ClientError) as info:
        agent_client(gw, first).list_objects_v2(Bucket="agent-rotor")
    assert info.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    assert agent_client(gw, second).list_objects_v2(Bucket="agent-rotor")["KeyCount"] == 0

    third = admin.rotate_key("rotor", grace_seconds=2)
    secrets_seen.append(third["secret_key"])
    assert third["old_key_expires_at"] is not None
    assert agent_client(gw, second).list_objects_v2(Bucket="agent-rotor")["KeyCount"] == 0  # in grace
    assert agent_client(gw, third).list_objects_v2(Bucket="agent-rotor")["KeyCount"] == 0
    keys = {k["access_key"]: k["status"] for k in admin.get_agent("rotor")["keys"]}
    assert keys == {second["access_key"]: "expiring", third["access_key"]: "active"}
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            agent_client(gw, second).list_objects_v2(Bucket="agent-rotor")
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "InvalidAccessKeyId"
            break
        time.sleep(0.2)
    else:
        pytest.fail("the rotated-away key kept working after its grace period")


def test_revoke_and_extra_keys(gw, admin, secrets_seen):
    agent = new_agent(admin, secrets_seen, "keyring")
    extra = admin.create_key("keyring")
    secrets_seen.append(extra["secret_key"])
    agent_client(gw, extra).create_bucket(Bucket="agent-keyring")
    with pytest.raises(AdminError) as info:
        admin.rotate_key("keyring")  # two active keys: which one?
    assert info.value.code == "InvalidRequest" and "name the one" in info.value.message
    admin.revoke_key(extra["access_key"])
    with pytest.raises(ClientError):
        agent_client(gw, extra).list_objects_v2(Bucket="agent-keyring")
    assert agent_client(gw, agent).list_objects_v2(Bucket="agent-keyring")["KeyCount"] == 0
    admin.delete_agent("keyring")
    with pytest.raises(ClientError):
        agent_client(gw, agent).list_objects_v2(Bucket="agent-keyring")


def test_a_human_with_the_admin_policy_administers(gw, admin, secrets_seen):
    ops = new_agent(admin, secrets_seen, "ops-lead", kind="human", policies=["admin"])
    delegate = AdminClient(gw.endpoint, ops["access_key"], ops["secret_key"])
    assert delegate.whoami()["kind"] == "human"
    helper = delegate.create_agent("helper-bot")
    secrets_seen.append(helper["secret_key"])
    assert helper["agent"]["policies"] == ["agent-default"]
    plain = AdminClient(gw.endpoint, helper["access_key"], helper["secret_key"])
    with pytest.raises(AdminError) as info:
        plain.create_agent("escalation")
    assert info.value.status == 403 and info.value.code == "AccessDenied"


def test_identities_survive_a_restart(tmp_path):
    gateway = Gateway(tmp_path / "data").start()
    try:
        admin = AdminClient(gateway.endpoint, gateway.access_key, gateway.secret_key)
        created = admin.create_agent("durable-agent")
        admin.create_team("durable-team")
        admin.add_member("durable-team", "durable-agent")
        gateway.stop()
        gateway.start()
        s3 = client(gateway, created["access_key"], created["secret_key"])
        s3.create_bucket(Bucket="agent-durable-agent")
        assert admin.get_team("durable-team")["members"] == ["durable-agent"]
        stored = list((tmp_path / "data").rglob("*"))
        assert all(p.stat().st_mode & 0o077 == 0 for p in stored), "the data directory is owner-only"
    finally:
        gateway.stop()


# -- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("document, expected", [
    (b"{not json", "invalid JSON at line 1"),
    (b'{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObjekt", '
     b'"Resource": "*"}]}', "s3:GetObjekt"),
    (b'{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "nosuch:Thing", '
     b'"Resource": "*"}]}', "nosuch"),
    (b'{"Version": "2012-10-17", "Statement": [{"Effect": "Maybe", "Action": "s3:GetObject", '
     b'"Resource": "*"}]}', "Effect"),
    (b'{"Version": "2099-01-01", "Statement": []}', "Version"),
    (b'{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*", '
     b'"Action": "s3:GetObject", "Resource": "*"}]}', "Principal"),
    (b'{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", '
     b'"Resource": "arn:aws:s3:::b", "Condition": {"IpAddress": {"aws:SourceIp": "300.1.1.1/8"}}}]}',
     "300.1.1.1"),
])
def test_bad_policies_are_refused_with_clear_messages(admin, document, expected):
    with pytest.raises(AdminError) as info:
        admin.put_policy("bad-policy", document)
    assert info.value.status == 400 and info.value.code == "MalformedPolicyDocument"
    assert expected in info.value.message
    with pytest.raises(AdminError):
        admin.get_policy("bad-policy")


def test_policy_over_20_kb_is_refused(admin):
    statements = [{"Sid": f"S{i}", "Effect": "Allow", "Action": "s3:GetObject",
                   "Resource": f"arn:aws:s3:::bucket-{i:05d}/*"} for i in range(300)]
    big = json.dumps({"Version": "2012-10-17", "Statement": statements}).encode()
    assert len(big) > 20480
    with pytest.raises(AdminError) as info:
        admin.put_policy("too-big", big)
    assert info.value.status == 400 and "20480" in info.value.message


def test_builtin_policies_cannot_be_replaced_or_deleted(admin):
    with pytest.raises(AdminError) as info:
        admin.put_policy("admin", {"Version": "2012-10-17", "Statement": [
            {"Effect": "Deny", "Action": "*", "Resource": "*"}]})
    assert "built-in" in info.value.message
    with pytest.raises(AdminError) as info:
        admin.delete_policy("readonly")
    assert "built-in" in info.value.message


def test_attached_policy_cannot_be_deleted(gw, admin, secrets_seen):
    admin.put_policy("sticky", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:ListAllMyBuckets", "Resource": "*"}]})
    new_agent(admin, secrets_seen, "sticky-user", policies=["sticky"])
    with pytest.raises(AdminError) as info:
        admin.delete_policy("sticky")
    assert info.value.status == 409 and "sticky-user" in info.value.message
    admin.detach_policy("sticky", agent="sticky-user")
    admin.delete_policy("sticky")


@pytest.mark.parametrize("body, status, code", [
    ({"name": "Bad Name!"}, 400, "InvalidRequest"),
    ({"name": "root"}, 400, "InvalidRequest"),
    ({"name": "x" * 60}, 400, "InvalidRequest"),
    ({"name": "ok-name", "teams": ["no-such-team"]}, 404, "NoSuchEntity"),
    ({"name": "ok-name", "policies": ["no-such-policy"]}, 404, "NoSuchEntity"),
    ({"name": "ok-name", "kind": "robot"}, 400, "InvalidRequest"),
    ({"name": "ok-name", "surprise": 1}, 400, "InvalidRequest"),
    ({"nom": "ok-name"}, 400, "InvalidRequest"),
])
def test_bad_agent_requests(admin, body, status, code):
    with pytest.raises(AdminError) as info:
        admin._request("POST", "/admin/v1/agents", body=json.dumps(body).encode())
    assert (info.value.status, info.value.code) == (status, code), info.value.message
    assert all(a["name"] != "ok-name" for a in admin.list_agents())


def test_admin_api_refuses_malformed_requests(gw, admin, secrets_seen):
    new_agent(admin, secrets_seen, "twice")
    with pytest.raises(AdminError) as info:
        admin.create_agent("twice")
    assert info.value.status == 409
    for method, path, body, status in [
        ("POST", "/admin/v1/agents", b"{broken", 400),
        ("POST", "/admin/v1/agents", b"", 400),
        ("GET", "/admin/v1/agents/nobody", b"", 404),
        ("POST", "/admin/v1/agents/twice/keys/rotate", b'{"grace_seconds": -5}', 400),
        ("PATCH", "/admin/v1/agents", b"", 405),
        ("GET", "/admin/v1/no-such-route", b"", 404),
        ("POST", "/admin/v1/policies/simulate", b'{"principal": "nobody", "action": "s3:GetObject", '
                                                b'"resource": "*"}', 404),
        ("GET", "/admin/v1/audit", b"", 200),
    ]:
        if status == 200:
            admin._request(method, path, query={"limit": "5"})
            continue
        with pytest.raises(AdminError) as info:
            admin._request(method, path, body=body)
        assert info.value.status == status, (method, path, info.value)
        assert info.value.message
    with pytest.raises(AdminError) as info:
        admin._request("GET", "/admin/v1/audit", query={"limit": "0"})
    assert info.value.status == 400
    with pytest.raises(AdminError) as info:
        admin._request("GET", "/admin/v1/audit", query={"after": "garbage!"})
    assert info.value.status == 400


def test_admin_body_must_match_its_signed_hash(gw, admin):
    body = json.dumps({"name": "tampered"}).encode()
    headers = admin.sign("POST", "/admin/v1/agents", "", body)
    request = urllib.request.Request(f"{gw.endpoint}/admin/v1/agents", data=body.replace(b"tampered", b"tampere2"),
                                     headers=headers, method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request)
    assert info.value.code == 400
    assert json.loads(info.value.read())["error"]["code"] == "XAmzContentSHA256Mismatch"


def test_oversized_admin_body_is_refused(gw, admin):
    with pytest.raises(AdminError) as info:
        admin._request("PUT", "/admin/v1/policies/huge", body=b"x" * (1024 * 1024 + 10))
    assert info.value.status == 413


# -- audit, logs and metrics -----------------------------------------------------------------------


def all_audit(admin, **filters) -> list[dict]:
    """Every audit record (the admin API flushes this gateway's buffered ones first)."""
    records, cursor = [], None
    while True:
        page = admin.audit(limit=1000, after=cursor, **filters)
        records += page["records"]
        cursor = page["cursor"]
        if len(page["records"]) < 1000:
            return records


def test_audit_records_allowed_and_denied_requests(gw, admin, secrets_seen):
    agent = new_agent(admin, secrets_seen, "audited")
    s3 = agent_client(gw, agent)
    s3.create_bucket(Bucket="agent-audited")
    s3.put_object(Bucket="agent-audited", Key="k", Body=b"12345")
    denied(lambda: s3.get_object(Bucket="library-missing", Key="k"))
    with pytest.raises(ClientError):
        client(gw, agent["access_key"], "wrong-secret").list_buckets()
    records = admin.audit(principal="audited", limit=100)["records"]
    put = next(r for r in records if r["operation"] == "PutObject")
    assert put["decision"] == "allow" and put["reason"] == "agent-default#OwnWorkspaceObjects"
    assert put["resource"] == "arn:aws:s3:::agent-audited/k" and put["bytes_in"] == 5
    assert put["status"] == 200 and put["access_key"] == agent["access_key"]
    refused = next(r for r in records if r["decision"] == "deny")
    assert refused["action"] == "s3:GetObject" and refused["reason"] == "implicit-deny"
    assert refused["status"] == 403
    only_denied = admin.audit(principal="audited", denied=True)["records"]
    assert only_denied and all(r["decision"] == "deny" for r in only_denied)
    # A failed signature is audited too, under the key it claimed, without a principal.
    failed = [r for r in all_audit(admin) if r["access_key"] == agent["access_key"] and r["principal"] is None]
    assert failed and failed[-1]["reason"] == "authentication: SignatureDoesNotMatch"


def test_deletes_and_admin_changes_are_audited_before_the_response(tmp_path):
    # A gateway of its own, killed the moment the responses are in: no flush interval passes
    # and no shutdown runs, so only records that were durable before the response survive.
    own = Gateway(tmp_path / "data").start()
    try:
        own_admin = AdminClient(own.endpoint, own.access_key, own.secret_key)
        agent = own_admin.create_agent("deleting")
        s3 = agent_client(own, agent)
        s3.create_bucket(Bucket="agent-deleting")
        s3.put_object(Bucket="agent-deleting", Key="gone", Body=b"x")
        response = s3.delete_object(Bucket="agent-deleting", Key="gone")
        request_id = response["ResponseMetadata"]["RequestId"]
        own_admin.disable_agent("deleting")
        own.kill()
        own.start()
        records = all_audit(AdminClient(own.endpoint, own.access_key, own.secret_key))
        assert any(r["request_id"] == request_id and r["operation"] == "DeleteObject" for r in records)
        assert any(r["operation"] == "DisableAgent" and r["resource"] == "arn:orgmem:admin:::agent/deleting"
                   for r in records)
    finally:
        own.stop()


def test_no_secret_appears_in_audit_records_or_logs(gw, admin, secrets_seen):
    agent = new_agent(admin, secrets_seen, "secretive")
    bearer = {"Authorization": f"Bearer {agent['access_key']}:{agent['secret_key']}"}
    urllib.request.urlopen(urllib.request.Request(f"{gw.endpoint}/admin/v1/whoami", headers=bearer)).read()
    bad_bearer = {"Authorization": f"Bearer {agent['access_key']}:not-the-secret-{agent['secret_key'][:6]}x"}
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(urllib.request.Request(f"{gw.endpoint}/admin/v1/whoami", headers=bad_bearer))
    texts = [json.dumps(all_audit(admin)), gw.log()]
    admin._request("POST", "/v1/bio/compact")  # and once they are Parquet
    texts.append(json.dumps(all_audit(admin)))
    assert len(secrets_seen) > 10
    for secret in secrets_seen + [gw.secret_key, "not-the-secret"]:
        for text in texts:
            assert secret not in text
    # The signature of a SigV4 request never reaches the audit either.
    assert "Signature=" not in "".join(texts)


def test_metrics_parse_as_prometheus_text(gw, admin, secrets_seen):
    root_s3(gw).create_bucket(Bucket="metered")
    denied(lambda: agent_client(gw, new_agent(admin, secrets_seen, "unmetered")).list_objects_v2(Bucket="metered"))
    s3 = root_s3(gw)
    s3.put_object(Bucket="metered", Key="k", Body=b"x" * 1000)
    s3.get_object(Bucket="metered", Key="k")["Body"].read()
    s3.create_multipart_upload(Bucket="metered", Key="pending")
    headers = {"Authorization": f"Bearer {gw.access_key}:{gw.secret_key}"}
    with urllib.request.urlopen(urllib.request.Request(f"{gw.endpoint}/metrics", headers=headers)) as r:
        assert r.headers["content-type"].startswith("text/plain")
        text = r.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"orgmem_requests", "orgmem_request_duration_seconds", "orgmem_received_bytes",
            "orgmem_sent_bytes", "orgmem_denied_requests", "orgmem_multipart_uploads_open"} <= set(families)
    requests = {(s.labels["operation"], s.labels["status"]): s.value
                for s in families["orgmem_requests"].samples if s.name == "orgmem_requests_total"}
    assert requests[("PutObject", "200")] >= 1 and requests[("GetObject", "200")] >= 1
    assert any(s.labels.get("operation") == "GetObject" and s.name.endswith("_bucket")
               for s in families["orgmem_request_duration_seconds"].samples)
    assert families["orgmem_multipart_uploads_open"].samples[0].value >= 1
    assert families["orgmem_received_bytes"].samples[0].value >= 1000
    denials = [s for s in families["orgmem_denied_requests"].samples if s.name.endswith("_total")]
    assert sum(s.value for s in denials) >= 1


def test_metrics_need_credentials(gw, admin, secrets_seen):
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{gw.endpoint}/metrics")
    assert info.value.code == 403
    agent = new_agent(admin, secrets_seen, "no-metrics")
    bearer = {"Authorization": f"Bearer {agent['access_key']}:{agent['secret_key']}"}
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(urllib.request.Request(f"{gw.endpoint}/metrics", headers=bearer))
    assert info.value.code == 403


def test_identity_document_is_not_reachable_over_s3(gw):
    s3 = root_s3(gw)
    with pytest.raises(ClientError) as info:
        s3.get_object(Bucket=".orgmem", Key="iam/identities.json")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] in (400, 404)
    assert ".orgmem" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    # The reserved area beside the store (generated root credentials; audit records live in
    # the store now) is owner-only whenever it exists.
    reserved = Path(gw.data / ".orgmem")
    assert not reserved.exists() or reserved.stat().st_mode & 0o077 == 0


def test_readme_lists_every_action_of_the_catalogue():
    """Later issues add actions to gateway/iam/actions.py; the README's table must follow."""
    from gateway.iam.actions import SERVICES

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in readme.splitlines()
            if line.startswith("| `") and line.count("|") == 4}
    for prefix, service in SERVICES.items():
        assert prefix in rows, f"README has no row for the {prefix} service"
        listed = {a.strip() for a in rows[prefix].split("|")[3].split(",")}
        assert listed == set(service.actions) - set(service.unused), prefix


# -- review regressions ---------------------------------------------------------------------------------


def test_a_narrow_admin_grant_cannot_escalate(gw, admin, secrets_seen):
    admin.put_policy("bot-provisioner", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "admin:*", "Resource": "arn:orgmem:admin:::agent/bots-*"},
        {"Effect": "Allow", "Action": ["admin:CreateTeam", "admin:UpdateTeam"],
         "Resource": "arn:orgmem:admin:::team/proj-*"},
        {"Effect": "Allow", "Action": "admin:AttachPolicy", "Resource": "arn:orgmem:admin:::policy/agent-default"}]})
    admin.create_team("admins", policies=["admin"])
    prov = new_agent(admin, secrets_seen, "provisioner", policies=["bot-provisioner"])
    p = AdminClient(gw.endpoint, prov["access_key"], prov["secret_key"])
    made = p.create_agent("bots-fine")  # agent-default: an attach it is allowed
    secrets_seen.append(made["secret_key"])
    for attempt in (lambda: p.create_agent("bots-evil", policies=["admin"]),
                    lambda: p.create_agent("bots-sneaky", teams=["admins"]),
                    lambda: p.attach_policy("admin", agent="provisioner"),
                    lambda: p.attach_policy("admin", agent="bots-fine"),
                    lambda: p.create_team("proj-x", policies=["admin"]),
                    lambda: p.add_member("admins", "bots-fine")):
        with pytest.raises(AdminError) as info:
            attempt()
        assert info.value.status == 403, info.value
    names = {a["name"] for a in admin.list_agents()}
    assert "bots-evil" not in names and "bots-sneaky" not in names
    assert admin.get_agent("provisioner")["policies"] == ["bot-provisioner"]
    assert admin.get_team("admins")["members"] == []


def test_policies_are_checked_in_the_form_they_are_stored(gw, admin):
    # 1e15 grows to 1000000000000000.0 when stored: the stored form must fit the limit too.
    values = ["1e15"] * 1800
    text = ('{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:ListBucket", '
            '"Resource": "*", "Condition": {"NumericLessThan": {"s3:max-keys": [' + ",".join(values) + ']}}}]}')
    assert len(text) < 20480
    with pytest.raises(AdminError) as info:
        admin.put_policy("grows", text.encode())
    assert info.value.status == 400 and "20480" in info.value.message
    for bad in (b'{"Version": "2012-10-17", "Id": "\\ud800", "Statement": [{"Effect": "Allow", '
                b'"Action": "s3:GetObject", "Resource": "*"}]}',
                b'{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:ListBucket", '
                b'"Resource": "*", "Condition": {"NumericLessThan": {"s3:max-keys": 123456789012345678901234567890}}}]}'):
        with pytest.raises(AdminError) as info:
            admin.put_policy("unstorable", bad)
        assert info.value.status == 400
    admin.create_team("still-works")  # later changes still succeed
    assert admin.get_team("still-works")["name"] == "still-works"


def test_forwarded_headers_are_not_believed_by_default(gw, admin, secrets_seen):
    root_s3(gw).create_bucket(Bucket="lb-guarded")
    admin.put_policy("via-tls-from-lan", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::lb-guarded",
         "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}, "Bool": {"aws:SecureTransport": "true"}}}]})
    agent = new_agent(admin, secrets_seen, "spoofer", policies=["via-tls-from-lan"])
    s3 = agent_client(gw, agent)

    def forge(request, **_):
        request.headers["X-Forwarded-For"] = "10.1.2.3"
        request.headers["X-Forwarded-Proto"] = "https"
    s3.meta.events.register("before-sign.s3.ListObjectsV2", forge)
    denied(lambda: s3.list_objects_v2(Bucket="lb-guarded"))
    records = admin.audit(principal="spoofer")["records"]
    assert records and all(r["remote_addr"] == "127.0.0.1" for r in records)


def test_graced_rotations_respect_the_key_limit(gw, admin, secrets_seen):
    new_agent(admin, secrets_seen, "many-keys")
    for _ in range(9):
        secrets_seen.append(admin.rotate_key("many-keys", grace_seconds=3600)["secret_key"])
    with pytest.raises(AdminError) as info:
        admin.rotate_key("many-keys", grace_seconds=3600)
    assert info.value.status == 400 and "10 access keys" in info.value.message
    assert len(admin.get_agent("many-keys")["keys"]) == 10


def test_a_disabled_principal_is_named_in_the_audit(gw, admin, secrets_seen):
    agent = new_agent(admin, secrets_seen, "named-when-disabled")
    admin.disable_agent("named-when-disabled")
    denied(lambda: agent_client(gw, agent).list_buckets())
    records = admin.audit(principal="named-when-disabled", denied=True)["records"]
    assert records and records[-1]["reason"] == "authentication: AccessDenied"


def test_odd_audit_and_bearer_input_is_a_clear_error(gw, admin, secrets_seen):
    for since in ("99999999999999999999", "9999999999999d", "yesterday"):
        with pytest.raises(AdminError) as info:
            admin._request("GET", "/admin/v1/audit", query={"since": since})
        assert info.value.status == 400, since
    agent = new_agent(admin, secrets_seen, "non-utf8")
    import http.client
    for path in ("/admin/v1/whoami", "/agent-non-utf8/x"):
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        conn.putrequest("GET", path)
        conn.putheader("Authorization", b"Bearer " + agent["access_key"].encode() + b":\xff\xfe")
        conn.endheaders()
        response = conn.getresponse()
        assert response.status == 403, (path, response.status)
        conn.close()


def test_virtual_host_keys_named_like_gateway_paths_are_objects(tmp_path):
    gateway = Gateway(tmp_path / "data", extra_args=["--domain", "s3.local"]).start()
    try:
        s3 = root_s3(gateway)
        s3.create_bucket(Bucket="vh-bucket")
        bearer = {"Authorization": f"Bearer {gateway.access_key}:{gateway.secret_key}", "Host": "vh-bucket.s3.local"}
        for key in ("metrics", "admin/v1/notes.txt"):
            put = urllib.request.Request(f"{gateway.endpoint}/{key}", data=b"object " + key.encode(),
                                         headers=bearer, method="PUT")
            assert urllib.request.urlopen(put).status == 200
            got = urllib.request.urlopen(urllib.request.Request(f"{gateway.endpoint}/{key}", headers=bearer))
            assert got.read() == b"object " + key.encode()
        assert s3.get_object(Bucket="vh-bucket", Key="metrics")["Body"].read() == b"object metrics"
    finally:
        gateway.stop()


def test_a_stray_byte_in_a_request_is_audited_and_stops_nothing(gw, admin):
    """A header byte that is not UTF-8 reaches the audit record spelled out (\\xff), and the
    log goes on: it once stopped the log writer, and with it every durable write."""
    import socket

    from rawhttp import read_response

    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: probe-\xff-agent\r\n"
                     b"Connection: close\r\n\r\n")
        assert read_response(sock, "GET")[0] == 403
    # a durable write, through the log, still goes through at once
    admin.create_agent("after-stray-byte")
    records = all_audit(admin)
    assert any(r["user_agent"] == "probe-\\xff-agent" for r in records)
    assert any(r["operation"] == "CreateAgent" and r["status"] == 201 for r in records
               if (r.get("resource") or "").endswith("after-stray-byte"))
    # A query value that is not UTF-8 names nothing: 400, on REST and S3 alike.
    for path, query in (("/v1/events", "session=%FF"), ("/agent-x/k", "uploadId=%FF")):
        headers = admin.sign("GET", path, query)
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        try:
            conn.request("GET", f"{path}?{query}", headers=headers)
            answer = conn.getresponse()
            body = answer.read()
        finally:
            conn.close()
        assert answer.status == 400 and b"InvalidArgument" in body and b"not valid UTF-8" in body


def test_names_may_not_end_in_a_newline(admin):
    """``$`` also matches before a final newline: "root\\n" once passed the name rules (and the
    reserved names), and so did "eng\\n" and a policy "p\\n"."""
    for attempt in (lambda: admin.create_agent("root\n"), lambda: admin.create_agent("scout\n"),
                    lambda: admin.create_team("eng\n"),
                    lambda: admin.put_policy("p\n", {"Version": "2012-10-17", "Statement": []})):
        with pytest.raises(AdminError) as refused:
            attempt()
        assert refused.value.status in (400, 404)


def test_refusals_made_inside_an_operation_are_audited_as_denials(gw, admin, secrets_seen):
    """The route check allows per-item operations and the item check refuses later (a
    memory-bucket GET a Deny covers, search with every search:Query denied): those 403s were
    audited with decision "allow", so `audit query --denied` and the denied metric missed them."""
    admin.put_policy("hide-memory", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Deny", "Action": ["memory:GetDocument", "search:Query"], "Resource": "*"}]})
    hider = new_agent(admin, secrets_seen, "hider", policies=["agent-default", "hide-memory"])
    denied(lambda: agent_client(gw, hider).get_object(Bucket="memory", Key="org/some-rule.json"))
    with pytest.raises(AdminError) as refused:
        AdminClient(gw.endpoint, hider["access_key"], hider["secret_key"])._request(
            "GET", "/v1/search", query={"q": "anything"})
    assert refused.value.status == 403
    records = admin.audit(principal="hider", limit=100)["records"]
    forbidden = [r for r in records if r["status"] == 403]
    assert len(forbidden) == 2 and all(r["decision"] == "deny" for r in forbidden)
    assert all("refused by the operation" in r["reason"] for r in forbidden)
    assert admin.audit(principal="hider", denied=True, limit=100)["records"] == forbidden


def test_a_team_with_members_cannot_be_deleted(gw, admin, secrets_seen):
    """Deleting a team took its policies, a Deny among them, from every member: admin:DeleteTeam
    alone undid what removing a member or detaching the policy would each have been refused."""
    admin.put_policy("quarantine-deny", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "*"}]})
    admin.create_team("quarantine", policies=["quarantine-deny"])
    inmate = new_agent(admin, secrets_seen, "inmate", teams=["quarantine"])
    s3 = agent_client(gw, inmate)
    s3.create_bucket(Bucket="agent-inmate")
    s3.put_object(Bucket="agent-inmate", Key="k", Body=b"data")
    denied(lambda: s3.get_object(Bucket="agent-inmate", Key="k"))
    with pytest.raises(AdminError) as refused:
        admin.delete_team("quarantine")
    assert refused.value.status == 409 and refused.value.code == "DeleteConflict"
    assert "1 member" in refused.value.message and "team remove quarantine" in refused.value.message
    denied(lambda: s3.get_object(Bucket="agent-inmate", Key="k"))  # the Deny still holds
    admin.remove_member("quarantine", "inmate")
    admin.delete_team("quarantine")
    assert s3.get_object(Bucket="agent-inmate", Key="k")["Body"].read() == b"data"


def test_lasting_keys_never_look_temporary():
    """About one lasting key in 36 began "OMS", the mark of a sandbox key in logs."""
    from gateway.iam.identities import new_key_pair, new_temporary_key

    keys = [new_key_pair(0).access_key for _ in range(3000)]
    assert all(len(k) == 20 and k.startswith("OM") and not k.startswith("OMS") for k in keys)
    assert new_temporary_key(0, 60, None, None).access_key.startswith("OMS")
