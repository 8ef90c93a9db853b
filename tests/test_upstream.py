"""The s3:// backend with a real SeaweedFS: killed and restarted under load, frozen,
shared by two gateways, and refused at start-up with a clear message."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from clients import wait_until
from servers import BIN, Gateway, Seaweed, free_port

from gateway.config import Config as GatewayConfig

UPSTREAM = "upstream"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def weed(tmp_path_factory):
    sw = Seaweed(tmp_path_factory.mktemp("weed")).start()
    sw.client().create_bucket(Bucket=UPSTREAM)
    yield sw
    sw.stop()


def s3_gateway(path, sw: Seaweed, prefix: str, *extra: str, env: dict | None = None) -> Gateway:
    return Gateway(path / "data", extra_args=["--backend", f"s3://{UPSTREAM}/{prefix}",
                                              "--backend-endpoint", sw.endpoint, *extra],
                   env={**sw.env, **(env or {})})


def client(gw: Gateway, read_timeout: float = 30):
    cfg = Config(signature_version="s3v4", s3={"addressing_style": "path"}, connect_timeout=3,
                 read_timeout=read_timeout, retries={"total_max_attempts": 1})
    return boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=gw.access_key,
                        aws_secret_access_key=gw.secret_key, region_name="us-east-1", config=cfg)


def ready(gw: Gateway) -> int:
    try:
        with urllib.request.urlopen(gw.endpoint + "/ready", timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def wait_for(condition, timeout: float, step: float = 0.2) -> bool:
    return wait_until(condition, timeout, step)


# -- verifiable bodies --------------------------------------------------------------


def body_for(key: str, writer: int, seq: int, size: int) -> bytes:
    header = f"<{key}|{writer}|{seq}|{size}>".encode()
    return header + random.Random(header).randbytes(max(0, size - len(header)))


def check_body(key: str, data: bytes) -> None:
    """A stored body is exactly one version some writer sent: never a mix, never short."""
    match = re.match(rb"<([^|]+)\|(\d+)\|(\d+)\|(\d+)>", data)
    assert match, f"{key}: not a body any writer sent ({data[:40]!r})"
    k, writer, seq, size = match.group(1).decode(), *map(int, match.groups()[1:])
    assert k == key and len(data) == size and data == body_for(k, writer, seq, size), \
        f"{key}: corrupt or partial ({len(data)} of {size} bytes)"


@dataclass
class Outcome:
    op: str
    started: float
    seconds: float
    status: int | None = None  # HTTP status; None for a transport error
    code: str = ""
    retry_after: str | None = None


@dataclass
class Load:
    """Several threads of mixed S3 traffic against one gateway, every outcome recorded."""

    gw: Gateway
    bucket: str
    threads: int = 6
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, n: int) -> None:
        s3 = client(self.gw)
        rng = random.Random(n)
        seq = 0
        while not self.stop.is_set():
            seq += 1
            key = f"k{rng.randrange(12)}"
            op = rng.choice(["put", "put", "put_large", "get", "get", "list", "multipart"])
            started = time.monotonic()
            outcome = Outcome(op, started, 0.0)
            try:
                if op == "put":
                    s3.put_object(Bucket=self.bucket, Key=key, Body=body_for(key, n, seq, rng.randrange(10, 64_000)))
                elif op == "put_large":
                    key = f"big{rng.randrange(3)}"
                    s3.put_object(Bucket=self.bucket, Key=key, Body=body_for(key, n, seq, 9 * MiB + 17))
                elif op == "get":
                    data = s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                    check_body(key, data)
                elif op == "list":
                    s3.list_objects_v2(Bucket=self.bucket)
                else:
                    key = f"mp{rng.randrange(2)}"
                    whole = body_for(key, n, seq, 5 * MiB + 1000)
                    upload = s3.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
                    etags = [s3.upload_part(Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=i + 1,
                                            Body=chunk)["ETag"]
                             for i, chunk in enumerate([whole[:5 * MiB], whole[5 * MiB:]])]
                    s3.complete_multipart_upload(
                        Bucket=self.bucket, Key=key, UploadId=upload,
                        MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]})
                outcome.status = 200
            except ClientError as exc:
                outcome.status = exc.response["ResponseMetadata"]["HTTPStatusCode"]
                outcome.code = exc.response["Error"].get("Code", "")
                outcome.retry_after = exc.response["ResponseMetadata"]["HTTPHeaders"].get("retry-after")
            except (BotoCoreError, OSError) as exc:
                outcome.code = repr(exc)[:200]
            outcome.seconds = time.monotonic() - started
            self.outcomes.append(outcome)

    def __enter__(self) -> Load:
        self._threads = [threading.Thread(target=self.run, args=(n,), daemon=True) for n in range(self.threads)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(120)
        assert not any(t.is_alive() for t in self._threads), "a client thread hung"


def test_upstream_killed_and_restarted_under_load(weed, tmp_path):
    """SIGKILL weed while six clients write and read: they get quick, clean 503s (or, for
    a transfer cut mid-way, a broken connection), /ready says 503, no partial or mixed
    object is ever visible, and once weed is back on the same ports and directory the
    same gateway process serves again."""
    gw = s3_gateway(tmp_path, weed, "killed", "--backend-timeout", "10").start()
    try:
        s3 = client(gw)
        s3.create_bucket(Bucket="load")
        for key in [f"k{i}" for i in range(12)] + ["big0", "big1", "big2", "mp0", "mp1"]:
            s3.put_object(Bucket="load", Key=key, Body=body_for(key, 99, 0, 100))
        with Load(gw, "load") as load:
            time.sleep(2.5)
            killed = time.monotonic()
            weed.kill()
            time.sleep(1)
            assert ready(gw) == 503
            time.sleep(1.5)
            down_until = time.monotonic()
            weed.start()
            assert wait_for(lambda: ready(gw) == 200, 30), "the gateway did not become ready again"
            recovered = time.monotonic()
            time.sleep(2.5)
        assert gw.proc.poll() is None
        outcomes = load.outcomes
        before = [o for o in outcomes if o.started + o.seconds < killed]
        during = [o for o in outcomes if o.started > killed + 0.2 and o.started + o.seconds < down_until]
        after = [o for o in outcomes if o.started > recovered + 0.5]
        assert before and all(o.status == 200 for o in before), [o for o in before if o.status != 200][:5]
        # While weed is down: every answer is 503 SlowDown with Retry-After, and quick.
        assert during, "no request ran while the upstream was down"
        for o in during:
            assert (o.status, o.code) == (503, "SlowDown") and o.retry_after, o
        assert max(o.seconds for o in during) < 10
        # Requests in flight at the kill: an error of some kind, none hung beyond the timeouts.
        assert max(o.seconds for o in outcomes) < 30, sorted(outcomes, key=lambda o: -o.seconds)[:3]
        assert any(o.status == 503 for o in outcomes)
        # Back to normal once weed is back, without restarting the gateway.
        assert after and all(o.status == 200 for o in after), [o for o in after if o.status != 200][:5]
        # Every object is whole: one version that some writer sent.
        listed = s3.list_objects_v2(Bucket="load")["Contents"]
        for obj in listed:
            data = s3.get_object(Bucket="load", Key=obj["Key"])["Body"].read()
            assert len(data) == obj["Size"]
            check_body(obj["Key"], data)
        assert ready(gw) == 200
    finally:
        gw.stop()
        if weed.proc is None:
            weed.start()


def test_upstream_killed_mid_upload_leaves_the_old_version(weed, tmp_path):
    """A large PUT and a multipart part in flight when weed dies fail cleanly; after a
    restart the key still holds its previous, complete version."""
    gw = s3_gateway(tmp_path, weed, "midway").start()
    try:
        s3 = client(gw)
        s3.create_bucket(Bucket="mid")
        old = body_for("obj", 0, 0, 1000)
        s3.put_object(Bucket="mid", Key="obj", Body=old)
        upload = s3.create_multipart_upload(Bucket="mid", Key="mp")["UploadId"]
        sent = threading.Event()
        errors: list[str] = []

        def slow_body(total: int):
            for i in range(total // MiB):
                if i == 3:
                    sent.set()
                    time.sleep(1.5)  # weed dies meanwhile
                yield b"n" * MiB

        def put_large():
            try:
                raw_put(gw, "/mid/obj", slow_body(12 * MiB), 12 * MiB)
                errors.append("put succeeded")
            except Exception as exc:  # noqa: BLE001 - any error is the point
                errors.append(repr(exc))

        def put_part():
            try:
                raw_put(gw, f"/mid/mp?partNumber=1&uploadId={upload}", slow_body(6 * MiB), 6 * MiB)
                errors.append("part succeeded")
            except Exception as exc:  # noqa: BLE001
                errors.append(repr(exc))

        threads = [threading.Thread(target=put_large), threading.Thread(target=put_part)]
        for t in threads:
            t.start()
        sent.wait(10)
        weed.kill()
        for t in threads:
            t.join(60)
        assert len(errors) == 2 and not any("succeeded" in e for e in errors), errors
        # 503 SlowDown, or (the gateway answered and closed while the body was still being
        # sent) a reset: either way a clean failure, never a success or a hang.
        assert all("503" in e and "SlowDown" in e or "ConnectionReset" in e or "BrokenPipe" in e
                   for e in errors), errors
        weed.start()
        assert wait_for(lambda: ready(gw) == 200, 30)
        assert s3.get_object(Bucket="mid", Key="obj")["Body"].read() == old
        assert s3.list_parts(Bucket="mid", Key="mp", UploadId=upload).get("Parts", []) == []
        s3.abort_multipart_upload(Bucket="mid", Key="mp", UploadId=upload)
    finally:
        gw.stop()
        if weed.proc is None:
            weed.start()


def raw_put(gw: Gateway, path: str, chunks, length: int) -> None:
    """A PUT signed with the bearer form, its body sent slowly; raises unless 200."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=60)
    try:
        conn.putrequest("PUT", path)
        conn.putheader("Authorization", f"Bearer {gw.access_key}:{gw.secret_key}")
        conn.putheader("Content-Length", str(length))
        conn.endheaders()
        for chunk in chunks:
            conn.send(chunk)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"{response.status} {body[:200]!r}")
    finally:
        conn.close()


def test_frozen_upstream_times_out_and_recovers(weed, tmp_path):
    """SIGSTOP: connections are accepted but never answered. Requests fail with 503 after
    --backend-timeout, /ready answers 503 within seconds, nothing hangs; SIGCONT heals."""
    gw = s3_gateway(tmp_path, weed, "frozen", "--backend-timeout", "2").start()
    s3 = client(gw)
    try:
        s3.create_bucket(Bucket="frozen")
        s3.put_object(Bucket="frozen", Key="k", Body=b"before")
        os.killpg(weed.proc.pid, signal.SIGSTOP)
        try:
            results = []

            def get():
                started = time.monotonic()
                try:
                    s3.get_object(Bucket="frozen", Key="k")
                    results.append(("ok", time.monotonic() - started))
                except ClientError as exc:
                    results.append((exc.response["Error"]["Code"], time.monotonic() - started))

            threads = [threading.Thread(target=get) for _ in range(4)]
            for t in threads:
                t.start()
            started = time.monotonic()
            assert ready(gw) == 503
            assert time.monotonic() - started < 8
            for t in threads:
                t.join(30)
            assert [code for code, _ in results] == ["SlowDown"] * 4
            assert max(seconds for _, seconds in results) < 10
        finally:
            os.killpg(weed.proc.pid, signal.SIGCONT)
        assert wait_for(lambda: ready(gw) == 200, 20)
        assert s3.get_object(Bucket="frozen", Key="k")["Body"].read() == b"before"
    finally:
        gw.stop()


# -- two gateways, one bucket ---------------------------------------------------------


@pytest.fixture(scope="module")
def pair(weed, tmp_path_factory):
    """Two gateways on the same upstream prefix, with the same KEK."""
    first = s3_gateway(tmp_path_factory.mktemp("gw-a"), weed, "shared").start()
    keyring = first.data.parent / f"{first.data.name}.keyring.json"
    second = s3_gateway(tmp_path_factory.mktemp("gw-b"), weed, "shared", "--kek", f"file:{keyring}").start()
    yield first, second
    first.stop()
    second.stop()


def test_a_key_issued_by_one_gateway_works_on_the_other_at_once(pair):
    """An unknown key makes a gateway re-read the identities (at most every 0.2 s), so a key
    just issued through another replica is not refused while its periodic refresh is due."""
    from gateway.admin_client import AdminClient

    a, b = pair
    for _ in range(3):
        created = AdminClient(a.endpoint, a.access_key, a.secret_key).create_agent(f"fresh-{uuid.uuid4().hex[:8]}")
        as_new = AdminClient(b.endpoint, created["access_key"], created["secret_key"])
        assert as_new.whoami()["name"] == created["name"]
        time.sleep(0.25)  # past the miss-refresh spacing: each try is its own first miss


def test_two_gateways_see_each_others_objects(pair):
    a, b = (client(gw) for gw in pair)
    bucket = f"shared-{uuid.uuid4().hex[:8]}"
    a.create_bucket(Bucket=bucket)
    assert bucket in [x["Name"] for x in b.list_buckets()["Buckets"]]
    b.head_bucket(Bucket=bucket)
    a.put_object(Bucket=bucket, Key="from-a", Body=b"hello from a", Metadata={"who": "a"})
    got = b.get_object(Bucket=bucket, Key="from-a")
    assert got["Body"].read() == b"hello from a" and got["Metadata"] == {"who": "a"}
    b.put_object(Bucket=bucket, Key="dir/from-b", Body=b"x" * (9 * MiB))
    assert [o["Key"] for o in a.list_objects_v2(Bucket=bucket)["Contents"]] == ["dir/from-b", "from-a"]
    assert a.head_object(Bucket=bucket, Key="dir/from-b")["ETag"] == b.head_object(Bucket=bucket, Key="dir/from-b")["ETag"]
    # A multipart upload begun on one gateway, continued and completed on the other.
    upload = a.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    assert [u["UploadId"] for u in b.list_multipart_uploads(Bucket=bucket).get("Uploads", [])] == [upload]
    e1 = b.upload_part(Bucket=bucket, Key="mp", UploadId=upload, PartNumber=1, Body=b"1" * (5 * MiB))["ETag"]
    e2 = a.upload_part(Bucket=bucket, Key="mp", UploadId=upload, PartNumber=2, Body=b"2")["ETag"]
    assert len(b.list_parts(Bucket=bucket, Key="mp", UploadId=upload)["Parts"]) == 2
    a.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert b.get_object(Bucket=bucket, Key="mp")["Body"].read() == b"1" * (5 * MiB) + b"2"
    b.delete_object(Bucket=bucket, Key="from-a")
    with pytest.raises(ClientError) as err:
        a.head_object(Bucket=bucket, Key="from-a")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_two_gateways_honour_each_others_conditional_writes(pair):
    clients = [client(gw) for gw in pair for _ in range(4)]
    bucket = f"race-{uuid.uuid4().hex[:8]}"
    clients[0].create_bucket(Bucket=bucket)
    for rnd in range(3):
        key = f"lease-{rnd}"
        barrier = threading.Barrier(len(clients))
        results: list[tuple[int, str]] = []

        def create(i: int, key: str = key, barrier=barrier, results=results) -> None:
            barrier.wait()
            try:
                clients[i].put_object(Bucket=bucket, Key=key, Body=f"holder-{i}".encode(), IfNoneMatch="*")
                results.append((i, "won"))
            except ClientError as exc:
                results.append((i, exc.response["Error"]["Code"]))

        threads = [threading.Thread(target=create, args=(i,)) for i in range(len(clients))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        winners = [i for i, r in results if r == "won"]
        assert len(results) == len(clients) and len(winners) == 1, results
        assert {r for _, r in results if r != "won"} == {"PreconditionFailed"}
        for c in (clients[0], clients[-1]):  # both gateways see the winner
            assert c.get_object(Bucket=bucket, Key=key)["Body"].read() == f"holder-{winners[0]}".encode()
    # Compare-and-swap: of writers on both gateways holding the same ETag, exactly one wins.
    etag = clients[0].head_object(Bucket=bucket, Key="lease-0")["ETag"]
    results = []

    def swap(i: int) -> None:
        try:
            clients[i].put_object(Bucket=bucket, Key="lease-0", Body=f"next-{i}".encode(), IfMatch=etag)
            results.append("won")
        except ClientError as exc:
            results.append(exc.response["Error"]["Code"])

    threads = [threading.Thread(target=swap, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == ["PreconditionFailed"] * (len(clients) - 1) + ["won"]


# -- start-up and configuration -----------------------------------------------------------


def serve(tmp_path, *args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ORGMEM_"))}
    full_env.update({"ORGMEM_ROOT_ACCESS_KEY": "AKORGMEMTEST00000001",
                     "ORGMEM_ROOT_SECRET_KEY": "orgmem-test-secret-key-000000000000000", **(env or {})})
    return subprocess.run([str(BIN / "orgmem"), "serve", "--port", str(free_port()), "--data",
                           str(tmp_path / "data"), *args], env=full_env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--backend", "gs://bucket"], "the gs:// scheme is not supported"),
    (["--backend", "bucket"], "--backend must be 'local' or s3://BUCKET[/PREFIX]"),
    (["--backend", "s3://"], "the bucket name is missing"),
    (["--backend", "s3://Not_A_Bucket!"], "is not a valid bucket name"),
    (["--backend", "s3://bucket//x"], "empty, '.' or '..' segment"),
    (["--backend", "s3://bucket/../x"], "empty, '.' or '..' segment"),
    (["--backend", "s3://bucket?versionId=1"], "a query or fragment"),
    (["--backend", "s3://AKIAEXAMPLE:hunter2@bucket"], "credentials do not belong in the URL"),
    (["--backend", "s3://bucket", "--backend-endpoint", "ftp://host"], "--backend-endpoint must be http(s)"),
    (["--backend", "s3://bucket", "--backend-endpoint", "http://host/path"], "no path"),
    (["--backend-endpoint", "http://127.0.0.1:1"], "need --backend s3://BUCKET"),
    (["--backend", "s3://bucket", "--backend-region", "Not A Region"], "--backend-region must look like"),
    (["--backend", "s3://bucket", "--backend-timeout", "0"], "--backend-timeout must be 1 to 3600"),
])
def test_bad_backend_settings_are_usage_errors(tmp_path, args, message):
    from click.testing import CliRunner

    from gateway.cli import main

    env = {k: None for k in os.environ if k.startswith(("AWS_", "ORGMEM_"))}
    result = CliRunner().invoke(main, ["serve", "--data", str(tmp_path / "data"), *args], env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output and "hunter2" not in result.output
    assert not (tmp_path / "data").exists()  # refused before anything was made


def test_a_bad_backend_is_a_usage_error_from_the_command_line(tmp_path):
    result = serve(tmp_path, "--backend", "gs://bucket", timeout=30)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--backend must be 'local' or s3://BUCKET[/PREFIX]: the gs:// scheme is not supported" \
        in result.stderr


def test_backend_settings_from_env_and_toml(tmp_path):
    toml = tmp_path / "orgmem.toml"
    toml.write_text('backend = "s3://from-toml/team"\nbackend_endpoint = "http://127.0.0.1:9"\n'
                    'backend_timeout = 5\n')
    config = GatewayConfig.load({}, str(toml), env={})
    assert (config.backend, config.backend_endpoint, config.backend_timeout) == \
        ("s3://from-toml/team", "http://127.0.0.1:9", 5)
    config = GatewayConfig.load({}, str(toml), env={"ORGMEM_BACKEND": "s3://from-env",
                                                   "ORGMEM_BACKEND_REGION": "eu-west-1"})
    assert (config.backend, config.backend_region) == ("s3://from-env", "eu-west-1")
    config = GatewayConfig.load({"backend": "local"}, None, env={})
    assert config.backend == "local"
    with pytest.raises(ValueError):
        GatewayConfig.load({}, None, env={"ORGMEM_BACKEND": "s3://Bad!"})


def test_unreachable_upstream_at_start_is_refused_with_a_clear_message(tmp_path):
    started = time.monotonic()
    result = serve(tmp_path, "--backend", "s3://bucket/p", "--backend-endpoint",
                   f"http://127.0.0.1:{free_port()}",
                   env={"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"})
    assert result.returncode == 1
    assert "cannot open the store (s3://bucket/p)" in result.stderr
    assert "not reachable" in result.stderr and "Traceback" not in result.stderr
    assert time.monotonic() - started < 30


def test_missing_upstream_bucket_and_wrong_credentials_are_refused(weed, tmp_path):
    result = serve(tmp_path, "--backend", "s3://no-such-upstream", "--backend-endpoint", weed.endpoint,
                   env=weed.env)
    assert result.returncode == 1 and "'no-such-upstream' does not exist" in result.stderr
    result = serve(tmp_path, "--backend", f"s3://{UPSTREAM}", "--backend-endpoint", weed.endpoint,
                   env={**weed.env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    assert result.returncode == 1 and "refused the gateway's credentials" in result.stderr
    assert "not-the-secret" not in result.stderr


def test_early_answer_to_a_large_put_does_not_hang_the_next_request(gateway):
    """boto3 sends bodies over 1 MiB with Expect: 100-continue. An answer given before the
    body is read (NoSuchBucket here; 503 while an upstream is down) closes the
    connection, so the next request on it is not swallowed as that body."""
    cfg = Config(s3={"addressing_style": "path"}, read_timeout=10, max_pool_connections=1,
                 retries={"total_max_attempts": 1})
    s3 = boto3.client("s3", endpoint_url=gateway.endpoint, aws_access_key_id=gateway.access_key,
                      aws_secret_access_key=gateway.secret_key, region_name="us-east-1", config=cfg)
    bucket = f"early-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    for _ in range(2):
        with pytest.raises(ClientError) as err:
            s3.put_object(Bucket="no-such-bucket-early", Key="k", Body=b"x" * (3 * MiB))
        assert err.value.response["Error"]["Code"] == "NoSuchBucket"
        started = time.monotonic()
        s3.head_bucket(Bucket=bucket)
        assert time.monotonic() - started < 5
    s3.delete_bucket(Bucket=bucket)
