"""`orgmem admin` and its AdminClient: the signer checked by the gateway's own verifier, then
the command line run as a subprocess against a real gateway, with boto3 using the keys it
hands out."""

from __future__ import annotations

import hashlib
import json
import queue
import re
import signal
import subprocess
import threading
import time
import uuid
from datetime import datetime
from urllib.parse import quote

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from clients import clean_env
from servers import BIN, Gateway, free_port

from gateway.admin_cli import parse_duration
from gateway.admin_client import AdminClient, AdminError, _query_string, from_env
from gateway.s3 import sigv4
from gateway.s3.sigv4 import AuthError

ORGMEM = BIN / "orgmem"
AK = "AKADMINCLIENTTEST001"
SECRET = "admin-client-test-secret/with+odd=chars"


def uname(prefix: str = "a") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def cli_env(gw: Gateway | None = None, **extra: str) -> dict[str, str]:
    """A clean environment: no AWS_* or ORGMEM_* from the caller, the root keys of ``gw``."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("ORGMEM_")}
    if gw is not None:
        env.update(ORGMEM_ENDPOINT=gw.endpoint, ORGMEM_ROOT_ACCESS_KEY=gw.access_key,
                   ORGMEM_ROOT_SECRET_KEY=gw.secret_key)
    env.update(extra)
    return env


def orgmem(gw: Gateway | None, *args: str, expect: int | None = 0, env: dict[str, str] | None = None,
           input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `orgmem admin ARGS`; check the exit code and that the root secret never shows."""
    proc = subprocess.run([str(ORGMEM), "admin", *args], env=cli_env(gw) if env is None else env,
                          input=input if input is not None else "", capture_output=True, text=True,
                          timeout=timeout, check=False)
    if expect is not None:
        assert proc.returncode == expect, (f"orgmem admin {' '.join(args)} exited {proc.returncode}, "
                                           f"expected {expect}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    if gw is not None:
        assert gw.secret_key not in proc.stdout + proc.stderr
    return proc


def as_json(gw: Gateway, *args: str, expect: int = 0):
    return json.loads(orgmem(gw, *args, "--json", expect=expect).stdout)


def s3_as(gw: Gateway, access_key: str, secret_key: str):
    cfg = Config(signature_version="s3v4", s3={"addressing_style": "path"},
                 retries={"max_attempts": 1, "mode": "standard"})
    return boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=access_key,
                        aws_secret_access_key=secret_key, region_name="us-east-1", config=cfg)


def status_of(call) -> int:
    try:
        call()
    except ClientError as exc:
        return exc.response["ResponseMetadata"]["HTTPStatusCode"]
    return 200


def create_agent(gw: Gateway, *extra: str) -> dict:
    name = uname()
    creds = as_json(gw, "agent", "create", name, *extra)
    assert creds["name"] == name
    return creds


def epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module")
def admin_gw(tmp_path_factory):
    """A gateway of this module's own, so identities and audit records start empty."""
    gw = Gateway(tmp_path_factory.mktemp("gw-admin") / "data").start()
    yield gw
    gw.stop()


# ============================================================================ signer (no admin API needed)

def _signed(client: AdminClient, method: str, path: str, query: str, body: bytes, now: float):
    headers = client.sign(method, path, query, body, {"content-type": "application/json"}, now=now)
    return headers, sigv4.parse_authorization(headers)


@pytest.mark.parametrize("method,path,query,body", [
    ("GET", "/admin/v1/whoami", "", b""),
    ("POST", "/admin/v1/agents", "", b'{"name": "scout"}'),
    ("PUT", "/admin/v1/teams/r%26d/members/a%20b%2Fc", "", b""),
    ("DELETE", "/admin/v1/keys/AKIA%2B%3D", "", b""),
    ("GET", "/admin/v1/audit",
     _query_string({"since": "2026-11-30T09:30:00Z", "principal": "ü b+c", "denied": True, "limit": 5}), b""),
])
def test_signature_is_accepted_by_the_gateway_verifier(method, path, query, body):
    client = AdminClient("http://127.0.0.1:9000", AK, SECRET)
    now = 1796030000.0
    headers, req = _signed(client, method, path, query, body, now)
    assert req.access_key == AK and req.service == "s3" and req.region == "us-east-1"
    assert headers["x-amz-content-sha256"] == req.payload_hash == hashlib.sha256(body).hexdigest()
    assert headers["host"] == "127.0.0.1:9000"
    assert {"host", "x-amz-date", "x-amz-content-sha256"} <= set(req.signed_headers)
    sigv4.verify(req, SECRET, method, path, query, headers, now)  # raises on mismatch
    assert SECRET not in json.dumps(headers)


def test_signature_fails_with_the_wrong_secret_or_a_changed_request():
    client = AdminClient("http://127.0.0.1:9000", AK, SECRET)
    now = 1796030000.0
    headers, req = _signed(client, "POST", "/admin/v1/agents", "", b'{"name": "a"}', now)
    with pytest.raises(AuthError) as exc:
        sigv4.verify(req, SECRET + "x", "POST", "/admin/v1/agents", "", headers, now)
    assert exc.value.code == "SignatureDoesNotMatch"
    with pytest.raises(AuthError):
        sigv4.verify(req, SECRET, "POST", "/admin/v1/agents/other", "", headers, now)
    with pytest.raises(AuthError):  # the body hash is part of the signature
        tampered = {**headers, "x-amz-content-sha256": sigv4.EMPTY_SHA256}
        sigv4.verify(sigv4.parse_authorization(tampered), SECRET, "POST", "/admin/v1/agents", "",
                     tampered, now)


def test_live_signed_calls_to_the_existing_s3_api(gateway, s3, bucket):
    """The gateway answers S3 for root keys today: the signer works on the wire."""
    key = "dir one/ü+x=y.txt"
    s3.put_object(Bucket=bucket, Key=key, Body=b"signed")
    client = AdminClient(gateway.endpoint, gateway.access_key, gateway.secret_key)
    status, headers, body = client._request("GET", "/")
    assert status == 200 and b"ListAllMyBucketsResult" in body and bucket.encode() in body
    status, _, body = client._request("GET", f"/{bucket}",
                                      query={"list-type": "2", "prefix": "dir one/ü+"})
    assert status == 200 and b"x=y.txt" in body
    status, _, body = client._request("GET", f"/{bucket}/{quote(key, safe='/')}")
    assert status == 200 and body == b"signed"
    status, _, _ = client._request("PUT", f"/{bucket}/{quote('put by admin client', safe='')}",
                                   body=b"payload", content_type="text/plain")
    assert status == 200
    assert s3.get_object(Bucket=bucket, Key="put by admin client")["Body"].read() == b"payload"


def test_live_wrong_secret_is_refused_without_leaking_it(gateway):
    wrong = "not-the-secret-0123456789"
    client = AdminClient(gateway.endpoint, gateway.access_key, wrong)
    with pytest.raises(AdminError) as exc:
        client._request("GET", "/")
    assert exc.value.status == 403 and exc.value.code == "SignatureDoesNotMatch"
    for text in (str(exc.value), repr(exc.value), repr(client)):
        assert wrong not in text and gateway.secret_key not in text
    unknown = AdminClient(gateway.endpoint, "AKUNKNOWN00000000000", wrong)
    with pytest.raises(AdminError) as exc:
        unknown._request("GET", "/")
    assert exc.value.code == "InvalidAccessKeyId"


def test_https_with_a_private_ca(tls_gateway, tls_files):
    client = AdminClient(tls_gateway.endpoint, tls_gateway.access_key, tls_gateway.secret_key,
                         ca_file=tls_files["ca"])
    assert client._request("GET", "/")[0] == 200
    untrusted = AdminClient(tls_gateway.endpoint, tls_gateway.access_key, tls_gateway.secret_key)
    with pytest.raises(AdminError) as exc:
        untrusted._request("GET", "/")
    assert exc.value.code == "TLSError" and "ORGMEM_CA_BUNDLE" in exc.value.message
    proc = orgmem(None, "whoami", expect=1, env=cli_env(
        tls_gateway, ORGMEM_ENDPOINT=tls_gateway.endpoint))
    assert "error: TLSError: cannot reach the gateway at " + tls_gateway.endpoint in proc.stderr


def test_connection_refused_is_a_readable_error():
    endpoint = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(AdminError) as exc:
        AdminClient(endpoint, AK, SECRET).whoami()
    assert exc.value.status == 0 and exc.value.message.startswith(f"cannot reach the gateway at {endpoint}")
    proc = orgmem(None, "agent", "list", expect=1, env=cli_env(
        ORGMEM_ENDPOINT=endpoint, ORGMEM_ACCESS_KEY=AK, ORGMEM_SECRET_KEY=SECRET))
    assert proc.stderr.startswith(f"error: ConnectionError: cannot reach the gateway at {endpoint}")
    assert SECRET not in proc.stdout + proc.stderr


def test_from_env_precedence_and_errors():
    env = {"ORGMEM_ROOT_ACCESS_KEY": "AKROOT", "ORGMEM_ROOT_SECRET_KEY": "rootsecret"}
    client = from_env(env=env)
    assert client.endpoint == "http://127.0.0.1:9000" and client.access_key == "AKROOT"
    client = from_env(env={**env, "ORGMEM_ACCESS_KEY": "AKUSER", "ORGMEM_SECRET_KEY": "usersecret",
                           "ORGMEM_ENDPOINT": "http://gw.example:9100/"})
    assert client.access_key == "AKUSER" and client.endpoint == "http://gw.example:9100"
    assert from_env("http://other:1", env=env).endpoint == "http://other:1"
    assert from_env(access_key="AKARG", secret_key="s", env=env).access_key == "AKARG"
    assert "rootsecret" not in repr(from_env(env=env))
    with pytest.raises(AdminError) as exc:
        from_env(env={})
    assert exc.value.code == "NoCredentials" and "ORGMEM_ACCESS_KEY" in exc.value.message
    with pytest.raises(AdminError) as exc:  # never mixed with the root pair
        from_env(env={**env, "ORGMEM_ACCESS_KEY": "AKUSER"})
    assert "ORGMEM_SECRET_KEY" in exc.value.message
    with pytest.raises(AdminError) as exc:
        from_env("ftp://x", env=env)
    assert exc.value.code == "InvalidEndpoint"
    with pytest.raises(AdminError):
        from_env("http://user:pw@host:9000", env=env)


def test_parse_duration():
    assert [parse_duration(v) for v in ("90s", "15m", "1h", "7d", "1h30m", "45", "0s")] == \
        [90, 900, 3600, 7 * 86400, 5400, 45, 0]
    for bad in ("", "1x", "h", "-5s", "1.5h", "5 parsecs"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_admin_group_is_registered():
    proc = subprocess.run([str(ORGMEM), "admin", "--help"], capture_output=True, text=True, check=True,
                          env=cli_env())
    for command in ("agent", "key", "team", "policy", "audit"):
        assert re.search(rf"^\s+{command}\s", proc.stdout, re.M), proc.stdout


def test_missing_credentials_is_a_clear_error():
    proc = orgmem(None, "agent", "list", expect=1, env=cli_env(ORGMEM_ENDPOINT="http://127.0.0.1:1"))
    assert proc.stderr.startswith("error: NoCredentials:")
    assert "ORGMEM_ACCESS_KEY" in proc.stderr and "ORGMEM_ROOT_ACCESS_KEY" in proc.stderr
    proc = orgmem(None, "agent", "list", expect=1, env=cli_env(ORGMEM_ACCESS_KEY="AKONLY"))
    assert "ORGMEM_SECRET_KEY is not set" in proc.stderr


@pytest.mark.parametrize("args,message", [
    (("key", "rotate", "someone", "--grace", "5parsecs"), "not a duration"),
    (("key", "rotate", "someone", "--grace", "-1h"), "not a duration"),
    (("policy", "simulate", "p", "s3:GetObject", "arn:aws:s3:::b/k", "--context", "novalue"), "KEY=VALUE"),
    (("audit", "tail", "--since", "yesterday"), "not a duration"),
    (("audit", "tail", "--limit", "0"), "--limit"),
    (("audit", "query", "--since", "yesterday"), "not a duration"),
    (("audit", "query", "--limit", "0"), "--limit"),
    (("policy", "attach", "p"), "exactly one of --agent or --team"),
    (("policy", "detach", "p", "--agent", "a", "--team", "t"), "exactly one of --agent or --team"),
])
def test_usage_errors_exit_2_before_any_request(args, message):
    # No credentials and no gateway: a usage error must be reported before either is needed.
    proc = orgmem(None, *args, expect=2, env=cli_env(ORGMEM_ENDPOINT=f"http://127.0.0.1:{free_port()}"))
    assert message in proc.stderr


# ============================================================================ against /admin/v1

def test_whoami_root(admin_gw):
    me = as_json(admin_gw, "whoami")
    assert me["is_root"] is True and me["name"]
    assert me["name"] in orgmem(admin_gw, "whoami").stdout


def test_agent_create_and_use_its_own_bucket(admin_gw):
    name = uname()
    proc = orgmem(admin_gw, "agent", "create", name, "--json")
    creds = json.loads(proc.stdout)
    assert set(creds) == {"name", "access_key", "secret_key"} and creds["name"] == name
    agent_s3 = s3_as(admin_gw, creds["access_key"], creds["secret_key"])
    bucket = f"agent-{name}"
    agent_s3.create_bucket(Bucket=bucket)
    agent_s3.put_object(Bucket=bucket, Key="notes.md", Body=b"what I learned")
    assert agent_s3.get_object(Bucket=bucket, Key="notes.md")["Body"].read() == b"what I learned"
    assert [o["Key"] for o in agent_s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["notes.md"]
    # ...but not somebody else's
    root = s3_as(admin_gw, admin_gw.access_key, admin_gw.secret_key)
    other = uname("rootb")
    root.create_bucket(Bucket=other)
    assert status_of(lambda: agent_s3.list_objects_v2(Bucket=other)) == 403

    human = uname("h")
    proc = orgmem(admin_gw, "agent", "create", human, "--human")
    assert re.search(r"^  access key: \S+$", proc.stdout, re.M)
    assert re.search(r"^  secret key: \S+$", proc.stdout, re.M)
    assert as_json(admin_gw, "agent", "show", human)["kind"] == "human"


def test_agent_list_and_show(admin_gw):
    creds = create_agent(admin_gw)
    name = creds["name"]
    table = orgmem(admin_gw, "agent", "list").stdout
    assert name in table and "NAME" in table
    agents = as_json(admin_gw, "agent", "list")
    mine = next(a for a in agents if a["name"] == name)
    assert mine["kind"] == "agent" and mine["disabled"] is False
    assert mine["policies"] == ["agent-default"]
    assert [k["access_key"] for k in mine["keys"]] == [creds["access_key"]]

    shown = orgmem(admin_gw, "agent", "show", name).stdout
    assert name in shown and creds["access_key"] in shown and "agent-default" in shown
    assert as_json(admin_gw, "agent", "show", name)["name"] == name
    for args in (("agent", "list"), ("agent", "list", "--json"), ("agent", "show", name),
                 ("agent", "show", name, "--json")):
        out = orgmem(admin_gw, *args)
        assert creds["secret_key"] not in out.stdout + out.stderr and "secret_key" not in out.stdout


def test_agent_disable_refuses_its_keys(admin_gw):
    creds = create_agent(admin_gw)
    name = creds["name"]
    agent_s3 = s3_as(admin_gw, creds["access_key"], creds["secret_key"])
    agent_s3.create_bucket(Bucket=f"agent-{name}")
    put = lambda: agent_s3.put_object(Bucket=f"agent-{name}", Key="k", Body=b"x")  # noqa: E731
    assert status_of(put) == 200
    assert as_json(admin_gw, "agent", "disable", name)["disabled"] is True
    assert status_of(put) == 403
    assert "disabled" in orgmem(admin_gw, "agent", "show", name).stdout
    assert as_json(admin_gw, "agent", "enable", name)["disabled"] is False
    assert status_of(put) == 200


def test_agent_delete(admin_gw):
    creds = create_agent(admin_gw)
    name = creds["name"]
    orgmem(admin_gw, "agent", "delete", name, expect=1, input="")  # no --yes, nobody to confirm
    assert as_json(admin_gw, "agent", "show", name)["name"] == name
    orgmem(admin_gw, "agent", "delete", name, "--yes")
    proc = orgmem(admin_gw, "agent", "show", name, expect=1)
    assert proc.stderr.startswith("error: NoSuchEntity:")
    agent_s3 = s3_as(admin_gw, creds["access_key"], creds["secret_key"])
    assert status_of(lambda: agent_s3.list_buckets()) == 403


def test_unknown_agent_is_no_such_entity(admin_gw):
    for args in (("agent", "show", "nobody-here"), ("agent", "disable", "nobody-here"),
                 ("key", "create", "nobody-here"), ("key", "rotate", "nobody-here", "--grace", "1h")):
        proc = orgmem(admin_gw, *args, expect=1)
        assert proc.stderr.startswith("error: NoSuchEntity: "), proc.stderr
        assert proc.stdout == ""


def test_key_rotate_with_grace(admin_gw):
    creds = create_agent(admin_gw)
    name, bucket = creds["name"], f"agent-{creds['name']}"
    old = s3_as(admin_gw, creds["access_key"], creds["secret_key"])
    old.create_bucket(Bucket=bucket)
    rotated = as_json(admin_gw, "key", "rotate", name, "--grace", "2s")
    assert rotated["replaced"] == creds["access_key"] and rotated["access_key"] != creds["access_key"]
    assert rotated["secret_key"] and rotated["old_key_expires_at"]
    new = s3_as(admin_gw, rotated["access_key"], rotated["secret_key"])
    assert status_of(lambda: new.head_bucket(Bucket=bucket)) == 200
    expires = epoch(rotated["old_key_expires_at"])
    if time.time() < expires - 0.5:  # still inside the grace period
        assert status_of(lambda: old.head_bucket(Bucket=bucket)) == 200
    time.sleep(max(0.0, expires - time.time()) + 0.5)
    deadline = time.time() + 15
    while status_of(lambda: old.head_bucket(Bucket=bucket)) != 403:
        assert time.time() < deadline, "the old key still works after its grace period"
        time.sleep(0.25)
    assert status_of(lambda: new.head_bucket(Bucket=bucket)) == 200

    # without --grace the old key is revoked at once; the table output says so
    out = orgmem(admin_gw, "key", "rotate", name).stdout
    assert "revoked" in out and rotated["access_key"] in out
    newest = re.search(r"access key: (\S+)", out).group(1)
    assert status_of(lambda: new.head_bucket(Bucket=bucket)) == 403
    keys = [k["access_key"] for k in as_json(admin_gw, "agent", "show", name)["keys"]]
    assert keys == [newest]


def test_key_create_and_revoke(admin_gw):
    creds = create_agent(admin_gw)
    name, bucket = creds["name"], f"agent-{creds['name']}"
    first = s3_as(admin_gw, creds["access_key"], creds["secret_key"])
    first.create_bucket(Bucket=bucket)
    second_creds = as_json(admin_gw, "key", "create", name)
    assert set(second_creds) == {"name", "access_key", "secret_key"}
    second = s3_as(admin_gw, second_creds["access_key"], second_creds["secret_key"])
    assert status_of(lambda: second.head_bucket(Bucket=bucket)) == 200
    # with two keys, rotate must be told which one
    proc = orgmem(admin_gw, "key", "rotate", name, expect=1)
    assert proc.stderr.startswith("error: ")
    orgmem(admin_gw, "key", "revoke", second_creds["access_key"])
    assert status_of(lambda: second.head_bucket(Bucket=bucket)) == 403
    assert status_of(lambda: first.head_bucket(Bucket=bucket)) == 200
    keys = [k["access_key"] for k in as_json(admin_gw, "agent", "show", name)["keys"]]
    assert keys == [creds["access_key"]]
    assert orgmem(admin_gw, "key", "revoke", second_creds["access_key"], expect=1).stderr.startswith("error: ")


def test_team_create_add_remove(admin_gw):
    member = create_agent(admin_gw)["name"]
    team = uname("t")
    created = as_json(admin_gw, "team", "create", team)
    assert created["name"] == team and created["members"] == []
    assert member in as_json(admin_gw, "team", "add", team, member)["members"]
    assert team in as_json(admin_gw, "agent", "show", member)["teams"]
    listed = next(t for t in as_json(admin_gw, "team", "list") if t["name"] == team)
    assert listed["members"] == [member]
    table = orgmem(admin_gw, "team", "list").stdout
    assert team in table and member in table
    assert as_json(admin_gw, "team", "remove", team, member)["members"] == []
    assert team not in as_json(admin_gw, "agent", "show", member)["teams"]
    assert orgmem(admin_gw, "team", "create", team, expect=1).stderr.startswith("error: EntityAlreadyExists:")
    assert orgmem(admin_gw, "team", "add", team, "nobody-here", expect=1).stderr.startswith(
        "error: NoSuchEntity:")


def notes_policy(bucket: str) -> dict:
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ReadNotes", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": [f"arn:aws:s3:::{bucket}/notes/*"]},
        {"Sid": "NoSecrets", "Effect": "Deny", "Action": "s3:GetObject",
         "Resource": f"arn:aws:s3:::{bucket}/notes/secret*"},
        {"Sid": "ListNotes", "Effect": "Allow", "Action": "s3:ListBucket",
         "Resource": f"arn:aws:s3:::{bucket}", "Condition": {"StringLike": {"s3:prefix": "notes/*"}}},
    ]}


def test_policy_put_from_file_and_stdin(admin_gw, tmp_path):
    name = uname("p")
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(notes_policy("shared"), indent=2))
    orgmem(admin_gw, "policy", "put", name, str(path))
    document = json.loads(orgmem(admin_gw, "policy", "show", name).stdout)
    assert [s["Sid"] for s in document["Statement"]] == ["ReadNotes", "NoSecrets", "ListNotes"]
    full = as_json(admin_gw, "policy", "show", name)
    assert full["name"] == name and full["builtin"] is False and full["document"] == document

    piped = uname("p")
    orgmem(admin_gw, "policy", "put", piped, "-", input=json.dumps(notes_policy("other")))
    assert "arn:aws:s3:::other/notes/*" in orgmem(admin_gw, "policy", "show", piped).stdout
    names = [p["name"] for p in as_json(admin_gw, "policy", "list")]
    assert {name, piped, "agent-default"} <= set(names)
    table = orgmem(admin_gw, "policy", "list").stdout
    assert name in table and piped in table


def test_policy_put_refuses_bad_documents(admin_gw):
    name = uname("bad")
    proc = orgmem(admin_gw, "policy", "put", name, "-", expect=1, input='{"Version": "2012-10-17", ')
    assert proc.stderr.startswith("error: MalformedPolicy") and re.search(r"(?i)json", proc.stderr)

    unknown = notes_policy("b")
    unknown["Statement"][0]["Action"] = ["s3:FlyToTheMoon"]
    proc = orgmem(admin_gw, "policy", "put", name, "-", expect=1, input=json.dumps(unknown))
    assert proc.stderr.startswith("error: MalformedPolicy") and "s3:FlyToTheMoon" in proc.stderr

    big = {"Version": "2012-10-17", "Statement": [
        {"Sid": f"S{i}", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": f"arn:aws:s3:::bucket-{i}/a-rather-long-prefix-to-fill-space/*"} for i in range(250)]}
    text = json.dumps(big)
    assert len(text.encode()) > 20480
    proc = orgmem(admin_gw, "policy", "put", name, "-", expect=1, input=text)
    assert proc.stderr.startswith("error: ")
    assert re.search(r"(?i)20480|20 ?KB|too large|too big|size|exceed|limit", proc.stderr), proc.stderr
    assert orgmem(admin_gw, "policy", "show", name, expect=1).stderr.startswith("error: NoSuchEntity:")


def test_policy_attach_detach(admin_gw):
    policy = uname("p")
    orgmem(admin_gw, "policy", "put", policy, "-", input=json.dumps(notes_policy("shared")))
    member = create_agent(admin_gw)["name"]
    team = uname("t")
    orgmem(admin_gw, "team", "create", team)

    summary = as_json(admin_gw, "policy", "attach", policy, "--agent", member)
    assert summary["attached_to"]["agents"] == [member]
    assert policy in as_json(admin_gw, "agent", "show", member)["policies"]
    assert f"attached to team {team}" in orgmem(admin_gw, "policy", "attach", policy, "--team", team).stdout
    assert policy in as_json(admin_gw, "team", "show", team)["policies"]
    assert orgmem(admin_gw, "policy", "delete", policy, expect=1).stderr.startswith("error: DeleteConflict:")

    summary = as_json(admin_gw, "policy", "detach", policy, "--agent", member)
    assert summary["attached_to"]["agents"] == [] and summary["attached_to"]["teams"] == [team]
    assert policy not in as_json(admin_gw, "agent", "show", member)["policies"]
    orgmem(admin_gw, "policy", "detach", policy, "--team", team)
    orgmem(admin_gw, "policy", "delete", policy)
    assert orgmem(admin_gw, "policy", "attach", policy, "--agent", member, expect=1).stderr.startswith(
        "error: NoSuchEntity:")


def test_policy_simulate(admin_gw):
    policy, bucket = uname("p"), uname("sim")
    orgmem(admin_gw, "policy", "put", policy, "-", input=json.dumps(notes_policy(bucket)))
    who = create_agent(admin_gw, "--policy", policy)["name"]

    allowed = orgmem(admin_gw, "policy", "simulate", who, "s3:GetObject",
                     f"arn:aws:s3:::{bucket}/notes/today.md", expect=0).stdout
    assert "ALLOWED" in allowed and f"{policy}#ReadNotes" in allowed and "Allow" in allowed

    denied = orgmem(admin_gw, "policy", "simulate", who, "s3:GetObject",
                    f"arn:aws:s3:::{bucket}/notes/secret.md", expect=3).stdout
    assert "DENIED" in denied and f"{policy}#NoSecrets" in denied and "Deny" in denied

    implicit = orgmem(admin_gw, "policy", "simulate", who, "s3:PutObject",
                      f"arn:aws:s3:::{bucket}/notes/today.md", expect=3).stdout
    assert "DENIED" in implicit and "implicit" in implicit

    result = as_json(admin_gw, "policy", "simulate", who, "s3:GetObject",
                     f"arn:aws:s3:::{bucket}/notes/secret.md", expect=3)
    assert result["allowed"] is False and result["decision"] == "explicit-deny"
    assert result["statement"]["sid"] == "NoSecrets" and result["statement"]["effect"] == "Deny"

    listing = ("policy", "simulate", who, "s3:ListBucket", f"arn:aws:s3:::{bucket}")
    assert "ListNotes" in orgmem(admin_gw, *listing, "--context", "s3:prefix=notes/2026", expect=0).stdout
    orgmem(admin_gw, *listing, "--context", "s3:prefix=private/", expect=3)

    proc = orgmem(admin_gw, "policy", "simulate", "nobody-here", "s3:GetObject", "arn:aws:s3:::b/k", expect=1)
    assert proc.stderr.startswith("error: NoSuchEntity:")


def _audit_records(gw: Gateway, *args: str) -> list[dict]:
    out = orgmem(gw, "audit", "tail", "--json", *args).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_audit_tail_shows_allowed_and_denied(admin_gw):
    creds = create_agent(admin_gw)
    name = creds["name"]
    agent_s3 = s3_as(admin_gw, creds["access_key"], creds["secret_key"])
    agent_s3.create_bucket(Bucket=f"agent-{name}")
    agent_s3.put_object(Bucket=f"agent-{name}", Key="audited.txt", Body=b"x")
    root = s3_as(admin_gw, admin_gw.access_key, admin_gw.secret_key)
    other = uname("rootb")
    root.create_bucket(Bucket=other)
    assert status_of(lambda: agent_s3.get_object(Bucket=other, Key="nope")) == 403

    deadline = time.time() + 20  # reads are audited asynchronously, within a bound
    while True:
        records = _audit_records(admin_gw, "--principal", name, "--since", "10m")
        decisions = {r["decision"] for r in records}
        if {"allow", "deny"} <= decisions or time.time() > deadline:
            break
        time.sleep(0.5)
    assert {"allow", "deny"} <= decisions, records
    assert all(r["principal"] == name for r in records)
    put = next(r for r in records if r["action"] == "s3:PutObject")
    assert put["decision"] == "allow" and put["resource"] == f"arn:aws:s3:::agent-{name}/audited.txt"
    assert put["access_key"] == creds["access_key"]
    deny = next(r for r in records if r["decision"] == "deny")
    assert deny["status"] == 403 and deny["reason"]
    assert list(put)[:3] == ["time", "request_id", "principal"]

    only_denied = _audit_records(admin_gw, "--principal", name, "--denied")
    assert only_denied and all(r["decision"] == "deny" for r in only_denied)
    assert len(_audit_records(admin_gw, "--principal", name, "--limit", "1")) == 1

    table = orgmem(admin_gw, "audit", "tail", "--principal", name).stdout
    for word in ("TIME", "PRINCIPAL", "DECISION", name, "allow", "deny", "403"):
        assert word in table

    everything = orgmem(admin_gw, "audit", "tail", "--json", "--limit", "1000").stdout
    assert creds["secret_key"] not in everything and admin_gw.secret_key not in everything


def test_audit_query_finds_records_oldest_first(admin_gw):
    creds = create_agent(admin_gw)
    name = creds["name"]
    agent_s3 = s3_as(admin_gw, creds["access_key"], creds["secret_key"])
    agent_s3.create_bucket(Bucket=f"agent-{name}")
    for i in range(3):
        agent_s3.put_object(Bucket=f"agent-{name}", Key=f"q{i}.txt", Body=b"x")
    assert status_of(lambda: agent_s3.get_object(Bucket=uname("nob"), Key="k")) in (403, 404)

    def query(*args: str, expect: int = 0) -> tuple[list[dict], str]:
        proc = orgmem(admin_gw, "audit", "query", "--json", "--principal", name, *args, expect=expect)
        return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()], proc.stderr

    records, note = query("--since", "10m")
    puts = [r["resource"].rsplit("/", 1)[1] for r in records if r["operation"] == "PutObject"]
    assert puts == ["q0.txt", "q1.txt", "q2.txt"] and not note
    assert [r["time"] for r in records] == sorted(r["time"] for r in records)
    denied, _ = query("--denied")
    assert denied and all(r["decision"] == "deny" for r in denied)
    first, note = query("--limit", "2")
    assert first == records[:2] and "more than 2 records match" in note
    assert query("--since", "2000-01-01T00:00:00Z", "--limit", str(len(records)))[0] == records
    # the records are the same once the log is compacted into Parquet
    client = AdminClient(admin_gw.endpoint, admin_gw.access_key, admin_gw.secret_key)
    client._request("POST", "/v1/bio/compact")
    assert query("--since", "10m")[0] == records
    table = orgmem(admin_gw, "audit", "query", "--principal", name, "--denied").stdout
    for word in ("TIME", "PRINCIPAL", "DECISION", name, "deny"):
        assert word in table


def test_audit_tail_follow(admin_gw):
    creds = create_agent(admin_gw)
    name = creds["name"]
    agent_s3 = s3_as(admin_gw, creds["access_key"], creds["secret_key"])
    agent_s3.create_bucket(Bucket=f"agent-{name}")
    proc = subprocess.Popen([str(ORGMEM), "admin", "audit", "tail", "--follow", "--json",
                             "--principal", name], env=cli_env(admin_gw), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        time.sleep(1.5)  # let it print the backlog and start polling
        agent_s3.put_object(Bucket=f"agent-{name}", Key="followed.txt", Body=b"x")
        deadline = time.time() + 20
        seen = False
        while not seen and time.time() < deadline:
            try:
                record = json.loads(lines.get(timeout=1))
            except queue.Empty:
                continue
            seen = record.get("resource", "").endswith("/followed.txt")
        assert seen, "audit tail --follow did not show the new request"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(30)  # generous: on a loaded 2-core box the CLI can be slow to wind down
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, proc.stderr.read()


def test_https_cli_with_ca_bundle(tls_gateway, tls_files):
    env = cli_env(tls_gateway)
    proc = orgmem(tls_gateway, "--ca-bundle", tls_files["ca"], "whoami", "--json", env=env)
    assert json.loads(proc.stdout)["is_root"] is True
    env["ORGMEM_CA_BUNDLE"] = tls_files["ca"]
    assert json.loads(orgmem(tls_gateway, "whoami", "--json", env=env).stdout)["is_root"] is True


def test_agent_credentials_see_only_their_own_identity(admin_gw):
    creds = create_agent(admin_gw)
    env = cli_env(admin_gw, ORGMEM_ACCESS_KEY=creds["access_key"], ORGMEM_SECRET_KEY=creds["secret_key"])
    me = json.loads(orgmem(admin_gw, "whoami", "--json", env=env).stdout)
    assert me["name"] == creds["name"] and me["is_root"] is False
    proc = orgmem(admin_gw, "agent", "create", uname(), env=env, expect=1)
    assert proc.stderr.startswith("error: AccessDenied:")
    assert creds["secret_key"] not in proc.stdout + proc.stderr

