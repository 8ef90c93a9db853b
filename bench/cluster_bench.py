#!/usr/bin/env python3
"""Cluster benchmark: gateway replicas behind nginx on a shared SeaweedFS, with one and two replicas.

Every configuration is a fresh ``deploy/local-cluster.sh`` (SeaweedFS ``weed mini``, N
``orgmem serve`` replicas sharing one bucket, nginx in front), started in a temporary directory
and destroyed afterwards (also on errors and Ctrl-C):

- ``direct``: one replica, the clients straight at the gateway: the baseline without a load balancer;
- ``nginx x1``: the same replica behind nginx;
- ``nginx x2``: two replicas behind nginx (round robin).

What is measured in each, one phase after another:

1. 4 KiB objects: PUT and GET ops/s from 16 client threads (each with its own keep-alive
   ``http.client`` connection, the bearer form of authentication over loopback so the client
   spends little CPU; GETs read 64 objects written before the phase).
2. Large objects: 2 streams at once, each a PUT (boto3 ``upload_file``, 16 MiB parts, 4 threads)
   then a GET (``download_fileobj`` into a sink) of a 256 MiB object (``--quick``: 32 MiB):
   aggregate MB/s (10^6 bytes). Parts and ranges of one object land on every replica.
3. Acknowledged events/s: ``POST /v1/events`` with 100 events per request (NDJSON) from 8
   client threads; an answer means the events are durable in the bucket. Background compaction
   (every 5 s, in whichever replica holds the lease) runs meanwhile, as in production.

CPU: for each phase, the CPU seconds of every gateway process, of nginx (master and workers), of
SeaweedFS and of this client process, from ``/proc``; per request they give the cost of one
request on each tier. On 2 cores the client, nginx, SeaweedFS and the gateways share the
machine, so two replicas cannot show scaling here, only overhead; the table's last rows
extrapolate instead: requests/s one gateway core can serve = 1000 / gateway CPU ms per request.

Usage:
    .venv/bin/python bench/cluster_bench.py           # full run (~4 min on 2 cores)
    .venv/bin/python bench/cluster_bench.py --quick   # 32 MiB objects, shorter phases (~1.5 min)

Output: an aligned text table, one ``BENCH_JSON {...}`` line on stdout, and the same JSON in
bench/results/cluster_bench.json. Needs nginx (``apt-get install nginx``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import http.client
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import s3_bench as sb  # noqa: E402  /proc CPU helpers, run_load, median
from s3_bench import log, median, run_load  # noqa: E402

SCRIPT = REPO / "deploy" / "local-cluster.sh"
RESULTS_JSON = HERE / "results" / "cluster_bench.json"
BUCKET = "bench"
SMALL = 4096
MB = 1_000_000
MIB = 1024 * 1024
S3_CLIENTS = 16
EVENT_CLIENTS = 8
EVENTS_PER_REQUEST = 100
BIG_STREAMS = 2
CONFIGS = ("direct", "nginx x1", "nginx x2")


class Plan:
    def __init__(self, args: argparse.Namespace) -> None:
        self.quick = args.quick
        self.runs = args.runs or (1 if args.quick else 2)
        self.seconds = 2.0 if args.quick else 4.0
        self.big = (32 if args.quick else 256) * MIB

    def describe(self) -> dict[str, Any]:
        return {"quick": self.quick, "runs": self.runs, "phase_seconds": self.seconds,
                "small_object_bytes": SMALL, "s3_clients": S3_CLIENTS,
                "big_object_bytes": self.big, "big_streams": BIG_STREAMS, "big_part_bytes": 16 * MIB,
                "event_clients": EVENT_CLIENTS, "events_per_request": EVENTS_PER_REQUEST,
                "auth": "bearer (loopback) for 4 KiB and events; SigV4 (boto3) for large objects",
                "mb": "10^6 bytes"}


# -- the cluster --------------------------------------------------------------------------------


class Cluster:
    """deploy/local-cluster.sh in a directory of its own, with ``replicas`` gateways."""

    live: list[Cluster] = []

    def __init__(self, base: Path, replicas: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"cluster{replicas}-", dir=base)) / "state"
        self.replicas = replicas
        self.state: dict[str, str] = {}
        self.keys: tuple[str, str] = ("", "")

    def sh(self, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ORGMEM_"))}
        env.update(ORGMEM_CLUSTER_DIR=str(self.dir), ORGMEM_CLUSTER_REPLICAS=str(self.replicas),
                   ORGMEM_CLUSTER_BIN=str(Path(sys.executable).parent))
        proc = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"local-cluster.sh {' '.join(args)}: {proc.stderr.strip()[-1500:]}")
        return proc.stdout

    def start(self) -> Cluster:
        Cluster.live.append(self)
        log(f"starting a cluster with {self.replicas} replica(s) in {self.dir}")
        self.sh("start")
        self.state = _env_file(self.dir / "cluster.env")
        root = _env_file(self.dir / "secrets" / "root.env")
        self.keys = (root["ORGMEM_ROOT_ACCESS_KEY"], root["ORGMEM_ROOT_SECRET_KEY"])
        return self

    def destroy(self) -> None:
        if self in Cluster.live:
            Cluster.live.remove(self)
        try:
            self.sh("destroy")
        finally:
            shutil.rmtree(self.dir.parent, ignore_errors=True)

    def port(self, which: str) -> int:
        return int(self.state["LB_PORT" if which == "lb" else f"GATEWAY_{which}_PORT"])

    def pids(self) -> dict[str, list[int]]:
        def pid(rel: str) -> int:
            return int((self.dir / rel).read_text())
        return {"gateway": [pid(f"gateway-{n}/gateway.pid") for n in range(1, self.replicas + 1)],
                "nginx": [pid("nginx/nginx.pid")], "seaweedfs": [pid("seaweedfs/weed.pid")]}


def _env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k] = v.strip('"')
    return out


# -- clients ------------------------------------------------------------------------------------


class Conns:
    """One keep-alive connection per thread; reopened after an error."""

    def __init__(self, port: int, keys: tuple[str, str]) -> None:
        self.port = port
        self.auth = f"Bearer {keys[0]}:{keys[1]}"
        self.local = threading.local()

    def request(self, method: str, path: str, body: bytes | None = None,
                content_type: str | None = None) -> bytes:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        headers = {"Authorization": self.auth}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self.local.conn = None
            raise
        if resp.status >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {resp.status} {data[:200]!r}")
        return data


def boto(port: int, keys: tuple[str, str]):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                        aws_access_key_id=keys[0], aws_secret_access_key=keys[1],
                        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1},
                                      max_pool_connections=32, read_timeout=300,
                                      request_checksum_calculation="when_required",
                                      response_checksum_validation="when_required"))


class Sink:
    """Where large GETs go: counts bytes, keeps none. Seekable, so s3transfer writes the
    ranges as they come (with a stream it would queue out-of-order ranges, and it stalls)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.pos = 0

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def write(self, data: bytes) -> int:
        self.bytes += len(data)
        self.pos += len(data)
        return len(data)


# -- measuring ----------------------------------------------------------------------------------


def cpu_of(pids: dict[str, list[int]]) -> dict[str, float]:
    out = {tier: sum(sb.tree_cpu_ms(p) for p in group) for tier, group in pids.items()}
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out["client"] = (ru.ru_utime + ru.ru_stime) * 1000.0
    return out


def measured(pids: dict[str, list[int]], run: Callable[[], tuple[int, float]]) -> dict[str, Any]:
    """Run a phase; its count and seconds, and CPU ms per counted unit on every tier."""
    before = cpu_of(pids)
    count, seconds = run()
    after = cpu_of(pids)
    out: dict[str, Any] = {"count": count, "seconds": round(seconds, 3)}
    for tier in before:
        spent = after[tier] - before[tier]
        out[f"{tier}_cpu_ms"] = round(spent, 1)
        out[f"{tier}_cpu_ms_per"] = spent / count if count else None
    out["rate"] = count / seconds if count and seconds > 0 else None
    return out


def small_phases(port: int, keys: tuple[str, str], pids: dict, plan: Plan, tag: str) -> dict[str, Any]:
    conns = Conns(port, keys)
    body = os.urandom(SMALL)
    for i in range(64):
        conns.request("PUT", f"/{BUCKET}/get/{i:04d}", body)

    def phase(op: Callable[[int, int], None]) -> Callable[[], tuple[int, float]]:
        def go() -> tuple[int, float]:
            result = run_load(S3_CLIENTS, op, duration=plan.seconds, cap=plan.seconds * 5)
            if result.errors:
                raise RuntimeError(f"{result.errors} errors, first: {result.first_error}")
            return result.ok, result.elapsed
        return go

    put = measured(pids, phase(lambda t, i: conns.request("PUT", f"/{BUCKET}/put/{tag}/{t}/{i}", body)))
    get = measured(pids, phase(lambda t, i: conns.request("GET", f"/{BUCKET}/get/{(t * 7 + i) % 64:04d}")))
    return {"put": put, "get": get}


def big_phases(port: int, keys: tuple[str, str], pids: dict, plan: Plan, src: Path,
               tag: str) -> dict[str, Any]:
    from boto3.s3.transfer import TransferConfig

    client = boto(port, keys)
    cfg = TransferConfig(multipart_threshold=16 * MIB, multipart_chunksize=16 * MIB, max_concurrency=4)

    def parallel(fn: Callable[[int], None]) -> tuple[int, float]:
        errors: list[BaseException] = []

        def guarded(i: int) -> None:
            try:
                fn(i)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(BIG_STREAMS)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.5)  # short joins: Ctrl-C / SIGTERM get through
        if errors:
            raise errors[0]
        return BIG_STREAMS * plan.big, time.perf_counter() - t0

    def put(i: int) -> None:
        client.upload_file(str(src), BUCKET, f"big/{tag}/{i}", Config=cfg)

    def get(i: int) -> None:
        sink = Sink()
        client.download_fileobj(BUCKET, f"big/{tag}/{i}", sink, Config=cfg)
        if sink.bytes != plan.big:
            raise RuntimeError(f"GET big/{tag}/{i}: {sink.bytes} bytes, not {plan.big}")

    out = {"put": measured(pids, lambda: parallel(put)), "get": measured(pids, lambda: parallel(get))}
    for phase in out.values():
        phase["MBps"] = phase["count"] / MB / phase["seconds"]
    return out


def event_phase(port: int, keys: tuple[str, str], pids: dict, plan: Plan) -> dict[str, Any]:
    conns = Conns(port, keys)
    bodies = []
    for b in range(40):
        lines = [json.dumps({"session": f"bench-{b % 8}", "kind": "tool_result", "tool": "pytest",
                             "content": f"collected {b * 100 + k} items; {k} passed in 0.{k:02d}s "
                                        + "lorem ipsum dolor sit amet " * 4})
                 for k in range(EVENTS_PER_REQUEST)]
        bodies.append(("\n".join(lines) + "\n").encode())

    def op(t: int, i: int) -> None:
        answer = json.loads(conns.request("POST", "/v1/events", bodies[(t * 5 + i) % len(bodies)],
                                          "application/x-ndjson"))
        if answer.get("count") != EVENTS_PER_REQUEST:
            raise RuntimeError(f"POST /v1/events answered {answer}")

    def go() -> tuple[int, float]:
        result = run_load(EVENT_CLIENTS, op, duration=plan.seconds, cap=plan.seconds * 5)
        if result.errors:
            raise RuntimeError(f"{result.errors} errors, first: {result.first_error}")
        return result.ok, result.elapsed

    out = measured(pids, go)
    out["events_per_s"] = out["rate"] * EVENTS_PER_REQUEST if out["rate"] else None
    return out


def settle(cluster: Cluster, limit: float = 180.0) -> float:
    """Let the background work a phase left behind finish before the next phase is measured:
    compact the log, and wait until the index writer has read all of it. Seconds it took."""
    t0 = time.monotonic()
    conns = Conns(cluster.port("lb"), cluster.keys)
    conns.request("POST", "/v1/bio/compact", b"")
    while time.monotonic() - t0 < limit:
        for n in range(1, cluster.replicas + 1):
            status = json.loads(Conns(cluster.port(str(n)), cluster.keys).request("GET", "/v1/index/status"))
            if status["role"] == "writer" and status["lag_objects"] == 0:
                time.sleep(1.0)  # the last commit and snapshot
                return time.monotonic() - t0
        time.sleep(0.5)
    log(f"  the index did not catch up within {limit:.0f} s; measuring anyway")
    return time.monotonic() - t0


def bench_config(cluster: Cluster, target: str, plan: Plan, src: Path, run: int) -> dict[str, Any]:
    """All phases against ``target`` ("lb" or a replica number) of a running cluster, each
    started once the background work of the one before is done (see :func:`settle`)."""
    port = cluster.port(target)
    pids = cluster.pids()
    tag = f"{target}-{run}"
    settle(cluster)
    for pid in pids["gateway"]:
        sb.reset_hwm(pid)
    small = small_phases(port, cluster.keys, pids, plan, tag)
    settle(cluster)
    big = big_phases(port, cluster.keys, pids, plan, src, tag)
    settle(cluster)
    events = event_phase(port, cluster.keys, pids, plan)
    out = {"small": small, "big": big, "events": events, "settle_after_seconds": round(settle(cluster), 1),
           # the largest resident size of one gateway during the phases (VmHWM, reset before them)
           "gateway_peak_rss_MB": max(sb.tree_hwm_bytes(pid) for pid in pids["gateway"]) / MB}
    log(f"  {target} run {run + 1}: PUT {out['small']['put']['rate']:.0f}/s, GET "
        f"{out['small']['get']['rate']:.0f}/s, big PUT {out['big']['put']['MBps']:.0f} MB/s, GET "
        f"{out['big']['get']['MBps']:.0f} MB/s, {out['events']['events_per_s']:.0f} events/s")
    return out


# -- summary and table --------------------------------------------------------------------------

#: (key, label, path into a run's result, format)
METRICS = [
    ("put_ops", "4 KiB PUT ops/s (+)", ("small", "put", "rate"), "{:,.0f}"),
    ("get_ops", "4 KiB GET ops/s (+)", ("small", "get", "rate"), "{:,.0f}"),
    ("big_put_MBps", "{big} PUT MB/s, 2 streams (+)", ("big", "put", "MBps"), "{:,.0f}"),
    ("big_get_MBps", "{big} GET MB/s, 2 streams (+)", ("big", "get", "MBps"), "{:,.0f}"),
    ("events_per_s", "acknowledged events/s, 100/request (+)", ("events", "events_per_s"), "{:,.0f}"),
    ("gw_put_ms", "gateway CPU ms per 4 KiB PUT (-)", ("small", "put", "gateway_cpu_ms_per"), "{:.2f}"),
    ("gw_get_ms", "gateway CPU ms per 4 KiB GET (-)", ("small", "get", "gateway_cpu_ms_per"), "{:.2f}"),
    ("gw_event_req_ms", "gateway CPU ms per events request (-)", ("events", "gateway_cpu_ms_per"), "{:.2f}"),
    ("gw_big_put_ms_per_MB", "gateway CPU ms per MB of large PUT (-)", ("big", "put", "gateway_cpu_ms_per"),
     "{:.2f}"),
    ("gw_big_get_ms_per_MB", "gateway CPU ms per MB of large GET (-)", ("big", "get", "gateway_cpu_ms_per"),
     "{:.2f}"),
    ("nginx_put_ms", "nginx CPU ms per 4 KiB PUT (-)", ("small", "put", "nginx_cpu_ms_per"), "{:.3f}"),
    ("nginx_get_ms", "nginx CPU ms per 4 KiB GET (-)", ("small", "get", "nginx_cpu_ms_per"), "{:.3f}"),
    ("s3_put_ms", "SeaweedFS CPU ms per 4 KiB PUT (-)", ("small", "put", "seaweedfs_cpu_ms_per"), "{:.2f}"),
    ("client_put_ms", "client CPU ms per 4 KiB PUT (-)", ("small", "put", "client_cpu_ms_per"), "{:.2f}"),
    ("gw_rss_MB", "peak resident MB of one gateway (-)", ("gateway_peak_rss_MB",), "{:,.0f}"),
]


def _dig(d: Any, path: tuple[str, ...]) -> Any:
    for p in path:
        d = d.get(p) if isinstance(d, dict) else None
    return d


def summarise(results: dict[str, list[dict]]) -> dict[str, dict[str, Any]]:
    """Median over runs of every metric, per configuration, plus the per-core extrapolation."""
    m: dict[str, dict[str, Any]] = {}
    for config, runs in results.items():
        vals = {key: median([_dig(r, path) for r in runs]) for key, _, path, _ in METRICS}
        # the big-object phases count bytes: CPU ms per byte -> per MB
        for key in ("gw_big_put_ms_per_MB", "gw_big_get_ms_per_MB"):
            if vals.get(key) is not None:
                vals[key] *= MB
        for key, per in (("put_per_core", "gw_put_ms"), ("get_per_core", "gw_get_ms"),
                         ("events_per_core", "gw_event_req_ms")):
            ms = vals.get(per)
            vals[key] = 1000.0 / ms * (EVENTS_PER_REQUEST if key == "events_per_core" else 1) if ms else None
        m[config] = vals
    return m


EXTRAPOLATED = [
    ("put_per_core", "4 KiB PUT ops/s one gateway core serves (1000 / CPU ms)", "{:,.0f}"),
    ("get_per_core", "4 KiB GET ops/s one gateway core serves", "{:,.0f}"),
    ("events_per_core", "events/s one gateway core acknowledges", "{:,.0f}"),
]


def ratio(a: Any, b: Any) -> float | None:
    return a / b if a is not None and b else None


def fmt(v: Any, f: str) -> str:
    return "n/a" if v is None else f.format(v)


def render(m: dict[str, dict[str, Any]], plan: Plan) -> str:
    big = f"{plan.big // MIB} MiB"
    header = ["metric", *CONFIGS, "x2 / x1", "x1 / direct"]
    rows = []
    for key, label, _, f in METRICS:
        vals = [m.get(c, {}).get(key) for c in CONFIGS]
        rows.append([label.format(big=big), *(fmt(v, f) for v in vals),
                     fmt(ratio(vals[2], vals[1]), "{:.2f}x"), fmt(ratio(vals[1], vals[0]), "{:.2f}x")])
    rows.append(["extrapolated per replica (on its own core):", "", "", "", "", ""])
    for key, label, f in EXTRAPOLATED:
        vals = [m.get(c, {}).get(key) for c in CONFIGS]
        rows.append([f"  {label}", *(fmt(v, f) for v in vals),
                     fmt(ratio(vals[2], vals[1]), "{:.2f}x"), fmt(ratio(vals[1], vals[0]), "{:.2f}x")])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cells))

    out = [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]
    out.append(f"(median of {plan.runs} run(s); {os.cpu_count()} cores shared by the clients, nginx, "
               "SeaweedFS and the gateways: two replicas show the overhead of the second hop and of "
               "sharing, not scaling. A gateway's Python request path uses about one core, so N "
               "replicas on N cores serve about N times the per-core rows, until nginx or the S3 "
               "service is the limit.)")
    return "\n".join(out)


# -- main ---------------------------------------------------------------------------------------


def run_all(plan: Plan, base: Path) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    src = base / "big.bin"
    with open(src, "wb") as f:
        left = plan.big
        while left:
            chunk = os.urandom(min(left, 8 * MIB))
            f.write(chunk)
            left -= len(chunk)
    for replicas, targets in ((1, (("direct", "1"), ("nginx x1", "lb"))), (2, (("nginx x2", "lb"),))):
        cluster = Cluster(base, replicas).start()
        try:
            Conns(cluster.port("lb"), cluster.keys).request("PUT", f"/{BUCKET}")
            for run in range(plan.runs):
                for config, target in targets:
                    results[config].append(bench_config(cluster, target, plan, src, run))
        finally:
            cluster.destroy()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="32 MiB objects, 2 s phases, 1 run")
    ap.add_argument("--runs", type=int, help="runs per configuration (default 2; --quick 1)")
    ap.add_argument("--tmp", type=Path, help="parent of the temporary directories (a real disk)")
    ap.add_argument("--json-out", type=Path, default=RESULTS_JSON)
    args = ap.parse_args(argv)
    if shutil.which("nginx") is None:
        print("nginx is not installed (apt-get install nginx)", file=sys.stderr)
        return 2
    plan = Plan(args)

    def on_term(signum, frame):  # noqa: ARG001 - tear the clusters down on SIGTERM too
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    t0 = time.monotonic()
    load0 = tuple(round(x, 2) for x in os.getloadavg())
    base = Path(tempfile.mkdtemp(prefix="cluster-bench-", dir=args.tmp))
    try:
        results = run_all(plan, base)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        for cluster in list(Cluster.live):
            try:
                cluster.destroy()
            except Exception as exc:  # noqa: BLE001 - best effort, then the next
                log(f"could not tear down {cluster.dir}: {exc}")
        shutil.rmtree(base, ignore_errors=True)
    m = summarise(results)
    print(render(m, plan))
    doc = {"bench": "cluster_bench", "version": 1,
           "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
           "host": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                    "nginx": subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip(),
                    "loadavg_start": load0, "loadavg_end": tuple(round(x, 2) for x in os.getloadavg())},
           "plan": plan.describe(), "metrics": m,
           "ratios": {key: {"x2_over_x1": ratio(m["nginx x2"].get(key), m["nginx x1"].get(key)),
                            "x1_over_direct": ratio(m["nginx x1"].get(key), m["direct"].get(key))}
                      for key in m["direct"]},
           "results": results, "wall_seconds": round(time.monotonic() - t0, 1)}
    print("BENCH_JSON " + json.dumps(doc, separators=(",", ":"), default=str), flush=True)
    try:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        log(f"wrote {args.json_out}")
    except OSError as exc:
        log(f"could not write {args.json_out}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
