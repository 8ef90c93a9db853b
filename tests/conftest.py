"""Shared fixtures: a real gateway over HTTP and HTTPS, and clients for it."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from clients import remove_bucket
from servers import Gateway, Seaweed

#: The backends the shared gateways run on: the embedded store, and an upstream bucket
#: on a real SeaweedFS. Every test that uses ``gateway``/``s3`` runs once on each.
BACKENDS = ["local", "s3"]
#: The bucket on the session's SeaweedFS that the s3 gateways store into.
UPSTREAM_BUCKET = "orgmem-upstream"


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory):
    """A self-signed CA and a certificate for 127.0.0.1/localhost, as PEM files."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    d = tmp_path_factory.mktemp("tls")
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(d / "cert.pem"), append=True)
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    return {"cert": str(d / "cert.pem"), "key": str(d / "key.pem"), "ca": str(d / "ca.pem")}


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """One SeaweedFS (``weed mini``) for the session, with UPSTREAM_BUCKET created."""
    sw = Seaweed(tmp_path_factory.mktemp("seaweed")).start()
    sw.client().create_bucket(Bucket=UPSTREAM_BUCKET)
    yield sw
    sw.stop()


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> str:
    return request.param


def backend_options(request, backend: str, prefix: str) -> tuple[list[str], dict[str, str]]:
    """``orgmem serve`` arguments and environment for a gateway on ``backend``; an s3
    gateway stores under ``prefix`` in the session's SeaweedFS bucket."""
    if backend == "local":
        return [], {}
    sw = request.getfixturevalue("seaweed")
    return (["--backend", f"s3://{UPSTREAM_BUCKET}/{prefix}", "--backend-endpoint", sw.endpoint],
            sw.env)


@pytest.fixture(scope="session")
def gateway(request, backend, tmp_path_factory):
    args, env = backend_options(request, backend, "gw-http")
    gw = Gateway(tmp_path_factory.mktemp("gw-http") / "data", extra_args=args, env=env).start()
    gw.backend = backend
    yield gw
    gw.stop()


@pytest.fixture(scope="session")
def tls_gateway(request, backend, tmp_path_factory, tls_files):
    args, env = backend_options(request, backend, "gw-https")
    gw = Gateway(tmp_path_factory.mktemp("gw-https") / "data",
                 tls=(tls_files["cert"], tls_files["key"]), extra_args=args, env=env).start()
    gw.backend = backend
    yield gw
    gw.stop()


def make_client(gw: Gateway, ca: str | None = None, **config):
    cfg = Config(signature_version="s3v4", s3={"addressing_style": "path"},
                 retries={"max_attempts": 1, "mode": "standard"}, **config)
    return boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=gw.access_key,
                        aws_secret_access_key=gw.secret_key, region_name="us-east-1",
                        config=cfg, verify=ca if ca else None)


@pytest.fixture(scope="session")
def s3(gateway):
    return make_client(gateway)


@pytest.fixture(scope="session")
def s3_tls(tls_gateway, tls_files):
    return make_client(tls_gateway, tls_files["ca"])


@pytest.fixture
def bucket(s3):
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    yield name
    remove_bucket(s3, name)


@pytest.fixture(scope="session")
def moto():
    """A real ``moto_server`` process on a free 127.0.0.1 port."""
    from servers import free_port

    port = free_port()
    exe = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {proc.returncode}")
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
