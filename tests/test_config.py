"""Config precedence (flags > env > TOML file > defaults) and bad configuration."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.config import Config


def test_defaults():
    config = Config.load({}, None, env={})
    assert (config.host, config.port, config.data) == ("127.0.0.1", 9000, "./orgmem-data")
    assert config.domain is None and config.scheme == "http"


def test_precedence(tmp_path):
    toml = tmp_path / "orgmem.toml"
    toml.write_text('host = "127.0.0.2"\nport = 9100\ndata = "/from/file"\ndomain = "file.example"\n')
    env = {"ORGMEM_PORT": "9200", "ORGMEM_DATA": "/from/env"}
    config = Config.load({"data": "/from/flag", "host": None}, str(toml), env=env)
    assert config.host == "127.0.0.2"      # file beats default
    assert config.port == 9200             # env beats file
    assert config.data == "/from/flag"     # flag beats env
    assert config.domain == "file.example"


def test_config_file_from_env(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("upload-expiry = 60\n")
    assert Config.load({}, None, env={"ORGMEM_CONFIG": str(toml)}).upload_expiry == 60


@pytest.mark.parametrize("text, message", [
    ("prot = 1\n", "unknown keys: prot"),
    ("port = \n", "not valid TOML"),
    ('port = "many"\n', "port must be an integer"),
    ("port = 70000\n", "not between 1 and 65535"),
    ('tls_cert = "/c.pem"\n', "must be given together"),
    ("copy_keepalive = 0\n", "copy_keepalive must be more than 0"),
    ("copy_keepalive = 301\n", "at most 300 seconds"),
    ('copy_keepalive = "soon"\n', "copy_keepalive must be a number"),
])
def test_bad_config_file(tmp_path, text, message):
    toml = tmp_path / "bad.toml"
    toml.write_text(text)
    with pytest.raises(ValueError, match=message):
        Config.load({}, str(toml), env={})


def test_missing_config_file():
    with pytest.raises(ValueError, match="does not exist"):
        Config.load({}, "/no/such/orgmem.toml", env={})


def test_repr_hides_secrets():
    config = Config.load({}, None, env={"ORGMEM_ROOT_ACCESS_KEY": "AK", "ORGMEM_ROOT_SECRET_KEY": "s3cr3t"})
    assert "s3cr3t" not in repr(config)


def test_serve_reports_bad_config_clearly(tmp_path):
    toml = tmp_path / "bad.toml"
    toml.write_text("colour = 'blue'\n")
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(toml)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "unknown keys: colour" in proc.stderr and "Traceback" not in proc.stderr
