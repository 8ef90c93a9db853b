#!/usr/bin/env python3
"""Redaction micro-benchmark: what scanning every biography event for secrets costs.

Builds a realistic ~1 MiB agent transcript (English prose, Python/JS/Go code, shell logs with
git SHAs, UUIDs and digests, JSON tool results with token usage) as a list of events, then
times, single-threaded, best of N runs:

1. ``Redactor.redact_text`` over the whole transcript as one string: clean, with a few
   planted secrets, and with a few non-ASCII characters (which make CPython store it wide);
2. per event, the way ingestion calls it: ``redact_text(content)`` + ``redact_json(data)``,
   and as one ``redact_json`` of the whole event (one prefilter pass instead of two);
3. ``add_values`` exact-value redaction with 20 and 200 registered values;
4. peers in the same run: ``orjson.dumps`` + ``zstd`` level 3 of the events (what ingestion
   already spends per byte), and the naive design this module avoids: the same provider
   rules as ONE ``re`` alternation with named groups, ``finditer`` over the text.

The redacted output is checked (planted secrets gone, clean text unchanged), so a fast wrong
answer cannot pass. Secret values are generated here and never printed.

Usage:
    .venv/bin/python bench/redact_speed.py            # ~1 MiB, 5 runs
    .venv/bin/python bench/redact_speed.py --mib 4 --runs 3

Output: an aligned table, then one ``BENCH_JSON {...}`` line on stdout.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import platform
import random
import re
import string
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import orjson  # noqa: E402
import zstandard  # noqa: E402

from gateway.biography.redact import Redactor  # noqa: E402

PROSE = [
    "The agent reviewed the deployment plan and noticed that the token budget for the "
    "summarization step was too small, so it raised max_tokens to 4096 and re-ran the evaluation.",
    "Authentication failed twice because the session had expired; the author of the runbook "
    "suggests rotating credentials every ninety days and storing them in the vault.",
    "Every password field in the signup form is validated on the client and on the server, "
    "and the secret sauce of the team is careful testing before each release.",
    "The tokenizer splits words into subword units, and the token count grows with the length "
    "of the prompt, which matters for latency more than for cost.",
    "I opened the pull request, waited for the checks to pass, and asked a reviewer to look at "
    "the migration because it touches the accounts table and the audit log.",
    "Open question: should the compactor merge segments smaller than 8 MiB, or is the overhead "
    "of an extra GET per query acceptable for the first release?",
    "Decision: keep the public API stable and add a new endpoint for bulk export instead of "
    "changing the pagination of the existing one.",
    "The build failed on the ARM runner with an illegal instruction, most likely because the "
    "wheel was compiled with AVX2; pinning the previous version fixed it.",
]
PY = '''def load_settings(path: str) -> Settings:
    """Read the settings file; credentials come from the environment, never from disk."""
    raw = tomllib.loads(Path(path).read_text())
    password = os.environ["DB_PASSWORD"]
    token = get_token(raw["auth"]["issuer"])
    token_count = sum(len(t) for t in tokens)
    password_field = form.fields.get("password")
    secret = None
    for i, tok in enumerate(tokenizer.encode(text)):
        counts[tok] = counts.get(tok, 0) + 1
    return Settings(user=raw["user"], password=password, timeout=raw.get("timeout", 30))
'''
JS = """export async function fetchUser(id, { signal } = {}) {
  const token = await getAccessToken();
  const res = await fetch(`https://api.example.com/v1/users/${id}`, {
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    signal,
  });
  if (!res.ok) throw new Error(`request failed: ${res.status} ${res.statusText}`);
  return res.json();
}
"""
GO = """func (s *Server) handleLogin(w http.ResponseWriter, r *http.Request) {
	var req struct {
		User     string `json:"user"`
		Password string `json:"password"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	token, err := s.auth.Issue(r.Context(), req.User, req.Password)
	if err != nil {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	writeJSON(w, map[string]string{"token_type": "bearer", "expires_in": "3600"})
}
"""


def _shell(r: random.Random) -> str:
    sha = hashlib.sha1(r.randbytes(16)).hexdigest()
    seg = uuid.UUID(int=r.getrandbits(128))
    return (
        f"$ git log --oneline -3\n{sha[:7]} fix: handle empty token list\n"
        f"$ git rev-parse HEAD\n{sha}\n"
        f"$ ls -la /var/lib/orgmem/data/agent=build-{r.randint(1, 9)}/\n"
        f"-rw-r--r--  1 agent agent {r.randint(1000, 9999999)} 2025-03-14T09:21:{r.randint(10, 59)}Z "
        f"segment-{seg}.parquet\n"
        f"$ curl -s https://admin@orgmem.internal:9000/health\n"
        f'{{"status":"ok","version":"1.4.{r.randint(0, 20)}"}}\n'
        f"$ sha256sum dist/orgmem-1.4.2.tar.gz\n{hashlib.sha256(sha.encode()).hexdigest()}  "
        f"dist/orgmem-1.4.2.tar.gz\n"
        f"$ pytest -q tests/test_api.py\n{'.' * r.randint(20, 60)}\n"
        f"{r.randint(10, 90)} passed in {r.random() * 9:.2f}s\n"
    )


def _tool_result(r: random.Random) -> dict:
    return {
        "tool": r.choice(["bash", "read_file", "http_get", "search"]),
        "input": {"command": r.choice(["pytest -q", "make build", "ls -la src/"]), "cwd": "/work/app"},
        "output": _shell(r),
        "usage": {"input_tokens": r.randint(100, 9000), "output_tokens": r.randint(1, 900)},
        "meta": {
            "id": str(uuid.UUID(int=r.getrandbits(128))),
            "ts": "2025-03-14T09:21:33.123Z",
            "theme": "#1f2937",
            "owner": "jane.doe@example.com",
        },
    }


def build_events(size: int, seed: int = 7) -> list[dict]:
    """Events until their content + JSON data total about ``size`` characters."""
    r = random.Random(seed)
    events: list[dict] = []
    total = 0
    while total < size:
        kind = r.choice(["prompt", "response", "response", "tool_call", "tool_result"])
        if kind in ("prompt", "response"):
            content = " ".join(r.choice(PROSE) for _ in range(r.randint(2, 6)))
            if r.random() < 0.5:
                content += "\n\n```\n" + r.choice([PY, JS, GO]) + "```\n"
            data: dict = {"model": "claude-x", "usage": {"input_tokens": r.randint(10, 9999)}}
        else:
            content = r.choice(["Running the test suite.", "Reading the config.", "Done."])
            data = _tool_result(r)
        events.append({"type": kind, "content": content, "data": data})
        total += len(content) + len(json.dumps(data))
    return events


def fake_secrets(r: random.Random) -> list[str]:
    """One secret of each kind, generated (never real, never printed)."""

    def rnd(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
        return "Q7x" + "".join(r.choice(alphabet) for _ in range(n - 3))

    def b64url(b: bytes) -> str:
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

    jwt = ".".join(
        [
            b64url(b'{"alg":"HS256","typ":"JWT"}'),
            b64url(b'{"sub":"agent-7","exp":1}'),
            b64url(r.randbytes(32)),
        ]
    )
    body = "\n".join(base64.b64encode(r.randbytes(48)).decode() for _ in range(6))
    return [
        "AKIA" + rnd(16, string.ascii_uppercase + string.digits).upper(),
        "gh" + "p_" + rnd(36),
        "gl" + "pat-" + rnd(20),
        "xo" + "xb-" + "1234567890-" + rnd(24),
        "sk" + "_live_" + rnd(24),
        "sk-" + "proj-" + rnd(64),
        "AI" + "za" + rnd(35),
        jwt,
        "-----BEGIN RSA PRIVATE KEY-----\n" + body + "\n-----END RSA PRIVATE KEY-----",
        f'password = "{rnd(14, string.ascii_letters + string.digits + "#!%")}"',
    ]


def plant(text: str, secrets: list[str], r: random.Random) -> str:
    """``text`` with each secret inserted once at a line start."""
    lines = text.split("\n")
    for s in secrets:
        lines.insert(r.randrange(len(lines)), f"note: {s} end")
    return "\n".join(lines)


# The naive peer: provider rules as ONE alternation with named groups.
NAIVE = re.compile(
    r"(?P<aws>(?<![A-Za-z0-9])A(?:KIA|SIA)[A-Z0-9]{16})"
    r"|(?P<gh>gh[pousr]_[A-Za-z0-9]{36})|(?P<gl>glpat-[A-Za-z0-9_-]{20,})"
    r"|(?P<slack>xox[abeoprs]-[A-Za-z0-9-]{10,})|(?P<stripe>[sr]k_(?:live|test)_[A-Za-z0-9]{10,})"
    r"|(?P<sk>sk-[A-Za-z0-9_-]{20,})|(?P<google>AIza[0-9A-Za-z_-]{35})"
    r"|(?P<jwt>eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*)"
    r"|(?P<pem>-----BEGIN[A-Z ]*PRIVATE KEY-----)|(?P<url>://[^\s:/@]*:[^\s/@]+@)"
    r"|(?P<kv>(?i:password|passwd|pwd|secret|token|api_?key|access_?key|auth)\w*[\"']?\s*[:=]\s*\S+)"
)


def best(fn: Callable[[], object], runs: int) -> float:
    """Best wall time of ``runs`` calls, in seconds."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=1.0, help="transcript size in MiB")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()

    r = random.Random(11)
    events = build_events(int(args.mib * (1 << 20)))
    clean = "\n".join(e["content"] + "\n" + json.dumps(e["data"], indent=1) for e in events)
    secrets = fake_secrets(r)
    dirty = plant(clean, secrets, r)
    wide = clean.replace("reviewed", "reviewed — “twice” ✅", 50)  # a few non-ASCII characters
    red = Redactor(b"bench-key")

    out, n = red.redact_text(clean)
    assert n == 0 and out == clean, f"false positives in the clean transcript: {n}"
    out, n = red.redact_text(dirty)
    assert n == len(secrets) and not any(s in out for s in secrets[:-1]), "missed a planted secret"
    assert red.redact_text(wide) == (wide, 0), "false positives in the non-ASCII transcript"

    def per_event() -> None:
        for e in events:
            red.redact_text(e["content"])
            red.redact_json(e["data"])

    blob = orjson.dumps(events)
    zc = zstandard.ZstdCompressor(level=3)
    vault20, vault200 = Redactor(b"k"), Redactor(b"k")
    alnum = string.ascii_letters + string.digits
    values = ["".join(r.choice(alnum) for _ in range(r.randint(16, 48))) for _ in range(200)]
    vault20.add_values(values[:20])
    vault200.add_values(values)

    size = len(clean)
    rows = [
        ("redact_text, whole transcript, clean", size, best(lambda: red.redact_text(clean), args.runs)),
        (
            f"redact_text, whole transcript, {len(secrets)} secrets",
            len(dirty),
            best(lambda: red.redact_text(dirty), args.runs),
        ),
        (
            "redact_text, whole transcript, non-ASCII",
            len(wide),
            best(lambda: red.redact_text(wide), args.runs),
        ),
        (f"per event: text + json ({len(events)} events)", size, best(per_event, args.runs)),
        (
            "per event: one redact_json of {content, data}",
            size,
            best(lambda: [red.redact_json(e) for e in events], args.runs),
        ),
        ("redact_text + 20 vault values", size, best(lambda: vault20.redact_text(clean), args.runs)),
        ("redact_text + 200 vault values", size, best(lambda: vault200.redact_text(clean), args.runs)),
        (
            "peer: orjson.dumps + zstd-3 of events",
            size,
            best(lambda: zc.compress(orjson.dumps(events)), args.runs),
        ),
        (
            "peer: naive one-alternation re, finditer",
            size,
            best(lambda: sum(1 for _ in NAIVE.finditer(clean)), max(1, args.runs // 2)),
        ),
    ]
    print(
        f"transcript: {size / (1 << 20):.2f} MiB text, {len(events)} events, "
        f"{len(blob) / (1 << 20):.2f} MiB as JSON; python {platform.python_version()}"
    )
    print(f"{'measurement':52s} {'ms':>9s} {'MB/s':>9s}")
    result: dict[str, object] = {
        "bench": "redact_speed",
        "mib": round(size / (1 << 20), 3),
        "events": len(events),
        "rows": {},
    }
    for name, nbytes, secs in rows:
        mbs = nbytes / secs / 1e6
        print(f"{name:52s} {secs * 1e3:9.2f} {mbs:9.1f}")
        result["rows"][name] = {"ms": round(secs * 1e3, 3), "mb_per_s": round(mbs, 1)}  # type: ignore[index]
    print("BENCH_JSON " + json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
