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
- Bounds on what a client that sends or reads nothing can hold. uvicorn times out
  an idle connection only after its first answer, has no limit on a request
  head's size, none on connections, and waits forever for a client that does not
  read: here a request head must arrive within ``body_timeout`` seconds (the
  same bound a request body that stalls has) and fit in ``MAX_HEAD_BYTES`` (431
  otherwise), connections beyond ``MAX_CONNECTIONS`` are closed at once, and an
  answer the client has read nothing of for ``body_timeout`` seconds is cut off.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import resource
import signal
import socket
import struct
import sys
import termios

import click

from .config import Config

#: Seconds an idle TLS client gets to acknowledge close_notify at shutdown.
TLS_CLOSE_GRACE = 2.0
#: The largest request head taken, in bytes (AWS S3 takes 8 KiB of headers; the rest is
#: room), counted from the first read after the one it began in.
MAX_HEAD_BYTES = 128 * 1024
#: Connections served at once; more are closed as they come (each holds a descriptor, and
#: the store, the log and the index need theirs): at most half the descriptors the process
#: may open, whose soft limit is raised to the hard one at start.
MAX_CONNECTIONS = 4096


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


def _status_response(status: bytes, message: str) -> bytes:
    body = message.encode()
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


def _send_queue(transport) -> int:
    """Bytes in the socket's kernel send queue, not yet taken by the peer (0 where unknown)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return 0


def connection_limit() -> int:
    """:data:`MAX_CONNECTIONS`, or half the descriptors this process may open if fewer, after
    raising the soft limit on them to the hard one (1,024 is a common soft default)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (OSError, ValueError):
            pass
    return max(16, min(MAX_CONNECTIONS, soft // 2))


def _protocol_class(stall_timeout: float = 60.0, max_connections: int = MAX_CONNECTIONS):
    """The protocol, with ``stall_timeout``: the seconds a request head may take to arrive
    (from the connection's start for its first request, from its first byte for later
    ones), and an answer may wait for the client to read; and ``max_connections``."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GatewayProtocol(HttpToolsProtocol):
        _refused = False
        _in_head = True
        _head_bytes = 0
        _begun = 0  # requests begun on this connection
        _head_timer: asyncio.TimerHandle | None = None
        _stall_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            if len(self.connections) >= max_connections:
                self._refused = True
                transport.abort()
                return
            sock = transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            super().connection_made(CoalescingTransport(transport))
            self._arm_head_timer()

        def connection_lost(self, exc) -> None:
            if self._refused:
                return
            self._cancel_timers()
            super().connection_lost(exc)

        # -- the request head: on time, and bounded ------------------------------

        def data_received(self, data: bytes) -> None:
            # a read counts towards a head only if that head was being read before it came
            # (one where a request began also held the end of the one before): a head is
            # refused past MAX_HEAD_BYTES plus at most one read
            begun = self._begun
            super().data_received(data)
            if self._in_head and self._begun == begun and not self.transport.is_closing():
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD_BYTES:
                    if self._busy():  # answer the requests before first: read no more meanwhile
                        self.flow.pause_reading()
                    else:
                        self._refuse(b"431 Request Header Fields Too Large",
                                     f"The request head is larger than {MAX_HEAD_BYTES} bytes.")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head, self._head_bytes = True, 0
            self._begun += 1
            self._arm_head_timer()

        def _busy(self) -> bool:
            """Whether a request before the one being read is still being answered."""
            return (self.cycle is not None and not self.cycle.response_complete) or bool(self.pipeline)

        def on_headers_complete(self) -> None:
            self._in_head = False
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().on_headers_complete()

        def _arm_head_timer(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(stall_timeout, self._head_too_slow)

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if not self._in_head or self.transport.is_closing():
                return
            if self._busy():  # we are the slow ones: reading waits on the answers before
                self._arm_head_timer()
                return
            if self._head_bytes:
                self._refuse(b"408 Request Timeout", f"The request head did not arrive within "
                                                     f"{stall_timeout:g} seconds.")
            else:  # nothing asked: nothing to answer
                self.transport.close()

        def _refuse(self, status: bytes, message: str) -> None:
            self._in_head = False
            self.transport.write(_status_response(status, message))
            self.transport.close()

        # -- answers the client does not read ----------------------------------

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._stall_timer is None:
                self._watch_reader(self._unread())

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._stall_timer is not None:
                self._stall_timer.cancel()
                self._stall_timer = None

        def _watch_reader(self, unread: int) -> None:
            self._stall_timer = self.loop.call_later(stall_timeout, self._check_reader, unread)

        def _check_reader(self, unread_before: int) -> None:
            """While the answer waits for the client: one that read some of it since the last
            look is waited for again; one that read nothing for ``stall_timeout`` seconds is
            cut off (the handler's next send finds the connection gone and stops)."""
            self._stall_timer = None
            unread = self._unread()
            if unread < unread_before:
                self._watch_reader(unread)
            else:
                self.transport.abort()

        def _unread(self) -> int:
            """Bytes of the answer the client has not taken: those waiting in our buffer, and
            those in the kernel's send queue (a client that reads frees the queue long before
            the kernel asks for more of the buffer)."""
            return self.transport.get_write_buffer_size() + _send_queue(self.transport)

        def _cancel_timers(self) -> None:
            for timer in (self._head_timer, self._stall_timer):
                if timer is not None:
                    timer.cancel()
            self._head_timer = self._stall_timer = None

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
        app, host=config.host, port=config.port, loop="uvloop",
        http=_protocol_class(config.body_timeout, connection_limit()),
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
