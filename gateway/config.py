"""One Config for the gateway: flags > ORGMEM_* environment > TOML file > defaults."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

_REGION = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}\Z")


@dataclass
class Config:
    host: str = "127.0.0.1"
    port: int = 9000
    data: str = "./orgmem-data"
    domain: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    region: str = "us-east-1"
    #: abandoned multipart uploads older than this many seconds are aborted
    upload_expiry: int = 7 * 24 * 3600
    #: worker threads that run storage calls
    threads: int = 64
    #: seconds an upload may stall (send nothing) before it is abandoned
    body_timeout: int = 60
    #: seconds a copy or CompleteMultipartUpload runs silent before the gateway answers 200 and
    #: keeps the connection alive with a space this often until it is done (as S3 does)
    copy_keepalive: float = 10.0
    log_level: str = "info"
    #: comma-separated addresses of load balancers whose X-Forwarded-For/-Proto are
    #: believed (for aws:SourceIp, aws:SecureTransport and the audit's remote address)
    trusted_proxies: str = ""
    #: where the key-encryption key comes from: file:PATH, env:VAR, passphrase, aws-kms:KEY_ID;
    #: empty means a keyring file created beside the data directory on first start
    kek: str = ""
    #: where objects live: "local" (the embedded store under ``data``) or s3://BUCKET[/PREFIX]
    backend: str = "local"
    #: the S3 service of an s3:// backend (default: AWS S3); credentials come from AWS_* / profile
    backend_endpoint: str | None = None
    backend_region: str | None = None
    #: seconds an upstream request may wait for an answer before it fails (503 to clients)
    backend_timeout: int = 30
    #: seconds between background compactions of the log into Parquet (0: only on demand)
    compact_interval: int = 5
    #: whether this gateway may write the search index (take the index lease); a gateway
    #: that may not serves searches from the published snapshots only
    index_writer: bool = True
    #: processes that parse, validate and redact large event batches beside the gateway's
    #: interpreter; 0: all in its request threads; unset: one per CPU (none on one CPU)
    ingest_processes: int | None = None
    root_access_key: str | None = None
    root_secret_key: str | None = None

    def __repr__(self) -> str:  # never print secrets
        shown = {f.name: getattr(self, f.name) for f in fields(self) if "secret" not in f.name}
        return f"Config({shown})"

    @classmethod
    def load(cls, flags: Mapping[str, Any] | None = None, config_file: str | None = None,
             env: Mapping[str, str] | None = None) -> Config:
        """Merge the four sources; unknown keys in the TOML file are an error, not ignored."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        path = config_file or env.get("ORGMEM_CONFIG")
        if path:
            values.update(_read_toml(Path(path)))
        for f in fields(cls):
            raw = env.get(f"ORGMEM_{f.name.upper()}")
            if raw not in (None, ""):
                values[f.name] = raw
        values.update({k: v for k, v in (flags or {}).items() if v is not None})
        config = cls()
        for f in fields(cls):
            if f.name in values:
                setattr(config, f.name, _coerce(f.name, f.type, values[f.name]))
        config.validate()
        return config

    def validate(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key must be given together")
        if not 0 < self.port < 65536:
            raise ValueError(f"port {self.port} is not between 1 and 65535")
        if bool(self.root_access_key) != bool(self.root_secret_key):
            raise ValueError("ORGMEM_ROOT_ACCESS_KEY and ORGMEM_ROOT_SECRET_KEY must be set together")
        if not 0 <= self.compact_interval <= 86400:
            raise ValueError(f"compact_interval must be 0 to 86400 seconds, not {self.compact_interval}")
        if not 0 < self.copy_keepalive <= 300:
            raise ValueError(f"copy_keepalive must be more than 0 and at most 300 seconds, "
                             f"not {self.copy_keepalive}")
        if self.ingest_processes is not None and not 0 <= self.ingest_processes <= 64:
            raise ValueError(f"ingest_processes must be 0 to 64, not {self.ingest_processes}")
        self._validate_backend()

    @property
    def ingest_process_count(self) -> int:
        """``ingest_processes``, or when unset one per CPU this process may run on (none on one:
        a process of its own would only take turns with the gateway on the one CPU)."""
        if self.ingest_processes is not None:
            return self.ingest_processes
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return cpus if cpus > 1 else 0

    def _validate_backend(self) -> None:
        if self.backend in ("", "local"):
            self.backend = "local"
            if self.backend_endpoint or self.backend_region:
                raise ValueError("--backend-endpoint and --backend-region need --backend s3://BUCKET")
            return
        from .store.s3 import check_endpoint, parse_location

        parse_location(self.backend)
        if self.backend_endpoint:
            check_endpoint(self.backend_endpoint)
        if not 1 <= self.backend_timeout <= 3600:
            raise ValueError(f"--backend-timeout must be 1 to 3600 seconds, not {self.backend_timeout}")
        if self.backend_region is not None and not _REGION.match(self.backend_region):
            raise ValueError(f"--backend-region must look like us-east-1, not {self.backend_region!r}")

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ValueError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path} is not valid TOML: {exc}") from None
    data = {k.replace("-", "_"): v for k, v in data.items()}
    known = {f.name for f in fields(Config)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"config file {path} has unknown keys: {', '.join(unknown)}")
    return data


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _coerce(name: str, kind: Any, value: Any) -> Any:
    if "bool" in str(kind) and not isinstance(value, bool):
        text = str(value).strip().lower()
        if text not in _TRUE + _FALSE:
            raise ValueError(f"{name} must be true or false, not {value!r}")
        return text in _TRUE
    if "float" in str(kind) and not isinstance(value, int | float):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{name} must be a number, not {value!r}") from None
    if "int" in str(kind) and not isinstance(value, int):
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{name} must be an integer, not {value!r}") from None
    return value
