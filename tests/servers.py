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
    secret_key: str = field(default="orgmem-test-secret-key-0000000000000000", repr=False)
    port: int = field(default_factory=free_port)
    tls: tuple[str, str] | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    #: "local" or "s3": which store the gateway runs on (informational)
    backend: str = "local"
    #: what runs before ``serve ...``: the installed command, or another entry point to it
    program: list[str] = field(default_factory=lambda: [str(BIN / "orgmem")])

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20) -> Gateway:
        args = [*self.program, "serve", "--host", "127.0.0.1", "--port", str(self.port),
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

    def log_events(self, event: str) -> list[dict]:
        """The JSON log lines of ``event`` (``request``, ...), parsed, oldest first."""
        import json

        found = []
        for line in self.log().splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("event") == event:
                found.append(doc)
        return found

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


def free_ports(n: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (all held open until chosen)."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            if s.getsockname()[1] not in ports:
                ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _free_port_with_offset(offset: int, avoid: list[int]) -> int:
    """A free port p with p+offset free too: weed mini's plugin worker dials the admin
    gRPC port as admin.port+10000, whatever -admin.port.grpc says."""
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
    raise RuntimeError("no free port pair found")


@dataclass
class Seaweed:
    """A real SeaweedFS (``weed mini``) on 127.0.0.1 with one S3 identity.

    ``stop()`` then ``start()`` brings it back on the same ports and data directory,
    so a test can kill the upstream and restart it under a running gateway.
    """

    dir: Path
    access_key: str = "AKSEAWEEDTEST0000001"
    secret_key: str = field(default="seaweed-test-secret-key-000000000000000", repr=False)
    ports: list[int] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The AWS variables a gateway (boto3's default chain) needs to reach it."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_DEFAULT_REGION": "us-east-1"}

    def _argv(self) -> list[str]:
        (s3, s3grpc, mport, mgrpc, vport, vgrpc, fport, fgrpc, aport, agrpc) = self.ports
        d = self.dir
        return [str(BIN / "weed"), f"-logdir={d / 'log'}", "mini", f"-dir={d / 'data'}",
                "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-s3.port={s3}", f"-s3.port.grpc={s3grpc}", f"-s3.config={d / 's3.json'}",
                f"-s3.localSocket={d / 's3.sock'}",
                f"-master.port={mport}", f"-master.port.grpc={mgrpc}",
                f"-volume.port={vport}", f"-volume.port.grpc={vgrpc}",
                f"-filer.port={fport}", f"-filer.port.grpc={fgrpc}",
                f"-filer.localSocket={d / 'filer.sock'}",
                f"-admin.port={aport}", f"-admin.port.grpc={agrpc}", "-admin.ui=false",
                "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-master.telemetry=false"]

    def start(self, timeout: float = 60) -> Seaweed:
        import json

        if not self.ports:
            self.ports = free_ports(8)
            admin = _free_port_with_offset(10000, self.ports)
            self.ports += [admin, admin + 10000]
        (self.dir / "log").mkdir(parents=True, exist_ok=True)
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        (self.dir / "s3.json").write_text(json.dumps({"identities": [{
            "name": "orgmem", "credentials": [{"accessKey": self.access_key,
                                               "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ORGMEM_"))}
        env["TMPDIR"] = str(self.dir)
        log = open(self.dir / "weed.log", "ab")
        self.proc = subprocess.Popen(self._argv(), cwd=self.dir, env=env, stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._wait_ready(timeout)
        return self

    def client(self, **config):
        import boto3
        from botocore.config import Config

        cfg = Config(signature_version="s3v4", s3={"addressing_style": "path"},
                     retries={"max_attempts": 1, "mode": "standard"}, **config)
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1",
                            config=cfg)

    def _wait_ready(self, timeout: float) -> None:
        """Ready when a bucket can be created and written: weed's filer and volume
        server come up after its S3 port does."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client(connect_timeout=1, read_timeout=5)
        deadline = time.time() + timeout
        last: Exception | None = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                try:
                    client.create_bucket(Bucket="seaweed-probe")
                except ClientError as exc:
                    if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou",
                                                             "BucketAlreadyExists"):
                        raise
                client.put_object(Bucket="seaweed-probe", Key="probe", Body=b"ok")
                return
            except (BotoCoreError, ClientError) as exc:
                last = exc
                time.sleep(0.2)
        raise RuntimeError(f"weed did not become ready ({last!r}): {self.log()[-2000:]}")

    def log(self) -> str:
        path = self.dir / "weed.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        """Stop weed (its whole process group); SIGKILL simulates a crash."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(10)
        # weed names unix sockets in /tmp after its gRPC ports and leaves them when killed
        import glob

        for port in self.ports:
            for path in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def kill(self) -> None:
        self.stop(signal.SIGKILL)
