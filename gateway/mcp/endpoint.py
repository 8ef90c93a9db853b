"""``/mcp`` on the gateway: the MCP tools over streamable HTTP, as the calling agent.

The caller sends ``Authorization: Bearer ACCESS_KEY:SECRET_KEY``. The gateway's own
:class:`~gateway.iam.authn.Authenticator` checks it before MCP sees the request (401 with a
JSON error otherwise, audited like any refused request), and the tools then call the
gateway's REST and S3 API with those same keys, in process (``httpx.ASGITransport`` into the
gateway's own ASGI app, signed as over TCP): every tool call passes the same policies and
leaves the same audit record as the equivalent REST call, with the caller's address and
scheme (``aws:SourceIp``, ``aws:SecureTransport``) as the MCP request carried them.

The MCP transport runs stateless with JSON answers: no session lives in this process, so
any replica behind a load balancer can answer any request. The SDK (and its session
manager's task group) is loaded and started on the first MCP request, not at startup, and
stopped with the gateway.

``mcp`` is one of the bucket names the gateway reserves for its own routes
(:data:`gateway.s3.names.ROUTE_NAMES`), so the path alone says a request is MCP.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import orjson

from ..iam.authn import Authenticator
from ..logs import log
from ..recorder import Outcome, Recorder
from ..s3.body import drain, waits_for_continue
from ..s3.sigv4 import AuthError

PATHS = ("/mcp", "/mcp/")
#: The Host the in-process tool calls name (signed like any other; never resolved).
IN_PROCESS_HOST = "orgmem.internal"
#: Where the authenticated caller travels in the ASGI scope, for the tools to find.
CALLER = "orgmem.mcp.caller"
#: An MCP request body: one JSON-RPC message; a workspace file is at most 1 MiB of text,
#: which JSON escaping can inflate several times.
MAX_BODY = 8 * 1024 * 1024


def is_mcp(scope: dict) -> bool:
    """A request for /mcp (no bucket can be named ``mcp``)."""
    return scope["path"] in PATHS


#: The most of a refused request's body read and dropped, and how long that may take.
REFUSED_BODY = 1024 * 1024
REFUSED_SECONDS = 5.0


@dataclass(frozen=True)
class Credentials:
    """The caller's key pair, checked, and where its tool calls go."""

    endpoint: str
    access_key: str
    secret_key: str
    name: str
    kind: str
    is_root: bool
    #: the address the MCP request came from: its tool calls come from there too
    client_ip: str = ""

    def __repr__(self) -> str:  # never the secret
        return f"Credentials(endpoint={self.endpoint!r}, access_key={self.access_key!r}, name={self.name!r})"


class McpEndpoint:
    """The ASGI app for /mcp: authenticate, then hand the request to the MCP session manager."""

    def __init__(self, authenticator: Authenticator, recorder: Recorder, app) -> None:
        self.authenticator = authenticator
        self.recorder = recorder
        #: the gateway's ASGI app, which the tools call in process
        self.app = app
        self._manager = None
        self._clients = None
        self._runner: asyncio.Task | None = None
        self._stopping = asyncio.Event()
        self._starting = asyncio.Lock()

    async def __call__(self, scope: dict, receive, send) -> None:
        started = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            credentials = self._authenticate(scope, headers)
        except AuthError as exc:
            await self._refuse(scope, headers, exc, send, started, receive)
            return
        manager = await self._started()
        request_id = os.urandom(8).hex().upper()
        counted = {"status": None, "in": 0, "out": 0}

        async def receiving() -> dict:
            message = await receive()
            counted["in"] += len(message.get("body", b""))
            return message

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                counted["status"] = message["status"]
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-amz-request-id", request_id.encode())]}
            elif message["type"] == "http.response.body":
                counted["out"] += len(message.get("body", b""))
            await send(message)

        try:
            await manager.handle_request({**scope, CALLER: credentials}, receiving, sending)
        finally:  # its tool calls log their own lines, as the REST requests they make
            log.info("request", request_id=request_id, method=scope["method"], path=scope.get("path"),
                     op="McpRequest", status=counted["status"], bytes_in=counted["in"],
                     bytes_out=counted["out"], ms=round((time.perf_counter() - started) * 1000, 2),
                     principal=credentials.name, client=credentials.client_ip)

    # -- authentication -------------------------------------------------------------

    def _authenticate(self, scope: dict, headers: dict[str, str]) -> Credentials:
        authorization = headers.get("authorization", "")
        if not authorization.startswith("Bearer "):
            raise AuthError("AccessDenied", "The MCP endpoint needs the header "
                            "Authorization: Bearer <access_key>:<secret_key>.", 401)
        # only the bearer header: the tools need the secret itself, which SigV4 never sends
        auth = self.authenticator.authenticate("POST", scope["path"], "", [],
                                               {"authorization": authorization})
        token = authorization[len("Bearer "):].strip()
        access_key, _, secret_key = token.partition(":")
        p = auth.principal
        endpoint = f"{scope.get('scheme', 'http')}://{IN_PROCESS_HOST}"
        return Credentials(endpoint, access_key, secret_key, p.name, p.kind, p.is_root,
                           (scope.get("client") or ("", 0))[0])

    async def _refuse(self, scope: dict, headers: dict[str, str], exc: AuthError, send,
                      started: float, receive) -> None:
        """401 with the gateway's JSON error; audited, naming at most the access key claimed.
        Its body is dropped if small and quick to come, else the connection closes."""
        request_id = os.urandom(8).hex().upper()
        keep = not waits_for_continue(headers) and await drain(receive, REFUSED_BODY, REFUSED_SECONDS)
        body = orjson.dumps({"error": {"code": exc.code, "message": exc.message}})
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b'Bearer realm="orgmem"'), (b"x-amz-request-id", request_id.encode()),
            (b"server", b"orgmem"), *([] if keep else [(b"connection", b"close")])]})
        await send({"type": "http.response.body", "body": body})
        outcome = Outcome(request_id=request_id, client_ip=(scope.get("client") or ("", 0))[0],
                          headers=headers, operation="McpRequest", status=401, error=exc.code,
                          principal=getattr(exc, "principal", None), bytes_out=len(body))
        self.recorder.record(outcome, time.perf_counter() - started)

    # -- the session manager's lifetime ---------------------------------------------------

    async def _started(self):
        """The MCP session manager, running (started by the first request)."""
        if self._manager is None:
            async with self._starting:
                if self._manager is None:
                    self._manager = await self._start()
        return self._manager

    async def _start(self):
        from .tools import ClientCache, http_manager

        self._clients = ClientCache()
        manager = http_manager(self._caller, MAX_BODY)
        ready = asyncio.Event()
        self._runner = asyncio.create_task(self._run(manager, ready))
        await ready.wait()
        if self._runner.done():  # it could not start: say why, on this request
            self._runner.result()
        return manager

    async def _run(self, manager, ready: asyncio.Event) -> None:
        try:
            async with manager.run():
                ready.set()
                await self._stopping.wait()
        finally:
            ready.set()

    async def stop(self) -> None:
        """Called at the gateway's shutdown: end the session manager's task group."""
        self._stopping.set()
        if self._runner is not None:
            await asyncio.gather(self._runner, return_exceptions=True)
            await self._clients.close()

    def _caller(self, scope: dict):
        """The orgmem client of the request's authenticated caller (tools call this)."""
        from .tools import Caller

        c: Credentials = scope[CALLER]
        client = self._clients.get(c.endpoint, c.access_key, c.secret_key, None,
                                   transport=lambda: self._transport(c.client_ip), origin=c.client_ip)
        return Caller(client, c.name, c.kind, c.is_root)

    def _transport(self, client_ip: str):
        """Requests into the gateway's own app, as if from ``client_ip`` (no socket, no TLS)."""
        import httpx

        return httpx.ASGITransport(app=self.app, client=(client_ip or "127.0.0.1", 0))
