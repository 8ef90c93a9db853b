"""Shared fixtures: a real gateway over HTTP and HTTPS, and clients for it."""

from __future__ import annotations

import uuid

import boto3
import pytest
from botocore.config import Config
from clients import remove_bucket
from servers import Gateway


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
def gateway(tmp_path_factory):
    gw = Gateway(tmp_path_factory.mktemp("gw-http") / "data").start()
    yield gw
    gw.stop()


@pytest.fixture(scope="session")
def tls_gateway(tmp_path_factory, tls_files):
    gw = Gateway(tmp_path_factory.mktemp("gw-https") / "data",
                 tls=(tls_files["cert"], tls_files["key"])).start()
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
