#!/usr/bin/env python3
"""Biography benchmark: event ingestion, compaction and Parquet size, with two peers, in one run.

What it measures, on the embedded store with encryption on (a plain ``orgmem serve``):

1. Acknowledged events/s of ``POST /v1/events`` (NDJSON, SigV4-signed) with 1, 100 and 1,000
   events per request, from 1 and 16 concurrent clients (threads, each with its own keep-alive
   ``http.client`` connection; every request is signed before the phase starts, so during a
   phase the client only sends bytes and reads answers). An acknowledged request means its
   events are durable in the group-commit log. The gateway runs with its defaults, so its
   background compactor (every 5 s) and the search index work during the phases; between
   phases, untimed, ``POST /v1/bio/compact`` and a wait until the search index has caught up
   empty both backlogs so each phase starts alike (indexing costs about as much CPU per event
   as acknowledging it, and before the wait a phase after a 1,000-event phase measured that
   backlog as much as itself). Server CPU per event comes from ``/proc/<pid>/stat`` of the
   gateway's process tree (its ingest and index processes included), client CPU from
   ``getrusage``; "cores busy" is server CPU seconds over wall seconds.
   1b. Sustained: 16 clients send batches of 100 for 20 s (``--quick`` 8 s), then the clock
   runs on until the search index has read the whole log and holds every event. The short
   phases count acknowledgements while the indexer may still be behind; events / (phase +
   catch-up) is the rate at which events become searchable, what a steady load can keep.
2. Single-event append latency p50/p99: 1 client, batches of 1, sequential.
3. Compaction events/s: a second gateway (``ORGMEM_COMPACT_INTERVAL=0``: no background
   compaction, so the timed call does all the work) ingests N events (200,000; ``--quick``
   30,000), then ``POST /v1/bio/compact`` is timed until it answers (committed).
4. Parquet size: the bytes of the segments the gateway wrote for those N events (listed in the
   ``biographies`` bucket with boto3; every segment is then fetched and its Parquet row count
   checked against N) against the same events as the NDJSON that was sent, gzip'd NDJSON
   (level 6) and, for reference, zstd-3 NDJSON.
5. Peers in the same run: (a) one object PUT per event to a bucket on the same gateway (the
   same client: keep-alive http.client, pre-signed requests), 1 and 16 clients; (b) SQLite in
   WAL mode with ``synchronous=FULL`` (every commit fsyncs the WAL: the durability an
   acknowledged orgmem append has), one transaction per request, the same NDJSON bodies
   parsed and inserted, the same batches and 1/16 client threads (each with its own
   connection). SQLite runs in-process: it pays no HTTP, signing, authentication, redaction,
   encryption or audit, so it is the bound of "a local embedded database", not a like-for-like
   network service.

The events come from a fixed, seeded generator (``EventGen``): agent sessions (prompt, then
responses, tool calls with JSON arguments, tool results, a few questions/answers/decisions/
notes/errors/state/handoffs), by 4 agents over one day. Prose is an order-2 word Markov chain
over the Python documentation shipped with the interpreter (``pydoc_data/topics.py``) and
stdlib docstrings: real vocabulary and word triples, new sentences; it is somewhat less
compressible than the real text it imitates (the JSON's ``generator.prose_calibration`` and
the table's footnote give both ratios). Code is real code: slices of the interpreter's stdlib
``.py`` files (a session works in one package, as an agent works in one repository). Shell
output (pytest, git, ls, pip, grep, logs) is synthesised. Content sizes are log-normal, from
tens of bytes (a tool call's one-line description) to ~5 KB at p99 (tool results, responses).
The generator depends on nothing but the seed and the interpreter's stdlib (its Python version
and a digest of the files it read are in the JSON).

Every server is started here on 127.0.0.1 (s3_bench's ``Server``) and stopped (SIGTERM to its
process group, SIGKILL after 10 s) also on errors and on Ctrl-C / SIGTERM.

Usage:
    .venv/bin/python bench/bio_bench.py             # full run (~3.5-4 min on 2 cores)
    .venv/bin/python bench/bio_bench.py --quick     # 30,000 events, 1 run of shorter phases (~1 min)
    .venv/bin/python bench/bio_bench.py --profile   # + cProfile of the gateway (all threads)
                                                    #   during a batch-100 ingest and a compaction

Output: an aligned text table with PASS/FAIL target rows, one ``BENCH_JSON {...}`` line on
stdout, and the same JSON in bench/results/bio_bench.json.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import http.client
import io
import json
import math
import os
import platform
import random
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import orjson  # noqa: E402
import s3_bench as sb  # noqa: E402  the shared server, load and /proc helpers
import zstandard  # noqa: E402
from s3_bench import ServerError, log, median, percentile, run_load  # noqa: E402

RESULTS_JSON = HERE / "results" / "bio_bench.json"
SECRETS = (sb.SECRET_KEY,)
EVENTS_PATH = "/v1/events"
NDJSON = "application/x-ndjson"
PEER_BUCKET = "bench-events"
BATCHES = (1, 100, 1000)
CLIENTS = (1, 16)
SEED = 20261130
AGENTS = ("scout", "builder", "reviewer", "planner")
#: every generated event lies on this (UTC) day: one partition per agent
DAY = _dt.datetime(2026, 11, 30, tzinfo=_dt.UTC)
SQLITE_SYNC = "FULL"

# --------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------


class Plan:
    def __init__(self, args: argparse.Namespace):
        q = self.quick = args.quick
        self.runs = args.runs or (1 if q else 3)
        self.ingest_seconds = 2.0 if q else 3.0          # each orgmem events/s phase
        self.peer_put_seconds = 2.0 if q else 3.0        # each object-PUT phase
        self.sqlite_seconds = 1.5 if q else 2.0          # each SQLite phase
        self.latency_requests = 300 if q else 2000       # sequential single-event appends
        self.compact_events = args.events or (30_000 if q else 200_000)
        self.compact_batch = 1000
        self.compact_clients = 4
        self.put_pool = 2500 if q else 6000              # distinct pre-signed object PUTs
        self.profile_seconds = 4.0 if q else 8.0
        self.sustained_seconds = 8.0 if q else 20.0      # the sustained phase (batch 100, 16 clients)
        self.catchup_cap = 300.0                         # at most this long for search to catch up
        # distinct request bodies per batch size (each is resent; the server gives every
        # event a fresh id, so a resent body is new events)
        self.bodies = {1: 2000, 100: 200, 1000: 40}

    def describe(self) -> dict[str, Any]:
        return {"quick": self.quick, "runs": self.runs, "batches": list(BATCHES), "clients": list(CLIENTS),
                "ingest_phase_seconds": self.ingest_seconds,
                "object_put_phase_seconds": self.peer_put_seconds,
                "sqlite_phase_seconds": self.sqlite_seconds, "latency_requests": self.latency_requests,
                "sustained_seconds": self.sustained_seconds,
                "compaction_events": self.compact_events, "compaction_ingest": {
                    "batch": self.compact_batch, "clients": self.compact_clients},
                "distinct_bodies_per_batch_size": self.bodies, "object_put_pool": self.put_pool,
                "body_format": "NDJSON (application/x-ndjson)", "sqlite_synchronous": SQLITE_SYNC,
                "between_phases": "POST /v1/bio/compact, then wait until GET /v1/index/status shows "
                                  "lag 0 (untimed), so every phase starts with no backlog of compaction "
                                  "or search; the background compactor (every 5 s) and the search "
                                  "index run during phases"}


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def redact(text: str) -> str:
    for s in SECRETS:
        text = text.replace(s, "<redacted>")
    return text


def err(e: BaseException) -> str:
    return redact(f"{type(e).__name__}: {e}")[:600]


def ratio(a: Any, b: Any) -> float | None:
    ok = isinstance(a, (int, float)) and isinstance(b, (int, float))
    return a / b if ok and b else None


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def fmt(v: Any, f: str) -> str:
    return "-" if v is None else (v if isinstance(v, str) else f.format(v))


# --------------------------------------------------------------------------
# the event generator (fixed: a seed and the interpreter's stdlib)
# --------------------------------------------------------------------------

_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "encodings",
              "pydoc_data", "ensurepip", "__pycache__", "config-3.11-x86_64-linux-gnu", "tkinter",
              "distutils"}
_B62 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_DOCSTRING = re.compile(r'^\s*(?:[rRuU]?)"""(.*?)"""', re.S | re.M)
_SKIP_FILES = {"_pydecimal.py", "_sysconfigdata__linux_x86_64-linux-gnu.py", "this.py"}


class Corpus:
    """Real text to draw from: stdlib code grouped in 'projects' and documentation prose."""

    def __init__(self) -> None:
        lib = Path(sysconfig.get_paths()["stdlib"])
        self.lib = lib
        digest = hashlib.sha256()
        files: list[Path] = []
        for path in sorted(lib.rglob("*.py")):
            rel = path.relative_to(lib)
            if any(part in _SKIP_DIRS for part in rel.parts[:-1]) or rel.name in _SKIP_FILES:
                continue
            files.append(path)
        self.files: dict[str, list[str]] = {}
        projects: dict[str, list[str]] = defaultdict(list)
        docstrings: list[str] = []
        for path in files:
            rel = str(path.relative_to(lib))
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            lines = text.splitlines()
            if len(lines) < 40:
                continue
            digest.update(rel.encode() + b"\0" + text.encode())
            self.files[rel] = lines
            top = rel.split("/")[0] if "/" in rel else "stdlib-" + rel[0]
            projects[top].append(rel)
            for ds in _DOCSTRING.findall(text):  # docstrings (and other triple-quoted text)
                if len(ds) > 60:
                    docstrings.append(ds)
        self.projects = {k: sorted(v) for k, v in sorted(projects.items())}
        ns: dict[str, Any] = {}
        topics_src = (lib / "pydoc_data" / "topics.py").read_text(encoding="utf-8")
        digest.update(topics_src.encode())
        exec(compile(topics_src, "topics.py", "exec"), ns)  # noqa: S102 - the stdlib's own data
        topics = ns["topics"]
        prose_src = "\n".join(topics[k] for k in sorted(topics)) + "\n" + "\n".join(docstrings)
        self.words = prose_src.split()
        self.digest = digest.hexdigest()
        names = set()
        for rel in self.files:
            for line in self.files[rel]:
                s = line.lstrip()
                if s.startswith("def ") and "(" in s:
                    names.add(s[4:s.index("(")])
        self.func_names = sorted(n for n in names if n.isidentifier())

    def describe(self) -> dict[str, Any]:
        return {"stdlib": str(self.lib), "python": platform.python_version(), "code_files": len(self.files),
                "projects": len(self.projects), "prose_words": len(self.words), "sha256": self.digest}


class EventGen:
    """Agent sessions as NDJSON lines (bytes), deterministic for a seed.

    Sessions are emitted whole, one after another (best case for a streaming compressor such
    as gzip, whose window is 32 KiB); their start times spread over one day, 4 agents.
    """

    TOOLS = ("read_file", "bash", "edit_file", "grep", "web_fetch")
    TOOL_WEIGHTS = (30, 35, 15, 12, 8)
    MODELS = ("claude-sonnet-4-5", "claude-haiku-4-5", "gpt-4.1")

    def __init__(self, corpus: Corpus, seed: int = SEED, bank_words: int = 1_200_000) -> None:
        self.c = corpus
        self.rng = random.Random(seed)
        self.bank = self._markov_bank(bank_words)
        self.bank_len = len(self.bank)
        self.kinds: Counter[str] = Counter()
        self.content_bytes: list[int] = []

    def calibration(self, n: int = 1_600_000) -> dict[str, Any]:
        """How compressible the generated prose is next to the real text the chain imitates:
        gzip -6 over the whole sample, and zstd -3 in 1 MB pieces (about a Parquet page)."""
        def ratios(b: bytes) -> tuple[float, float]:
            zc = zstandard.ZstdCompressor(level=3)
            z = sum(len(zc.compress(b[i:i + 1_000_000])) for i in range(0, len(b), 1_000_000))
            return round(len(b) / len(zlib.compress(b, 6)), 3), round(len(b) / z, 3)

        src = " ".join(self.c.words).encode()[:n]
        gen = self.bank.encode()[:len(src)]
        (g_src, z_src), (g_gen, z_gen) = ratios(src), ratios(gen)
        return {"sample_bytes": len(src),
                "gzip6_ratio_source_prose": g_src, "gzip6_ratio_generated_prose": g_gen,
                "zstd3_1MB_ratio_source_prose": z_src, "zstd3_1MB_ratio_generated_prose": z_gen}

    # -- text -----------------------------------------------------------------
    def _markov_bank(self, n: int) -> str:
        """n words of an order-2 word Markov chain over the documentation prose: real word
        triples, new sentences (about 30% of its 6-word runs occur in the source)."""
        words = self.c.words
        succ: dict[tuple[str, str], list[str]] = defaultdict(list)
        for a, b, c in zip(words, words[1:], words[2:], strict=False):
            succ[(a, b)].append(c)
        frozen = {k: tuple(v) for k, v in succ.items()}
        rng = random.Random(self.rng.random())
        ch = rng.choice
        a, b = words[0], words[1]
        out = []
        append = out.append
        get = frozen.get
        for _ in range(n):
            append(a)
            nx = get((a, b))
            a, b = b, (ch(nx) if nx else ch(words))
        return " ".join(out)

    def size(self, median_b: float, sigma: float = 0.7, lo: int = 40, hi: int = 16000) -> int:
        return int(min(hi, max(lo, self.rng.lognormvariate(math.log(median_b), sigma))))

    def prose(self, n: int) -> str:
        bank = self.bank
        start = self.rng.randrange(0, self.bank_len - n - 200)
        start = bank.find(" ", start) + 1
        end = bank.rfind(" ", start, start + n)
        if end <= start:
            end = start + n
        text = bank[start:end]
        return text[:1].upper() + text[1:].rstrip(",;:") + "."

    def code(self, rel: str, n: int) -> tuple[int, list[str]]:
        lines = self.c.files[rel]
        start = self.rng.randrange(0, max(1, len(lines) - 5))
        out, size = [], 0
        for line in lines[start:]:
            out.append(line)
            size += len(line) + 1
            if size >= n:
                break
        return start + 1, out

    # -- tool calls and results -------------------------------------------------
    def _hexid(self, n: int) -> str:
        return f"{self.rng.getrandbits(n * 4):0{n}x}"

    def _call_id(self) -> str:
        """An id like a tool-use id of a model API: 22 random base62 characters."""
        v = self.rng.getrandbits(131)
        out = []
        for _ in range(22):
            v, d = divmod(v, 62)
            out.append(_B62[d])
        return "toolu_01" + "".join(out)

    def _pytest_output(self, rel: str, n: int) -> str:
        r = self.rng
        mod = rel.replace("/", "_").removesuffix(".py")
        lines = ["============================= test session starts ==============================",
                 "platform linux -- Python 3.11.7, pytest-8.3.4, pluggy-1.5.0",
                 "rootdir: /work/repo", "configfile: pyproject.toml", "plugins: anyio-4.6.2, timeout-2.3.1",
                 f"collected {r.randint(5, 400)} items", ""]
        size = sum(map(len, lines))
        failed = []
        while size < n:
            name = r.choice(self.c.func_names)
            ok = r.random() > 0.08
            if not ok:
                failed.append(name)
            line = (f"tests/test_{mod}.py::test_{name.strip('_')} "
                    f"{'PASSED' if ok else 'FAILED'} [{r.randint(1, 99):3d}%]")
            lines.append(line)
            size += len(line) + 1
        if failed:
            lines += ["", "=================================== FAILURES ===================================",
                      f"{'_' * 30} test_{failed[0].strip('_')} {'_' * 30}"]
            first, code = self.code(rel, 300)
            lines += [f">       {code[-1].strip()}" if code else "", "E       AssertionError: assert "
                      f"{r.randint(0, 999)} == {r.randint(0, 999)}", "",
                      f"{rel}:{first + len(code)}: AssertionError"]
        lines.append(f"{'=' * 10} {len(failed)} failed, {r.randint(5, 400)} passed in "
                     f"{r.uniform(0.2, 90):.2f}s {'=' * 10}")
        return "\n".join(lines)

    def _git_output(self, project: str, n: int) -> str:
        r = self.rng
        files = self.c.projects[project]
        if r.random() < 0.5:
            lines = ["On branch main", "Your branch is up to date with 'origin/main'.", "",
                     "Changes not staged for commit:",
                     '  (use "git add <file>..." to update what will be committed)']
            for f in r.sample(files, min(len(files), r.randint(1, 6))):
                lines.append(f"\tmodified:   Lib/{f}")
            return "\n".join(lines)
        rel = r.choice(files)
        first, code = self.code(rel, n)
        lines = [f"diff --git a/Lib/{rel} b/Lib/{rel}", f"index {self._hexid(7)}..{self._hexid(7)} 100644",
                 f"--- a/Lib/{rel}", f"+++ b/Lib/{rel}",
                 f"@@ -{first},{len(code)} +{first},{len(code) + 1} @@"]
        for i, line in enumerate(code):
            if i == len(code) // 2:
                lines.append("-" + line)
                lines.append("+" + line.replace("self", "self_", 1) + "  # fixed")
            else:
                lines.append(" " + line)
        return "\n".join(lines)

    def _ls_output(self, project: str) -> str:
        r = self.rng
        lines = [f"total {r.randint(20, 900)}"]
        for f in self.c.projects[project][:40]:
            lines.append(f"-rw-r--r-- 1 agent agent {r.randint(200, 90000):6d} Nov {r.randint(1, 30):2d} "
                         f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d} {f.split('/')[-1]}")
        return "\n".join(lines)

    def _log_output(self, n: int) -> str:
        r = self.rng
        lines, size = [], 0
        t = DAY.timestamp() + r.uniform(0, 80000)
        levels = ("INFO", "INFO", "INFO", "DEBUG", "WARNING", "ERROR")
        while size < n:
            t += r.expovariate(20)
            stamp = _dt.datetime.fromtimestamp(t, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
            if r.random() < 0.5:
                line = orjson.dumps({"ts": stamp, "level": r.choice(levels).lower(),
                                     "event": r.choice(self.c.func_names), "request_id": self._hexid(16),
                                     "status": r.choice((200, 200, 200, 201, 204, 404, 500)),
                                     "duration_ms": round(r.expovariate(0.05), 2)}).decode()
            else:
                line = (f"{stamp} {r.choice(levels):7s} [{r.choice(self.c.func_names)}] "
                        f"{self.prose(r.randint(30, 120))}")
            lines.append(line)
            size += len(line) + 1
        return "\n".join(lines)

    def _pip_output(self) -> str:
        r = self.rng
        pkgs = ("orjson", "pyarrow", "zstandard", "httpx", "pydantic", "uvicorn", "boto3", "duckdb", "numpy")
        lines = []
        for p in r.sample(pkgs, r.randint(2, 6)):
            v = f"{r.randint(0, 20)}.{r.randint(0, 30)}.{r.randint(0, 9)}"
            lines.append(f"Collecting {p}=={v}")
            lines.append(f"  Downloading {p}-{v}-cp311-cp311-manylinux_2_17_x86_64.whl "
                         f"({r.uniform(0.1, 40):.1f} MB)")
        lines.append("Installing collected packages: " + ", ".join(x.split()[1].split("==")[0]
                                                                  for x in lines if x.startswith("Coll")))
        lines.append("Successfully installed " + " ".join(x.split()[1].replace("==", "-")
                                                          for x in lines if x.startswith("Coll")))
        return "\n".join(lines)

    def _grep(self, project: str, n: int) -> tuple[str, str]:
        r = self.rng
        word = r.choice(self.c.func_names)
        lines, size = [], 0
        files = self.c.projects[project]
        while size < n:
            rel = r.choice(files)
            first, code = self.code(rel, 1)
            line = f"Lib/{rel}:{first}:{code[0] if code else ''}"
            lines.append(line)
            size += len(line) + 1
        return word, "\n".join(lines)

    def _traceback(self, project: str) -> tuple[str, str]:
        r = self.rng
        exc = r.choice(("KeyError", "TypeError", "ValueError", "AttributeError", "FileNotFoundError",
                        "TimeoutError", "AssertionError"))
        lines = ["Traceback (most recent call last):"]
        for _ in range(r.randint(2, 7)):
            rel = r.choice(self.c.projects[project])
            first, code = self.code(rel, 1)
            lines.append(f'  File "/work/repo/Lib/{rel}", line {first}, in {r.choice(self.c.func_names)}')
            lines.append(f"    {code[0].strip() if code else 'pass'}")
        lines.append(f"{exc}: {self.prose(r.randint(20, 120))}")
        return exc, "\n".join(lines)

    def _secret_line(self) -> str:
        """A credential an agent pasted or a tool printed (about 1 tool result in 500)."""
        r = self.rng
        alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
        if r.random() < 0.5:
            return "export GITHUB_TOKEN=ghp_" + "".join(r.choice(alnum) for _ in range(36))
        return "AWS_SECRET_ACCESS_KEY=" + "".join(r.choice(alnum + "/+") for _ in range(40))

    def tool_pair(self, project: str, working: list[str]) -> tuple[str, str, dict, str, dict]:
        """(tool, call content, call args, result content, result data)."""
        r = self.rng
        tool = r.choices(self.TOOLS, self.TOOL_WEIGHTS)[0]
        if tool == "read_file":
            rel = r.choice(working)
            first, code = self.code(rel, self.size(1800, 0.6, 200, 12000))
            args = {"path": f"/work/repo/Lib/{rel}", "offset": first, "limit": len(code)}
            result = "\n".join(f"{first + i:6d}\t{line}" for i, line in enumerate(code))
            call = f"Reading Lib/{rel} around line {first}."
            data = {"lines": len(code), "truncated": False}
        elif tool == "bash":
            kind = r.choices(("pytest", "git", "ls", "log", "pip", "python"), (30, 20, 10, 25, 5, 10))[0]
            rel = r.choice(working)
            if kind == "pytest":
                cmd = f"python -m pytest -q tests/test_{rel.replace('/', '_').removesuffix('.py')}.py -x"
                result = self._pytest_output(rel, self.size(1200, 0.7, 200, 8000))
            elif kind == "git":
                cmd = r.choice(("git status", f"git diff Lib/{rel}", "git diff --stat"))
                result = self._git_output(project, self.size(1200, 0.6, 200, 6000))
            elif kind == "ls":
                cmd = f"ls -la Lib/{project}"
                result = self._ls_output(project)
            elif kind == "log":
                cmd = f"tail -n {r.randint(20, 200)} /var/log/app/{r.choice(self.c.func_names)}.log"
                result = self._log_output(self.size(1500, 0.7, 200, 10000))
            elif kind == "pip":
                cmd = "pip install -r requirements.txt"
                result = self._pip_output()
            else:
                fn = r.choice(self.c.func_names)
                mod = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                cmd = f"python -c 'import {mod}; print({mod}.{fn})'"
                result = self.prose(self.size(200, 0.5, 40, 1000))
            if r.random() < 0.002:
                result = self._secret_line() + "\n" + result
            args = {"command": cmd, "timeout": r.choice((60, 120, 600)), "cwd": "/work/repo"}
            call = f"Running `{cmd}`."
            data = {"exit_code": r.choice((0, 0, 0, 0, 1, 2)), "duration_ms": r.randint(5, 90000)}
        elif tool == "edit_file":
            rel = r.choice(working)
            first, old = self.code(rel, self.size(400, 0.6, 60, 3000))
            new = [line.replace("return", "return  # checked", 1) if i == 0 else line
                   for i, line in enumerate(old)]
            new.insert(len(new) // 2, "        " + "# " + self.prose(60))
            args = {"path": f"/work/repo/Lib/{rel}", "old_str": "\n".join(old), "new_str": "\n".join(new)}
            snippet = "\n".join(f"{first + i:6d}\t{line}" for i, line in enumerate(new[:12]))
            result = f"The file /work/repo/Lib/{rel} has been edited. Here's the result of running " \
                     f"`cat -n` on a snippet of the edited file:\n{snippet}"
            call = f"Editing Lib/{rel}: {self.prose(80)}"
            data = {"replacements": 1}
        elif tool == "grep":
            word, result = self._grep(project, self.size(800, 0.7, 100, 6000))
            args = {"pattern": word, "path": f"/work/repo/Lib/{project}", "output_mode": "content"}
            call = f"Searching for {word}."
            data = {"matches": result.count("\n") + 1}
        else:
            url = f"https://docs.python.org/3/library/{r.choice(self.c.func_names).strip('_')}.html"
            args = {"url": url, "prompt": self.prose(self.size(120, 0.5, 30, 400))}
            result = "# " + self.prose(40) + "\n\n" + self.prose(self.size(1500, 0.7, 200, 8000))
            call = f"Fetching {url}."
            data = {"status": 200, "bytes": len(result) * 3}
        cid = self._call_id()
        args = {"call_id": cid, **args}
        data = {"call_id": cid, **data}
        return tool, call, args, result, data

    # -- sessions ---------------------------------------------------------------
    def session(self, budget: int) -> list[dict]:
        r = self.rng
        agent = r.choice(AGENTS)
        project = r.choice(list(self.c.projects))
        files = self.c.projects[project]
        working = r.sample(files, min(len(files), r.randint(2, 6)))
        model = r.choices(self.MODELS, (60, 25, 15))[0]
        t = DAY.timestamp() + r.uniform(0, 22 * 3600)
        sid = f"{agent}-{DAY:%Y%m%d}-{self._hexid(8)}"
        traced = r.random() < 0.3
        trace_id = self._hexid(32) if traced else None
        task = f"task:{r.randint(1000, 9999)}"
        tags = [task, f"repo:cpython/{project}"]
        n = min(budget, r.randint(20, 120))
        out: list[dict] = []
        ctx = r.randint(3000, 20000)
        seq = 0

        def emit(kind: str, role: str | None, content: str | None, **extra: Any) -> None:
            nonlocal t, seq
            t += r.uniform(0.2, 25.0)
            seq += 1
            ts = _dt.datetime.fromtimestamp(t, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            ev: dict[str, Any] = {"agent": agent, "session": sid, "seq": seq, "ts": ts, "kind": kind}
            if role:
                ev["role"] = role
            if content is not None:
                ev["content"] = content
                self.content_bytes.append(len(content.encode()))
            for k, v in extra.items():
                if v is not None:
                    ev[k] = v
            if traced:
                ev["trace_id"] = trace_id
                ev["span_id"] = self._hexid(16)
            self.kinds[kind] += 1
            out.append(ev)

        emit("prompt", "user", self.prose(self.size(600, 0.6, 120, 4000)), tags=tags)
        while len(out) < n:
            x = r.random()
            if x < 0.62:
                tin = ctx
                text = self.prose(self.size(500, 0.7, 80, 3000))
                if r.random() < 0.2:
                    first, code = self.code(r.choice(working), self.size(500, 0.6, 100, 2500))
                    text += ("\n\n```python\n" + "\n".join(code) + "\n```\n\n"
                             + self.prose(self.size(150, 0.5)))
                tout = max(20, len(text) // 4)
                ctx += tout + r.randint(200, 4000)
                emit("response", "assistant", text, model=model, tokens_in=tin, tokens_out=tout)
                for _ in range(r.choice((1, 1, 1, 2, 2, 3))):
                    if len(out) >= n - 1:
                        break
                    tool, call, args, result, data = self.tool_pair(project, working)
                    emit("tool_call", "assistant", call, tool=tool, data=args)
                    emit("tool_result", "tool", result, tool=tool, data=data)
                    ctx += len(result) // 4
            elif x < 0.70:
                emit("note", "assistant", self.prose(self.size(250, 0.6)))
            elif x < 0.76 and len(out) < n - 1:
                emit("question", "assistant", self.prose(self.size(220, 0.5)).rstrip(".") + "?")
                emit("answer", "user", self.prose(self.size(260, 0.6)))
            elif x < 0.82:
                opts = [self.prose(60) for _ in range(r.randint(2, 4))]
                emit("decision", "assistant", self.prose(self.size(300, 0.6)),
                     data={"choice": 0, "alternatives": opts}, tags=[task])
            elif x < 0.88:
                exc, tb = self._traceback(project)
                emit("error", "tool", tb, tool="bash", data={"exception": exc, "exit_code": 1})
            elif x < 0.94:
                emit("state", "assistant", "Plan updated.", data={
                    "plan": [self.prose(70) for _ in range(r.randint(2, 6))],
                    "done": r.randint(0, 5), "files": [f"Lib/{f}" for f in working],
                    "context_tokens": ctx})
            else:
                emit("note", "assistant", self.prose(self.size(120, 0.5)))
        if r.random() < 0.3:
            other = r.choice([a for a in AGENTS if a != agent])
            emit("handoff", "assistant", self.prose(self.size(300, 0.5)),
                 data={"to": other, "reason": self.prose(80)})
        return out

    def lines(self, n: int) -> list[bytes]:
        """n NDJSON lines (no trailing newline), in session order."""
        out: list[bytes] = []
        dumps = orjson.dumps
        while len(out) < n:
            for ev in self.session(n - len(out)):
                out.append(dumps(ev))
        return out[:n]


# --------------------------------------------------------------------------
# servers and clients
# --------------------------------------------------------------------------


class Gateway(sb.Server):
    """``orgmem serve`` as s3_bench starts it (sealed embedded store), plus extra env/argv."""

    def __init__(self, label: str, bin_dir: Path, base_tmp: Path, env: dict[str, str] | None = None,
                 argv: list[str] | None = None):
        super().__init__("orgmem", bin_dir, base_tmp)
        self.label = label
        self.extra_env = dict(env or {})
        self.argv_prefix = list(argv or [])

    def _command(self) -> tuple[list[str], dict[str, str]]:
        argv, env = super()._command()
        if self.argv_prefix:
            argv = self.argv_prefix + argv[1:]
        return argv, {**env, **self.extra_env}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "command": self.argv,
                "env": {k: ("<redacted>" if "SECRET" in k else v) for k, v in self.env_shown.items()},
                "store": "embedded (LocalStore), sealed (AES-256-GCM, default keyring)",
                "durability": self.durability}


def bio_client(gw: Gateway, timeout: float = 900):
    try:
        from gateway.bio_client import BioClient
    except ImportError:  # pragma: no cover - the module exists in this repo
        BioClient = None
    if BioClient is not None:
        return BioClient(gw.endpoint, sb.ACCESS_KEY, sb.SECRET_KEY, timeout=timeout)
    raise ServerError("gateway.bio_client is missing")


def signer(gw: Gateway):
    from gateway.admin_client import AdminClient

    return AdminClient(gw.endpoint, sb.ACCESS_KEY, sb.SECRET_KEY)


class Req:
    """One pre-signed request: method, path, body, headers, and what a good answer ends with."""

    __slots__ = ("method", "path", "body", "headers", "events")

    def __init__(self, method: str, path: str, body: bytes, headers: dict[str, str], events: int):
        self.method, self.path, self.body, self.headers, self.events = method, path, body, headers, events


def sign_events(ac: Any, bodies: list[tuple[bytes, int]]) -> list[Req]:
    out = []
    for body, n in bodies:
        h = ac.sign("POST", EVENTS_PATH, "", body, {"content-type": NDJSON})
        out.append(Req("POST", EVENTS_PATH, body, h, n))
    return out


class Conns:
    """One keep-alive http.client connection per client thread."""

    def __init__(self, port: int, n: int):
        self.port = port
        self.conns: list[http.client.HTTPConnection | None] = [None] * n

    def send(self, t: int, req: Req) -> bytes:
        conn = self.conns[t]
        if conn is None:
            conn = self.conns[t] = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request(req.method, req.path, req.body, req.headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self.conns[t] = None
            raise
        if resp.status != 200:
            raise ServerError(f"HTTP {resp.status}: {data[:300]!r}")
        return data

    def close(self) -> None:
        for c in self.conns:
            if c is not None:
                c.close()


def event_op(conns: Conns, reqs: list[Req], nthreads: int) -> Callable[[int, int], None]:
    stride = max(1, len(reqs) // nthreads)

    def op(t: int, i: int) -> None:
        req = reqs[(t * stride + i) % len(reqs)]
        data = conns.send(t, req)
        if not data.endswith(b'"count":%d}' % req.events):
            got = orjson.loads(data).get("count")
            if got != req.events:
                raise ServerError(f"acknowledged {got} events of {req.events}")
    return op


def bodies_of(lines: list[bytes], batch: int, count: int, offset: int = 0) -> list[tuple[bytes, int]]:
    out = []
    n = len(lines)
    for k in range(count):
        start = (offset + k * batch) % n
        chunk = [lines[(start + j) % n] for j in range(batch)]
        out.append((b"\n".join(chunk) + b"\n", batch))
    return out


def measured(srv_pid: int | None, nthreads: int, op: Callable[[int, int], None],
             **kw: Any) -> tuple[sb.Phase, float | None, float]:
    """``run_load(nthreads, op, **kw)``; (phase, server CPU ms, client CPU s)."""
    s0 = sb.tree_cpu_ms(srv_pid) if srv_pid else None
    c0 = cpu_s()
    ph = run_load(nthreads, op, **kw)
    c1 = cpu_s()
    s1 = sb.tree_cpu_ms(srv_pid) if srv_pid else None
    return ph, (None if s0 is None or s1 is None else s1 - s0), c1 - c0


# --------------------------------------------------------------------------
# 1 + 2 + 5a: ingest, latency, one object PUT per event (gateway with default settings)
# --------------------------------------------------------------------------


def bench_ingest(gw: Gateway, plan: Plan, lines: list[bytes]) -> dict[str, Any]:
    ac = signer(gw)
    bio = bio_client(gw)
    raw: dict[str, Any] = {}
    errors: dict[str, str] = {}

    def drain() -> float:
        """Untimed: compact, then wait until search holds everything too. Indexing costs about
        as much CPU per event as acknowledging it, so a phase that started while the index was
        still working off the phases before it (a 1,000-event phase leaves ~100,000 events)
        measured that backlog as much as its own batch size."""
        t0 = time.perf_counter()
        bio.compact()
        wait_index_current(ac, 0, 600)
        return time.perf_counter() - t0

    # warm-up: one of each size, then an empty backlog
    for b in BATCHES:
        bio.put_events(bodies_of(lines, b, 1)[0][0])
    drain()
    for r in range(plan.runs):
        for batch in BATCHES:
            log(f"signing {plan.bodies[batch]} bodies of {batch} event(s)")
            reqs = sign_events(ac, bodies_of(lines, batch, plan.bodies[batch], offset=batch * 7 + r))
            for nt in CLIENTS:
                key = f"b{batch}_c{nt}"
                conns = Conns(gw.port, nt)
                try:
                    ph, srv_ms, cli_s = measured(gw.pid, nt, event_op(conns, reqs, nt),
                                                 duration=plan.ingest_seconds, cap=plan.ingest_seconds + 60)
                finally:
                    conns.close()
                events = ph.ok * batch
                d = raw.setdefault(key, {"events_per_s": [], "requests_per_s": [],
                                         "server_cpu_us_per_event": [], "client_cpu_us_per_event": [],
                                         "server_cores_busy": [], "errors": 0, "drain_s": []})
                d["server_cores_busy"].append(srv_ms / 1000 / ph.elapsed if srv_ms is not None else None)
                d["events_per_s"].append(events / ph.elapsed if ph.ok else None)
                d["requests_per_s"].append(ph.ops)
                d["server_cpu_us_per_event"].append(
                    srv_ms * 1000 / events if events and srv_ms is not None else None)
                d["client_cpu_us_per_event"].append(cli_s * 1e6 / events if events else None)
                d["errors"] += ph.errors
                if ph.first_error:
                    errors.setdefault(key, redact(ph.first_error))
                d["drain_s"].append(round(drain(), 2))
                log(f"orgmem {key}: {events} events in {ph.elapsed:.2f}s = "
                    f"{(events / ph.elapsed) if ph.ok else 0:,.0f} ev/s; server "
                    f"{d['server_cpu_us_per_event'][-1] or 0:.0f} us CPU/event, client "
                    f"{d['client_cpu_us_per_event'][-1] or 0:.0f}; errors {ph.errors}; "
                    f"drain {d['drain_s'][-1]}s")
    # 2. latency: sequential single-event appends
    reqs = sign_events(ac, bodies_of(lines, 1, plan.latency_requests, offset=12345))
    conns = Conns(gw.port, 1)
    try:
        ph = run_load(1, event_op(conns, reqs, 1), count=plan.latency_requests, cap=120, record_latency=True)
    finally:
        conns.close()
    lat = ph.latencies
    raw["latency"] = {"samples": len(lat), "errors": ph.errors,
                      "p50_ms": (percentile(lat, 50) or 0) * 1000 if lat else None,
                      "p90_ms": (percentile(lat, 90) or 0) * 1000 if lat else None,
                      "p99_ms": (percentile(lat, 99) or 0) * 1000 if lat else None,
                      "max_ms": max(lat) * 1000 if lat else None}
    if ph.first_error:
        errors.setdefault("latency", redact(ph.first_error))
    log(f"orgmem latency: p50 {raw['latency']['p50_ms']:.2f} ms, p99 {raw['latency']['p99_ms']:.2f} ms "
        f"({len(lat)} samples)")
    raw["latency"]["drain_s"] = round(drain(), 2)
    # what the log did
    return {"raw": raw, "errors": errors}


def index_status(ac: Any) -> dict[str, Any]:
    """``GET /v1/index/status``: the search index's lag (log objects unread) and document count."""
    status, _, data = ac._request("GET", "/v1/index/status")
    if status != 200:
        raise RuntimeError(f"/v1/index/status answered {status}")
    return json.loads(data)


def wait_index_current(ac: Any, docs: int, cap: float) -> dict[str, Any]:
    """Poll until the index has read the whole log and holds at least ``docs`` documents, the
    same count twice (the status's lag counts a step's objects read before its commit makes
    their documents count)."""
    deadline = time.monotonic() + cap
    seen = None
    while True:
        st = index_status(ac)
        current = st.get("lag_objects") == 0 and (st.get("docs") or 0) >= docs
        if current and st.get("docs") == seen:
            return st
        seen = st.get("docs") if current else None
        if time.monotonic() > deadline:
            raise TimeoutError(f"the index did not catch up within {cap:.0f}s: {st.get('lag_objects')} log "
                               f"objects unread, {st.get('docs')} of {docs} documents")
        time.sleep(0.1)


def bench_sustained(gw: Gateway, plan: Plan, lines: list[bytes]) -> dict[str, Any]:
    """What the gateway sustains with search kept current, not only what it acknowledges.

    The short phases above measure acknowledgements; the search index (and the compactor)
    may still be working through what those phases wrote when they end. Here 16 clients
    send batches of 100 for ``sustained_seconds``, then the clock runs on until the index
    has read the whole log and holds every event: events / (phase + catch-up) is the rate at
    which events become searchable, the capacity a steady load can keep up with."""
    ac = signer(gw)
    bio_client(gw).compact()
    docs0 = wait_index_current(ac, 0, plan.catchup_cap).get("docs") or 0
    reqs = sign_events(ac, bodies_of(lines, 100, 600, offset=4242))
    conns = Conns(gw.port, 16)
    try:
        ph, srv_ms, _ = measured(gw.pid, 16, event_op(conns, reqs, 16), duration=plan.sustained_seconds,
                                 cap=plan.sustained_seconds + 120)
    finally:
        conns.close()
    events = ph.ok * 100
    cpu0, t0 = sb.tree_cpu_ms(gw.pid), time.perf_counter()
    st = wait_index_current(ac, docs0 + events, plan.catchup_cap)
    catchup, catchup_ms = time.perf_counter() - t0, sb.tree_cpu_ms(gw.pid) - cpu0
    out = {"events": events, "errors": ph.errors, "ingest_seconds": round(ph.elapsed, 2),
           "ingest_events_per_s": events / ph.elapsed if ph.ok else None,
           "catchup_seconds": round(catchup, 2),
           "catchup_cores_busy": round(catchup_ms / 1000 / catchup, 2) if catchup > 0 else None,
           "ingest_cores_busy": round(srv_ms / 1000 / ph.elapsed, 2) if srv_ms else None,
           "searchable_events_per_s": events / (ph.elapsed + catchup) if ph.ok else None,
           "server_cpu_us_per_event": (srv_ms + catchup_ms) * 1000 / events if events and srv_ms else None,
           "index_docs": st.get("docs")}
    if ph.first_error:
        out["first_error"] = redact(ph.first_error)
    log(f"orgmem sustained: {events} events in {ph.elapsed:.1f}s = "
        f"{out['ingest_events_per_s'] or 0:,.0f} ev/s acknowledged; search caught up {catchup:.1f}s "
        f"later: {out['searchable_events_per_s'] or 0:,.0f} ev/s searchable; "
        f"{out['server_cpu_us_per_event'] or 0:.0f} us server CPU/event")
    return out


def bench_object_put(gw: Gateway, plan: Plan, lines: list[bytes]) -> dict[str, Any]:
    """Peer (a): every event its own object, PUT to a bucket on the same gateway."""
    ac = signer(gw)
    c = sb.make_client(gw, 1)
    try:
        c.create_bucket(Bucket=PEER_BUCKET)
    except Exception as e:  # noqa: BLE001
        if getattr(e, "response", {}).get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
    raw: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for r in range(plan.runs):
        for nt in CLIENTS:
            key = f"c{nt}"
            reqs = []
            base = 50_000 + r * 10 * plan.put_pool + nt * plan.put_pool
            for k in range(plan.put_pool):
                body = lines[(base + k) % len(lines)]
                ev = orjson.loads(body)
                path = (f"/{PEER_BUCKET}/events/{ev['agent']}/{ev['session']}/"
                        f"{ev['seq']:06d}-r{r}c{nt}k{k}.json")
                h = ac.sign("PUT", path, "", body, {"content-type": "application/json"})
                reqs.append(Req("PUT", path, body, h, 1))
            conns = Conns(gw.port, nt)
            per = plan.put_pool // nt

            def op(t: int, i: int, reqs: list[Req] = reqs, conns: Conns = conns, per: int = per) -> None:
                conns.send(t, reqs[t * per + i])
            try:
                ph, srv_ms, cli_s = measured(gw.pid, nt, op, count=per * nt, duration=plan.peer_put_seconds,
                                             cap=plan.peer_put_seconds + 60, record_latency=(nt == 1))
            finally:
                conns.close()
            d = raw.setdefault(key, {"events_per_s": [], "server_cpu_us_per_event": [],
                                     "client_cpu_us_per_event": [], "errors": 0, "p50_ms": [], "p99_ms": []})
            d["events_per_s"].append(ph.ops)
            d["server_cpu_us_per_event"].append(
                srv_ms * 1000 / ph.ok if ph.ok and srv_ms is not None else None)
            d["client_cpu_us_per_event"].append(cli_s * 1e6 / ph.ok if ph.ok else None)
            d["errors"] += ph.errors
            if ph.latencies:
                d["p50_ms"].append(percentile(ph.latencies, 50) * 1000)
                d["p99_ms"].append(percentile(ph.latencies, 99) * 1000)
            if ph.first_error:
                errors.setdefault(key, redact(ph.first_error))
            if ph.ok >= per * nt:  # the rate stands (PUTs / their time); the phase was just shorter
                d.setdefault("notes", []).append(f"all {per * nt} pre-signed PUTs done in {ph.elapsed:.2f}s "
                                                 f"(< {plan.peer_put_seconds:g}s)")
            log(f"object PUT {key}: {ph.ok} PUTs in {ph.elapsed:.2f}s = {ph.ops or 0:,.0f} events/s; "
                f"server {d['server_cpu_us_per_event'][-1] or 0:.0f} us CPU/event; errors {ph.errors}")
    return {"raw": raw, "errors": errors}


# --------------------------------------------------------------------------
# 3 + 4: compaction and size (a gateway without background compaction)
# --------------------------------------------------------------------------


def bench_compaction(gw: Gateway, plan: Plan, lines: list[bytes]) -> dict[str, Any]:
    ac = signer(gw)
    bio = bio_client(gw)
    n = len(lines)
    batch = plan.compact_batch
    bodies = [(b"\n".join(lines[i:i + batch]) + b"\n", len(lines[i:i + batch])) for i in range(0, n, batch)]
    reqs = sign_events(ac, bodies)
    nt = plan.compact_clients
    conns = Conns(gw.port, nt)
    next_i = [0]
    lock = threading.Lock()

    def op(t: int, i: int) -> None:
        with lock:
            k = next_i[0]
            next_i[0] += 1
        event_op(conns, [reqs[k]], 1)(t, 0)
    try:
        ph, srv_ms, cli_s = measured(gw.pid, nt, op, count=len(reqs), cap=900)
    finally:
        conns.close()
    if ph.errors:
        raise ServerError(f"ingest for compaction: {ph.errors} failed requests: {ph.first_error}")
    ingest = {"events": n, "seconds": ph.elapsed, "events_per_s": n / ph.elapsed,
              "server_cpu_us_per_event": srv_ms * 1000 / n if srv_ms is not None else None,
              "batch": batch, "clients": nt}
    log(f"compaction gateway: ingested {n:,} events in {ph.elapsed:.1f}s ({n / ph.elapsed:,.0f} ev/s)")
    s0 = sb.tree_cpu_ms(gw.pid)
    t0 = time.perf_counter()
    result = bio.compact()
    dt = time.perf_counter() - t0
    s1 = sb.tree_cpu_ms(gw.pid)
    log(f"compaction: {result} in {dt:.2f}s")
    compact = {"seconds": dt, "answer": result, "records": result.get("records"),
               "bio_events": n, "events_per_s": n / dt if dt else None,
               "records_per_s": (result.get("records") or 0) / dt if dt else None,
               "server_cpu_s": (s1 - s0) / 1000}
    # 4. sizes: list the biographies bucket, fetch every segment, count its rows
    c = sb.make_client(gw, 4)
    import pyarrow.parquet as pq

    listed, rows, segments = 0, 0, []
    kinds: Counter[str] = Counter()
    for page in c.get_paginator("list_objects_v2").paginate(Bucket="biographies"):
        for obj in page.get("Contents", []):
            body = c.get_object(Bucket="biographies", Key=obj["Key"])["Body"].read()
            if len(body) != obj["Size"]:
                raise ServerError(f"segment {obj['Key']}: listed {obj['Size']} bytes, GET gave {len(body)}")
            t = pq.read_table(io.BytesIO(body), columns=["kind"])
            rows += t.num_rows
            kinds.update(t.column("kind").to_pylist())
            listed += obj["Size"]
            meta = pq.read_metadata(io.BytesIO(body))
            segments.append({"key": obj["Key"], "bytes": obj["Size"], "rows": t.num_rows,
                             "row_groups": meta.num_row_groups})
    # the gateway's biographies also hold nothing but the bench's events here
    sent = Counter(orjson.loads(x)["kind"] for x in lines)
    if rows != n or dict(kinds) != dict(sent):
        raise ServerError(f"Parquet holds {rows} rows ({dict(kinds)}); {n} events were sent ({dict(sent)})")
    on_disk = sum(f.stat().st_size for f in (gw.data / "store").rglob("*") if f.is_file()) \
        if (gw.data / "store").exists() else None
    return {"ingest": ingest, "compaction": compact,
            "parquet": {"bytes": listed, "segments": segments, "rows": rows, "rows_checked": True},
            "store_bytes_on_disk_after": on_disk}


def ndjson_sizes(lines: list[bytes]) -> dict[str, Any]:
    nd = sum(len(x) + 1 for x in lines)
    gz = zstandard_size = 0
    co = zlib.compressobj(6, zlib.DEFLATED, 31)  # gzip container, level 6 (gzip's default)
    zc = zstandard.ZstdCompressor(level=3).compressobj()
    for i in range(0, len(lines), 1000):
        chunk = b"\n".join(lines[i:i + 1000]) + b"\n"
        gz += len(co.compress(chunk))
        zstandard_size += len(zc.compress(chunk))
    gz += len(co.flush())
    zstandard_size += len(zc.flush())
    return {"ndjson_bytes": nd, "gzip6_bytes": gz, "zstd3_bytes": zstandard_size}


# --------------------------------------------------------------------------
# 5b: SQLite WAL, synchronous=FULL, one transaction per request
# --------------------------------------------------------------------------

SQL_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
  event_id TEXT PRIMARY KEY, agent TEXT NOT NULL, session TEXT NOT NULL, seq INTEGER,
  ts TEXT NOT NULL, kind TEXT NOT NULL, role TEXT, tool TEXT, content TEXT, data TEXT,
  model TEXT, tokens_in INTEGER, tokens_out INTEGER, tags TEXT, trace_id TEXT, span_id TEXT)
"""
SQL_INSERT = "INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"


def sqlite_connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=120, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={SQLITE_SYNC}")
    conn.execute("PRAGMA busy_timeout=120000")
    return conn


def bench_sqlite(plan: Plan, lines: list[bytes], base_tmp: Path) -> dict[str, Any]:
    from gateway.biography.events import new_event_id

    d = Path(tempfile.mkdtemp(prefix="sqlite-", dir=base_tmp))
    raw: dict[str, Any] = {}
    errors: dict[str, str] = {}
    loads, dumps = orjson.loads, orjson.dumps

    def rows_of(body: bytes) -> list[tuple]:
        now = int(time.time() * 1_000_000)
        out = []
        for line in body.split(b"\n"):
            if not line:
                continue
            e = loads(line)
            data = e.get("data")
            tags = e.get("tags")
            out.append((new_event_id(now), e.get("agent"), e["session"], e.get("seq"), e.get("ts"), e["kind"],
                        e.get("role"), e.get("tool"), e.get("content"),
                        None if data is None else dumps(data, option=orjson.OPT_SORT_KEYS).decode(),
                        e.get("model"), e.get("tokens_in"), e.get("tokens_out"),
                        None if tags is None else dumps(tags).decode(), e.get("trace_id"), e.get("span_id")))
        return out

    for r in range(plan.runs):
        for batch in BATCHES:
            bodies = [b for b, _ in bodies_of(lines, batch, plan.bodies[batch], offset=batch * 7 + r)]
            for nt in CLIENTS:
                key = f"b{batch}_c{nt}"
                db = d / f"{key}-r{r}.db"
                setup = sqlite_connect(db)
                setup.execute(SQL_SCHEMA)
                setup.close()
                conns = [sqlite_connect(db) for _ in range(nt)]
                stride = max(1, len(bodies) // nt)

                def op(t: int, i: int, bodies: list[bytes] = bodies, conns: list = conns,
                       stride: int = stride) -> None:
                    rows = rows_of(bodies[(t * stride + i) % len(bodies)])
                    conn = conns[t]
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        conn.executemany(SQL_INSERT, rows)
                        conn.execute("COMMIT")
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                try:
                    ph, _, cli_s = measured(None, nt, op, duration=plan.sqlite_seconds,
                                            cap=plan.sqlite_seconds + 60,
                                            record_latency=(nt == 1 and batch == 1))
                finally:
                    for conn in conns:
                        conn.close()
                check = sqlite3.connect(db)
                stored = check.execute("SELECT count(*) FROM events").fetchone()[0]
                check.close()
                events = ph.ok * batch
                dd = raw.setdefault(key, {"events_per_s": [], "cpu_us_per_event": [], "errors": 0,
                                          "p50_ms": [], "p99_ms": []})
                dd["events_per_s"].append(events / ph.elapsed if ph.ok else None)
                dd["cpu_us_per_event"].append(cli_s * 1e6 / events if events else None)
                dd["errors"] += ph.errors
                if ph.latencies:
                    dd["p50_ms"].append(percentile(ph.latencies, 50) * 1000)
                    dd["p99_ms"].append(percentile(ph.latencies, 99) * 1000)
                if ph.first_error:
                    errors.setdefault(key, ph.first_error)
                if stored != events:
                    errors.setdefault(key + "_count", f"{stored} rows stored, {events} acknowledged")
                log(f"sqlite {key}: {events} events in {ph.elapsed:.2f}s = "
                    f"{(events / ph.elapsed) if ph.ok else 0:,.0f} ev/s; errors {ph.errors}")
                for f in d.glob(f"{key}-r{r}.db*"):
                    f.unlink()
    shutil.rmtree(d, ignore_errors=True)
    return {"raw": raw, "errors": errors, "synchronous": SQLITE_SYNC, "journal_mode": "WAL",
            "path_fs": subprocess.run(["stat", "-f", "-c", "%T", str(base_tmp)], capture_output=True,
                                      text=True).stdout.strip()}


# --------------------------------------------------------------------------
# --profile: the gateway under cProfile (every thread, thread CPU time)
# --------------------------------------------------------------------------

PROFILE_WRAPPER = r'''
import cProfile, pstats, sys, threading, time
_profiles = []
_lock = threading.Lock()
_orig_run = threading.Thread.run
def _run(self):
    p = cProfile.Profile(time.thread_time)
    with _lock:
        _profiles.append(p)
    p.enable()
    try:
        _orig_run(self)
    finally:
        p.disable()
threading.Thread.run = _run
_main = cProfile.Profile(time.thread_time)
_profiles.append(_main)
out = sys.argv.pop(1)
try:
    _main.enable()
    from gateway.cli import main
    main(prog_name="orgmem", args=sys.argv[1:])
finally:
    _main.disable()
    stats = None
    for p in list(_profiles):
        try:
            p.snapshot_stats()
            if not p.stats:
                continue
            stats = pstats.Stats(p) if stats is None else (stats.add(p) or stats)
        except Exception as exc:
            print("profile merge:", exc, file=sys.stderr)
    if stats is not None:
        stats.dump_stats(out)
'''


def profile_gateway(plan: Plan, lines: list[bytes], bin_dir: Path, base_tmp: Path) -> dict[str, Any]:
    """Batch-100 ingest from 16 clients, then one compaction, on a gateway under cProfile."""
    import pstats

    wrapper = base_tmp / "profile_wrapper.py"
    wrapper.write_text(PROFILE_WRAPPER)
    out: dict[str, Any] = {}
    for what in ("ingest", "compaction"):
        stats_path = base_tmp / f"gateway-{what}.prof"
        gw = Gateway(f"orgmem-profile-{what}", bin_dir, base_tmp,
                     env={"ORGMEM_COMPACT_INTERVAL": "5" if what == "ingest" else "0",
                          "PYTHONPATH": str(REPO)},
                     argv=[str(bin_dir / "python"), str(wrapper), str(stats_path)])
        gw.start()
        try:
            ac = signer(gw)
            if what == "ingest":
                reqs = sign_events(ac, bodies_of(lines, 100, plan.bodies[100]))
                conns = Conns(gw.port, 16)
                try:
                    ph, srv_ms, _ = measured(gw.pid, 16, event_op(conns, reqs, 16),
                                             duration=plan.profile_seconds, cap=120)
                finally:
                    conns.close()
                out[what] = {"events": ph.ok * 100, "events_per_s": ph.ok * 100 / ph.elapsed,
                             "server_cpu_s": (srv_ms or 0) / 1000}
            else:
                n = min(len(lines), 50_000)
                reqs = sign_events(ac, [(b"\n".join(lines[i:i + 1000]) + b"\n", len(lines[i:i + 1000]))
                                        for i in range(0, n, 1000)])
                conns = Conns(gw.port, 1)
                try:
                    for req in reqs:
                        conns.send(0, req)
                finally:
                    conns.close()
                s0 = sb.tree_cpu_ms(gw.pid)
                t0 = time.perf_counter()
                bio_client(gw).compact()
                out[what] = {"events": n, "seconds": time.perf_counter() - t0,
                             "server_cpu_s": (sb.tree_cpu_ms(gw.pid) - s0) / 1000,
                             "note": "the profile covers the whole process: start-up, the ingest, "
                                     "then the compaction"}
        finally:
            gw.stop()
            gw.cleanup(True)
        if not stats_path.exists():
            out[what]["error"] = f"no profile written: {gw.log_tail(800)}"
            continue
        for order in ("tottime", "cumulative"):
            buf = io.StringIO()
            st = pstats.Stats(str(stats_path), stream=buf)
            st.sort_stats(order).print_stats(30)
            text = buf.getvalue()
            out[what][f"top_{order}"] = text[text.find("   ncalls"):][:9000]
            log(f"profile {what}, by {order} (thread CPU time, all gateway threads):\n{text[-9000:]}")
    return out


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    m: dict[str, Any] = {}
    ing = ((results.get("ingest") or {}).get("raw")) or {}
    put = ((results.get("object_put") or {}).get("raw")) or {}
    sql = ((results.get("sqlite") or {}).get("raw")) or {}
    for b in BATCHES:
        for nt in CLIENTS:
            k = f"b{b}_c{nt}"
            x = ing.get(k) or {}
            m[f"orgmem_{k}"] = median(x.get("events_per_s") or [])
            m[f"orgmem_srvcpu_{k}"] = median(x.get("server_cpu_us_per_event") or [])
            m[f"orgmem_clicpu_{k}"] = median(x.get("client_cpu_us_per_event") or [])
            m[f"orgmem_cores_{k}"] = median(x.get("server_cores_busy") or [])
            m[f"sqlite_{k}"] = median((sql.get(k) or {}).get("events_per_s") or [])
            m[f"sqlite_cpu_{k}"] = median((sql.get(k) or {}).get("cpu_us_per_event") or [])
            m[f"put_{k}"] = median((put.get(f"c{nt}") or {}).get("events_per_s") or [])
            m[f"put_srvcpu_{k}"] = median((put.get(f"c{nt}") or {}).get("server_cpu_us_per_event") or [])
    sus = results.get("sustained") or {}
    for k in ("ingest_events_per_s", "catchup_seconds", "searchable_events_per_s", "server_cpu_us_per_event"):
        m[f"sustained_{k}"] = sus.get(k)
    lat = ing.get("latency") or {}
    m["orgmem_p50_ms"], m["orgmem_p99_ms"] = lat.get("p50_ms"), lat.get("p99_ms")
    m["put_p50_ms"] = median((put.get("c1") or {}).get("p50_ms") or [])
    m["put_p99_ms"] = median((put.get("c1") or {}).get("p99_ms") or [])
    m["sqlite_p50_ms"] = median((sql.get("b1_c1") or {}).get("p50_ms") or [])
    m["sqlite_p99_ms"] = median((sql.get("b1_c1") or {}).get("p99_ms") or [])
    comp = results.get("compaction") or {}
    if comp.get("compaction"):
        m["compact_events_per_s"] = comp["compaction"]["events_per_s"]
        m["compact_seconds"] = comp["compaction"]["seconds"]
        m["compact_cpu_s"] = comp["compaction"]["server_cpu_s"]
        m["compact_ingest_events_per_s"] = comp["ingest"]["events_per_s"]
    sizes = results.get("sizes") or {}
    pq_bytes = ((comp.get("parquet") or {}).get("bytes"))
    if sizes and pq_bytes:
        m["ndjson_bytes"], m["gzip_bytes"], m["zstd_bytes"] = (sizes["ndjson_bytes"], sizes["gzip6_bytes"],
                                                              sizes["zstd3_bytes"])
        m["parquet_bytes"] = pq_bytes
        m["ndjson_over_parquet"] = ratio(sizes["ndjson_bytes"], pq_bytes)
        m["gzip_over_parquet"] = ratio(sizes["gzip6_bytes"], pq_bytes)
        m["zstd_over_parquet"] = ratio(sizes["zstd3_bytes"], pq_bytes)
    return m


def targets_of(m: dict[str, Any], plan: Plan) -> list[dict[str, Any]]:
    t: list[dict[str, Any]] = []
    note_q = " (--quick: judge from a full run)" if plan.quick else ""

    def add(name: str, value: Any, limit: float, ok: bool | None, note: str) -> None:
        t.append({"target": name, "value": value, "limit": limit,
                  "status": "N/A" if ok is None else ("PASS" if ok else "FAIL"), "note": note + note_q})

    c = {nt: m.get(f"orgmem_b100_c{nt}") for nt in CLIENTS}
    have = {k: v for k, v in c.items() if v is not None}
    best_nt = max(have, key=have.get) if have else None
    v = have.get(best_nt) if best_nt else None
    add(">= 20,000 acknowledged events/s, batches of 100", v, 20000, None if v is None else v >= 20000,
        f"best of 1/16 clients: {best_nt} client(s); " + ", ".join(
            f"{k} client(s) {fmt(x, '{:,.0f}')}" for k, x in c.items()))
    v = m.get("orgmem_p50_ms")
    add("single-event append p50 < 10 ms", v, 10, None if v is None else v < 10,
        f"p99 {fmt(m.get('orgmem_p99_ms'), '{:.2f}')} ms; 1 client, sequential")
    v = m.get("ndjson_over_parquet")
    add("Parquet >= 5x smaller than NDJSON", v, 5, None if v is None else v >= 5,
        f"gzip'd NDJSON / Parquet = {fmt(m.get('gzip_over_parquet'), '{:.2f}')}x, "
        f"zstd-3 NDJSON / Parquet = {fmt(m.get('zstd_over_parquet'), '{:.2f}')}x")
    return t


def render(results: dict[str, Any], m: dict[str, Any], targets: list[dict[str, Any]], plan: Plan,
           load: tuple[Any, Any], gen_info: dict[str, Any]) -> str:
    header = ["metric (+ higher / - lower is better)", "orgmem", "obj-PUT/event", f"SQLite WAL {SQLITE_SYNC}",
              "orgmem/obj-PUT", "orgmem/SQLite"]
    rows: list[list[str] | str] = []
    rows.append("1. acknowledged events/s, POST /v1/events NDJSON (+)")
    for b in BATCHES:
        for nt in CLIENTS:
            k = f"b{b}_c{nt}"
            o, p, s = m.get(f"orgmem_{k}"), m.get(f"put_{k}"), m.get(f"sqlite_{k}")
            rows.append([f"  batch {b:>4}, {nt:>2} client{'s' if nt > 1 else ' '}", fmt(o, "{:,.0f}"),
                         fmt(p, "{:,.0f}") + ("*" if b > 1 and p is not None else ""), fmt(s, "{:,.0f}"),
                         fmt(ratio(o, p), "{:.1f}x"), fmt(ratio(o, s), "{:.2f}x")])
    rows.append("   server CPU us/event (-) [orgmem: gateway process tree, SQLite: the whole in-process "
                "peer]")
    for b in BATCHES:
        for nt in CLIENTS:
            k = f"b{b}_c{nt}"
            o, p, s = m.get(f"orgmem_srvcpu_{k}"), m.get(f"put_srvcpu_{k}"), m.get(f"sqlite_cpu_{k}")
            rows.append([f"  batch {b:>4}, {nt:>2} client{'s' if nt > 1 else ' '}", fmt(o, "{:,.0f}"),
                         fmt(p, "{:,.0f}") + ("*" if b > 1 and p is not None else ""), fmt(s, "{:,.0f}"),
                         fmt(ratio(o, p), "{:.2f}x"), fmt(ratio(o, s), "{:.2f}x")])
    rows.append("   orgmem: client CPU us/event (-) | gateway cores busy (CPU s / wall s) | ceiling at "
                "1 core (10^6 / server us per event) ev/s")
    for b in BATCHES:
        for nt in CLIENTS:
            k = f"b{b}_c{nt}"
            srv = m.get(f"orgmem_srvcpu_{k}")
            rows.append([f"  batch {b:>4}, {nt:>2} client{'s' if nt > 1 else ' '}",
                         fmt(m.get(f"orgmem_clicpu_{k}"), "{:,.0f}"),
                         fmt(m.get(f"orgmem_cores_{k}"), "{:.2f} cores"),
                         fmt(1e6 / srv if srv else None, "{:,.0f} ev/s"), "", ""])
    rows.append(f"1b. sustained: batch 100, 16 clients for {plan.sustained_seconds:g} s, then until search "
                "holds every event (the index is part of the product)")
    for k, lab, f in (("ingest_events_per_s", "acknowledged events/s during the phase (+)", "{:,.0f}"),
                      ("catchup_seconds", "search caught up, seconds after the phase (-)", "{:.1f}"),
                      ("searchable_events_per_s", "events/s made searchable: events / (phase + catch-up) (+)",
                       "{:,.0f}"),
                      ("server_cpu_us_per_event", "server CPU us/event, catch-up included (-)", "{:,.0f}")):
        rows.append([f"  {lab}", fmt(m.get(f"sustained_{k}"), f), "", "", "", ""])
    rows.append("2. single-event append latency, 1 client, sequential (-)")
    for q in ("p50", "p99"):
        o, p, s = m.get(f"orgmem_{q}_ms"), m.get(f"put_{q}_ms"), m.get(f"sqlite_{q}_ms")
        rows.append([f"  {q} ms", fmt(o, "{:.2f}"), fmt(p, "{:.2f}"), fmt(s, "{:.2f}"),
                     fmt(ratio(o, p), "{:.2f}x"), fmt(ratio(o, s), "{:.2f}x")])
    n = plan.compact_events
    rows.append(f"3. compaction of {n:,} events (POST /v1/bio/compact, no background compaction)")
    rows.append([f"  ingest before it: events/s (batch {plan.compact_batch}, "
                 f"{plan.compact_clients} clients) (+)",
                 fmt(m.get("compact_ingest_events_per_s"), "{:,.0f}"), "", "", "", ""])
    rows.append(["  compaction seconds (-)", fmt(m.get("compact_seconds"), "{:.2f}"), "", "", "", ""])
    rows.append(["  compaction events/s (+)", fmt(m.get("compact_events_per_s"), "{:,.0f}"), "", "", "", ""])
    rows.append(["  compaction server CPU seconds (-)", fmt(m.get("compact_cpu_s"), "{:.2f}"),
                 "", "", "", ""])
    rows.append(f"4. size of those {n:,} events, MB (10^6 bytes) (-)")
    for k, lab in (("ndjson_bytes", "NDJSON as sent"), ("gzip_bytes", "gzip -6 NDJSON"),
                   ("zstd_bytes", "zstd -3 NDJSON (reference)"),
                   ("parquet_bytes", "orgmem Parquet segments")):
        v = m.get(k)
        per = f" ({v / n:,.0f} B/event)" if v else ""
        rows.append([f"  {lab}{per}", fmt(v / 1e6 if v else None, "{:.2f}"), "", "", "", ""])
    for k, lab in (("ndjson_over_parquet", "NDJSON / Parquet"),
                   ("gzip_over_parquet", "gzip NDJSON / Parquet"),
                   ("zstd_over_parquet", "zstd NDJSON / Parquet")):
        rows.append([f"  {lab} (+)", fmt(m.get(k), "{:.2f}x"), "", "", "", ""])

    table = [r for r in rows if isinstance(r, list)]
    widths = [max(len(header[i]), *(len(r[i]) for r in table)) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cells))

    out = [line(header), "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append(r if isinstance(r, str) else line(r))
    runs = f"events/s and CPU rows: median of {plan.runs} runs" if plan.runs > 1 else "1 run"
    out.append(f"({runs}; phases of {plan.ingest_seconds:g} s (orgmem), "
               f"{plan.peer_put_seconds:g} s (object PUT), "
               f"{plan.sqlite_seconds:g} s (SQLite); latency over {plan.latency_requests} requests)")
    out.append("(* obj-PUT/event cannot batch: each event is one PUT whatever the batch; its "
               "1/16-client value "
               "is repeated on every batch row. SQLite runs in-process: no HTTP, auth, redaction, "
               "encryption or audit. Client and server share 2 cores.)")
    cal = gen_info.get("prose_calibration") or {}
    if cal:
        out.append(f"(generated prose vs the real text it imitates: gzip -6 "
                   f"{cal['gzip6_ratio_generated_prose']:.2f}x vs {cal['gzip6_ratio_source_prose']:.2f}x, "
                   f"zstd -3 per MB {cal['zstd3_1MB_ratio_generated_prose']:.2f}x vs "
                   f"{cal['zstd3_1MB_ratio_source_prose']:.2f}x; events: content p50 "
                   f"{gen_info['content_bytes']['p50']} B, p90 {gen_info['content_bytes']['p90']} B, "
                   f"{gen_info['ndjson_bytes_per_event']:.0f} B/event as NDJSON)")
    out.append(f"(load average at start {load[0]}, at end {load[1]} on {os.cpu_count()} CPUs: other "
               "processes share this machine, single runs vary by 10-20% or more)")
    out.append("")
    out.append("targets (orgmem):")
    tw = max(len(t["target"]) for t in targets)
    for t in targets:
        v = t["value"]
        vs = "-" if v is None else (f"{v:,.2f}" if isinstance(v, float) else str(v))
        out.append(f"  {t['status']:<4}  {t['target']:<{tw}}  value={vs}  {t['note']}".rstrip())
    errs = [(k, (results.get(k) or {}).get("error") or (results.get(k) or {}).get("errors"))
            for k in ("ingest", "sustained", "object_put", "sqlite", "compaction", "sizes", "profile")]
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="30,000 events for compaction/size, 2 s phases, 300 latency samples (~1.5 min)")
    ap.add_argument("--runs", type=int, default=None,
                    help="runs of every throughput phase, the table shows the median (default 3, --quick 1)")
    ap.add_argument("--events", type=int, default=None,
                    help="events for the compaction and size parts (default 200,000; --quick 30,000)")
    ap.add_argument("--profile", action="store_true",
                    help="afterwards, cProfile the gateway (all threads) during a batch-100 ingest and a "
                         "compaction (stderr + JSON)")
    ap.add_argument("--bin-dir", type=Path, default=sb.VENV_BIN,
                    help=f"directory with orgmem and python (default {sb.VENV_BIN})")
    ap.add_argument("--tmp", type=Path, default=None,
                    help="parent for the temp dirs (default: system temp dir; use a real disk, not tmpfs)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (server data + logs)")
    ap.add_argument("--json-out", type=Path, default=RESULTS_JSON)
    args = ap.parse_args(argv)
    plan = Plan(args)

    signal.signal(signal.SIGTERM, sb._sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    base_tmp = Path(tempfile.mkdtemp(prefix="orgmem-biobench-", dir=args.tmp))
    results: dict[str, Any] = {}
    servers: dict[str, Any] = {}
    gen_info: dict[str, Any] = {}
    load0 = tuple(round(x, 2) for x in os.getloadavg())
    t_start = time.monotonic()
    interrupted = False

    def section(name: str, fn: Callable[[], dict[str, Any]]) -> None:
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

    def on_gateway(label: str, env: dict[str, str], body: Callable[[Gateway], None]) -> None:
        gw = Gateway(label, args.bin_dir, base_tmp, env=env)
        try:
            gw.start()
            servers[label] = gw.describe()
            body(gw)
        finally:
            gw.stop()
            gw.cleanup(args.keep)

    try:
        t0 = time.monotonic()
        corpus = Corpus()
        gen = EventGen(corpus, SEED, bank_words=800_000 if plan.quick else 2_500_000)
        lines = gen.lines(plan.compact_events)
        cb = sorted(gen.content_bytes)
        gen_info = {"seed": SEED, "corpus": corpus.describe(), "events": len(lines), "kinds": dict(gen.kinds),
                    "prose_bank_words": len(gen.bank.split(" ")),
                    "ndjson_bytes_per_event": sum(map(len, lines)) / len(lines),
                    "content_bytes": {"p10": percentile(cb, 10), "p50": percentile(cb, 50),
                                      "p90": percentile(cb, 90), "p99": percentile(cb, 99), "max": cb[-1],
                                      "mean": sum(cb) / len(cb)},
                    "agents": list(AGENTS), "day": f"{DAY:%Y-%m-%d}", "prose_calibration": gen.calibration(),
                    "seconds": round(time.monotonic() - t0, 1)}
        log(f"generated {len(lines):,} events ({gen_info['ndjson_bytes_per_event']:.0f} B/event NDJSON; "
            "content "
            f"p50 {gen_info['content_bytes']['p50']} B, p90 {gen_info['content_bytes']['p90']} B) in "
            f"{gen_info['seconds']}s")

        def part_a(gw: Gateway) -> None:
            section("ingest", lambda: bench_ingest(gw, plan, lines))
            section("sustained", lambda: bench_sustained(gw, plan, lines))
            section("object_put", lambda: bench_object_put(gw, plan, lines))

        section("gateway_a", lambda: on_gateway("orgmem", {}, part_a) or {})
        section("sqlite", lambda: bench_sqlite(plan, lines, base_tmp))

        def part_b(gw: Gateway) -> None:
            section("compaction", lambda: bench_compaction(gw, plan, lines))

        section("gateway_b", lambda: on_gateway("orgmem-compaction", {"ORGMEM_COMPACT_INTERVAL": "0"}, part_b)
                or {})
        section("sizes", lambda: ndjson_sizes(lines))
        if args.profile:
            section("profile", lambda: profile_gateway(plan, lines, args.bin_dir, base_tmp))
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
    m = summarise(results)
    targets = targets_of(m, plan)
    ratios = {}
    for b in BATCHES:
        for nt in CLIENTS:
            k = f"b{b}_c{nt}"
            ratios[k] = {"orgmem_over_object_put": ratio(m.get(f"orgmem_{k}"), m.get(f"put_{k}")),
                         "orgmem_over_sqlite": ratio(m.get(f"orgmem_{k}"), m.get(f"sqlite_{k}"))}
    ratios["latency_p50"] = {"orgmem_over_object_put": ratio(m.get("orgmem_p50_ms"), m.get("put_p50_ms")),
                             "orgmem_over_sqlite": ratio(m.get("orgmem_p50_ms"), m.get("sqlite_p50_ms"))}
    print(render(results, m, targets, plan, (load0, load1), gen_info))
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(args.tmp or tempfile.gettempdir())],
                        capture_output=True, text=True).stdout.strip()
    doc = {
        "bench": "bio_bench", "version": 1,
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                 "sqlite": sqlite3.sqlite_version, "tmp_fs": fs, "loadavg_start": load0,
                 "loadavg_end": load1},
        "plan": plan.describe(), "generator": gen_info, "servers": servers,
        "metrics": m, "ratios": ratios, "targets": targets, "results": results,
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
