"""The ``orgmem`` command."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import click

from . import logs
from .config import Config


@click.group()
def main() -> None:
    """orgmem: durable, shared memory for fleets of AI agents, over S3."""


@main.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--host", help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=int, help="Port to bind (default 9000).")
@click.option("--data", help="Data directory of the embedded store (default ./orgmem-data).")
@click.option("--domain", help="Serve virtual-host style requests for BUCKET.<domain>.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="PEM certificate: serve HTTPS.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="PEM private key for --tls-cert.")
@click.option("--region", help="Region the gateway reports (default us-east-1).")
@click.option("--upload-expiry", type=int, help="Abort multipart uploads older than this many seconds.")
@click.option("--body-timeout", type=int, help="Seconds an upload may send nothing before it is abandoned (default 60).")
@click.option("--log-level", type=click.Choice(list(logs.LEVELS)), help="Log level (default info).")
def serve(config_file: str | None, **flags) -> None:
    """Run the gateway. Every flag is also ORGMEM_<FLAG> and a key in the TOML file."""
    import uvicorn

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
    app = build(config, access, secret)
    logs.log.info("starting", host=config.host, port=config.port, scheme=config.scheme,
                  data=str(Path(config.data).resolve()), domain=config.domain)
    server_config = uvicorn.Config(
        app, host=config.host, port=config.port, loop="uvloop", http=_nodelay_protocol(),
        ssl_certfile=config.tls_cert, ssl_keyfile=config.tls_key, log_config=None,
        access_log=False, server_header=False, lifespan="on", timeout_keep_alive=30,
        timeout_graceful_shutdown=30, backlog=2048)
    server = uvicorn.Server(server_config)
    # uvicorn drains connections on SIGTERM/SIGINT, then re-raises the signal to the
    # previous handler: make that handler a clean exit rather than death by signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    server.run(sockets=[_listen(config.host, config.port)])
    sys.exit(0)


def _nodelay_protocol():
    """uvicorn's httptools protocol with TCP_NODELAY on every connection, and prompt TLS shutdown.

    uvicorn writes response headers and body in separate writes; with Nagle's
    algorithm on, a small body waits for the peer's delayed ACK: 40 ms per GET.
    """
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class NoDelayProtocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            super().connection_made(transport)

        def shutdown(self) -> None:
            # An idle keep-alive connection is aborted rather than closed: closing a
            # TLS connection waits for the client's close_notify, which an idle
            # client never sends, and would hold shutdown for the whole grace period.
            idle = self.cycle is None or self.cycle.response_complete
            if idle and self.transport.get_write_buffer_size() == 0:
                self.transport.abort()
            else:
                super().shutdown()

    return NoDelayProtocol


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so a busy port is a clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


if __name__ == "__main__":
    main()
