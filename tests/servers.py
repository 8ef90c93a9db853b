"""Starting and stopping real servers for tests: the gateway and SeaweedFS."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Gateway:
    """A real ``orgmem serve`` process on 127.0.0.1."""

    data: Path
    access_key: str = "AKORGMEMTEST000000001"
    secret_key: str = "orgmem-test-secret-key-0000000000000000"
    port: int = field(default_factory=free_port)
    tls: tuple[str, str] | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20) -> Gateway:
        args = [str(BIN / "orgmem"), "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--data", str(self.data), *self.extra_args]
        if self.tls:
            args += ["--tls-cert", self.tls[0], "--tls-key", self.tls[1]]
        env = {**os.environ, "ORGMEM_ROOT_ACCESS_KEY": self.access_key,
               "ORGMEM_ROOT_SECRET_KEY": self.secret_key, **self.env}
        self.log_path = self.data.parent / f"gateway-{self.port}.log"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        import ssl

        ctx = ssl._create_unverified_context() if self.tls else None
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}: {self.log()}")
            try:
                with urllib.request.urlopen(self.endpoint + "/ready", timeout=1, context=ctx) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.05)
        raise RuntimeError(f"gateway did not become ready: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        self.stop(signal.SIGKILL)
