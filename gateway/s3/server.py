"""The S3 protocol as a lean ASGI application.

No web framework: SigV4 signs the raw path, and at 4 KiB per request the
per-request overhead of routing layers is most of the cost. The event loop
only moves bytes; authentication, routing and storage run in one hop to a
worker thread, where handlers are plain synchronous functions.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from ..biography.artifacts import CHANGES, record_change
from ..iam.authn import Authenticator
from ..iam.authz import PER_ITEM_DECISION, ROOT_DECISION, Authorizer, denial_message
from ..logs import log
from ..recorder import Outcome, Recorder
from . import access, keepalive
from .body import BufferedBody, ReceiveReader, receive_some, unsupported_transfer_coding, waits_for_continue
from .context import S3Context
from .errors import S3Error, from_exception
from .handlers.objects import parse_copy_source
from .message import Request, Response, split_path
from .names import check_bucket_name
from .router import SEALED_OPERATIONS, SUBRESOURCES, route
from .sigv4 import not_utf8, parse_query
from .xml import error_document

#: Bodies up to this size are received on the loop before the handler runs (and so
#: before authentication: kept small, so unauthenticated clients pin little memory).
SMALL_BODY = 64 * 1024
#: An answer given before a body was read waits for at most this much more of it, for at
#: most this long, so the client reads the answer instead of a reset (ReceiveReader.drain).
DRAIN_LIMIT = 8 * 1024 * 1024
DRAIN_SECONDS = 5.0
#: Responses up to this size are read in the worker thread and sent in one write.
SMALL_RESPONSE = 256 * 1024
STREAM_CHUNK = 1024 * 1024
#: Methods handled on the event loop: no body to receive, no fsync to wait for.
INLINE_METHODS = frozenset({"GET", "HEAD"})

#: Changes whose audit record is durable before the response is sent.
DURABLE_OPERATIONS = frozenset({"DeleteObject", "DeleteObjects", "DeleteBucket", "AbortMultipartUpload"})
COPY_OPERATIONS = frozenset({"CopyObject", "UploadPartCopy"})


class S3App:
    def __init__(self, ctx: S3Context, authenticator: Authenticator, executor: ThreadPoolExecutor,
                 authorizer: Authorizer, recorder: Recorder, domain: str | None = None,
                 body_timeout: float = 60.0, inline_io: bool = True, keepalive_after: float = 10.0) -> None:
        self.body_timeout = body_timeout
        #: seconds a copy or CompleteMultipartUpload runs before its 200 goes out, and then
        #: between the spaces that keep the connection alive (see keepalive)
        self.keepalive_after = keepalive_after
        #: store calls are cheap enough for the event loop (False for a network store:
        #: every request then goes to a worker, so a slow upstream never stalls the loop)
        self.inline_io = inline_io
        #: requests in flight (being received, handled or sent) right now
        self._active = 0
        self.ctx = ctx
        self.authenticator = authenticator
        self.executor = executor
        self.domain = domain.lower().strip(".") if domain else None
        self.authorizer = authorizer
        self.recorder = recorder

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]],
                       send: Callable[[dict], Awaitable[None]]) -> None:
        self._active += 1
        try:
            await self._serve(scope, receive, send)
        finally:
            self._active -= 1

    async def _serve(self, scope: dict, receive, send) -> None:
        started = time.perf_counter()
        request_id = os.urandom(8).hex().upper()
        loop = asyncio.get_running_loop()
        req = None
        sent = None  # bytes of a body already sent while the handler ran
        outcome = Outcome(request_id, scope.get("client", ("", 0))[0],
                          raw_query=scope.get("query_string", b"").decode("latin-1"))
        try:
            req = self._request(scope, request_id)
            outcome.headers, req.outcome = req.headers, outcome
            if req.method in INLINE_METHODS and self.inline_io:
                # Reads of metadata and small objects cost less than a hop to a thread
                # (and the GIL hand-off that comes with it); large bodies still stream
                # from worker threads in _stream.
                response, op_name = self._handle(req)
            else:
                req.body = await self._body(req, receive, loop)
                if self._active == 1 and self.inline_io and _cheap_write(req):
                    # A small PUT is one short transaction: a hop to a worker thread costs
                    # more CPU than the work. Only when it is the sole request in flight,
                    # so no other request ever waits behind its fsync.
                    response, op_name = self._handle(req)
                else:
                    response, op_name, sent = await self._run(req, send)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an S3 error
            response, op_name = self._error_response(exc, req, request_id, scope), None
        if sent is None:
            response.headers.append(("x-amz-request-id", request_id))
            if req is not None and isinstance(req.body, ReceiveReader) and not req.body.complete \
                    and not await _drained(req):
                response.headers.append(("connection", "close"))  # see ReceiveReader.complete
            try:
                sent = await self._send(response, send, receive, loop, scope["method"] == "HEAD")
            except Exception as exc:  # noqa: BLE001 - the answer began: the connection is closed
                # (the body is cut short); the request is still logged, audited and counted
                log.error("response_failed", request_id=request_id, error=exc.__class__.__name__)
                outcome.error, sent = exc.__class__.__name__, 0
        if not outcome.recorded:
            outcome.bytes_in = getattr(req.body, "received", 0) if req is not None else 0
            outcome.status, outcome.bytes_out = response.status, sent
            outcome.error = outcome.error or response.error
            self.recorder.record(outcome, time.perf_counter() - started)
        log.info("request", request_id=request_id, method=scope["method"],
                 path=scope.get("path"), op=op_name, status=response.status, bytes_in=outcome.bytes_in,
                 bytes_out=sent,
                 ms=round((time.perf_counter() - started) * 1000, 2),
                 principal=getattr(req.principal, "name", None) if req else None,
                 client=scope.get("client", ("", 0))[0])

    # -- request ----------------------------------------------------------

    def _request(self, scope: dict, request_id: str) -> Request:
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            key = name.decode("latin-1").lower()
            # UTF-8 with surrogate escapes: non-ASCII metadata reads as text, and the
            # signature check re-encodes it to exactly the bytes that were signed.
            text = value.decode("utf-8", "surrogateescape")
            headers[key] = f"{headers[key]},{text}" if key in headers else text
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        raw_query = scope.get("query_string", b"").decode("latin-1")
        pairs = parse_query(raw_query)
        if (bad := not_utf8(pairs)) is not None:
            raise S3Error("InvalidArgument", f"The query parameter {bad} is not valid UTF-8 once "
                          "percent-decoded.")
        query: dict[str, str] = {}
        for name, value in pairs:
            query.setdefault(name, value)
        req = Request(scope["method"], raw_path, raw_query, query, pairs, headers,
                      scope.get("client", ("", 0))[0], request_id, scheme=scope.get("scheme", "http"))
        try:
            req.bucket, req.key = split_path(raw_path, self.host_bucket(headers.get("host", "")))
        except UnicodeDecodeError:
            raise S3Error("InvalidURI", "Couldn't parse the specified URI: it is not valid UTF-8.",
                          400) from None
        return req

    def host_bucket(self, host: str) -> str | None:
        if not self.domain:
            return None
        hostname = host.rsplit(":", 1)[0].lower() if not host.endswith("]") else host
        suffix = "." + self.domain
        if hostname.endswith(suffix) and len(hostname) > len(suffix):
            return hostname[: -len(suffix)]
        return None

    async def _body(self, req: Request, receive, loop) -> object | None:
        if req.method in ("GET", "HEAD", "DELETE"):
            return None
        unsupported_transfer_coding(req.headers)
        length = req.headers.get("content-length")
        if length is not None and length.isascii() and length.isdigit() and int(length) <= SMALL_BODY:
            return BufferedBody(await _receive_all(receive, int(length), self.body_timeout))
        expected = int(length) if length is not None and length.isascii() and length.isdigit() else None
        return ReceiveReader(receive, loop, expected, timeout=self.body_timeout)

    async def _run(self, req: Request, send) -> tuple[Response, str | None, int | None]:
        """Handle ``req`` in a worker thread. A copy still running after ``keepalive_after``
        seconds is answered 200 at once and kept alive (see keepalive): the bytes sent then
        come back as the third value, which is None when the answer is still to be sent."""
        work = asyncio.ensure_future(asyncio.get_running_loop().run_in_executor(
            self.executor, self._handle, req))
        if keepalive.may_run_long(req):
            while not await keepalive.settled(work, self.keepalive_after):
                if not isinstance(req.body, ReceiveReader) or req.body.complete:
                    headers = [(b"content-type", b"application/xml"),
                               (b"x-amz-request-id", req.request_id.encode()), (b"server", b"orgmem"),
                               (b"x-amz-server-side-encryption", _header_bytes(_sealed_as(req)))]
                    return await keepalive.answer(work, send, headers, self.keepalive_after)
        response, op_name = await work
        return response, op_name, None

    # -- handling (worker thread) -------------------------------------------

    def _handle(self, req: Request) -> tuple[Response, str | None]:
        op_name = None
        try:
            auth = self.authenticator.authenticate(req.method, req.raw_path, req.raw_query,
                                                   req.query_pairs, req.headers)
            req.principal, req.payload_hash, req.signing = auth.principal, auth.payload_hash, auth.signing
            if req.bucket is not None:
                check_bucket_name(req.bucket)
            op = route(req)
            op_name = op.name
            self._authorize(req, op.name, op.action)
            response = op.handler(self.ctx, req)
            if op_name in SEALED_OPERATIONS and response.status < 300:
                # Sealed at rest under the organization's KEK; aws:kms also tells clients
                # (rclone, the aws cli) the ETag is opaque, not the MD5 of the data.
                response.headers.append(("x-amz-server-side-encryption", _sealed_as(req)))
            if op_name in CHANGES and response.status < 300 and self.ctx.biographies is not None:
                record_change(self.ctx.biographies, req.principal, op_name, req.bucket, req.key,
                              req.headers, response)
            if response.stream is not None and (response.length or 0) <= SMALL_RESPONSE:
                try:
                    response.body = _read_all(response.stream)
                finally:
                    response.stream.close()
                response.stream = None
        except Exception as exc:  # noqa: BLE001
            req.outcome.principal = req.outcome.principal or getattr(exc, "principal", None)
            response = self._error_response(exc, req, req.request_id, None)
        if op_name in DURABLE_OPERATIONS:
            outcome = req.outcome
            outcome.status, outcome.error = response.status, response.error
            outcome.bytes_in, outcome.bytes_out = getattr(req.body, "received", 0), len(response.body)
            self.recorder.record(outcome, 0.0, durable=True)
        return response, op_name

    def _authorize(self, req: Request, op_name: str, action: str) -> None:
        """Decide every permission the request needs; the first refusal answers AccessDenied."""
        outcome, principal = req.outcome, req.principal
        outcome.principal, outcome.operation, outcome.action = principal, op_name, action
        outcome.resource = access.request_arn(req)
        context = access.context(req, op_name)
        req.permits = lambda act, resource, counted=True: self._permits(outcome, principal, act, resource,
                                                                        context, counted)
        req.denies_under = lambda act, prefix: self.authorizer.denies_some_under(principal, act, prefix,
                                                                                  context)
        req.allows_under = lambda act, prefix: self.authorizer.allows_some_under(principal, act, prefix,
                                                                                  context)
        source = None
        if op_name in COPY_OPERATIONS:
            source = parse_copy_source(req.header("x-amz-copy-source", ""))
        checks = access.checks(req, op_name, action, source)
        if not checks:
            outcome.decision = ROOT_DECISION if principal.is_root else PER_ITEM_DECISION
            return
        for check in checks:
            decision = self.authorizer.decide(principal, check.action, check.resource, context)
            if outcome.decision is None or not decision.allowed:
                outcome.decision = decision
            if not decision.allowed:
                outcome.action, outcome.resource = check.action, check.resource
                raise S3Error("AccessDenied", denial_message(principal, check.action, check.resource,
                                                             decision))

    def _permits(self, outcome: Outcome, principal, action: str, resource: str, context: dict,
                 counted: bool = True) -> bool:
        """One item of a per-item operation; refusals are counted for the audit record."""
        allowed = self.authorizer.allows(principal, action, resource, context)
        if not allowed and counted:
            outcome.items_denied += 1
        return allowed

    def _error_response(self, exc: Exception, req: Request | None, request_id: str,
                        scope: dict | None) -> Response:
        err = from_exception(exc)
        if err is None:
            log.error("internal_error", request_id=request_id, error=exc.__class__.__name__,
                      trace=traceback.format_exc(limit=8))
            err = S3Error("InternalError", "We encountered an internal error. Please try again.", 500)
        elif err.status >= 500:
            log.warning("unavailable", request_id=request_id, code=err.code)
        resource = req.resource if req is not None else (scope or {}).get("path", "/")
        headers = [("content-type", "application/xml")]
        if err.code in ("SlowDown", "ServiceUnavailable"):
            headers.append(("retry-after", "1"))
        return Response(err.status, headers, error_document(err, resource, request_id), error=err.code)

    # -- response -----------------------------------------------------------

    async def _send(self, response: Response, send, receive, loop, head: bool) -> int:
        headers = [(k.encode("latin-1"), _header_bytes(v)) for k, v in response.headers]
        if response.stream is None and not any(k == b"content-length" for k, _ in headers):
            headers.append((b"content-length", str(len(response.body)).encode()))
        headers.append((b"server", b"orgmem"))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        if response.stream is None:
            await send({"type": "http.response.body", "body": b"" if head else response.body})
            return 0 if head else len(response.body)
        return await self._stream(response, send, receive, loop)

    async def _stream(self, response: Response, send, receive, loop) -> int:
        """Send a large body chunk by chunk; stop reading the store if the client leaves."""
        sent = 0
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            while not gone.done():
                chunk = await loop.run_in_executor(self.executor, response.stream.read, STREAM_CHUNK)
                if not chunk:
                    await send({"type": "http.response.body", "body": b""})
                    break
                sent += len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            gone.cancel()
            response.stream.close()
        return sent


def _sealed_as(req: Request) -> str:
    """The x-amz-server-side-encryption a sealed operation answers: what the client asked
    for, else aws:kms (which also tells clients the ETag is not the data's MD5)."""
    return req.headers.get("x-amz-server-side-encryption", "aws:kms")


def _cheap_write(req: Request) -> bool:
    """PutObject with a small body already received: one small transaction."""
    if req.key is None or any(name in SUBRESOURCES for name in req.query):
        return False
    return (req.method == "PUT" and isinstance(req.body, BufferedBody)
            and "x-amz-copy-source" not in req.headers)


def _header_bytes(value: str) -> bytes:
    """ASCII as is; anything else (user metadata) in RFC 2047 form, as AWS sends it."""
    if value.isascii():
        return value.encode("ascii")
    raw = value.encode("utf-8", "surrogateescape")
    return b"=?UTF-8?B?" + base64.b64encode(raw) + b"?="


async def _drained(req: Request) -> bool:
    """Whether the unread rest of an answered request's body was read to its end, so the
    answer reaches the client and the connection stays open (see ``ReceiveReader.drain``)."""
    if waits_for_continue(req.headers):
        return False  # the client sends nothing until told to, and we have answered instead
    return await req.body.drain(DRAIN_LIMIT, DRAIN_SECONDS)


async def _wait_disconnect(receive) -> None:
    """Returns once the client has gone (the request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _receive_all(receive, length: int, timeout: float) -> bytes:
    """A small body whole; one that stalls for ``timeout`` seconds is refused (400), so a
    caller cannot hold a request open by sending less than it declared."""
    data, _ = await receive_some(receive, float("inf"), idle=timeout)
    if len(data) < length:
        raise S3Error("IncompleteBody", "You did not provide the number of bytes specified by the "
                      "Content-Length HTTP header.")
    return data


def _read_all(stream) -> bytes:
    """All of a small stream; ``read`` may return less than asked, so loop."""
    chunks = []
    while True:
        chunk = stream.read(SMALL_RESPONSE)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
