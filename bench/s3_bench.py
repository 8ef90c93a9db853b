#!/usr/bin/env python3
"""S3 micro-benchmark: orgmem vs. moto, nanio and SeaweedFS (`weed mini`).

Every server is started by this script on 127.0.0.1, in a fresh temporary
directory, measured with the same boto3 client and with wrk, and stopped
(SIGTERM to its process group, SIGKILL after a grace period) when its
measurements finish -- also on errors and on Ctrl-C / SIGTERM.

`orgmem-agent` is orgmem again, measured with the keys of a non-root agent
that this script creates through the admin API (two teams, `agent-default`
plus a 10-statement custom policy), so every request pays for authentication
against the identities document and a real policy evaluation.

Usage:
    .venv/bin/python bench/s3_bench.py                       # full run, all servers
    .venv/bin/python bench/s3_bench.py --quick               # small sizes, 1 run
    .venv/bin/python bench/s3_bench.py --servers moto,nanio,seaweedfs --quick

See bench/README.md for what every number means and the targets.
Output: an aligned text table, one ``BENCH_JSON {...}`` line on stdout, and
the same JSON in bench/results/s3_bench.json.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS_JSON = HERE / "results" / "s3_bench.json"
VENV_BIN = REPO / ".venv" / "bin"

ALL_SERVERS = ("orgmem", "orgmem-agent", "moto", "nanio", "seaweedfs")
ORGMEM_VARIANTS = ("orgmem", "orgmem-agent")  # the same gateway, root keys / an agent's keys
PYTHON_PEERS = ("moto", "nanio")
BUCKET = "bench"
SMALL = 4096
MB = 1_000_000  # every "MB" in this script is 10^6 bytes
CLK_TCK = os.sysconf("SC_CLK_TCK")

ACCESS_KEY = "orgmembenchAK0001"
SECRET_KEY = "orgmembench-secret-key-0123456789abcdef"

DURABILITY = {
    "orgmem": "fsync (durable)",
    "orgmem-agent": "fsync (durable)",
    "moto": "none (in-memory)",
    "nanio": "fsync data+meta, no dir fsync",
    "seaweedfs": "no fsync (page cache)",
}

# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_ports(n: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (bind port 0, keep all open until done)."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            p = s.getsockname()[1]
            if p not in ports:
                ports.append(p)
    finally:
        for s in socks:
            s.close()
    return ports


def free_port_with_offset(offset: int, avoid: list[int]) -> int:
    """A free port p such that p+offset is free too (weed mini's plugin worker
    dials the admin gRPC port as admin.port+10000, whatever -admin.port.grpc says)."""
    for _ in range(200):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            if p in avoid or p + offset in avoid or p + offset > 65535:
                continue
            try:
                b.bind(("127.0.0.1", p + offset))
            except OSError:
                continue
            return p
    raise ServerError("no free port pair found")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # fields after the "(comm)" which may itself contain spaces/parens
    return data[data.rfind(")") + 2:].split()


def proc_tree(root: int) -> list[int]:
    """root plus all live descendants, found by walking /proc/*/stat ppid."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        f = _stat_fields(int(d))
        if f is None:
            continue
        children.setdefault(int(f[1]), []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        if _stat_fields(p) is None:
            continue
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def tree_cpu_ms(root: int) -> float:
    """utime+stime (+cutime+cstime of reaped children) of the whole tree, in ms."""
    ticks = 0
    for pid in proc_tree(root):
        f = _stat_fields(pid)
        if f is None:
            continue
        # f[0] is field 3 (state); utime=14, stime=15, cutime=16, cstime=17
        ticks += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    return ticks * 1000.0 / CLK_TCK


def _status_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_bytes(root: int) -> int:
    return sum(_status_kb(p, "VmRSS") for p in proc_tree(root)) * 1024


def tree_hwm_bytes(root: int) -> int:
    return sum(_status_kb(p, "VmHWM") for p in proc_tree(root)) * 1024


def reset_hwm(root: int) -> bool:
    """Reset VmHWM to the current RSS (echo 5 > /proc/pid/clear_refs)."""
    ok = True
    for pid in proc_tree(root):
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            ok = False
    return ok


class MemWatch:
    """Memory growth of a process tree during a block.

    growth = VmHWM (reset to current RSS at the start via clear_refs) - RSS at
    the start.  Only if clear_refs is not permitted does a 10 ms RSS sampler
    run instead (it would otherwise steal client CPU during the transfer).
    """

    def __init__(self, root: int):
        self.root = root
        self.before = 0
        self.peak_sampled = 0
        self.hwm_ok = False
        self._stop = threading.Event()
        self._t: threading.Thread | None = None
        self.growth = 0

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak_sampled = max(self.peak_sampled, tree_rss_bytes(self.root))

    def __enter__(self) -> MemWatch:
        self.hwm_ok = reset_hwm(self.root)
        self.before = tree_rss_bytes(self.root)
        self.peak_sampled = self.before
        if not self.hwm_ok:
            self._t = threading.Thread(target=self._sample, daemon=True)
            self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._t:
            self._t.join()
        self.peak_sampled = max(self.peak_sampled, tree_rss_bytes(self.root))
        peak = self.peak_sampled
        if self.hwm_ok:
            peak = max(peak, tree_hwm_bytes(self.root))
        self.growth = max(0, peak - self.before)


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(q / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


# --------------------------------------------------------------------------
# servers
# --------------------------------------------------------------------------


class ServerError(RuntimeError):
    pass


class Server:
    """A server process started in its own session/process group."""

    live: list[Server] = []

    def __init__(self, name: str, bin_dir: Path, base_tmp: Path):
        self.name = name
        self.bin_dir = bin_dir
        self.dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base_tmp))
        self.data = self.dir / "data"
        self.data.mkdir()
        self.log_path = self.dir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.extra_ports: list[int] = []
        self.argv: list[str] = []
        self.env_shown: dict[str, str] = {}
        # the keys the measurements use; orgmem-agent swaps in the agent's keys after start
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY
        self.durability = DURABILITY[name]
        self.is_orgmem = name in ORGMEM_VARIANTS

    # -- command lines -----------------------------------------------------
    def _command(self) -> tuple[list[str], dict[str, str]]:
        b = self.bin_dir
        p = self.port
        if self.is_orgmem:
            return (
                [str(b / "orgmem"), "serve", "--host", "127.0.0.1", "--port", str(p),
                 "--data", str(self.data)],
                {"ORGMEM_ROOT_ACCESS_KEY": ACCESS_KEY,
                 "ORGMEM_ROOT_SECRET_KEY": SECRET_KEY},
            )
        if self.name == "moto":
            # moto accepts any credentials (no auth checks by default)
            return ([str(b / "moto_server"), "-H", "127.0.0.1", "-p", str(p)], {})
        if self.name == "nanio":
            return (
                [str(b / "nanio"), "serve", "--data-dir", str(self.data),
                 "--host", "127.0.0.1", "--port", str(p),
                 "--no-access-log", "--log-level", "warning"],
                {"NANIO_ACCESS_KEY": self.access_key, "NANIO_SECRET_KEY": self.secret_key},
            )
        if self.name == "seaweedfs":
            s3cfg = self.dir / "s3.json"
            s3cfg.write_text(json.dumps({"identities": [{
                "name": "bench",
                "credentials": [{"accessKey": self.access_key,
                                 "secretKey": self.secret_key}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }]}))
            (s3grpc, mport, mgrpc, vport, vgrpc, fport, fgrpc, aport, agrpc) = self.extra_ports
            return (
                [str(b / "weed"), f"-logdir={self.dir}", "mini",
                 f"-dir={self.data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                 f"-s3.port={p}", f"-s3.port.grpc={s3grpc}",
                 f"-s3.config={s3cfg}", f"-s3.localSocket={self.dir / 's3.sock'}",
                 f"-master.port={mport}", f"-master.port.grpc={mgrpc}",
                 f"-volume.port={vport}", f"-volume.port.grpc={vgrpc}",
                 f"-filer.port={fport}", f"-filer.port.grpc={fgrpc}",
                 f"-filer.localSocket={self.dir / 'filer.sock'}",
                 f"-admin.port={aport}", f"-admin.port.grpc={agrpc}",
                 "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                 "-master.telemetry=false"],
                {},
            )
        raise ValueError(self.name)

    # -- lifecycle -----------------------------------------------------------
    def start(self, timeout: float = 60.0) -> None:
        ports = free_ports(8 if self.name == "seaweedfs" else 1)
        if self.name == "seaweedfs":
            aport = free_port_with_offset(10000, ports)
            ports += [aport, aport + 10000]
        self.port, self.extra_ports = ports[0], ports[1:]
        argv, extra_env = self._command()
        if not Path(argv[0]).exists():
            raise ServerError(f"{argv[0]} not found")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "NANIO_", "ORGMEM_"))}
        env.update(extra_env)
        env["TMPDIR"] = str(self.dir)  # e.g. moto spools big objects to TMPDIR
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        self.argv, self.env_shown = argv, extra_env
        self._logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            argv, cwd=self.dir, env=env, stdin=subprocess.DEVNULL,
            stdout=self._logf, stderr=subprocess.STDOUT, start_new_session=True,
        )
        Server.live.append(self)
        log(f"{self.name}: started pid {self.proc.pid} on port {self.port}")
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.port}" + ("/health" if self.is_orgmem else "/")
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"exited with code {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200 or not self.is_orgmem:
                        return
                    last = f"HTTP {r.status}"
            except urllib.error.HTTPError as e:  # any HTTP answer means "listening"
                if not self.is_orgmem:
                    return
                last = f"HTTP {e.code}"
            except (OSError, urllib.error.URLError) as e:
                last = repr(e)
            time.sleep(0.2)
        raise ServerError(f"not ready after {timeout:.0f}s ({last}): {self.log_tail()}")

    def log_tail(self, n: int = 1500) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        tree = proc_tree(proc.pid)
        pgid = proc.pid  # start_new_session: pgid == pid
        if proc.poll() is None:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log(f"{self.name}: no exit 10s after SIGTERM, sending SIGKILL")
        # whatever is left of the group (or of the tree we saw), by id
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in tree:
            if pid != proc.pid and _stat_fields(pid) is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._logf.close()
        if self.name == "seaweedfs":
            # weed leaves unix sockets named after its ports in /tmp
            for p in [self.port, *self.extra_ports]:
                for s in glob.glob(f"/tmp/seaweedfs-*-{p}.sock"):
                    try:
                        os.unlink(s)
                    except OSError:
                        pass
        if self in Server.live:
            Server.live.remove(self)
        log(f"{self.name}: stopped")

    def cleanup(self, keep: bool) -> None:
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def stop_all_servers() -> None:
    for s in list(Server.live):
        try:
            s.stop()
        except Exception:  # noqa: BLE001 - best effort
            traceback.print_exc()


# --------------------------------------------------------------------------
# orgmem-agent: a non-root principal created through the admin API
# --------------------------------------------------------------------------

AGENT_NAME = "bench-agent"
AGENT_TEAMS = ("bench-research", "bench-platform")
AGENT_POLICY = "bench-agent-s3"
AGENT_POLICIES = ("agent-default", AGENT_POLICY)
# Statement that must decide every benchmark request; the others are there to be evaluated.
AGENT_BENCH_SID = "BenchBucket"


def agent_policy_document() -> dict[str, Any]:
    """A realistic custom policy of 10 statements.

    Wildcard actions and resources, ${aws:username} and ${orgmem:teams} variables, a condition on
    s3:prefix, and a Deny on every S3 action from outside the local networks (evaluated on every
    request, never matching the bench traffic from 127.0.0.1). Only `BenchBucket` allows the
    benchmark's bucket, with s3:* (CreateBucket, Put/Get/List/Delete, multipart).
    """
    me = "${aws:username}"
    teams = "${orgmem:teams}"
    s3 = "arn:aws:s3:::"
    return {"Version": "2012-10-17", "Id": AGENT_POLICY, "Statement": [
        {"Sid": "SeeBuckets", "Effect": "Allow",
         "Action": ["s3:ListAllMyBuckets", "s3:GetBucketLocation"], "Resource": "*"},
        {"Sid": "ReadSharedBuckets", "Effect": "Allow", "Action": ["s3:Get*", "s3:List*"],
         "Resource": [f"{s3}shared-*", f"{s3}shared-*/*"]},
        {"Sid": "OwnScratchBuckets", "Effect": "Allow", "Action": "s3:*",
         "Resource": [f"{s3}scratch-{me}", f"{s3}scratch-{me}/*"]},
        {"Sid": "TeamBucketObjects", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
         "Resource": f"{s3}team-{teams}/*"},
        {"Sid": "ListOwnDatasetPrefixes", "Effect": "Allow", "Action": "s3:ListBucket",
         "Resource": f"{s3}datasets",
         "Condition": {"StringLike": {"s3:prefix": ["public/*", f"users/{me}/*"]}}},
        {"Sid": "ReadDatasets", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": [f"{s3}datasets/public/*", f"{s3}datasets/users/{me}/*"]},
        {"Sid": "AgentPrefixedBuckets", "Effect": "Allow", "Action": ["s3:Get*", "s3:Put*"],
         "Resource": f"{s3}agent-{me}-*/*"},
        {"Sid": "ReadTeamMemory", "Effect": "Allow", "Action": ["memory:Get*", "memory:List*"],
         "Resource": f"arn:orgmem:memory:::team/{teams}/*"},
        {"Sid": "DenyOutsideLocalNetworks", "Effect": "Deny", "Action": "s3:*", "Resource": "*",
         "Condition": {"NotIpAddress": {"aws:SourceIp": ["127.0.0.0/8", "10.0.0.0/8", "::1/128"]}}},
        {"Sid": AGENT_BENCH_SID, "Effect": "Allow", "Action": "s3:*",
         "Resource": [f"{s3}{BUCKET}", f"{s3}{BUCKET}/*"]},
    ]}


# (action, resource) of every S3 call the benchmark makes as the agent (boto3's
# upload_file aborts its multipart upload on failure, hence AbortMultipartUpload).
AGENT_NEEDS = [
    ("s3:CreateBucket", f"arn:aws:s3:::{BUCKET}"),
    ("s3:ListBucket", f"arn:aws:s3:::{BUCKET}"),
    ("s3:ListBucketMultipartUploads", f"arn:aws:s3:::{BUCKET}"),
    ("s3:PutObject", f"arn:aws:s3:::{BUCKET}/big/object"),
    ("s3:GetObject", f"arn:aws:s3:::{BUCKET}/g4k/0000"),
    ("s3:DeleteObject", f"arn:aws:s3:::{BUCKET}/probe/delete"),
    ("s3:AbortMultipartUpload", f"arn:aws:s3:::{BUCKET}/big/object"),
    ("s3:ListMultipartUploadParts", f"arn:aws:s3:::{BUCKET}/big/object"),
]


def admin_call(srv: Server, method: str, path: str, body: Any = None,
               keys: tuple[str, str] = (ACCESS_KEY, SECRET_KEY)) -> Any:
    """One admin REST call with `Authorization: Bearer <access>:<secret>` (root keys by default).

    Errors carry the method, path, status and the server's error body, never the token.
    """
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{srv.port}{path}", data=data, method=method,
        headers={"Authorization": f"Bearer {keys[0]}:{keys[1]}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        detail = e.read()[:500].decode("utf-8", "replace")
        raise ServerError(f"admin {method} {path}: HTTP {e.code}: {detail}") from None
    return json.loads(raw) if raw else None


def provision_agent(srv: Server) -> dict[str, Any]:
    """Create the teams, the custom policy and the agent as root; switch srv to the agent's keys.

    Then check, before anything is measured, that the agent is who it should be and that the
    policy simulator allows every call the benchmark makes through `BenchBucket` (and that the
    Deny would fire for traffic from elsewhere, so it is live, not dead weight).
    Returns a description for the JSON output (no secret in it).
    """
    doc = agent_policy_document()
    admin_call(srv, "PUT", f"/admin/v1/policies/{AGENT_POLICY}", json.dumps(doc).encode())
    for team in AGENT_TEAMS:
        admin_call(srv, "POST", "/admin/v1/teams", {"name": team})
    created = admin_call(srv, "POST", "/admin/v1/agents",
                         {"name": AGENT_NAME, "kind": "agent", "teams": list(AGENT_TEAMS),
                          "policies": list(AGENT_POLICIES)})
    srv.access_key, srv.secret_key = created["access_key"], created["secret_key"]

    who = admin_call(srv, "GET", "/admin/v1/whoami", keys=(srv.access_key, srv.secret_key))
    if (who.get("name") != AGENT_NAME or who.get("is_root")
            or sorted(who.get("teams", [])) != sorted(AGENT_TEAMS)
            or who.get("policies") != list(AGENT_POLICIES)):
        raise ServerError(f"whoami as the agent answered {who}")

    def simulate(action: str, resource: str, ip: str) -> dict[str, Any]:
        return admin_call(srv, "POST", "/admin/v1/policies/simulate",
                          {"principal": AGENT_NAME, "action": action, "resource": resource,
                           "context": {"aws:SourceIp": ip}})

    simulated = {}
    for action, resource in AGENT_NEEDS:
        d = simulate(action, resource, "127.0.0.1")
        st = d.get("statement") or {}
        simulated[action] = f"{d.get('decision')} by {st.get('policy')}#{st.get('sid')}"
        if not d.get("allowed") or (st.get("policy"), st.get("sid")) != (AGENT_POLICY, AGENT_BENCH_SID):
            raise ServerError(f"policy simulator: {action} on {resource} for {AGENT_NAME}: {d}")
    d = simulate("s3:GetObject", f"arn:aws:s3:::{BUCKET}/g4k/0000", "203.0.113.7")
    if d.get("decision") != "explicit-deny":
        raise ServerError(f"policy simulator: the Deny statement does not fire from 203.0.113.7: {d}")
    simulated["s3:GetObject from 203.0.113.7"] = d["decision"]
    log(f"{srv.name}: created agent {AGENT_NAME} (teams {', '.join(AGENT_TEAMS)}; policies "
        f"{', '.join(AGENT_POLICIES)}, {len(doc['Statement'])} custom statements); measuring with its keys")
    return {"name": AGENT_NAME, "teams": list(AGENT_TEAMS), "policies": list(AGENT_POLICIES),
            "custom_policy": {"name": AGENT_POLICY, "document": doc}, "simulated": simulated}


def check_agent_audit(srv: Server, max_pages: int = 1000) -> dict[str, Any]:
    """After the measurements, untimed: page through the agent's whole audit trail (1000 records
    per call, with the cursor). Every S3 record must be allowed by BenchBucket; a denial or any
    other deciding statement means the policy did not do what the benchmark assumes."""
    want = f"{AGENT_POLICY}#{AGENT_BENCH_SID}"
    s3_records, others, pages = 0, 0, 0
    operations: dict[str, int] = {}
    reasons: dict[str, int] = {}
    first_bad = None
    cursor = None
    while pages < max_pages:
        q = f"principal={AGENT_NAME}&limit=1000" + (f"&after={urllib.parse.quote(cursor)}" if cursor else "")
        page = admin_call(srv, "GET", f"/admin/v1/audit?{q}")
        pages += 1
        for r in page["records"]:
            if not str(r.get("action") or "").startswith("s3:"):
                others += 1  # the admin API's whoami
                continue
            s3_records += 1
            op, why = str(r.get("operation")), str(r.get("reason"))
            operations[op] = operations.get(op, 0) + 1
            reasons[why] = reasons.get(why, 0) + 1
            if first_bad is None and (why != want or r.get("decision") != "allow"):
                first_bad = r
        cursor = page.get("cursor")
        if len(page["records"]) < 1000 or not cursor:
            break
    out = {"s3_records": s3_records, "other_records": others, "pages": pages,
           "operations": dict(sorted(operations.items())), "reasons": reasons}
    needed = {"CreateBucket", "PutObject", "GetObject", "DeleteObject", "CreateMultipartUpload",
              "UploadPart", "CompleteMultipartUpload", "ListObjectsV2"}
    missing = sorted(needed - set(operations))
    if first_bad is not None or missing or not s3_records:
        raise ServerError(f"audit check: expected every S3 record of {AGENT_NAME} allowed by {want}, "
                          f"with operations {sorted(needed)}; missing {missing}, got {out}, "
                          f"first other: {first_bad}")
    return out


# --------------------------------------------------------------------------
# load generation
# --------------------------------------------------------------------------


class Phase:
    """Result of one timed load phase."""

    def __init__(self, ok: int, errors: int, elapsed: float, first_error: str | None,
                 latencies: list[float] | None = None):
        self.ok, self.errors, self.elapsed = ok, errors, elapsed
        self.first_error = first_error
        self.latencies = latencies or []

    @property
    def ops(self) -> float | None:
        return self.ok / self.elapsed if self.ok and self.elapsed > 0 else None


def run_load(nthreads: int, op: Callable[[int, int], None], *, count: int | None = None,
             duration: float | None = None, cap: float = 120.0,
             record_latency: bool = False) -> Phase:
    """Run op(thread, i) from nthreads threads, either `count` ops in total or
    for `duration` seconds; never longer than `cap` seconds."""
    stop = threading.Event()
    start = threading.Barrier(nthreads + 1)
    lock = threading.Lock()
    res = {"ok": 0, "err": 0, "first": None}
    lats: list[list[float]] = [[] for _ in range(nthreads)]
    ends = [0.0] * nthreads
    t0_box = [0.0]
    quota = ([count // nthreads + (1 if t < count % nthreads else 0) for t in range(nthreads)]
             if count else None)

    def worker(t: int) -> None:
        ok = err = 0
        first = None
        mylat = lats[t]
        start.wait()
        deadline_dur = t0_box[0] + duration if duration else None
        deadline_cap = t0_box[0] + cap
        i = 0
        pc = time.perf_counter
        while not stop.is_set():
            now = pc()
            if now >= deadline_cap or (deadline_dur and now >= deadline_dur):
                break
            if quota is not None and i >= quota[t]:
                break
            try:
                op(t, i)
                ok += 1
                if record_latency:
                    mylat.append(pc() - now)
            except Exception as e:  # noqa: BLE001
                err += 1
                if first is None:
                    first = f"{type(e).__name__}: {e}"[:300]
                if err >= 20 and err > ok:
                    stop.set()  # phase is broken; don't spin for the whole duration
            i += 1
        ends[t] = pc()
        with lock:
            res["ok"] += ok
            res["err"] += err
            if res["first"] is None:
                res["first"] = first

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(nthreads)]
    for th in threads:
        th.start()
    t0_box[0] = time.perf_counter()
    start.wait()
    try:
        for th in threads:
            while th.is_alive():
                th.join(0.2)  # short joins so Ctrl-C is delivered promptly
    except BaseException:
        stop.set()
        raise
    elapsed = max(ends) - t0_box[0]
    all_lat = [x for lst in lats for x in lst]
    return Phase(res["ok"], res["err"], elapsed, res["first"], all_lat)


def make_client(srv: Server, threads: int):
    import boto3
    from botocore.config import Config

    cfg = Config(
        signature_version="s3v4",
        s3={"addressing_style": "path"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        max_pool_connections=max(32, threads),
        connect_timeout=5,
        read_timeout=60,
        retries={"total_max_attempts": 1},
    )
    return boto3.client(
        "s3", endpoint_url=f"http://127.0.0.1:{srv.port}", region_name="us-east-1",
        aws_access_key_id=srv.access_key, aws_secret_access_key=srv.secret_key, config=cfg,
    )


WRK_RE = {
    "rps": re.compile(r"Requests/sec:\s+([\d.]+)"),
    "total": re.compile(r"(\d+) requests in ([\d.]+)(us|ms|s|m)"),
    "non2xx": re.compile(r"Non-2xx or 3xx responses:\s+(\d+)"),
    "sockerr": re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)"),
}


def run_wrk(url: str, seconds: int, conns: int = 32) -> dict[str, Any]:
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", url]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=seconds + 60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    r: dict[str, Any] = {"raw_tail": out[-400:]}
    m = WRK_RE["rps"].search(out)
    r["rps"] = float(m.group(1)) if m else None
    m = WRK_RE["total"].search(out)
    r["requests"] = int(m.group(1)) if m else None
    m = WRK_RE["non2xx"].search(out)
    r["non2xx"] = int(m.group(1)) if m else 0
    m = WRK_RE["sockerr"].search(out)
    r["socket_errors"] = sum(int(x) for x in m.groups()) if m else 0
    return r


# --------------------------------------------------------------------------
# the benchmark for one server
# --------------------------------------------------------------------------


class Plan:
    def __init__(self, quick: bool, runs: int | None):
        self.quick = quick
        self.runs = runs if runs else (1 if quick else 3)
        self.duration = None if quick else 4.0          # 4 KiB phases: seconds each
        self.counts = {"put_1t": 300, "put_8t": 800, "get_1t": 500, "get_8t": 800} if quick else None
        self.phase_cap = 30.0 if quick else 20.0           # hard bound per 4 KiB phase
        self.wrk_seconds = 2 if quick else 5
        self.big_bytes = (64 if quick else 256) * 1024 * 1024
        self.list_keys = 2000 if quick else 10_000
        self.get_pool = 64                                 # distinct 4 KiB objects read back

    def describe(self) -> dict[str, Any]:
        return {
            "quick": self.quick, "runs": self.runs,
            "small_object_bytes": SMALL,
            "phase_seconds": self.duration, "phase_counts": self.counts,
            "wrk": f"wrk -t1 -c32 -d{self.wrk_seconds}s <presigned GET url>",
            "big_object_bytes": self.big_bytes, "list_keys": self.list_keys,
            "mb": "10^6 bytes",
        }


def bench_server(srv: Server, plan: Plan, big_src: Path, big_sha: str) -> dict[str, Any]:
    from boto3.s3.transfer import TransferConfig

    raw: dict[str, Any] = {}
    errors: dict[str, Any] = {}
    c = make_client(srv, 8)

    # readiness for real: the bucket must be creatable (weed's filer may lag its S3 port)
    deadline = time.monotonic() + 30
    while True:
        try:
            c.create_bucket(Bucket=BUCKET)
            break
        except Exception as e:  # noqa: BLE001
            code = getattr(e, "response", {}).get("Error", {}).get("Code")
            if code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                break
            if time.monotonic() > deadline:
                raise ServerError(f"create_bucket failed: {e}") from e
            time.sleep(0.3)

    body = os.urandom(SMALL)
    for i in range(plan.get_pool):
        c.put_object(Bucket=BUCKET, Key=f"g4k/{i:04d}", Body=body)
    got = c.get_object(Bucket=BUCKET, Key="g4k/0000")["Body"].read()
    if got != body:
        raise ServerError("4 KiB round trip returned different bytes")
    # untimed: the client may delete too (for orgmem-agent, its policy must allow it)
    c.put_object(Bucket=BUCKET, Key="probe/delete", Body=b"x")
    c.delete_object(Bucket=BUCKET, Key="probe/delete")

    gen = [0]

    def put_op(t: int, i: int) -> None:
        c.put_object(Bucket=BUCKET, Key=f"p4k/{gen[0]}/{t}/{i}", Body=body)

    def get_op(t: int, i: int) -> None:
        r = c.get_object(Bucket=BUCKET, Key=f"g4k/{(t * 7 + i) % plan.get_pool:04d}")
        n = len(r["Body"].read())
        if n != SMALL:
            raise ValueError(f"short read {n}")

    # ---- 4 KiB boto3 phases (+ server CPU per request) ----
    phases = [("put_1t", put_op, 1), ("put_8t", put_op, 8), ("get_1t", get_op, 1), ("get_8t", get_op, 8)]
    for name, _, _ in phases:
        raw[name] = {"ops": [], "cpu_ms_per_req": [], "errors": 0}
    latencies: list[float] = []
    for r in range(plan.runs):
        for name, op, nt in phases:
            gen[0] += 1
            cpu0 = tree_cpu_ms(srv.pid)
            ph = run_load(nt, op, count=plan.counts[name] if plan.counts else None,
                          duration=plan.duration, cap=plan.phase_cap,
                          record_latency=(name == "get_1t"))
            cpu1 = tree_cpu_ms(srv.pid)
            d = raw[name]
            d["ops"].append(ph.ops)
            d["cpu_ms_per_req"].append((cpu1 - cpu0) / ph.ok if ph.ok else None)
            d["errors"] += ph.errors
            if ph.first_error:
                errors.setdefault(name, ph.first_error)
            if name == "get_1t":
                latencies.extend(ph.latencies)
            log(f"{srv.name}: run {r + 1} {name}: {ph.ok} ok / {ph.errors} err in "
                f"{ph.elapsed:.2f}s = {ph.ops or 0:.0f} ops/s, "
                f"cpu {((cpu1 - cpu0) / ph.ok if ph.ok else 0):.3f} ms/req")

    # ---- wrk on a presigned GET URL ----
    raw["wrk"] = {"rps": [], "cpu_ms_per_req": [], "non2xx": 0, "socket_errors": 0}
    if shutil.which("wrk") is None:
        errors["wrk"] = "wrk not installed"
    else:
        url = c.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "g4k/0000"},
                                       ExpiresIn=3600)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                ok = resp.status == 200 and len(resp.read()) == SMALL
        except Exception as e:  # noqa: BLE001
            ok = False
            errors["wrk"] = f"presigned URL check failed: {e}"
        if ok:
            for r in range(plan.runs):
                cpu0 = tree_cpu_ms(srv.pid)
                w = run_wrk(url, plan.wrk_seconds)
                cpu1 = tree_cpu_ms(srv.pid)
                bad = w["non2xx"] + w["socket_errors"]
                raw["wrk"]["non2xx"] += w["non2xx"]
                raw["wrk"]["socket_errors"] += w["socket_errors"]
                n = w["requests"] or 0
                good_rps = w["rps"] * (n - w["non2xx"]) / n if (w["rps"] and n) else None
                raw["wrk"]["rps"].append(good_rps)
                raw["wrk"]["cpu_ms_per_req"].append((cpu1 - cpu0) / n if n else None)
                if bad:
                    errors.setdefault("wrk", f"{w['non2xx']} non-2xx, {w['socket_errors']} socket errors")
                if w["rps"] is None:
                    errors.setdefault("wrk", "could not parse wrk output: " + w["raw_tail"])
                log(f"{srv.name}: run {r + 1} wrk: {w['rps']} req/s ({n} requests, {bad} bad), "
                    f"cpu {((cpu1 - cpu0) / n if n else 0):.3f} ms/req")

    # ---- 256 MiB object: upload_file / download_file ----
    raw["big"] = {"put_MBps": [], "get_MBps": [], "put_mem_MB": [], "get_mem_MB": []}
    tc = TransferConfig()
    dst = srv.dir / "download.bin"
    for r in range(plan.runs):
        try:
            with MemWatch(srv.pid) as mw:
                t0 = time.perf_counter()
                c.upload_file(str(big_src), BUCKET, "big/object", Config=tc)
                dt = time.perf_counter() - t0
            raw["big"]["put_MBps"].append(plan.big_bytes / MB / dt)
            raw["big"]["put_mem_MB"].append(mw.growth / MB)
            with MemWatch(srv.pid) as mw:
                t0 = time.perf_counter()
                c.download_file(BUCKET, "big/object", str(dst), Config=tc)
                dt = time.perf_counter() - t0
            size = dst.stat().st_size
            if size != plan.big_bytes:
                raise ValueError(f"downloaded {size} bytes, expected {plan.big_bytes}")
            if r == 0 and sha256_file(dst) != big_sha:
                raise ValueError("downloaded object differs from the uploaded file")
            raw["big"]["get_MBps"].append(plan.big_bytes / MB / dt)
            raw["big"]["get_mem_MB"].append(mw.growth / MB)
            log(f"{srv.name}: run {r + 1} big: PUT {raw['big']['put_MBps'][-1]:.1f} MB/s "
                f"(+{raw['big']['put_mem_MB'][-1]:.1f} MB RSS), GET {raw['big']['get_MBps'][-1]:.1f} MB/s "
                f"(+{raw['big']['get_mem_MB'][-1]:.1f} MB RSS)")
        except Exception as e:  # noqa: BLE001
            errors.setdefault("big", f"{type(e).__name__}: {e}"[:300])
            log(f"{srv.name}: big object failed: {e}")
            break
        finally:
            dst.unlink(missing_ok=True)

    # ---- LIST of N keys ----
    raw["list"] = {"seconds": [], "upload_errors": 0}
    n = plan.list_keys
    lbody = b"k" * 16
    ph = run_load(8, lambda t, i: c.put_object(Bucket=BUCKET, Key=f"list/{t}/{i:06d}", Body=lbody),
                  count=n, cap=180)
    raw["list"]["upload_errors"] = ph.errors
    if ph.errors:
        errors.setdefault("list", f"upload: {ph.errors} errors, first: {ph.first_error}")
    log(f"{srv.name}: uploaded {ph.ok} list keys in {ph.elapsed:.1f}s (untimed)")
    if ph.ok == n:
        pag = c.get_paginator("list_objects_v2")
        for r in range(plan.runs):
            try:
                t0 = time.perf_counter()
                cnt = 0
                for page in pag.paginate(Bucket=BUCKET, Prefix="list/"):
                    cnt += len(page.get("Contents", []))
                dt = time.perf_counter() - t0
                if cnt != n:
                    raise ValueError(f"listed {cnt} keys, expected {n}")
                raw["list"]["seconds"].append(dt)
                log(f"{srv.name}: run {r + 1} list {n}: {dt:.3f}s")
            except Exception as e:  # noqa: BLE001
                errors.setdefault("list", f"{type(e).__name__}: {e}"[:300])
                break

    # ---- summarise ----
    m: dict[str, Any] = {}
    for name in ("put_1t", "put_8t", "get_1t", "get_8t"):
        m[f"{name}_ops"] = median(raw[name]["ops"])
        m[f"cpu_{name}_ms"] = median(raw[name]["cpu_ms_per_req"])
    m["get_p50_ms"] = (percentile(latencies, 50) or 0) * 1000 if latencies else None
    m["get_p99_ms"] = (percentile(latencies, 99) or 0) * 1000 if latencies else None
    m["latency_samples"] = len(latencies)
    m["wrk_rps"] = median(raw["wrk"]["rps"])
    m["cpu_wrk_ms"] = median(raw["wrk"]["cpu_ms_per_req"])
    m["big_put_MBps"] = median(raw["big"]["put_MBps"])
    m["big_get_MBps"] = median(raw["big"]["get_MBps"])
    m["big_put_mem_MB"] = max(raw["big"]["put_mem_MB"]) if raw["big"]["put_mem_MB"] else None
    m["big_get_mem_MB"] = max(raw["big"]["get_mem_MB"]) if raw["big"]["get_mem_MB"] else None
    m["list_s"] = median(raw["list"]["seconds"])
    m["errors"] = (sum(raw[p]["errors"] for p in ("put_1t", "put_8t", "get_1t", "get_8t"))
                   + raw["wrk"]["non2xx"] + raw["wrk"]["socket_errors"]
                   + raw["list"]["upload_errors"] + (1 if "big" in errors else 0)
                   + (1 if "list" in errors and not raw["list"]["upload_errors"] else 0))
    return {"metrics": m, "raw": raw, "errors": errors}


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def make_big_file(path: Path, size: int) -> str:
    h = hashlib.sha256()
    chunk = 8 << 20
    with open(path, "wb") as f:
        left = size
        while left:
            b = os.urandom(min(chunk, left))
            h.update(b)
            f.write(b)
            left -= len(b)
    return h.hexdigest()


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------

# key, label, "hi"/"lo" = which direction is better, number format
ROWS = [
    ("put_1t_ops", "4KiB PUT ops/s, boto3 1 thread", "hi", "{:.0f}"),
    ("put_8t_ops", "4KiB PUT ops/s, boto3 8 threads", "hi", "{:.0f}"),
    ("get_1t_ops", "4KiB GET ops/s, boto3 1 thread", "hi", "{:.0f}"),
    ("get_8t_ops", "4KiB GET ops/s, boto3 8 threads", "hi", "{:.0f}"),
    ("get_p50_ms", "4KiB GET p50 ms, 1 thread", "lo", "{:.2f}"),
    ("get_p99_ms", "4KiB GET p99 ms, 1 thread", "lo", "{:.2f}"),
    ("wrk_rps", "4KiB GET req/s, wrk -c32 presigned", "hi", "{:.0f}"),
    ("cpu_put_1t_ms", "server CPU ms/req, PUT 1 thread", "lo", "{:.3f}"),
    ("cpu_put_8t_ms", "server CPU ms/req, PUT 8 threads", "lo", "{:.3f}"),
    ("cpu_get_1t_ms", "server CPU ms/req, GET 1 thread", "lo", "{:.3f}"),
    ("cpu_get_8t_ms", "server CPU ms/req, GET 8 threads", "lo", "{:.3f}"),
    ("cpu_wrk_ms", "server CPU ms/req, wrk GET", "lo", "{:.3f}"),
    ("big_put_MBps", "{big} PUT MB/s (upload_file)", "hi", "{:.1f}"),
    ("big_get_MBps", "{big} GET MB/s (download_file)", "hi", "{:.1f}"),
    ("big_put_mem_MB", "server RSS growth MB, {big} PUT", "lo", "{:.1f}"),
    ("big_get_mem_MB", "server RSS growth MB, {big} GET", "lo", "{:.1f}"),
    ("list_s", "LIST {nkeys} keys, seconds", "lo", "{:.3f}"),
    ("errors", "errors (all phases)", "lo", "{:.0f}"),
]


def ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return a / b
    return None


def best_python_peer(results: dict[str, Any], key: str, better: str) -> float | None:
    vals = [results[p]["metrics"].get(key) for p in PYTHON_PEERS
            if p in results and results[p].get("metrics")]
    vals = [v for v in vals if isinstance(v, (int, float))]
    if not vals:
        return None
    return max(vals) if better == "hi" else min(vals)


# ratio columns of the table: (JSON key, column header)
RATIO_COLUMNS = [
    ("orgmem_over_seaweedfs", "orgmem/SeaweedFS"),
    ("orgmem_over_best_python_peer", "orgmem/best-Py-peer"),
    ("orgmem_agent_over_orgmem", "orgmem-agent/orgmem"),
]


def compute_ratios(results: dict[str, Any]) -> dict[str, Any]:
    om = results.get("orgmem", {}).get("metrics") or {}
    ag = results.get("orgmem-agent", {}).get("metrics") or {}
    sw = results.get("seaweedfs", {}).get("metrics") or {}
    out: dict[str, dict[str, Any]] = {k: {} for k, _ in RATIO_COLUMNS}
    for key, _, better, _ in ROWS:
        if key == "errors":
            continue
        out["orgmem_over_seaweedfs"][key] = ratio(om.get(key), sw.get(key))
        out["orgmem_over_best_python_peer"][key] = ratio(om.get(key), best_python_peer(results, key, better))
        # the cost of being a non-root principal: authn lookup + policy evaluation per request
        out["orgmem_agent_over_orgmem"][key] = ratio(ag.get(key), om.get(key))
    return out


def evaluate_targets(results: dict[str, Any], plan: Plan) -> list[dict[str, Any]]:
    om = results.get("orgmem", {}).get("metrics") or {}
    sw = results.get("seaweedfs", {}).get("metrics") or {}
    peers = {p: results[p]["metrics"] for p in PYTHON_PEERS if results.get(p, {}).get("metrics")}
    t: list[dict[str, Any]] = []

    def add(name: str, value: Any, limit: Any, ok: bool | None, note: str = "") -> None:
        status = "N/A" if ok is None else ("PASS" if ok else "FAIL")
        t.append({"target": name, "value": value, "limit": limit, "status": status, "note": note})

    for k in ("put_1t_ops", "put_8t_ops", "get_1t_ops", "get_8t_ops"):
        r = ratio(om.get(k), sw.get(k))
        add(f"boto3 {k} >= 0.9x SeaweedFS", r, 0.9, None if r is None else r >= 0.9)
    r = ratio(om.get("wrk_rps"), sw.get("wrk_rps"))
    add("wrk 4KiB GET req/s >= 0.5x SeaweedFS", r, 0.5, None if r is None else r >= 0.5)
    for k in ("cpu_get_1t_ms", "cpu_get_8t_ms", "cpu_wrk_ms"):
        v = om.get(k)
        pv = {p: m.get(k) for p, m in peers.items() if isinstance(m.get(k), (int, float))}
        ok = None if v is None or not pv else all(v < x for x in pv.values())
        add(f"{k} < every Python peer ({', '.join(pv) or 'none ran'})", v,
            min(pv.values()) if pv else None, ok)
    quick = plan.big_bytes != 256 * 1024 * 1024
    note = f"measured with {plan.big_bytes >> 20} MiB (--quick)" if quick else ""
    v = om.get("big_get_MBps")
    add("big GET >= 500 MB/s", v, 500, None if v is None else v >= 500, note)
    v = om.get("big_put_MBps")
    add("big PUT >= 150 MB/s", v, 150, None if v is None else v >= 150, note)
    for k in ("big_put_mem_MB", "big_get_mem_MB"):
        v = om.get(k)
        add(f"{k} < 64 MB", v, 64, None if v is None else v < 64, note)
    return t


def fmt(v: Any, f: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return f.format(v)


def render_table(results: dict[str, Any], order: list[str], ratios: dict[str, Any],
                 targets: list[dict[str, Any]], plan: Plan) -> str:
    big = f"{plan.big_bytes >> 20}MiB"
    header = ["metric (+ higher / - lower is better)", *order, *(h for _, h in RATIO_COLUMNS)]
    blank = [""] * len(RATIO_COLUMNS)
    lines: list[list[str]] = []
    lines.append(["durability", *[results[s].get("durability", "-") for s in order], *blank])
    lines.append(["status", *[("ok" if results[s].get("metrics") else "FAILED") for s in order], *blank])
    for key, label, better, f in ROWS:
        lab = label.format(big=big, nkeys=plan.list_keys) + (" (+)" if better == "hi" else " (-)")
        row = [lab]
        for s in order:
            m = results[s].get("metrics") or {}
            row.append(fmt(m.get(key), f))
        row += [fmt(ratios[k].get(key), "{:.2f}x") for k, _ in RATIO_COLUMNS]
        lines.append(row)
    widths = [max(len(header[i]), *(len(r[i]) for r in lines)) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cells))

    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in lines]
    if plan.runs > 1:
        out.append(f"(ops/s, req/s, MB/s, CPU and LIST: median of {plan.runs} runs; "
                   f"RSS growth: max of {plan.runs} runs; latency: all 1-thread GET samples)")
    if "orgmem-agent" in order:
        out.append(f"(orgmem-agent: orgmem measured with the keys of agent {AGENT_NAME} (2 teams, "
                   f"{' + '.join(AGENT_POLICIES)}); orgmem-agent/orgmem shows the cost of policy "
                   "evaluation: below 1x on (+) rows / above 1x on (-) rows is overhead)")
    out.append("")
    out.append("targets (orgmem):")
    tw = max(len(t["target"]) for t in targets)
    for t in targets:
        v = t["value"]
        vs = "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
        out.append(f"  {t['status']:<4}  {t['target']:<{tw}}  value={vs}  {t['note']}".rstrip())
    errs = [(s, results[s].get("error") or results[s].get("errors")) for s in order]
    errs = [(s, e) for s, e in errs if e]
    if errs:
        out.append("")
        out.append("errors:")
        for s, e in errs:
            out.append(f"  {s}: {json.dumps(e)[:600]}")
    return "\n".join(out)


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default=",".join(ALL_SERVERS),
                    help=f"comma-separated subset of {','.join(ALL_SERVERS)} (default: all)")
    ap.add_argument("--quick", action="store_true",
                    help="fixed small op counts, 64 MiB object, 2000 LIST keys, 1 run (~2 min)")
    ap.add_argument("--runs", type=int, default=None, help="runs per measurement (default 3, --quick 1)")
    ap.add_argument("--bin-dir", type=Path, default=VENV_BIN,
                    help=f"directory with orgmem, moto_server, nanio, weed (default {VENV_BIN})")
    ap.add_argument("--tmp", type=Path, default=None,
                    help="parent for the temp dirs (default: system temp dir; use a real disk, not tmpfs)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (server data + logs)")
    ap.add_argument("--json-out", type=Path, default=RESULTS_JSON)
    args = ap.parse_args(argv)

    order = [s.strip() for s in args.servers.split(",") if s.strip()]
    bad = [s for s in order if s not in ALL_SERVERS]
    if bad or not order:
        ap.error(f"unknown server(s) {bad}; choose from {ALL_SERVERS}")
    plan = Plan(args.quick, args.runs)

    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if inherited as ignored
    base_tmp = Path(tempfile.mkdtemp(prefix="orgmem-s3bench-", dir=args.tmp))
    results: dict[str, Any] = {}
    t_start = time.monotonic()
    interrupted = False
    try:
        big_src = base_tmp / "big-source.bin"
        log(f"writing {plan.big_bytes >> 20} MiB source file in {base_tmp}")
        big_sha = make_big_file(big_src, plan.big_bytes)
        for name in order:
            srv = Server(name, args.bin_dir, base_tmp)
            entry: dict[str, Any] = {"durability": srv.durability}
            results[name] = entry
            t0 = time.monotonic()
            try:
                srv.start()
                entry["command"] = srv.argv
                # Secrets never reach output, not even the benchmark's throwaway ones.
                entry["env"] = {k: ("<redacted>" if "SECRET" in k else v) for k, v in srv.env_shown.items()}
                if name == "orgmem-agent":
                    entry["agent"] = provision_agent(srv)
                entry["credentials"] = ("any (moto does not check signatures)" if name == "moto"
                                        else {"access_key": srv.access_key, "secret_key": "<redacted>"})
                if name == "orgmem-agent":
                    entry["credentials"].update(principal=AGENT_NAME, created_by="root (ORGMEM_ROOT_*)")
                entry.update(bench_server(srv, plan, big_src, big_sha))
                if name == "orgmem-agent":
                    try:
                        entry["agent"]["audit_check"] = check_agent_audit(srv)
                    except Exception as e:  # noqa: BLE001 - keep the numbers, report the problem
                        entry.setdefault("errors", {})["audit_check"] = f"{type(e).__name__}: {e}"[:600]
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 - one broken server must not stop the others
                entry["error"] = f"{type(e).__name__}: {e}"[:2000]
                entry.setdefault("command", srv.argv)
                log(f"{name}: FAILED: {entry['error']}")
            finally:
                srv.stop()
                srv.cleanup(args.keep)
                entry["wall_seconds"] = round(time.monotonic() - t0, 1)
                log(f"{name}: done in {entry['wall_seconds']}s")
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted; stopping servers")
    finally:
        stop_all_servers()
        if not args.keep:
            shutil.rmtree(base_tmp, ignore_errors=True)
        else:
            log(f"kept {base_tmp}")
    if interrupted:
        return 130

    ratios = compute_ratios(results)
    targets = evaluate_targets(results, plan)
    print(render_table(results, order, ratios, targets, plan))
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(args.tmp or tempfile.gettempdir())],
                        capture_output=True, text=True).stdout.strip()
    doc = {
        "bench": "s3_bench", "version": 1,
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                 "tmp_fs": fs},
        "plan": plan.describe(),
        "servers": order,
        "results": results,
        "ratios": ratios,
        "targets": targets,
        "wall_seconds": round(time.monotonic() - t_start, 1),
    }
    line = json.dumps(doc, separators=(",", ":"), default=str)
    print("BENCH_JSON " + line, flush=True)
    try:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        log(f"wrote {args.json_out}")
    except OSError as e:
        log(f"could not write {args.json_out}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
