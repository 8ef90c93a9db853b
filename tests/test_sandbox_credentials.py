"""Sandbox credentials: temporary keys of an agent, narrowed by an optional session policy,
that expire by themselves. Against a real gateway, with boto3, presigned URLs, bearer tokens
and the `orgmem admin` command line as the sandbox and its launcher would use them."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime

import boto3
import orjson
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from clients import clean_env
from servers import BIN, Gateway

from gateway.admin_client import AdminClient, AdminError
from gateway.iam.identities import DOCUMENT_KEY, IdentityStore
from gateway.iam.model import EXPIRED_SANDBOX_KEPT, SANDBOX_KEYS_MAX, SANDBOX_TTL_MAX, IdentityError
from gateway.iam.principals import RootCredentials
from gateway.store.base import INTERNAL_BUCKET
from gateway.store.local import LocalStore

ORGMEM = BIN / "orgmem"


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("sandbox") / "data").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin(gw):
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


@pytest.fixture(scope="module")
def secrets_seen():
    """Every secret key handed out in this module, to check that none leaks."""
    return []


def s3_client(gw, access_key: str, secret_key: str):
    cfg = Config(signature_version="s3v4", s3={"addressing_style": "path"},
                 retries={"max_attempts": 1, "mode": "standard"})
    return boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=access_key,
                        aws_secret_access_key=secret_key, region_name="us-east-1", config=cfg)


def new_agent(admin, secrets_seen, name: str, **kwargs) -> dict:
    created = admin.create_agent(name, **kwargs)
    secrets_seen.append(created["secret_key"])
    return created


def sandbox(admin, secrets_seen, agent: str, ttl: int = 3600, **kwargs) -> dict:
    creds = admin.sandbox_credentials(agent, ttl, **kwargs)
    secrets_seen.append(creds["secret_key"])
    return creds


def as_s3(gw, creds: dict):
    return s3_client(gw, creds["access_key"], creds["secret_key"])


def s3_error(call) -> ClientError:
    with pytest.raises(ClientError) as info:
        call()
    return info.value


def denied(call) -> ClientError:
    err = s3_error(call)
    assert err.response["Error"]["Code"] == "AccessDenied", err.response
    assert err.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    return err


def bearer(creds: dict) -> dict[str, str]:
    return {"Authorization": f"Bearer {creds['access_key']}:{creds['secret_key']}"}


def http_error(request) -> urllib.error.HTTPError:
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request)
    return info.value


def wait_until_refused(call, code: str, timeout: float = 15) -> ClientError:
    """Call until the gateway answers ``code``; fails if it never does (no timing is asserted)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            call()
        except ClientError as exc:
            if exc.response["Error"]["Code"] == code:
                return exc
            raise
        time.sleep(0.2)
    pytest.fail(f"still allowed after {timeout} s; expected {code}")


def identities_etag(gw) -> str:
    """The ETag of the stored identities document: any write, even an invisible one, moves it."""
    db = sqlite3.connect(f"file:{gw.data / 'store' / 'index.db'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT etag FROM objects WHERE bucket = ? AND key = ?",
                         (INTERNAL_BUCKET, DOCUMENT_KEY.encode())).fetchone()
    finally:
        db.close()
    return row[0]


def all_audit(admin, **filters) -> list[dict]:
    records, cursor = [], None
    while True:
        page = admin.audit(limit=1000, after=cursor, **filters)
        records += page["records"]
        cursor = page["cursor"]
        if len(page["records"]) < 1000:
            return records


# -- what sandbox credentials may do -----------------------------------------------------------------


def test_sandbox_keys_carry_the_agents_rights(gw, admin, secrets_seen):
    new_agent(admin, secrets_seen, "sbx-ada")
    s3_client(gw, gw.access_key, gw.secret_key).create_bucket(Bucket="sbx-private")
    before = time.time()
    creds = sandbox(admin, secrets_seen, "sbx-ada", ttl=3600)
    assert creds["agent"] == "sbx-ada" and creds["policy"] is None and creds["inline_policy"] is False
    assert creds["access_key"].startswith("OMS") and len(creds["access_key"]) == 20
    assert before + 3600 <= creds["expires"] <= time.time() + 3601
    assert creds["expires_at"] == datetime.fromtimestamp(creds["expires"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    s3 = as_s3(gw, creds)
    s3.create_bucket(Bucket="agent-sbx-ada")
    s3.put_object(Bucket="agent-sbx-ada", Key="work/out.txt", Body=b"from the sandbox")
    assert s3.get_object(Bucket="agent-sbx-ada", Key="work/out.txt")["Body"].read() == b"from the sandbox"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="agent-sbx-ada")["Contents"]] == ["work/out.txt"]
    err = denied(lambda: s3.get_object(Bucket="sbx-private", Key="x"))
    assert "User: sbx-ada is not authorized" in str(err) and "identity-based policy" in str(err)
    denied(lambda: s3.create_bucket(Bucket="agent-sbx-other"))

    shown = admin.get_agent("sbx-ada")["temporary_keys"]
    assert shown == [{"access_key": creds["access_key"], "created_at": shown[0]["created_at"],
                      "expires_at": creds["expires_at"], "policy": None, "inline_policy": False}]
    me = json.loads(urllib.request.urlopen(urllib.request.Request(
        f"{gw.endpoint}/admin/v1/whoami", headers=bearer(creds))).read())
    assert me["name"] == "sbx-ada" and me["expires_at"] == creds["expires_at"]
    put = next(r for r in admin.audit(principal="sbx-ada")["records"] if r["operation"] == "PutObject")
    assert put["access_key"] == creds["access_key"] and put["decision"] == "allow"


def test_a_named_session_policy_narrows_to_what_both_allow(gw, admin, secrets_seen):
    owner = new_agent(admin, secrets_seen, "sbx-reader")
    own = s3_client(gw, owner["access_key"], owner["secret_key"])
    own.create_bucket(Bucket="agent-sbx-reader")
    own.put_object(Bucket="agent-sbx-reader", Key="data.csv", Body=b"a,b")
    root = s3_client(gw, gw.access_key, gw.secret_key)
    root.create_bucket(Bucket="sbx-library")
    root.put_object(Bucket="sbx-library", Key="book", Body=b"words")

    creds = sandbox(admin, secrets_seen, "sbx-reader", policy="readonly")
    assert creds["policy"] == "readonly"
    s3 = as_s3(gw, creds)
    assert s3.get_object(Bucket="agent-sbx-reader", Key="data.csv")["Body"].read() == b"a,b"
    err = denied(lambda: s3.put_object(Bucket="agent-sbx-reader", Key="new.csv", Body=b"x"))
    assert "because no session policy allows the s3:PutObject action" in str(err)
    denied(lambda: s3.delete_object(Bucket="agent-sbx-reader", Key="data.csv"))
    # readonly allows reading everything, but the agent may not: the intersection may not either.
    denied(lambda: s3.get_object(Bucket="sbx-library", Key="book"))
    # The agent's own keys keep their full rights.
    own.put_object(Bucket="agent-sbx-reader", Key="new.csv", Body=b"x")
    denied_put = next(r for r in admin.audit(principal="sbx-reader", denied=True)["records"]
                      if r["operation"] == "PutObject")
    assert denied_put["reason"] == "implicit-deny (session policy)"
    assert admin.get_agent("sbx-reader")["temporary_keys"][0]["policy"] == "readonly"


def test_an_inline_session_policy_uses_the_agents_name_and_its_denies_win(gw, admin, secrets_seen):
    owner = new_agent(admin, secrets_seen, "sbx-inline")
    s3_client(gw, owner["access_key"], owner["secret_key"]).create_bucket(Bucket="agent-sbx-inline")
    document = {"Version": "2012-10-17", "Statement": [
        {"Sid": "ScratchOnly", "Effect": "Allow", "Action": "s3:*",
         "Resource": "arn:aws:s3:::agent-${aws:username}/scratch/*"},
        {"Sid": "NoDeletes", "Effect": "Deny", "Action": "s3:DeleteObject", "Resource": "*"}]}
    creds = sandbox(admin, secrets_seen, "sbx-inline", policy_document=document)
    assert creds["policy"] is None and creds["inline_policy"] is True
    s3 = as_s3(gw, creds)
    s3.put_object(Bucket="agent-sbx-inline", Key="scratch/a", Body=b"a")
    assert s3.get_object(Bucket="agent-sbx-inline", Key="scratch/a")["Body"].read() == b"a"
    denied(lambda: s3.put_object(Bucket="agent-sbx-inline", Key="elsewhere", Body=b"b"))
    err = denied(lambda: s3.delete_object(Bucket="agent-sbx-inline", Key="scratch/a"))
    assert "with an explicit deny in a session policy" in str(err)
    refused = next(r for r in admin.audit(principal="sbx-inline", denied=True)["records"]
                   if r["operation"] == "DeleteObject")
    assert refused["reason"] == "session:inline#NoDeletes"


def test_sandbox_credentials_cannot_mint_longer_lived_keys(gw, admin, secrets_seen):
    new_agent(admin, secrets_seen, "sbx-boss", kind="human", policies=["admin"])
    creds = sandbox(admin, secrets_seen, "sbx-boss")
    as_boss = AdminClient(gw.endpoint, creds["access_key"], creds["secret_key"])
    assert as_boss.whoami()["name"] == "sbx-boss"
    for attempt in (lambda: as_boss.create_key("sbx-boss"),
                    lambda: as_boss.rotate_key("sbx-boss"),
                    lambda: as_boss.sandbox_credentials("sbx-boss", SANDBOX_TTL_MAX),
                    lambda: as_boss.create_agent("sbx-escape", policies=["admin"])):
        with pytest.raises(AdminError) as info:
            attempt()
        assert info.value.status == 403 and "Sandbox credentials cannot create" in info.value.message
    assert len(admin.get_agent("sbx-boss")["keys"]) == 1
    assert len(admin.get_agent("sbx-boss")["temporary_keys"]) == 1
    assert "sbx-escape" not in [a["name"] for a in admin.list_agents()]


# -- expiry, disabling, revoking -------------------------------------------------------------------------


def test_sandbox_credentials_expire_with_a_clear_error(gw, admin, secrets_seen):
    owner = new_agent(admin, secrets_seen, "sbx-brief")
    s3_client(gw, owner["access_key"], owner["secret_key"]).create_bucket(Bucket="agent-sbx-brief")
    creds = sandbox(admin, secrets_seen, "sbx-brief", ttl=2)
    s3 = as_s3(gw, creds)
    s3.put_object(Bucket="agent-sbx-brief", Key="k", Body=b"v")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": "agent-sbx-brief", "Key": "k"},
                                    ExpiresIn=3600)
    object_url = f"{gw.endpoint}/agent-sbx-brief/k"

    err = wait_until_refused(lambda: s3.get_object(Bucket="agent-sbx-brief", Key="k"), "ExpiredToken")
    assert err.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    message = err.response["Error"]["Message"]
    assert message == (f"The access key {creds['access_key']} expired at {creds['expires_at']}; "
                       "ask for new sandbox credentials.")
    assert creds["secret_key"] not in message

    presigned = http_error(url)  # the URL itself is valid for an hour; its key is not
    assert presigned.code == 403 and b"<Code>ExpiredToken</Code>" in presigned.read()
    refused = http_error(urllib.request.Request(object_url, headers=bearer(creds)))  # S3 with a bearer
    assert refused.code == 403 and b"<Code>ExpiredToken</Code>" in refused.read()
    refused = http_error(urllib.request.Request(f"{gw.endpoint}/admin/v1/whoami", headers=bearer(creds)))
    assert refused.code == 403
    assert json.loads(refused.read())["error"] == {"code": "ExpiredToken", "message": message}

    assert admin.get_agent("sbx-brief")["temporary_keys"] == []
    records = admin.audit(principal="sbx-brief", denied=True)["records"]
    assert records and records[-1]["reason"] == "authentication: ExpiredToken"
    assert records[-1]["access_key"] == creds["access_key"]


def test_disabling_or_deleting_the_agent_stops_its_sandbox_keys(gw, admin, secrets_seen):
    owner = new_agent(admin, secrets_seen, "sbx-sleeper")
    s3_client(gw, owner["access_key"], owner["secret_key"]).create_bucket(Bucket="agent-sbx-sleeper")
    s3 = as_s3(gw, sandbox(admin, secrets_seen, "sbx-sleeper"))
    assert s3.list_objects_v2(Bucket="agent-sbx-sleeper")["KeyCount"] == 0
    admin.disable_agent("sbx-sleeper")
    assert "disabled" in str(denied(lambda: s3.list_objects_v2(Bucket="agent-sbx-sleeper")))
    admin.enable_agent("sbx-sleeper")
    assert s3.list_objects_v2(Bucket="agent-sbx-sleeper")["KeyCount"] == 0
    admin.delete_agent("sbx-sleeper")
    err = s3_error(lambda: s3.list_objects_v2(Bucket="agent-sbx-sleeper"))
    assert err.response["Error"]["Code"] == "InvalidAccessKeyId"


def test_sandbox_keys_can_be_revoked_before_they_expire(gw, admin, secrets_seen):
    new_agent(admin, secrets_seen, "sbx-revoked")
    creds = sandbox(admin, secrets_seen, "sbx-revoked")
    s3 = as_s3(gw, creds)
    s3.create_bucket(Bucket="agent-sbx-revoked")
    admin.revoke_key(creds["access_key"])
    err = s3_error(lambda: s3.list_objects_v2(Bucket="agent-sbx-revoked"))
    assert err.response["Error"]["Code"] == "InvalidAccessKeyId"
    assert admin.get_agent("sbx-revoked")["temporary_keys"] == []


def test_a_session_policy_in_use_cannot_be_deleted(gw, admin, secrets_seen):
    admin.put_policy("sbx-listing", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "*"}]})
    new_agent(admin, secrets_seen, "sbx-lister")
    creds = sandbox(admin, secrets_seen, "sbx-lister", policy="sbx-listing")
    with pytest.raises(AdminError) as info:
        admin.delete_policy("sbx-listing")
    assert info.value.status == 409 and "sbx-lister" in info.value.message
    admin.revoke_key(creds["access_key"])
    admin.delete_policy("sbx-listing")


# -- bad input ---------------------------------------------------------------------------------------------


BAD_REQUESTS = [
    ("sbx-target", {"ttl_seconds": 0}, 400, "InvalidRequest", "from 1 to 604800"),
    ("sbx-target", {"ttl_seconds": -5}, 400, "InvalidRequest", "from 1 to 604800"),
    ("sbx-target", {"ttl_seconds": 604801}, 400, "InvalidRequest", "604800 (7 days)"),
    ("sbx-target", {"ttl_seconds": "1h"}, 400, "InvalidRequest", "ttl_seconds"),
    ("sbx-target", {"ttl_seconds": 1.5}, 400, "InvalidRequest", "ttl_seconds"),
    ("sbx-target", {"ttl_seconds": True}, 400, "InvalidRequest", "ttl_seconds"),
    ("sbx-target", {}, 400, "InvalidRequest", "ttl_seconds"),
    ("sbx-target", {"ttl_seconds": 60, "lifetime": 5}, 400, "InvalidRequest", "lifetime"),
    ("sbx-nobody", {"ttl_seconds": 60}, 404, "NoSuchEntity", "no agent named 'sbx-nobody'"),
    ("sbx-target", {"ttl_seconds": 60, "policy": "sbx-no-such-policy"}, 404, "NoSuchEntity",
     "no policy named 'sbx-no-such-policy'"),
    ("sbx-target", {"ttl_seconds": 60, "policy_document": {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:GetObjekt", "Resource": "*"}]}}, 400,
     "MalformedPolicyDocument", "s3:GetObjekt"),
    ("sbx-target", {"ttl_seconds": 60, "policy_document": {"Statement": []}}, 400,
     "MalformedPolicyDocument", "Version"),
    ("sbx-target", {"ttl_seconds": 60, "policy_document": "readonly"}, 400, "InvalidRequest",
     "policy_document"),
    ("sbx-target", {"ttl_seconds": 60, "policy": "readonly", "policy_document": {
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}},
     400, "InvalidRequest", "not both"),
    ("root", {"ttl_seconds": 60}, 400, "InvalidRequest", "root cannot have sandbox credentials"),
    ("sbx-team", {"ttl_seconds": 60}, 404, "NoSuchEntity", "is a team, not an agent"),
    ("sbx-off", {"ttl_seconds": 60}, 400, "InvalidRequest", "is disabled"),
]


@pytest.fixture(scope="module")
def bad_input_targets(admin, secrets_seen):
    new_agent(admin, secrets_seen, "sbx-target")
    new_agent(admin, secrets_seen, "sbx-off")
    admin.disable_agent("sbx-off")
    admin.create_team("sbx-team")


@pytest.mark.parametrize("agent, body, status, code, words", BAD_REQUESTS)
def test_bad_requests_answer_clearly_and_change_nothing(gw, admin, bad_input_targets, agent, body,
                                                        status, code, words):
    before = (identities_etag(gw), admin.list_agents())
    with pytest.raises(AdminError) as info:
        admin._call("POST", "agents", agent, "sandbox-credentials", payload=body)
    assert (info.value.status, info.value.code) == (status, code), info.value
    assert words in info.value.message
    assert (identities_etag(gw), admin.list_agents()) == before


def test_an_unparseable_body_is_refused(gw, admin, bad_input_targets):
    before = identities_etag(gw)
    with pytest.raises(AdminError) as info:
        admin._call("POST", "agents", "sbx-target", "sandbox-credentials", raw=b"{ttl_seconds: 60")
    assert info.value.status == 400 and "not valid JSON" in info.value.message
    assert identities_etag(gw) == before


# -- the command line -------------------------------------------------------------------------------------


def cli_env(gw, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if not k.startswith("ORGMEM_")}
    env.update(ORGMEM_ENDPOINT=gw.endpoint, ORGMEM_ROOT_ACCESS_KEY=gw.access_key,
               ORGMEM_ROOT_SECRET_KEY=gw.secret_key, **extra)
    return env


def orgmem(gw, *args: str, expect: int = 0, input: str = "") -> subprocess.CompletedProcess:
    proc = subprocess.run([str(ORGMEM), "admin", *args], env=cli_env(gw), input=input,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == expect, (args, proc.returncode, proc.stdout, proc.stderr)
    assert gw.secret_key not in proc.stdout + proc.stderr
    return proc


def test_the_cli_prints_credentials_for_people_for_eval_and_as_json(gw, admin, secrets_seen, tmp_path):
    owner = new_agent(admin, secrets_seen, "sbx-cli")
    s3_client(gw, owner["access_key"], owner["secret_key"]).create_bucket(Bucket="agent-sbx-cli")

    text = orgmem(gw, "sandbox-credentials", "--agent", "sbx-cli", "--ttl", "15m")
    fields = dict(line.strip().split(": ", 1) for line in text.stdout.splitlines()[1:])
    secrets_seen.append(fields["secret key"].strip())
    assert text.stdout.startswith("Sandbox credentials for sbx-cli, valid for 15m.")
    assert fields["access key"].strip().startswith("OMS") and fields["expires at"].strip().endswith("Z")
    assert "cannot be shown again" in text.stderr
    s3_client(gw, fields["access key"].strip(), fields["secret key"].strip()).put_object(
        Bucket="agent-sbx-cli", Key="from-text", Body=b"t")

    as_json = json.loads(orgmem(gw, "sandbox-credentials", "--agent", "sbx-cli", "--ttl", "1h",
                                "--policy", "readonly", "--json").stdout)
    secrets_seen.append(as_json["secret_key"])
    assert as_json["policy"] == "readonly" and as_json["agent"] == "sbx-cli"
    assert as_json["expires"] - time.time() > 3500
    denied(lambda: as_s3(gw, as_json).put_object(Bucket="agent-sbx-cli", Key="no", Body=b"n"))

    env = orgmem(gw, "sandbox-credentials", "--agent", "sbx-cli", "--ttl", "90s", "--format", "env")
    exports = dict(line.removeprefix("export ").split("=", 1) for line in env.stdout.splitlines())
    assert set(exports) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "ORGMEM_ACCESS_KEY",
                            "ORGMEM_SECRET_KEY"}
    secrets_seen.append(exports["AWS_SECRET_ACCESS_KEY"].strip("'"))
    assert "expire at" in env.stderr
    # A sandbox launcher evals the lines; the aws cli inside then uses the sandbox keys.
    script = (f'eval "$({ORGMEM} admin sandbox-credentials --agent sbx-cli --ttl 2m --format env)" '
              f'&& {BIN / "aws"} --endpoint-url {gw.endpoint} s3 ls s3://agent-sbx-cli/')
    launched = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                              env=cli_env(gw, AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE="/dev/null",
                                          AWS_SHARED_CREDENTIALS_FILE="/dev/null"))
    assert launched.returncode == 0, launched.stderr
    assert "from-text" in launched.stdout

    policy = tmp_path / "scratch.json"
    policy.write_text(json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::agent-sbx-cli/*"}]}))
    inline = json.loads(orgmem(gw, "sandbox-credentials", "--agent", "sbx-cli", "--ttl", "1h",
                               "--policy-file", str(policy), "--format", "json").stdout)
    secrets_seen.append(inline["secret_key"])
    assert inline["inline_policy"] is True
    assert as_s3(gw, inline).get_object(Bucket="agent-sbx-cli", Key="from-text")["Body"].read() == b"t"

    shown = orgmem(gw, "agent", "show", "sbx-cli")
    assert "sandbox credentials" in shown.stdout and inline["access_key"] in shown.stdout
    assert inline["expires_at"] in shown.stdout and "(inline)" in shown.stdout
    for secret in secrets_seen[-4:]:
        assert secret not in shown.stdout


@pytest.mark.parametrize("args, expect, words", [
    (("--ttl", "8d"), 1, "604800"),
    (("--ttl", "0"), 1, "from 1 to 604800"),
    (("--ttl", "soon"), 2, "is not a duration"),
    (("--ttl", "1h", "--policy", "sbx-nope"), 1, "NoSuchEntity"),
    (("--ttl", "1h", "--policy", "readonly", "--policy-file", "-"), 2, "not both"),
    (("--ttl", "1h", "--json", "--format", "env"), 2, "not both"),
])
def test_the_cli_refuses_bad_input_clearly(gw, admin, bad_input_targets, args, expect, words):
    before = identities_etag(gw)
    proc = orgmem(gw, "sandbox-credentials", "--agent", "sbx-target", *args, expect=expect, input="{}")
    assert words in proc.stderr and proc.stdout == ""
    assert identities_etag(gw) == before


def test_the_cli_refuses_a_policy_file_that_is_not_json(gw, bad_input_targets, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = orgmem(gw, "sandbox-credentials", "--agent", "sbx-target", "--ttl", "1h",
                  "--policy-file", str(bad), expect=1)
    assert "MalformedPolicyDocument" in proc.stderr


# -- the identities document ---------------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def stored_document(store: LocalStore) -> dict:
    reader = store.open_object(INTERNAL_BUCKET, DOCUMENT_KEY)
    try:
        return orjson.loads(reader.read())
    finally:
        reader.close()


def test_expired_sandbox_keys_leave_the_document_at_a_later_change(tmp_path):
    clock = Clock(1_800_000_000.0)
    store = LocalStore(tmp_path / "store")
    identities = IdentityStore(store, RootCredentials("AKROOTROOTROOT000001", "root-secret"), clock=clock)
    identities.create_agent("pruned")
    assert "temporary_keys" not in stored_document(store)["agents"][0]  # readable by older gateways
    key = identities.create_sandbox_credentials("pruned", 60)
    assert key.expires_at == 1_800_000_060

    clock.now += 61  # expired: refused by the authenticator, still known so it says ExpiredToken
    principal, _ = identities.lookup(key.access_key)
    assert principal.expires_at == key.expires_at and principal.name == "pruned"
    identities.create_team("a-change")
    assert identities.lookup(key.access_key) is not None

    clock.now += EXPIRED_SANDBOX_KEPT
    identities.create_team("another-change")
    assert identities.lookup(key.access_key) is None
    assert "temporary_keys" not in stored_document(store)["agents"][0]
    assert key.access_key not in json.dumps(stored_document(store))


def test_at_most_100_sandbox_keys_per_agent_and_expired_ones_make_room(tmp_path):
    clock = Clock(1_800_000_000.0)
    identities = IdentityStore(LocalStore(tmp_path / "store"),
                               RootCredentials("AKROOTROOTROOT000001", "root-secret"), clock=clock)
    identities.create_agent("busy")
    for _ in range(SANDBOX_KEYS_MAX):
        identities.create_sandbox_credentials("busy", 60)
    with pytest.raises(IdentityError) as info:
        identities.create_sandbox_credentials("busy", 60)
    assert "100 live sandbox credentials" in info.value.message
    clock.now += 61
    fresh = identities.create_sandbox_credentials("busy", 60)
    assert [k["access_key"] for k in identities.get_agent("busy")["temporary_keys"]] == [fresh.access_key]


def test_a_bad_ttl_is_refused_by_the_service_itself(tmp_path):
    store = LocalStore(tmp_path / "store")
    identities = IdentityStore(store, RootCredentials("AKROOTROOTROOT000001", "root-secret"))
    identities.create_agent("bounded")
    for ttl in (0, SANDBOX_TTL_MAX + 1, 2.5, True, "60"):
        with pytest.raises(IdentityError):
            identities.create_sandbox_credentials("bounded", ttl)
    assert identities.create_sandbox_credentials("bounded", SANDBOX_TTL_MAX).expires_at > 0


# -- secrets ----------------------------------------------------------------------------------------------------


def test_no_sandbox_secret_appears_in_logs_or_audit(gw, admin, secrets_seen):
    creds = sandbox(admin, secrets_seen, "sbx-target", ttl=60)
    urllib.request.urlopen(urllib.request.Request(f"{gw.endpoint}/admin/v1/whoami",
                                                  headers=bearer(creds))).read()
    texts = [json.dumps(all_audit(admin)), gw.log()]
    admin._request("POST", "/v1/bio/compact")  # and once the audit is Parquet
    texts.append(json.dumps(all_audit(admin)))
    assert len(secrets_seen) >= 15
    for secret in secrets_seen:
        for text in texts:
            assert secret not in text
    assert any(creds["access_key"] in text for text in texts)  # the key ID is audited, its secret not
    assert os.path.exists(gw.log_path)


# -- search honours the session policy ---------------------------------------------------------------


def test_narrowed_sandbox_keys_search_only_what_the_session_policy_allows(gw, admin, secrets_seen):
    """Search turns grants into index tokens, cached per principal: the cache must tell a
    sandbox key narrowed to memory from its agent, or the key would search the biography."""
    from gateway.bio_client import BioClient
    from orgmem import Client

    owner = new_agent(admin, secrets_seen, "sbx-searcher")
    word = "zebraword" + uuid.uuid4().hex[:6]
    BioClient(gw.endpoint, owner["access_key"], owner["secret_key"]).put_events(
        [{"session": "s1", "kind": "note", "content": f"the {word} in my biography"}])
    own = Client(gw.endpoint, owner["access_key"], owner["secret_key"])
    deadline = time.monotonic() + 30
    while not own.search(word)["count"]:
        assert time.monotonic() < deadline, "the event never became searchable"
        time.sleep(0.3)
    memory_only = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": [
        "search:Query", "memory:GetDocument", "memory:ListDocuments"], "Resource": "*"}]}
    creds = sandbox(admin, secrets_seen, "sbx-searcher", policy_document=memory_only)
    narrowed = Client(gw.endpoint, creds["access_key"], creds["secret_key"])
    found = narrowed.search(word)
    assert found["count"] == 0 and found["hits"] == []
    assert own.search(word)["count"] == 1  # the agent's own key still finds it
