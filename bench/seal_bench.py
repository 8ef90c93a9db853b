#!/usr/bin/env python3
"""Sealing benchmark: what encryption at rest costs, in one run.

1. The machine's AES-256-GCM ceiling: ``cryptography``'s AESGCM on 64 KiB chunks, one thread,
   with the per-chunk nonce and associated data the sealed format uses (``vault/stream.py``).
2. Sealed against unsealed, in-process at store level (no HTTP: the gateway has no unsealed
   mode): ``LocalStore`` vs ``SealedStore(LocalStore)`` and ``S3Store`` (over a SeaweedFS
   ``weed mini`` started here) vs ``SealedStore(S3Store)``, 4 KiB PUT/GET ops/s and
   256 MiB PUT/GET MB/s (single ``put_object`` and an 8 MiB-part multipart upload).
3. SeaweedFS direct against the gateway over SeaweedFS (``orgmem serve --backend s3://...``),
   with the boto3 client of ``s3_bench.py``: 4 KiB PUT/GET ops/s, 256 MiB upload/download MB/s.
3b. End to end, what clients see: 256 MiB upload/download through the gateway against the same
   gateway without the sealed store (``orgmem serve`` run by this script with ``--serve-unsealed``,
   the HTTP-level twin of the store-level unsealed case), on the embedded store and over
   SeaweedFS. Informational; the issue's targets are the store-level ratios (2), the gateway over
   SeaweedFS against SeaweedFS direct (3) and rewrap on the embedded store (4).
4. Rewrap objects/s: a gateway with N small objects, ``POST /admin/v1/vault/kek/rotate``, then
   ``POST /admin/v1/vault/rewrap`` batches until done; on the embedded store and over SeaweedFS.

Every server is started here on 127.0.0.1 and stopped (SIGTERM to its process group, SIGKILL
after 10 s) when the run ends, also on errors and on Ctrl-C / SIGTERM. Bytes read back are
compared with the bytes written, so a fast wrong answer cannot pass.

Usage:
    .venv/bin/python bench/seal_bench.py            # full run (~8-10 min on 2 cores)
    .venv/bin/python bench/seal_bench.py --quick    # small sizes, 1 run (~2-3 min)
    .venv/bin/python bench/seal_bench.py --parts aes,local --quick

See bench/README.md ("Sealing benchmark") for every number and the targets.
Output: an aligned text table, one ``BENCH_JSON {...}`` line on stdout, and the same JSON in
bench/results/seal_bench.json.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as _dt
import hashlib
import io
import json
import os
import platform
import pstats
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import s3_bench as sb  # noqa: E402  the shared server, load and admin helpers
from s3_bench import MB, SMALL, ServerError, log, median, run_load  # noqa: E402

RESULTS_JSON = HERE / "results" / "seal_bench.json"
MiB = 1024 * 1024
PART = 8 * MiB                      # multipart part size (store level; boto3's default too)
READ = 1 * MiB                      # read size of a store-level GET (the gateway's STREAM_CHUNK)
ALL_PARTS = ("aes", "local", "s3", "http", "e2e", "rewrap", "rewrap-s3")
NEEDS_WEED = {"s3", "http", "e2e", "rewrap-s3"}

# SeaweedFS's S3 identity (the gateway's upstream credentials); the gateway's root keys are
# s3_bench's ACCESS_KEY / SECRET_KEY.
SW_ACCESS = "sealbenchSWAK0001"
SW_SECRET = "sealbench-seaweed-secret-0123456789abcdef"
SECRETS = (sb.SECRET_KEY, SW_SECRET)
UPSTREAM = "orgmem-up"              # the one upstream bucket every orgmem layer uses
REWRAP_BUCKET = "rewrap"
#: argv[1] that makes this script run `orgmem serve` without the sealed store (the e2e baseline)
UNSEALED_FLAG = "--serve-unsealed"

# --------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------


class Plan:
    def __init__(self, args: argparse.Namespace):
        q = self.quick = args.quick
        # even: the store part alternates which of plain and sealed goes first (see bench_store)
        self.runs = args.runs or (1 if q else 4)
        self.aes_seconds = 0.5 if q else 1.5
        self.duration = None if q else 3.0                       # 4 KiB phases: seconds each
        self.store_counts = {"put": 200, "get": 500} if q else None
        self.http_counts = {"put_1t": 300, "put_8t": 800, "get_1t": 500, "get_8t": 800} if q else None
        self.phase_cap = 30.0 if q else 20.0
        self.big_bytes = (64 if q else 256) * MiB
        self.get_pool = 64
        self.rewrap_objects = args.rewrap_objects or (1000 if q else 5000)
        self.rewrap_s3_objects = (args.rewrap_s3_objects if args.rewrap_s3_objects is not None
                                  else (200 if q else 500))
        self.rewrap_batch = args.rewrap_batch
        self.rewrap_verify = 200                                  # objects read back after each run

    @property
    def big(self) -> str:
        return f"{self.big_bytes >> 20}MiB"

    @property
    def parts(self) -> int:
        return -(-self.big_bytes // PART)

    def describe(self) -> dict[str, Any]:
        return {"quick": self.quick, "runs": self.runs, "aes_seconds_per_measurement": self.aes_seconds,
                "small_object_bytes": SMALL, "phase_seconds": self.duration,
                "store_phase_counts": self.store_counts, "http_phase_counts": self.http_counts,
                "big_object_bytes": self.big_bytes, "part_bytes": PART, "store_read_bytes": READ,
                "rewrap_objects": self.rewrap_objects, "rewrap_s3_objects": self.rewrap_s3_objects,
                "rewrap_batch": self.rewrap_batch, "mb": "10^6 bytes"}


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def redact(text: str) -> str:
    for s in SECRETS:
        text = text.replace(s, "<redacted>")
    return text


def err(e: BaseException) -> str:
    return redact(f"{type(e).__name__}: {e}")[:600]


@contextlib.contextmanager
def upstream_env() -> Iterator[None]:
    """S3Store takes its credentials from boto3's default chain: SeaweedFS's identity."""
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_PROFILE",
            "AWS_SESSION_TOKEN")
    saved = {k: os.environ.get(k) for k in keys}
    for k in keys:
        os.environ.pop(k, None)
    os.environ.update(AWS_ACCESS_KEY_ID=SW_ACCESS, AWS_SECRET_ACCESS_KEY=SW_SECRET,
                      AWS_DEFAULT_REGION="us-east-1")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def read_all(reader: Any, n: int = READ) -> bytes:
    chunks = []
    while chunk := reader.read(n):
        chunks.append(chunk)
    return b"".join(chunks)


def drain(reader: Any, sha: Any = None) -> int:
    """Read a store reader to its end in READ-sized calls (as the gateway's GET does)."""
    total = 0
    while chunk := reader.read(READ):
        total += len(chunk)
        if sha is not None:
            sha.update(chunk)
    return total


class Slice:
    """``read(n)`` over the next ``size`` bytes of a file (one multipart part)."""

    def __init__(self, f: Any, size: int):
        self.f, self.left = f, size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.f.read(n) if n else b""
        self.left -= len(data)
        return data


def ratio(a: Any, b: Any) -> float | None:
    ok = isinstance(a, (int, float)) and isinstance(b, (int, float))
    return a / b if ok and b else None


def cpu_s() -> float:
    """CPU seconds of this process, all threads (getrusage: microsecond resolution)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# --------------------------------------------------------------------------
# servers (s3_bench's Server, with the extra flags and environment this bench needs)
# --------------------------------------------------------------------------


class Proc(sb.Server):
    """``seaweedfs`` (with SeaweedFS's identity) or ``orgmem`` (with extra flags/env)."""

    def __init__(self, kind: str, label: str, bin_dir: Path, base_tmp: Path,
                 args: list[str] | None = None, env: dict[str, str] | None = None):
        super().__init__(kind, bin_dir, base_tmp)
        self.label = label
        self.extra_args = list(args or [])
        self.extra_env = dict(env or {})
        self.unsealed = False
        if kind == "seaweedfs":
            self.access_key, self.secret_key = SW_ACCESS, SW_SECRET
            self.durability = "no fsync (page cache)"

    def _command(self) -> tuple[list[str], dict[str, str]]:
        argv, env = super()._command()
        if self.unsealed:  # the same `orgmem serve`, through this script's --serve-unsealed
            argv = [sys.executable, str(Path(__file__).resolve()), UNSEALED_FLAG, *argv[1:]]
        return argv + self.extra_args, {**env, **self.extra_env}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "command": self.argv,
                "env": {k: ("<redacted>" if "SECRET" in k else v) for k, v in self.env_shown.items()},
                "credentials": {"access_key": self.access_key, "secret_key": "<redacted>"},
                "durability": self.durability}


def start_weed(bin_dir: Path, base_tmp: Path) -> Proc:
    weed = Proc("seaweedfs", "seaweedfs", bin_dir, base_tmp)
    weed.start()
    c = sb.make_client(weed, 8)
    deadline = time.monotonic() + 60
    for bucket in ("bench", UPSTREAM):  # weed's filer may lag its S3 port
        while True:
            try:
                c.create_bucket(Bucket=bucket)
                break
            except Exception as e:  # noqa: BLE001
                code = getattr(e, "response", {}).get("Error", {}).get("Code")
                if code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    break
                if time.monotonic() > deadline:
                    raise ServerError(f"weed: create_bucket {bucket} failed: {err(e)}") from None
                time.sleep(0.3)
    c.put_object(Bucket="bench", Key="probe", Body=b"ok")
    if c.get_object(Bucket="bench", Key="probe")["Body"].read() != b"ok":
        raise ServerError("weed: probe round trip returned different bytes")
    c.delete_object(Bucket="bench", Key="probe")
    return weed


def start_gateway(label: str, bin_dir: Path, base_tmp: Path, weed: Proc | None,
                  prefix: str = "", unsealed: bool = False) -> Proc:
    """orgmem serve with its own keyring (file:, as the embedded default is) outside --data;
    over SeaweedFS when ``weed`` is given, with SeaweedFS's identity as AWS credentials.
    ``unsealed``: the same server without the sealed store (see ``serve_unsealed``)."""
    from vault.keys import create_keyring

    args: list[str] = []
    env: dict[str, str] = {}
    gw = Proc("orgmem", label, bin_dir, base_tmp, args, env)
    gw.unsealed = unsealed
    ring = gw.dir / "keyring.json"
    create_keyring(ring, forbidden_dir=gw.data)
    args += ["--kek", f"file:{ring}"]
    if weed is not None:
        args += ["--backend", f"s3://{UPSTREAM}/{prefix}", "--backend-endpoint", weed.endpoint]
        env.update(AWS_ACCESS_KEY_ID=SW_ACCESS, AWS_SECRET_ACCESS_KEY=SW_SECRET,
                   AWS_DEFAULT_REGION="us-east-1")
        gw.durability = "upstream SeaweedFS: no fsync (page cache)"
    gw.extra_args, gw.extra_env = args, env
    gw.start()
    return gw


def ensure_bucket(c: Any, bucket: str) -> None:
    try:
        c.create_bucket(Bucket=bucket)
    except Exception as e:  # noqa: BLE001
        if getattr(e, "response", {}).get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise


# --------------------------------------------------------------------------
# 1. the AES-256-GCM ceiling
# --------------------------------------------------------------------------


def bench_aes(plan: Plan) -> dict[str, Any]:
    """One thread, 64 KiB chunks, a fresh nonce and the format's 45-byte AAD per chunk (as
    SealingReader / OpeningReader call it): the rate sealing could reach with zero other cost."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from vault import stream

    aead = AESGCM(AESGCM.generate_key(bit_length=256))
    chunk = os.urandom(stream.CHUNK)
    prefix = os.urandom(stream.HEADER) + struct.pack(">I", 0)
    pack = struct.Struct(">QB").pack
    seed = int.from_bytes(os.urandom(12), "big")
    sealed = [aead.encrypt((seed ^ i).to_bytes(12, "big"), chunk, prefix + pack(i, False))
              for i in range(64)]
    for i in (0, 63):
        if aead.decrypt((seed ^ i).to_bytes(12, "big"), sealed[i], prefix + pack(i, False)) != chunk:
            raise ValueError("AES-GCM round trip returned different bytes")

    def rate(decrypt: bool) -> tuple[float, float]:
        """(MB/s, MB per CPU-second of this thread)."""
        enc, dec = aead.encrypt, aead.decrypt
        n, t0, c0 = 0, time.perf_counter(), time.thread_time()
        while True:
            for i in range(64):
                nonce = (seed ^ i).to_bytes(12, "big")
                if decrypt:
                    dec(nonce, sealed[i], prefix + pack(i, False))
                else:
                    enc(nonce, chunk, prefix + pack(i, False))
            n += 64
            dt = time.perf_counter() - t0
            if dt >= plan.aes_seconds:
                mb = n * stream.CHUNK / MB
                return mb / dt, mb / max(time.thread_time() - c0, 1e-6)

    raw: dict[str, list[float]] = {"encrypt_MBps": [], "decrypt_MBps": [], "encrypt_cpu": [],
                                   "decrypt_cpu": []}
    for r in range(plan.runs):
        for op in ("encrypt", "decrypt"):
            wall, cpu = rate(op == "decrypt")
            raw[f"{op}_MBps"].append(wall)
            raw[f"{op}_cpu"].append(cpu)
        log(f"aes: run {r + 1}: encrypt {raw['encrypt_MBps'][-1]:.0f} MB/s "
            f"({raw['encrypt_cpu'][-1]:.0f} MB/CPU-s), decrypt {raw['decrypt_MBps'][-1]:.0f} MB/s "
            f"({raw['decrypt_cpu'][-1]:.0f} MB/CPU-s)")
    return {"metrics": {k: median(v) for k, v in raw.items()}, "raw": raw}


# --------------------------------------------------------------------------
# 2. store level: Store vs SealedStore(Store), in-process
# --------------------------------------------------------------------------

STORE_VARIANTS = ("plain", "sealed")


def store_pair(kind: str, base_tmp: Path, weed: Proc | None) -> tuple[Any, Any, dict[str, Any]]:
    """(inner store, SealedStore(inner), description). Both variants share the inner store (and
    so its index / upstream connection pool); they write to different buckets."""
    from gateway.store.base import BucketAlreadyExists
    from gateway.store.sealed import SealedStore
    from vault.keys import create_keyring

    d = Path(tempfile.mkdtemp(prefix=f"store-{kind}-", dir=base_tmp))
    keys = create_keyring(d / "keyring.json", forbidden_dir=d / "store")
    if kind == "local":
        from gateway.store.local import LocalStore

        inner = LocalStore(d / "store")
        desc = {"inner": f"LocalStore({d / 'store'})", "durability": "fsync (durable)"}
    else:
        from gateway.store.s3 import S3Store

        assert weed is not None
        inner = S3Store(UPSTREAM, "store/", weed.endpoint, "us-east-1", spool_dir=d / "spool")
        inner.learn_quirks()  # as the gateway does at start
        desc = {"inner": f"S3Store({UPSTREAM!r}, 'store/', {weed.endpoint!r}, 'us-east-1', "
                         f"spool_dir={str(d / 'spool')!r})",
                "durability": "SeaweedFS: no fsync (page cache)"}
    desc["sealed"] = "SealedStore(inner, FileKeyring) -- the embedded default's key provider"
    sealed = SealedStore(inner, keys)
    for b in STORE_VARIANTS:
        try:
            inner.create_bucket(b)
        except BucketAlreadyExists:  # a second S3Store on the same prefix (--profile)
            pass
    return inner, sealed, desc


def check_sealed_at_rest(inner: Any, bucket: str, key: str, plain_size: int, parts: int,
                         head: bytes) -> None:
    """The backend holds ciphertext of the right size and a wrapped key, not the plaintext
    (``head``: the object's first plaintext bytes; 32-byte samples of it must be absent)."""
    from vault import stream

    raw = inner.head_object(bucket, key)
    want = plain_size + parts * stream.PART_OVERHEAD if parts else stream.sealed_size(plain_size)
    if raw.size != want:
        raise ValueError(f"sealed {key} is {raw.size} bytes on the backend, expected {want}")
    if not raw.meta.sealed:
        raise ValueError(f"sealed {key} has no wrapped data key on the backend")
    r = inner.open_object(bucket, key, 0, min(raw.size, len(head) + 64 * 1024))
    try:
        stored = read_all(r)
    finally:
        r.close()
    for off in (0, len(head) // 3, len(head) - 32):
        if head[off:off + 32] in stored:
            raise ValueError(f"plaintext found in the backend's bytes of sealed {key}")


def file_head(path: Path, n: int = MiB) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def bench_store(kind: str, plan: Plan, base_tmp: Path, src: Path, src_sha: str,
                weed: Proc | None) -> dict[str, Any]:
    inner, sealed, desc = store_pair(kind, base_tmp, weed)
    stores = {"plain": inner, "sealed": sealed}
    out: dict[str, Any] = {"stores": desc, "metrics": {}, "raw": {}, "errors": {}}
    try:
        _bench_store(kind, plan, stores, inner, src, src_sha, out)
    finally:
        try:
            inner.close()
        except Exception:  # noqa: BLE001
            pass
    return out


BIG_STORE_ROWS = ("big_put_MBps", "big_get_MBps", "mp_put_MBps", "mp_get_MBps")
#: the same transfers in MB per CPU-second of this process (the orgmem side's cost; usually
#: steadier than MB/s when other processes compete for the CPU)
CPU_STORE_ROWS = ("big_put_cpu", "big_get_cpu", "mp_put_cpu", "mp_get_cpu")
STORE_ROWS = ("put4k_ops", "get4k_ops", *BIG_STORE_ROWS, *CPU_STORE_ROWS)


def _bench_store(kind: str, plan: Plan, stores: dict[str, Any], inner: Any, src: Path, src_sha: str,
                 out: dict[str, Any]) -> None:
    from gateway.store.base import ObjectMeta

    raw = out["raw"] = {v: {k: [] for k in STORE_ROWS} | {"cpu_s": {}} for v in STORE_VARIANTS}
    big_mb = plan.big_bytes / MB
    errors = out["errors"]
    body = os.urandom(SMALL)
    for v, st in stores.items():
        for i in range(plan.get_pool):
            st.put_object(v, f"g4k/{i:04d}", io.BytesIO(body), ObjectMeta())
        r = st.open_object(v, "g4k/0000")
        try:
            if read_all(r) != body:
                raise ValueError(f"{kind}/{v}: 4 KiB round trip returned different bytes")
        finally:
            r.close()
    check_sealed_at_rest(inner, "sealed", "g4k/0000", SMALL, 0, body)

    gen = [0]

    def put_op(v: str) -> Callable[[int, int], None]:
        st = stores[v]
        return lambda t, i: st.put_object(v, f"p4k/{gen[0]}/{i}", io.BytesIO(body), ObjectMeta())

    def get_op(v: str) -> Callable[[int, int], None]:
        st = stores[v]

        def op(t: int, i: int) -> None:
            r = st.open_object(v, f"g4k/{i % plan.get_pool:04d}")
            try:
                data = read_all(r)
            finally:
                r.close()
            if data != body:
                raise ValueError("4 KiB GET returned different bytes")
        return op

    def small_phase(name: str, v: str, make: Callable[[str], Callable[[int, int], None]], r: int) -> None:
        gen[0] += 1
        c0 = cpu_s()
        ph = run_load(1, make(v), count=plan.store_counts[name.split("4k")[0]] if plan.store_counts else None,
                      duration=plan.duration, cap=plan.phase_cap)
        raw[v][f"{name}_ops"].append(ph.ops)
        raw[v]["cpu_s"].setdefault(name, []).append(round(cpu_s() - c0, 3))
        if ph.errors:
            errors.setdefault(f"{v}.{name}", f"{ph.errors} errors, first: {ph.first_error}")
        if name == "put4k" and ph.ok:  # untimed: what was written reads back
            for i in {0, ph.ok // 2, ph.ok - 1}:
                rd = stores[v].open_object(v, f"p4k/{gen[0]}/{i}")
                try:
                    if read_all(rd) != body:
                        raise ValueError(f"{kind}/{v}: PUT p4k/{gen[0]}/{i} reads back different bytes")
                finally:
                    rd.close()
        log(f"{kind}/{v}: run {r + 1} {name}: {ph.ok} ok / {ph.errors} err = {ph.ops or 0:.0f} ops/s")

    def big_phase(v: str, multipart: bool, r: int) -> None:
        st = stores[v]
        key = "big/multipart" if multipart else "big/single"
        pre = "mp" if multipart else "big"
        c0, t0 = cpu_s(), time.perf_counter()
        with open(src, "rb") as f:
            if multipart:
                up = st.create_multipart(v, key, ObjectMeta())
                done = []
                for n in range(1, plan.parts + 1):
                    size = min(PART, plan.big_bytes - (n - 1) * PART)
                    p = st.upload_part(v, key, up.upload_id, n, Slice(f, size), None, size=size)
                    done.append((n, p.etag))
                info = st.complete_multipart(v, key, up.upload_id, done)
            else:
                info = st.put_object(v, key, f, ObjectMeta())
        dt_put, c1 = time.perf_counter() - t0, cpu_s()
        if info.size != plan.big_bytes:
            raise ValueError(f"{kind}/{v}: {key} stored {info.size} bytes, expected {plan.big_bytes}")
        t0 = time.perf_counter()
        rd = st.open_object(v, key)
        try:
            got = drain(rd)
        finally:
            rd.close()
        dt_get, c2 = time.perf_counter() - t0, cpu_s()
        if got != plan.big_bytes:
            raise ValueError(f"{kind}/{v}: GET {key} returned {got} bytes, expected {plan.big_bytes}")
        raw[v][f"{pre}_put_MBps"].append(big_mb / dt_put)
        raw[v][f"{pre}_get_MBps"].append(big_mb / dt_get)
        raw[v][f"{pre}_put_cpu"].append(big_mb / max(c1 - c0, 1e-6))
        raw[v][f"{pre}_get_cpu"].append(big_mb / max(c2 - c1, 1e-6))
        raw[v]["cpu_s"].setdefault(f"{pre}_put", []).append(round(c1 - c0, 3))
        raw[v]["cpu_s"].setdefault(f"{pre}_get", []).append(round(c2 - c1, 3))
        if r == 0:  # untimed: the whole object reads back as written, and is sealed at rest
            h = hashlib.sha256()
            rd = st.open_object(v, key)
            try:
                drain(rd, h)
            finally:
                rd.close()
            if h.hexdigest() != src_sha:
                raise ValueError(f"{kind}/{v}: {key} reads back different bytes than were written")
            if v == "sealed":
                check_sealed_at_rest(inner, v, key, plan.big_bytes, plan.parts if multipart else 0,
                                     file_head(src))
        st.delete_object(v, key)
        log(f"{kind}/{v}: run {r + 1} {pre}: PUT {raw[v][f'{pre}_put_MBps'][-1]:.1f} MB/s "
            f"(cpu {c1 - c0:.2f}s), GET {raw[v][f'{pre}_get_MBps'][-1]:.1f} MB/s (cpu {c2 - c1:.2f}s)")

    # every phase alternates plain and sealed, so background noise hits both alike, and which
    # goes first alternates between runs: a 256 MiB fsync'd write leaves the disk busy for the
    # write after it (on the embedded store the second of a pair measured up to 2x slower)
    for r in range(plan.runs):
        variants = STORE_VARIANTS if r % 2 == 0 else tuple(reversed(STORE_VARIANTS))
        for name, make in (("put4k", put_op), ("get4k", get_op)):
            for v in variants:
                try:
                    small_phase(name, v, make, r)
                except Exception as e:  # noqa: BLE001
                    errors.setdefault(f"{v}.{name}", err(e))
                    log(f"{kind}/{v}: {name} failed: {err(e)}")
        for multipart in (False, True):
            for v in variants:
                try:
                    big_phase(v, multipart, r)
                except Exception as e:  # noqa: BLE001
                    errors.setdefault(f"{v}.{'mp' if multipart else 'big'}", err(e))
                    log(f"{kind}/{v}: big failed: {err(e)}")
    out["metrics"] = {v: {k: median(raw[v][k]) for k in STORE_ROWS} for v in STORE_VARIANTS}


# --------------------------------------------------------------------------
# 3. SeaweedFS direct vs the gateway over SeaweedFS (HTTP, boto3)
# --------------------------------------------------------------------------

HTTP_TARGETS = ("direct", "gateway")
HTTP_ROWS = ("put_1t_ops", "put_8t_ops", "get_1t_ops", "get_8t_ops", "big_put_MBps", "big_get_MBps")


def bench_http(plan: Plan, weed: Proc, gw: Proc, src: Path, src_sha: str, base_tmp: Path) -> dict[str, Any]:
    from boto3.s3.transfer import TransferConfig

    servers = {"direct": weed, "gateway": gw}
    clients = {t: sb.make_client(s, 8) for t, s in servers.items()}
    raw: dict[str, Any] = {t: {k: [] for k in HTTP_ROWS} | {"server_cpu_s": {}} for t in HTTP_TARGETS}
    errors: dict[str, str] = {}
    body = os.urandom(SMALL)
    for t, c in clients.items():
        ensure_bucket(c, "bench")
        for i in range(plan.get_pool):
            c.put_object(Bucket="bench", Key=f"g4k/{i:04d}", Body=body)
        if c.get_object(Bucket="bench", Key="g4k/0000")["Body"].read() != body:
            raise ValueError(f"{t}: 4 KiB round trip returned different bytes")
    _check_upstream_sealed(clients["direct"], "gw/bench/", body, "g4k")

    gen = [0]

    def put_op(t: str) -> Callable[[int, int], None]:
        c = clients[t]
        return lambda th, i: c.put_object(Bucket="bench", Key=f"p4k/{gen[0]}/{th}/{i}", Body=body)

    def get_op(t: str) -> Callable[[int, int], None]:
        c = clients[t]

        def op(th: int, i: int) -> None:
            key = f"g4k/{(th * 7 + i) % plan.get_pool:04d}"
            if c.get_object(Bucket="bench", Key=key)["Body"].read() != body:
                raise ValueError("4 KiB GET returned different bytes")
        return op

    def server_cpu(t: str) -> float:  # the gateway's work includes SeaweedFS's
        return sb.tree_cpu_ms(weed.pid) + (sb.tree_cpu_ms(gw.pid) if t == "gateway" else 0.0)

    tc = TransferConfig()
    dst = base_tmp / "download.bin"
    for r in range(plan.runs):
        for name, make, nt in (("put_1t", put_op, 1), ("put_8t", put_op, 8),
                               ("get_1t", get_op, 1), ("get_8t", get_op, 8)):
            for t in HTTP_TARGETS:
                gen[0] += 1
                ph = run_load(nt, make(t), count=plan.http_counts[name] if plan.http_counts else None,
                              duration=plan.duration, cap=plan.phase_cap)
                raw[t][f"{name}_ops"].append(ph.ops)
                if ph.errors:
                    errors.setdefault(f"{t}.{name}", f"{ph.errors} errors, first: {ph.first_error}")
                log(f"http/{t}: run {r + 1} {name}: {ph.ok} ok / {ph.errors} err = {ph.ops or 0:.0f} ops/s")
        for t in HTTP_TARGETS:
            c = clients[t]
            try:
                cpu0, t0 = server_cpu(t), time.perf_counter()
                c.upload_file(str(src), "bench", "big/object", Config=tc)
                dt, cpu1 = time.perf_counter() - t0, server_cpu(t)
                c.download_file("bench", "big/object", str(dst), Config=tc)
                dt2, cpu2 = time.perf_counter() - t0 - dt, server_cpu(t)
                size = dst.stat().st_size
                if size != plan.big_bytes:
                    raise ValueError(f"downloaded {size} bytes, expected {plan.big_bytes}")
                if r == 0:
                    if sb.sha256_file(dst) != src_sha:
                        raise ValueError("downloaded object differs from the uploaded file")
                    if t == "gateway":
                        _check_upstream_sealed(clients["direct"], "gw/bench/", file_head(src, 4096), "big")
                raw[t]["big_put_MBps"].append(plan.big_bytes / MB / dt)
                raw[t]["big_get_MBps"].append(plan.big_bytes / MB / dt2)
                raw[t]["server_cpu_s"].setdefault("big_put", []).append(round((cpu1 - cpu0) / 1000, 2))
                raw[t]["server_cpu_s"].setdefault("big_get", []).append(round((cpu2 - cpu1) / 1000, 2))
                log(f"http/{t}: run {r + 1} big: PUT {raw[t]['big_put_MBps'][-1]:.1f} MB/s "
                    f"(server cpu {(cpu1 - cpu0) / 1000:.2f}s), GET {raw[t]['big_get_MBps'][-1]:.1f} MB/s "
                    f"(server cpu {(cpu2 - cpu1) / 1000:.2f}s)")
            except Exception as e:  # noqa: BLE001
                errors.setdefault(f"{t}.big", err(e))
                log(f"http/{t}: big failed: {err(e)}")
            finally:
                dst.unlink(missing_ok=True)
    return {"metrics": {t: {k: median(raw[t][k]) for k in HTTP_ROWS} for t in HTTP_TARGETS},
            "raw": raw, "errors": errors}


def _check_upstream_sealed(direct: Any, prefix: str, plain: bytes, contains: str) -> None:
    """What the gateway wrote to SeaweedFS (found by listing the upstream bucket) holds none of
    the plaintext: a 32-byte sample of it is absent from the stored object's first MiB."""
    pages = direct.get_paginator("list_objects_v2").paginate(Bucket=UPSTREAM, Prefix=prefix)
    names = [o["Key"] for page in pages
             for o in page.get("Contents", []) if contains in o["Key"]]
    if not names:
        raise ValueError(f"no upstream object under {prefix} with {contains!r} in its name")
    stored = direct.get_object(Bucket=UPSTREAM, Key=names[0], Range=f"bytes=0-{MiB - 1}")["Body"].read()
    if plain[100:132] in stored:
        raise ValueError(f"plaintext found in the upstream object {names[0]}")


# --------------------------------------------------------------------------
# 3b. end to end: the gateway sealed vs the same gateway unsealed (what clients see)
# --------------------------------------------------------------------------

E2E_BACKENDS = ("embedded", "seaweedfs")
E2E_VARIANTS = ("unsealed", "sealed")
E2E_ROWS = ("big_put_MBps", "big_get_MBps", "big_put_cpu", "big_get_cpu")


def serve_unsealed(argv: list[str]) -> None:
    """``orgmem serve`` with the sealed store left out: the gateway's own store (embedded or
    S3) serves plaintext, everything else (HTTP, auth, audit) is the same. Only this benchmark
    builds it, as its end-to-end baseline; the gateway itself has no unsealed mode."""
    import gateway.app
    from gateway.cli import main as cli_main

    sealed = gateway.app.seal

    def unsealed(inner, config):
        # the vault still wraps secrets under the KEK (it needs the key provider); every
        # object, the vault's included, is stored as it comes
        inner.keys = sealed(inner, config).keys
        return inner

    gateway.app.seal = unsealed
    sys.argv = ["orgmem", *argv]
    cli_main()


def bench_e2e(plan: Plan, weed: Proc | None, bin_dir: Path, base_tmp: Path, src: Path,
              src_sha: str, servers: dict[str, Any]) -> dict[str, Any]:
    """256 MiB upload_file / download_file (boto3, default TransferConfig) through a sealed and
    an unsealed gateway, on the embedded store and over SeaweedFS; the variants alternate."""
    out: dict[str, Any] = {"metrics": {}, "raw": {}, "errors": {}}
    for backend in E2E_BACKENDS:
        if backend == "seaweedfs" and weed is None:
            out["errors"][backend] = "SeaweedFS did not start"
            continue
        gws: dict[str, Proc] = {}
        try:
            for v in E2E_VARIANTS:
                label = f"e2e-{v}-{backend}"
                gws[v] = start_gateway(label, bin_dir, base_tmp, weed if backend == "seaweedfs" else None,
                                       f"e2e-{v}", unsealed=v == "unsealed")
                servers[label] = gws[v].describe() | {"unsealed": v == "unsealed"}
            out["raw"][backend] = _e2e_runs(plan, backend, gws, weed, src, src_sha, base_tmp,
                                            out["errors"])
            out["metrics"][backend] = {v: {k: median(out["raw"][backend][v][k]) for k in E2E_ROWS}
                                       for v in E2E_VARIANTS}
        finally:
            for gw in gws.values():
                gw.stop()
                gw.cleanup(False)
    return out


def _e2e_runs(plan: Plan, backend: str, gws: dict[str, Proc], weed: Proc | None, src: Path,
              src_sha: str, base_tmp: Path, errors: dict[str, str]) -> dict[str, Any]:
    from boto3.s3.transfer import TransferConfig

    tc = TransferConfig()
    clients = {v: sb.make_client(gw, 8) for v, gw in gws.items()}
    raw: dict[str, Any] = {v: {k: [] for k in E2E_ROWS} | {"server_cpu_s": {}} for v in E2E_VARIANTS}
    dst = base_tmp / "e2e-download.bin"
    mb = plan.big_bytes / MB

    def server_cpu(v: str) -> float:  # the gateway's work, and its upstream's
        return sb.tree_cpu_ms(gws[v].pid) + (sb.tree_cpu_ms(weed.pid) if backend == "seaweedfs" else 0.0)

    for c in clients.values():
        ensure_bucket(c, "bench")
    for r in range(plan.runs):
        order = list(clients.items())
        if r % 2:  # each goes first as often (see bench_store)
            order.reverse()
        for v, c in order:
            try:
                cpu0, t0 = server_cpu(v), time.perf_counter()
                c.upload_file(str(src), "bench", "e2e/object", Config=tc)
                put_s, cpu1 = time.perf_counter() - t0, server_cpu(v)
                c.download_file("bench", "e2e/object", str(dst), Config=tc)
                get_s, cpu2 = time.perf_counter() - t0 - put_s, server_cpu(v)
                if dst.stat().st_size != plan.big_bytes:
                    raise ValueError(f"downloaded {dst.stat().st_size} bytes, expected {plan.big_bytes}")
                if r == 0:
                    if sb.sha256_file(dst) != src_sha:
                        raise ValueError("downloaded object differs from the uploaded file")
                    _check_e2e_at_rest(backend, v, gws[v], weed, file_head(src, 4096))
                for op, secs, cpu in (("put", put_s, cpu1 - cpu0), ("get", get_s, cpu2 - cpu1)):
                    raw[v][f"big_{op}_MBps"].append(mb / secs)
                    raw[v][f"big_{op}_cpu"].append(mb / max(cpu / 1000, 1e-6))
                    raw[v]["server_cpu_s"].setdefault(f"big_{op}", []).append(round(cpu / 1000, 2))
                log(f"e2e/{backend}/{v}: run {r + 1}: PUT {mb / put_s:.1f} MB/s (server cpu "
                    f"{(cpu1 - cpu0) / 1000:.2f}s), GET {mb / get_s:.1f} MB/s (server cpu "
                    f"{(cpu2 - cpu1) / 1000:.2f}s)")
            except Exception as e:  # noqa: BLE001
                errors.setdefault(f"{backend}.{v}", err(e))
                log(f"e2e/{backend}/{v}: failed: {err(e)}")
            finally:
                dst.unlink(missing_ok=True)
    return raw


def _check_e2e_at_rest(backend: str, variant: str, gw: Proc, weed: Proc | None, plain: bytes) -> None:
    """The sealed gateway stored no plaintext, and the baseline really stored plaintext: a
    32-byte sample of the object is looked for in what the backend holds."""
    sample = plain[100:132]
    if backend == "seaweedfs":
        assert weed is not None
        direct = sb.make_client(weed, 2)
        names = [o["Key"] for page in direct.get_paginator("list_objects_v2").paginate(
            Bucket=UPSTREAM, Prefix=f"e2e-{variant}/") for o in page.get("Contents", [])
            if "e2e" in o["Key"] and o["Size"] >= MiB]
        found = any(sample in direct.get_object(Bucket=UPSTREAM, Key=n, Range=f"bytes=0-{MiB - 1}")
                    ["Body"].read() for n in names)
    else:
        found = False
        for path in (gw.data / "store").rglob("*"):
            if path.is_file() and path.stat().st_size >= MiB:
                with open(path, "rb") as f:
                    found = found or sample in f.read(MiB)
    if found != (variant == "unsealed"):
        raise ValueError(f"{backend}/{variant}: plaintext {'not ' if not found else ''}found at rest")


# --------------------------------------------------------------------------
# 4. rewrap objects/s through the admin API
# --------------------------------------------------------------------------


def bench_rewrap(label: str, gw: Proc, plan: Plan, n: int) -> dict[str, Any]:
    c = sb.make_client(gw, 8)
    ensure_bucket(c, REWRAP_BUCKET)

    def body(i: int) -> bytes:
        return hashlib.sha256(b"%d" % i).digest() * 32  # 1 KiB, a different one per object

    t0 = time.perf_counter()
    def put(t: int, i: int) -> None:
        c.put_object(Bucket=REWRAP_BUCKET, Key=f"o/{t}/{i:06d}", Body=body(t * n + i))

    ph = run_load(8, put, count=n, cap=600)
    if ph.errors or ph.ok != n:
        raise ValueError(f"loading {n} objects: {ph.ok} ok, {ph.errors} errors, first: {ph.first_error}")
    keys = [(f"o/{t}/{i:06d}", t * n + i) for t in range(8) for i in range(n // 8 + (1 if t < n % 8 else 0))]
    log(f"rewrap/{label}: loaded {n} objects in {time.perf_counter() - t0:.1f}s (untimed)")

    def admin(method: str, path: str, payload: Any = None) -> Any:
        return sb.admin_call(gw, method, f"/admin/v1/vault/{path}", payload)

    status = admin("GET", "kek")
    raw: dict[str, list[Any]] = {"objects_per_s": [], "scanned_per_s": [], "seconds": [], "rewrapped": [],
                                 "scanned": [], "batches": []}
    for r in range(plan.runs):
        old = status["primary"]
        expected = status["objects_by_version"].get(str(old), 0)
        if expected < n:
            raise ValueError(f"before run {r + 1}: {expected} objects under KEK version {old}, "
                             f"expected at least {n}: {status['objects_by_version']}")
        new = admin("POST", "kek/rotate")["primary"]
        if new == old:
            raise ValueError(f"rotate left the primary at version {old}")
        scanned = rewrapped = batches = 0
        resume = False
        t0 = time.perf_counter()
        while True:
            res = admin("POST", "rewrap", {"resume": resume, "limit": plan.rewrap_batch})
            resume = True
            batches += 1
            scanned += res["scanned"]
            rewrapped += res["rewrapped"]
            if res["done"]:
                break
            if batches > expected // plan.rewrap_batch + 20:
                raise ValueError(f"rewrap not done after {batches} batches ({scanned} scanned)")
        dt = time.perf_counter() - t0
        # untimed: every data key moved, the old version can go, and the data still reads back
        # (the gateway writes and collects objects of its own meanwhile, e.g. its log: so only
        # the bench's n objects are counted on, and no object may be left under another version)
        status = admin("GET", "kek")
        left = {v: k for v, k in status["objects_by_version"].items() if v != str(new)}
        if left or rewrapped < n or status["objects_by_version"].get(str(new), 0) < n:
            raise ValueError(f"after rewrap to version {new}: rewrapped {rewrapped} of {expected}; "
                             f"objects by version: {status['objects_by_version']}")
        admin("POST", "kek/retire", {"version": old})
        for key, i in random.sample(keys, min(plan.rewrap_verify, len(keys))):
            if c.get_object(Bucket=REWRAP_BUCKET, Key=key)["Body"].read() != body(i):
                raise ValueError(f"{key} reads back different bytes after rewrap")
        raw["objects_per_s"].append(rewrapped / dt)
        raw["scanned_per_s"].append(scanned / dt)
        for k, v in (("seconds", round(dt, 3)), ("rewrapped", rewrapped), ("scanned", scanned),
                     ("batches", batches)):
            raw[k].append(v)
        log(f"rewrap/{label}: run {r + 1}: version {old} -> {new}: {rewrapped} rewrapped "
            f"({scanned} scanned, {batches} batches) in {dt:.2f}s = {rewrapped / dt:.0f} objects/s; "
            f"version {old} retired, {min(plan.rewrap_verify, len(keys))} objects read back")
    return {"metrics": {"objects_per_s": median(raw["objects_per_s"]),
                        "scanned_per_s": median(raw["scanned_per_s"]),
                        "objects": n, "total_sealed_objects": status["total"]},
            "raw": raw}


# --------------------------------------------------------------------------
# --profile: where a sealed big GET / PUT spends its time (untimed, after the measurements)
# --------------------------------------------------------------------------


def profile_sealed(plan: Plan, base_tmp: Path, src: Path, weed: Proc | None,
                   kinds: list[str]) -> dict[str, Any]:
    from gateway.store.base import ObjectMeta

    out: dict[str, Any] = {}
    for kind in kinds:
        inner, sealed, _ = store_pair(kind, base_tmp, weed)
        try:
            for op in ("put", "get"):
                prof = cProfile.Profile()
                t0 = time.perf_counter()
                if op == "put":
                    with open(src, "rb") as f:
                        prof.runcall(sealed.put_object, "sealed", "big/p", f, ObjectMeta())
                else:
                    rd = sealed.open_object("sealed", "big/p")
                    try:
                        prof.runcall(drain, rd)
                    finally:
                        rd.close()
                dt = time.perf_counter() - t0
                s = io.StringIO()
                st = pstats.Stats(prof, stream=s)
                st.sort_stats("tottime").print_stats(14)
                text = s.getvalue()
                out[f"{kind}.{op}"] = {"seconds": round(dt, 3), "MBps": round(plan.big_bytes / MB / dt, 1),
                                       "top_tottime": text[text.find("ncalls"):].rstrip()}
                log(f"profile {kind} sealed {op} ({plan.big}, {plan.big_bytes / MB / dt:.0f} MB/s "
                    f"under cProfile):\n{out[f'{kind}.{op}']['top_tottime']}")
        finally:
            inner.close()
    return out


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------

ROW_LABELS = {
    "put4k_ops": ("4KiB PUT ops/s, 1 thread", "{:.0f}"),
    "get4k_ops": ("4KiB GET ops/s, 1 thread", "{:.0f}"),
    "big_put_MBps": ("{big} PUT MB/s, put_object", "{:.1f}"),
    "big_get_MBps": ("{big} GET MB/s, single object", "{:.1f}"),
    "mp_put_MBps": ("{big} PUT MB/s, multipart {parts}x8MiB", "{:.1f}"),
    "mp_get_MBps": ("{big} GET MB/s, multipart object", "{:.1f}"),
    "big_put_cpu": ("{big} PUT MB/CPU-s, put_object", "{:.0f}"),
    "big_get_cpu": ("{big} GET MB/CPU-s, single object", "{:.0f}"),
    "mp_put_cpu": ("{big} PUT MB/CPU-s, multipart", "{:.0f}"),
    "mp_get_cpu": ("{big} GET MB/CPU-s, multipart", "{:.0f}"),
}
HTTP_LABELS = {
    "put_1t_ops": ("4KiB PUT ops/s, boto3 1 thread", "{:.0f}"),
    "put_8t_ops": ("4KiB PUT ops/s, boto3 8 threads", "{:.0f}"),
    "get_1t_ops": ("4KiB GET ops/s, boto3 1 thread", "{:.0f}"),
    "get_8t_ops": ("4KiB GET ops/s, boto3 8 threads", "{:.0f}"),
    "big_put_MBps": ("{big} PUT MB/s, upload_file", "{:.1f}"),
    "big_get_MBps": ("{big} GET MB/s, download_file", "{:.1f}"),
}


TARGET, INFO = "target", "informational"


def compute(results: dict[str, Any], plan: Plan) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Ratios, and the lines under the table: the issue's targets (``kind`` "target": store
    level sealed/unsealed, gateway/direct over SeaweedFS, rewrap on the embedded store) and
    informational lines (``kind`` "informational": end to end sealed/unsealed through the
    gateway, what clients see; rewrap over SeaweedFS). A failing line says what bounds it
    when the AES-GCM ceiling alone rules it out."""
    ratios: dict[str, Any] = {}
    targets: list[dict[str, Any]] = []
    aes = (results.get("aes") or {}).get("metrics") or {}

    def add(name: str, value: Any, limit: float, kind: str, note: str = "") -> None:
        ok = None if value is None else value >= limit
        targets.append({"target": name, "kind": kind, "value": value, "limit": limit,
                        "status": "N/A" if ok is None else ("PASS" if ok else "FAIL"), "note": note})

    quick = "" if plan.big_bytes == 256 * MiB else f"measured with {plan.big} (--quick)"
    for kind, title in (("local", "LocalStore"), ("s3", "S3Store/SeaweedFS")):
        m = (results.get(kind) or {}).get("metrics") or {}
        p, s = m.get("plain") or {}, m.get("sealed") or {}
        ratios[f"{kind}_sealed_over_plain"] = {k: ratio(s.get(k), p.get(k)) for k in STORE_ROWS}
        for k in BIG_STORE_ROWS:
            lab = ROW_LABELS[k][0].format(big="big", parts=plan.parts)
            value = ratios[f"{kind}_sealed_over_plain"][k]
            add(f"{title}: sealed {lab} >= 0.8x unsealed", value, 0.8, TARGET,
                _bound(value, aes.get("encrypt_MBps" if "put" in k else "decrypt_MBps"), p.get(k), quick))
    m = (results.get("http") or {}).get("metrics") or {}
    d, g = m.get("direct") or {}, m.get("gateway") or {}
    ratios["gateway_over_direct"] = {k: ratio(g.get(k), d.get(k)) for k in HTTP_ROWS}
    for k in ("big_put_MBps", "big_get_MBps"):
        lab = HTTP_LABELS[k][0].format(big="big")
        add(f"gateway over SeaweedFS: {lab} >= 0.5x direct", ratios["gateway_over_direct"][k], 0.5,
            TARGET, quick)
    e2e = (results.get("e2e") or {}).get("metrics") or {}
    for backend in E2E_BACKENDS:
        m = e2e.get(backend) or {}
        u, s = m.get("unsealed") or {}, m.get("sealed") or {}
        ratios[f"e2e_{backend}_sealed_over_unsealed"] = {k: ratio(s.get(k), u.get(k)) for k in E2E_ROWS}
        for k in ("big_put_MBps", "big_get_MBps"):
            lab = HTTP_LABELS[k][0].format(big="big")
            add(f"gateway on {backend}, end to end: sealed {lab} >= 0.8x unsealed gateway",
                ratios[f"e2e_{backend}_sealed_over_unsealed"][k], 0.8, INFO,
                "what clients see" + (f"; {quick}" if quick else ""))
    for kind, title in (("rewrap", "embedded store"), ("rewrap-s3", "S3 backend")):
        v = ((results.get(kind) or {}).get("metrics") or {}).get("objects_per_s")
        add(f"rewrap objects/s >= 500 ({title})", v, 500, TARGET if kind == "rewrap" else INFO,
            "" if kind == "rewrap" else "the issue's target is the embedded store")
    ratios["sealed_over_aes_ceiling"] = {}
    for kind in ("local", "s3"):
        s = (((results.get(kind) or {}).get("metrics") or {}).get("sealed")) or {}
        for k in BIG_STORE_ROWS + CPU_STORE_ROWS:
            ceiling = aes.get(("encrypt" if "put" in k else "decrypt") + ("_cpu" if "cpu" in k else "_MBps"))
            ratios["sealed_over_aes_ceiling"][f"{kind}.{k}"] = ratio(s.get(k), ceiling)
    return ratios, targets


def _bound(value: Any, aes_mbps: Any, unsealed_mbps: Any, note: str) -> str:
    """Why a failing store-level line cannot pass: a sealed stream runs at most at one core's
    AES-GCM rate, so when that rate is under 0.8x of the unsealed rate (a copy out of the page
    cache), no sealed store passes."""
    bound = ratio(aes_mbps, unsealed_mbps)
    if value is None or value >= 0.8 or bound is None or bound >= 0.8:
        return note
    why = (f"cannot pass here: the AES-GCM ceiling ({aes_mbps:.0f} MB/s, 1 core) is {bound:.2f}x "
           f"of unsealed ({unsealed_mbps:.0f} MB/s)")
    return f"{why}; {note}" if note else why


def fmt(v: Any, f: str) -> str:
    return "-" if v is None else (v if isinstance(v, str) else f.format(v))


def render(results: dict[str, Any], ratios: dict[str, Any], targets: list[dict[str, Any]], plan: Plan,
           load: tuple[Any, Any]) -> str:
    header = ["metric (higher is better)", "unsealed / direct", "sealed / gateway", "ratio", "of AES ceiling"]
    rows: list[list[str] | str] = []
    aes = (results.get("aes") or {}).get("metrics") or {}
    rows.append("1. AES-256-GCM ceiling (cryptography AESGCM, 64 KiB chunks, 1 thread)")
    for op in ("encrypt", "decrypt"):
        rows.append([f"  {op} MB/s", "", fmt(aes.get(f"{op}_MBps"), "{:.0f}"), "", ""])
    for op in ("encrypt", "decrypt"):
        rows.append([f"  {op} MB/CPU-s", "", fmt(aes.get(f"{op}_cpu"), "{:.0f}"), "", ""])
    for kind, title in (("local", "2a. store level: LocalStore vs SealedStore(LocalStore), in-process "
                                  "[target: the big MB/s rows]"),
                        ("s3", "2b. store level: S3Store vs SealedStore(S3Store) over SeaweedFS, "
                               "in-process [target: the big MB/s rows]")):
        res = results.get(kind) or {}
        rows.append(title + ("" if res.get("metrics") else f"  [{'not run' if not res else 'FAILED'}]"))
        m = res.get("metrics") or {}
        for k in STORE_ROWS:
            lab, f = ROW_LABELS[k]
            ceil = ratios["sealed_over_aes_ceiling"].get(f"{kind}.{k}")
            rows.append(["  " + lab.format(big=plan.big, parts=plan.parts),
                         fmt((m.get("plain") or {}).get(k), f), fmt((m.get("sealed") or {}).get(k), f),
                         fmt(ratios[f"{kind}_sealed_over_plain"].get(k), "{:.2f}x"),
                         fmt(ceil, "{:.0%}") if ceil is not None else ""])
    res = results.get("http") or {}
    rows.append("3. HTTP, boto3: SeaweedFS direct vs orgmem gateway over SeaweedFS "
                "[target: the big MB/s rows]"
                + ("" if res.get("metrics") else f"  [{'not run' if not res else 'FAILED'}]"))
    m = res.get("metrics") or {}
    for k in HTTP_ROWS:
        lab, f = HTTP_LABELS[k]
        rows.append(["  " + lab.format(big=plan.big), fmt((m.get("direct") or {}).get(k), f),
                     fmt((m.get("gateway") or {}).get(k), f),
                     fmt(ratios["gateway_over_direct"].get(k), "{:.2f}x"), ""])
    res = results.get("e2e") or {}
    rows.append("3b. HTTP, boto3, end to end: the gateway unsealed vs sealed (what clients see) "
                "[informational]"
                + ("" if res.get("metrics") else f"  [{'not run' if not res else 'FAILED'}]"))
    e2e_labels = {"big_put_MBps": HTTP_LABELS["big_put_MBps"], "big_get_MBps": HTTP_LABELS["big_get_MBps"],
                  "big_put_cpu": ("{big} PUT MB per server CPU-s", "{:.0f}"),
                  "big_get_cpu": ("{big} GET MB per server CPU-s", "{:.0f}")}
    for backend in E2E_BACKENDS:
        m = (res.get("metrics") or {}).get(backend) or {}
        for k in E2E_ROWS:
            lab, f = e2e_labels[k]
            rows.append([f"  {backend}: " + lab.format(big=plan.big),
                         fmt((m.get("unsealed") or {}).get(k), f), fmt((m.get("sealed") or {}).get(k), f),
                         fmt(ratios[f"e2e_{backend}_sealed_over_unsealed"].get(k), "{:.2f}x"), ""])
    rows.append(f"4. rewrap (POST /admin/v1/vault/rewrap, batches of {plan.rewrap_batch}) "
                "[target: embedded store; informational: S3 backend]")
    for kind, title in (("rewrap", "embedded store"), ("rewrap-s3", "S3 backend (SeaweedFS)")):
        res = results.get(kind) or {}
        m = res.get("metrics") or {}
        state = "" if m else (" [not run]" if not res or res.get("skipped") else " [FAILED]")
        rows.append([f"  {title}: objects/s ({m.get('objects', '-')} objects){state}", "",
                     fmt(m.get("objects_per_s"), "{:.0f}"), "", ""])

    table = [r for r in rows if isinstance(r, list)]
    widths = [max(len(header[i]), *(len(r[i]) for r in table)) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cells))

    out = [line(header), "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append(r if isinstance(r, str) else line(r))
    runs = f"median of {plan.runs} runs" if plan.runs > 1 else "1 run (--quick)"
    out.append(f"(MB = 10^6 bytes; {runs}; ratio = sealed/unsealed or gateway/direct; 'of AES "
               "ceiling' = the sealed value over the AES encrypt (PUT) or decrypt (GET) value in the "
               "same unit; MB/CPU-s = MB per CPU-second of the benchmark process, i.e. of the "
               "orgmem side, not SeaweedFS; in 3b, MB per CPU-second of the gateway and, over "
               "SeaweedFS, weed)")
    out.append(f"(load average at start {load[0]}, at end {load[1]} on {os.cpu_count()} CPUs: other "
               "processes share this machine, single runs vary by 10-20% or more)")
    out.append("")
    out.append("targets ([target]: the issue's targets; [info]: informational):")
    tw = max(len(t["target"]) for t in targets)
    for t in targets:
        v = t["value"]
        vs = "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
        tag = "[target]" if t["kind"] == TARGET else "[info]  "
        out.append(f"  {t['status']:<4}  {tag}  {t['target']:<{tw}}  value={vs}  {t['note']}".rstrip())
    errs = [(k, (results.get(k) or {}).get("error") or (results.get(k) or {}).get("errors"))
            for k in ALL_PARTS]
    errs = [(k, e) for k, e in errs if e]
    if errs:
        out.append("")
        out.append("errors:")
        for k, e in errs:
            out.append(f"  {k}: {json.dumps(e)[:800]}")
    return redact("\n".join(out))


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [UNSEALED_FLAG]:
        serve_unsealed(argv[1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="64 MiB objects, fixed small op counts, 1000/200 rewrap objects, 1 run")
    ap.add_argument("--runs", type=int, default=None,
                    help="runs per measurement (default 4: plain and sealed go first alike; --quick 1)")
    ap.add_argument("--parts", default=",".join(ALL_PARTS),
                    help=f"comma-separated subset of {','.join(ALL_PARTS)} (default: all)")
    ap.add_argument("--rewrap-objects", type=int, default=None,
                    help="objects for the embedded-store rewrap (default 5000, --quick 1000)")
    ap.add_argument("--rewrap-s3-objects", type=int, default=None,
                    help="objects for the S3-backend rewrap (default 500, --quick 200; 0 skips it)")
    ap.add_argument("--rewrap-batch", type=int, default=500,
                    help="objects per rewrap request (default 500, as `orgmem vault rewrap`)")
    ap.add_argument("--profile", action="store_true",
                    help="afterwards, cProfile one sealed big PUT and GET per store (stderr + JSON)")
    ap.add_argument("--bin-dir", type=Path, default=sb.VENV_BIN,
                    help=f"directory with orgmem and weed (default {sb.VENV_BIN})")
    ap.add_argument("--tmp", type=Path, default=None,
                    help="parent for the temp dirs (default: system temp dir; use a real disk, not tmpfs)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (server data + logs)")
    ap.add_argument("--json-out", type=Path, default=RESULTS_JSON)
    args = ap.parse_args(argv)

    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in ALL_PARTS]
    if bad or not parts:
        ap.error(f"unknown part(s) {bad}; choose from {ALL_PARTS}")
    plan = Plan(args)

    signal.signal(signal.SIGTERM, sb._sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    base_tmp = Path(tempfile.mkdtemp(prefix="orgmem-sealbench-", dir=args.tmp))
    results: dict[str, Any] = {}
    servers: dict[str, Any] = {}
    profile: dict[str, Any] = {}
    load0 = tuple(round(x, 2) for x in os.getloadavg())
    t_start = time.monotonic()
    interrupted = False
    weed: Proc | None = None

    def section(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        if name not in parts:
            return
        t0 = time.monotonic()
        log(f"== {name}")
        try:
            results[name] = fn()
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - one broken part must not stop the others
            results[name] = {"error": err(e)}
            log(f"{name}: FAILED: {err(e)}")
        results[name]["wall_seconds"] = round(time.monotonic() - t0, 1)

    def gateway_part(name: str, label: str, body: Callable[[Proc], dict[str, Any]],
                     over_weed: bool, prefix: str = "") -> dict[str, Any]:
        if over_weed and weed is None:
            raise ServerError("SeaweedFS did not start")
        gw = start_gateway(label, args.bin_dir, base_tmp, weed if over_weed else None, prefix)
        servers[label] = gw.describe()
        try:
            return body(gw)
        finally:
            gw.stop()
            gw.cleanup(args.keep)

    try:
        src = base_tmp / "big-source.bin"
        log(f"writing {plan.big} source file in {base_tmp}")
        src_sha = sb.make_big_file(src, plan.big_bytes)
        section("aes", lambda: bench_aes(plan))
        section("local", lambda: bench_store("local", plan, base_tmp, src, src_sha, None))
        if NEEDS_WEED & set(parts):
            try:
                weed = start_weed(args.bin_dir, base_tmp)
                servers["seaweedfs"] = weed.describe()
            except Exception as e:  # noqa: BLE001
                servers["seaweedfs"] = {"error": err(e)}
                log(f"seaweedfs: FAILED to start: {err(e)}")

        def store_s3() -> dict[str, Any]:
            if weed is None:
                raise ServerError("SeaweedFS did not start")
            with upstream_env():
                return bench_store("s3", plan, base_tmp, src, src_sha, weed)

        section("s3", store_s3)
        section("http", lambda: gateway_part(
            "http", "orgmem-over-seaweedfs",
            lambda gw: bench_http(plan, weed, gw, src, src_sha, base_tmp), True, "gw"))
        section("e2e", lambda: bench_e2e(plan, weed, args.bin_dir, base_tmp, src, src_sha, servers))
        section("rewrap", lambda: gateway_part(
            "rewrap", "orgmem-embedded-rewrap",
            lambda gw: bench_rewrap("embedded", gw, plan, plan.rewrap_objects), False))
        if plan.rewrap_s3_objects:
            section("rewrap-s3", lambda: gateway_part(
                "rewrap-s3", "orgmem-over-seaweedfs-rewrap",
                lambda gw: bench_rewrap("s3", gw, plan, plan.rewrap_s3_objects), True, "rewrap"))
        elif "rewrap-s3" in parts:
            results["rewrap-s3"] = {"skipped": "--rewrap-s3-objects 0"}
        if args.profile:
            kinds = ["local"] + (["s3"] if weed is not None else [])
            with upstream_env():
                profile = profile_sealed(plan, base_tmp, src, weed, kinds)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted; stopping servers")
    finally:
        sb.stop_all_servers()
        if args.keep:
            log(f"kept {base_tmp}")
        else:
            shutil.rmtree(base_tmp, ignore_errors=True)
    if interrupted:
        return 130

    load1 = tuple(round(x, 2) for x in os.getloadavg())
    ratios, targets = compute(results, plan)
    print(render(results, ratios, targets, plan, (load0, load1)))
    import cryptography
    from cryptography.hazmat.backends.openssl import backend
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(args.tmp or tempfile.gettempdir())],
                        capture_output=True, text=True).stdout.strip()
    doc = {
        "bench": "seal_bench", "version": 1,
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                 "cryptography": cryptography.__version__, "openssl": backend.openssl_version_text(),
                 "tmp_fs": fs, "loadavg_start": load0, "loadavg_end": load1},
        "plan": plan.describe(), "parts": parts, "servers": servers,
        "results": results, "ratios": ratios, "targets": targets, "profile": profile,
        "wall_seconds": round(time.monotonic() - t_start, 1),
    }
    line = redact(json.dumps(doc, separators=(",", ":"), default=str))
    print("BENCH_JSON " + line, flush=True)
    try:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(redact(json.dumps(doc, indent=2, default=str)) + "\n")
        log(f"wrote {args.json_out}")
    except OSError as e:
        log(f"could not write {args.json_out}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
