"""Running the ASGI app on uvicorn, tuned for many small S3 requests.

Three things uvicorn does not do by itself that matter here:

- TCP_NODELAY on every connection. uvicorn writes a response's headers and
  body separately; with Nagle's algorithm a small body waits for the peer's
  delayed ACK, 40 ms per GET.
- One write per response. Writes made in the same turn of the event loop
  (status line and headers, then a small body) are joined and sent with one
  system call instead of two.
- Prompt shutdown. An idle keep-alive connection is aborted rather than left
  to the grace period; over TLS it is closed first and aborted two seconds
  later, since closing TLS waits for a close_notify an idle client never sends.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import sys

import click

from .config import Config

#: Seconds an idle TLS client gets to acknowledge close_notify at shutdown.
TLS_CLOSE_GRACE = 2.0


class CoalescingTransport:
    """A transport proxy that joins the writes of one event-loop turn into one."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
            self._pending = []
            if not self._transport.is_closing():
                self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


def _protocol_class():
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GatewayProtocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            super().connection_made(CoalescingTransport(transport))

        def shutdown(self) -> None:
            idle = self.cycle is None or self.cycle.response_complete
            if not idle:
                super().shutdown()
            elif self.transport.get_extra_info("sslcontext") is None:
                self.transport.abort()
            else:
                # TLS: bytes already encrypted may still sit below the TLS layer, so
                # close gracefully and only abort if the client never answers.
                self.transport.close()
                asyncio.get_running_loop().call_later(TLS_CLOSE_GRACE, self.transport.abort)

    return GatewayProtocol


def listen(host: str, port: int) -> socket.socket:
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


#: How long a thread may keep the GIL while another waits (CPython's default is 5 ms).
#: Every answer passes through the GIL several times (the event loop, the worker thread,
#: each blocking call it makes); under ingest each pass waited up to the interval behind
#: the log, compactor and index threads. At 1 ms, search_bench's p99 while indexing went
#: from 92 to 37 ms end to end, with ingest throughput within run-to-run noise.
GIL_SWITCH_SECONDS = 0.001


#: The cyclic collector's thresholds while serving (CPython's defaults: 700, 10, 10).
#: The gateway keeps hundreds of thousands of live containers (log records cached for the
#: compactor and the index pipeline, ids of recent segments), and each full collection
#: walked them all with the GIL held: under ingest, 28 full collections in 40 s took 4 s
#: and up to 226 ms each, stalling every request behind them (search p99 while indexing),
#: and young collections every 700 allocations took another 1.8 s. With these thresholds
#: young collections run every 20,000 net allocations and older ones rarely; the same
#: load spent 0.4 s in the collector, acknowledged 15-20% more events per second, and
#: search p99 while indexing fell from 71-195 ms to 46-122 ms (README, "Where searches run").
#: Cycles are still collected: most die young, the rest at the rarer older collections.
GC_THRESHOLDS = (20_000, 50, 100)


def tune_gc() -> None:
    """Collect less often, and never walk what start-up built.

    ``gc.freeze`` moves every object alive now (modules, the app, its configuration) to a
    generation no collection visits: they live as long as the process anyway.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run(app, config: Config) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, then drain and return."""
    import uvicorn

    server_config = uvicorn.Config(
        app, host=config.host, port=config.port, loop="uvloop", http=_protocol_class(),
        ssl_certfile=config.tls_cert, ssl_keyfile=config.tls_key, log_config=None,
        access_log=False, server_header=False, lifespan="on", timeout_keep_alive=30,
        timeout_graceful_shutdown=30, backlog=2048,
        # Forwarded headers decide policies (aws:SourceIp) and audit records: believe
        # them only from the load balancers the operator names.
        proxy_headers=bool(config.trusted_proxies), forwarded_allow_ips=config.trusted_proxies or None)
    server = uvicorn.Server(server_config)
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    tune_gc()
    # uvicorn drains connections on SIGTERM/SIGINT, then re-raises the signal to the
    # previous handler: make that handler a clean exit rather than death by signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    server.run(sockets=[listen(config.host, config.port)])
