"""Request bodies: from ASGI messages to a sync reader, then through the wire-format readers.

Handlers and stores are synchronous and run in worker threads; the body arrives
on the event loop. ``ReceiveReader`` bridges the two with bounded buffering,
so a 5 GiB upload holds at most a few MiB in memory. The pipeline built by
``decode_body`` mirrors the wire: aws-chunked framing and chunk signatures,
then the signed payload hash, then Content-MD5 and x-amz-checksum-* values.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable

from .checksums import VerifyingReader, checksum_request
from .chunked import AwsChunkedReader, streaming_mode
from .errors import S3Error

#: How much one hop to the event loop gathers before handing bytes to the worker.
PULL_SIZE = 1024 * 1024


#: What a client that stops sending its body is told.
STALLED = ("Your socket connection to the server was not read from or written to within the "
           "timeout period; nothing was written.")


async def receive_some(receive: Callable[[], Awaitable[dict]], limit: float,
                       idle: float | None = None) -> tuple[bytes, bool]:
    """ASGI body messages until ``limit`` bytes or the end: ``(bytes, more_to_come)``.

    ``idle``: the seconds the client may send nothing before it is refused (400
    ``RequestTimeout``); a slow client that keeps sending is not."""
    chunks, size, more = [], 0, True
    while more and size < limit:
        try:
            message = await (receive() if idle is None else asyncio.wait_for(receive(), idle))
        except TimeoutError:
            raise S3Error("RequestTimeout", STALLED) from None
        if message["type"] == "http.disconnect":
            raise S3Error("IncompleteBody", "The client closed the connection before sending "
                          "the whole body; nothing was written.")
        chunk = message.get("body", b"")
        if chunk:
            chunks.append(chunk)
            size += len(chunk)
        more = message.get("more_body", False)
    return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), more


#: Seconds without a byte after which draining a refused body stops (see :func:`drain`).
DRAIN_IDLE = 1.0


async def drain(receive: Callable[[], Awaitable[dict]], limit: int, seconds: float) -> bool:
    """Read and drop the rest of a body answered before it was read (some of it is still to
    come); True once it has all arrived, within ``limit`` bytes and ``seconds`` (then the
    connection can stay open and the answer reaches a client still sending, where a close
    over unread bytes resets it). A client that sends nothing for :data:`DRAIN_IDLE` s is
    waiting for the answer, not sending: it gets it then (with the connection closed), not
    after all of ``seconds``."""
    left = limit
    try:
        async with asyncio.timeout(seconds):
            while True:
                data, more = await receive_some(receive, PULL_SIZE, idle=min(DRAIN_IDLE, seconds))
                left -= len(data)
                if left < 0:
                    return False
                if not more:
                    return True
    except (TimeoutError, S3Error):  # too slow, or the client left
        return False


def waits_for_continue(headers: dict[str, str]) -> bool:
    """Whether the client sends its body only once told to (``Expect: 100-continue``)."""
    return headers.get("expect", "").strip().lower() == "100-continue"


def unsupported_transfer_coding(headers: dict[str, str]) -> None:
    """Refuse a body sent with a transfer coding other than chunked (``gzip, chunked``): the
    HTTP layer undoes only the chunking, and the gzip'd bytes would be stored as the data."""
    value = headers.get("transfer-encoding")
    if value is None:
        return
    codings = [c.strip().lower() for c in value.split(",") if c.strip()]
    if codings != ["chunked"]:
        raise S3Error("NotImplemented", f"Transfer-Encoding {value.strip()!r} is not supported: send the "
                      "body as is, or chunked.", 501)


class BufferedBody:
    """A body that was small enough to receive before the handler ran."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._pos = 0

    @property
    def received(self) -> int:
        return len(self._data)

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else min(len(self._data), self._pos + n)
        chunk = bytes(self._data[self._pos:end])
        self._pos = end
        return chunk


class ReceiveReader:
    """Reads an ASGI request body from a worker thread.

    Each ``read`` that finds the buffer empty schedules one coroutine on the
    loop that gathers up to ``PULL_SIZE`` bytes, so large uploads cost one
    thread hop per MiB rather than one per socket read. Pulled bytes are
    handed on without being copied into a growing buffer.
    """

    #: Seconds a stalled upload may send nothing before it is refused, so a client that
    #: stops sending cannot hold a worker thread forever (a slow one that keeps sending may).
    timeout: float = 60.0

    def __init__(self, receive: Callable[[], Awaitable[dict]], loop: asyncio.AbstractEventLoop,
                 expected: int | None, timeout: float | None = None) -> None:
        if timeout is not None:
            self.timeout = timeout
        self._receive = receive
        self._loop = loop
        self._expected = expected
        self._pending = memoryview(b"")
        self._more = True
        self._received = 0

    async def _pull(self) -> bytes:
        data, self._more = await receive_some(self._receive, PULL_SIZE, idle=self.timeout)
        return data

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            return self._read_all()
        if not self._pending and self._more:
            data = self._pulled(asyncio.run_coroutine_threadsafe(self._pull(), self._loop))
            self._received += len(data)
            self._pending = memoryview(data)
        if not self._pending:
            self._check_complete()
            return b""
        chunk = self._pending[:n]
        self._pending = self._pending[n:]
        return chunk.obj if len(chunk) == len(chunk.obj) else bytes(chunk)

    def _pulled(self, future: concurrent.futures.Future) -> bytes:
        """The pull's bytes. The pull gives up on a client that sends nothing for ``timeout``
        seconds; one that keeps sending, however slowly, is waited for, unless the event
        loop stopped meanwhile."""
        while True:
            try:
                return future.result(timeout=self.timeout)
            except concurrent.futures.TimeoutError:
                if not self._loop.is_running():
                    future.cancel()
                    raise S3Error("RequestTimeout", STALLED) from None
            except concurrent.futures.CancelledError:
                raise S3Error("RequestTimeout", STALLED) from None

    @property
    def received(self) -> int:
        """Bytes that arrived (what a request's ``bytes_in`` counts, not what it declared)."""
        return self._received

    @property
    def complete(self) -> bool:
        """Whether the whole body has arrived. A response sent before that must close the
        connection: otherwise the rest of the body (or, from a client that waited for
        100-continue and got a final answer instead, its next request) would be parsed
        as this request's body, and that client would wait for an answer forever."""
        return not self._more

    async def drain(self, limit: int, timeout: float) -> bool:
        """Read and drop the rest of the body, on the event loop, after an answer given before
        the handler read it (NoSuchBucket, AccessDenied...); True once it has all arrived.

        Closing the connection over unread bytes makes the kernel reset it, and a client still
        sending its body then loses the answer (it sees a reset, not the 404). So a body of at
        most ``limit`` more bytes that arrives within ``timeout`` seconds is read to its end,
        and the connection stays usable; anything larger or slower is cut off (False). The
        caller never drains a client that waits for 100-continue: it has sent nothing, and
        asking would make it send everything."""
        if self._expected is not None and self._expected - self._received > limit:
            return False

        async def counted() -> dict:
            message = await self._receive()
            self._received += len(message.get("body", b""))
            return message

        if self._more and not await drain(counted, limit, timeout):
            return False
        self._more, self._pending = False, memoryview(b"")
        return True

    def _read_all(self) -> bytes:
        parts = []
        while chunk := self.read(PULL_SIZE):
            parts.append(chunk)
        return b"".join(parts)

    def _check_complete(self) -> None:
        if self._expected is not None and self._received < self._expected:
            raise S3Error("IncompleteBody", "You did not provide the number of bytes specified "
                          "by the Content-Length HTTP header.")


class LimitedReader:
    """Refuses bodies larger than a limit (for XML request bodies read into memory)."""

    def __init__(self, source, limit: int) -> None:
        self._source = source
        self._left = limit

    def read_all(self) -> bytes:
        parts = []
        while True:
            chunk = self._source.read(64 * 1024)
            if not chunk:
                return b"".join(parts)
            self._left -= len(chunk)
            if self._left < 0:
                raise S3Error("MalformedXML", "The XML you provided is too large.")
            parts.append(chunk)


def upload_stream(req, header_checksums: bool = True) -> tuple[object, Callable[[], dict[str, str]]]:
    """The decoded, verified body of an upload, and a finalizer returning its checksums.

    ``header_checksums=False`` is for CompleteMultipartUpload, whose x-amz-checksum-*
    headers describe the whole object, not the XML body.

    Reading the returned stream to its end raises if anything does not match:
    chunk or trailer signatures, the signed SHA-256, Content-MD5, or an
    x-amz-checksum-* value (from a header or a trailer).
    """
    mode = req.payload_hash or "UNSIGNED-PAYLOAD"
    source = req.body if req.body is not None else BufferedBody(b"")
    expected_size = int_header(req, "content-length")
    chunked = None
    streaming = streaming_mode(mode)
    if mode.startswith("STREAMING-") and streaming is None:
        raise S3Error("InvalidArgument", f"x-amz-content-sha256 {mode} is not a payload mode "
                      "this gateway knows.")
    if streaming is not None:
        signed, trailer = streaming
        expected_size = int_header(req, "x-amz-decoded-content-length")
        if expected_size is None:
            raise S3Error("MissingContentLength", "An aws-chunked upload must send "
                          "x-amz-decoded-content-length.", 411)
        declared = [t.strip() for t in (req.header("x-amz-trailer") or "").split(",") if t.strip()]
        chunked = AwsChunkedReader(source, signing=req.signing if signed else None, trailer=trailer,
                                   decoded_length=expected_size, declared_trailers=declared)
        source = chunked
    signed_sha256 = None if mode.startswith("STREAMING-") or mode == "UNSIGNED-PAYLOAD" else mode
    algorithms, expected = checksum_request(req.headers) if header_checksums else ([], {})
    algorithms = list(dict.fromkeys([*algorithms, *req.extra_checksums]))

    def expected_values() -> dict[str, str]:
        values = dict(expected)
        if chunked is not None:
            values.update({k[len("x-amz-checksum-"):].upper(): v for k, v in chunked.trailers.items()
                           if k.startswith("x-amz-checksum-")})
        return values

    if expected_size is None:
        source = CappedReader(source, MAX_UNDECLARED_BODY)
    verifying = VerifyingReader(source, content_md5=req.header("content-md5"), algorithms=algorithms,
                                expected=expected_values, expected_size=expected_size,
                                content_sha256=signed_sha256)
    return verifying, lambda: dict(verifying.checksums)


#: The most a body of undeclared length (Transfer-Encoding: chunked) may carry: S3's
#: single-PUT limit.
MAX_UNDECLARED_BODY = 5 * 1024**3


class CappedReader:
    """Stops a body that has no declared length once it passes the object size limit."""

    def __init__(self, source, limit: int) -> None:
        self._source = source
        self._left = limit

    def read(self, n: int = -1) -> bytes:
        chunk = self._source.read(n)
        self._left -= len(chunk)
        if self._left < 0:
            raise S3Error("EntityTooLarge", "Your proposed upload exceeds the maximum allowed "
                          "object size of 5 GiB; nothing was written.")
        return chunk


def int_header(req, name: str) -> int | None:
    value = req.header(name)
    if value is None:
        return None
    value = value.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 19:
        raise S3Error("InvalidArgument", f"The {name} header must be a non-negative integer.")
    return int(value)
