"""The ``orgmem`` command."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from . import logs
from .admin_cli import admin
from .bio_cli import bio
from .config import Config
from .context_cli import context
from .mcp.cli import mcp
from .memory_cli import memory
from .run_cli import run
from .search_cli import index, search
from .skills_cli import skills
from .vault_cli import vault


@click.group()
def main() -> None:
    """orgmem: durable, shared memory for fleets of AI agents, over S3."""


@main.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--host", help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=int, help="Port to bind (default 9000).")
@click.option("--data", help="Data directory of the embedded store (default ./orgmem-data).")
@click.option("--domain", help="Serve virtual-host style requests for BUCKET.<domain>.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False),
              help="PEM certificate: serve HTTPS.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False),
              help="PEM private key for --tls-cert.")
@click.option("--region", help="Region the gateway reports (default us-east-1).")
@click.option("--upload-expiry", type=int, help="Abort multipart uploads older than this many seconds.")
@click.option("--body-timeout", type=int,
              help="Seconds an upload may send nothing before it is abandoned (default 60).")
@click.option("--kek", help="Key-encryption key: file:PATH, env:VAR, passphrase or aws-kms:KEY_ID "
              "(default: a keyring beside the data directory, created on first start).")
@click.option("--trusted-proxies",
              help="Comma-separated load balancer addresses whose X-Forwarded-For is believed.")
@click.option("--log-level", type=click.Choice(list(logs.LEVELS)), help="Log level (default info).")
@click.option("--backend", help="Where objects live: 'local' (default, under --data) or "
              "s3://BUCKET[/PREFIX] on an S3 service.")
@click.option("--backend-endpoint", help="URL of the S3 service of an s3:// backend (default AWS S3).")
@click.option("--backend-region", help="Region of the s3:// backend's bucket.")
@click.option("--backend-timeout", type=int,
              help="Seconds an upstream request may wait for an answer (default 30).")
@click.option("--compact-interval", type=int,
              help="Seconds between compactions of the log into Parquet (default 5; 0: on demand only).")
@click.option("--index-writer/--no-index-writer", default=None,
              help="Whether this gateway may write the search index (default: yes). With "
              "--no-index-writer it serves searches from the published snapshots only.")
@click.option("--ingest-processes", type=int,
              help="Processes that validate and redact large event batches beside the gateway "
              "(default: one per CPU, none on one CPU; 0: none).")
def serve(config_file: str | None, **flags) -> None:
    """Run the gateway. Every flag is also ORGMEM_<FLAG> and a key in the TOML file."""
    from . import httpserver
    from .app import build
    from .rootkeys import load_or_create

    try:
        config = Config.load(flags, config_file)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    logs.configure(config.log_level)
    os.umask(0o077)
    Path(config.data).mkdir(parents=True, exist_ok=True, mode=0o700)
    access, secret, created = load_or_create(Path(config.data), config.root_access_key,
                                             config.root_secret_key)
    if created:
        # Printed once, to the terminal only; never logged.
        click.echo(f"Root credentials were generated and saved to {config.data}/.orgmem/:\n"
                   f"  access key: {access}\n  secret key: {secret}\n"
                   "They will not be shown again.", err=True)
    from .sealing import SealingError
    from .store.base import StoreError

    try:
        app = build(config, access, secret)
    except StoreError as exc:
        # The upstream is unreachable, refuses the credentials, or has no such bucket.
        raise click.ClickException(f"cannot open the store ({config.backend}): {exc.message}") from None
    except SealingError as exc:
        # A wrong or missing KEK: never fall back to plaintext.
        raise click.ClickException(f"cannot open the sealed data: {exc}") from None
    logs.log.info("starting", host=config.host, port=config.port, scheme=config.scheme,
                  data=str(Path(config.data).resolve()), domain=config.domain,
                  backend=config.backend, backend_endpoint=config.backend_endpoint)
    httpserver.run(app, config)
    sys.exit(0)


main.add_command(admin)
main.add_command(vault)
main.add_command(bio)
main.add_command(memory)
main.add_command(skills)
main.add_command(context)
main.add_command(search), main.add_command(index)
main.add_command(run)
main.add_command(mcp)

if __name__ == "__main__":
    main()
