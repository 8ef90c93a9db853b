"""Keeping a slow copy's connection alive while it runs, as S3 does.

CopyObject, UploadPartCopy and CompleteMultipartUpload can run for minutes: a large
object is copied part by part on an S3 backend, or sealed anew (see
``SealedStore._copy_resealed``). A client gives up on a connection that stays silent
(botocore after 60 s, s3fs after 120 s) and retries a copy that is still running, which
then fails the same way. S3's answer, which the SDKs expect: once the operation has run
for a while, send 200 OK and the XML declaration, then a space every so often until the
work is done, then the result or an ``<Error>`` document in the same 200. botocore, the
Go and Java SDKs read an ``Error`` body in a 200 from exactly these three operations as
a failure (and retry it). The spaces go after the declaration because XML allows
whitespace before the root element but nothing before ``<?xml``.
"""

from __future__ import annotations

import asyncio

from .message import Request, Response
from .names import RESERVED_BUCKETS
from .xml import HEADER

_DECLARATION = HEADER.encode()


def may_run_long(req: Request) -> bool:
    """CopyObject and UploadPartCopy (a PUT with a copy source), CompleteMultipartUpload, in
    workspace buckets. Not in the memory features' buckets: a Complete there ingests what
    was uploaded, and its refusal (a bad event) must stay a 4xx the client does not retry."""
    if req.bucket in RESERVED_BUCKETS:
        return False
    if req.method == "PUT":
        return "x-amz-copy-source" in req.headers
    return req.method == "POST" and "uploadId" in req.query


async def settled(work: asyncio.Future, seconds: float) -> bool:
    """Whether ``work`` finished within ``seconds``; it runs on either way."""
    done, _ = await asyncio.wait({work}, timeout=seconds)
    return bool(done)


async def answer(work: asyncio.Future, send, headers: list[tuple[bytes, bytes]],
                 every: float) -> tuple[Response, str | None, int]:
    """Send 200 now and a space every ``every`` seconds, then ``work``'s XML answer.

    Returns what the handler answered (its status may say it failed: the client read it
    as an ``Error`` body), the operation's name, and the bytes sent."""
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": _DECLARATION, "more_body": True})
    sent = len(_DECLARATION)
    while not await settled(work, every):
        await send({"type": "http.response.body", "body": b" ", "more_body": True})
        sent += 1
    response, op_name = work.result()
    body = response.body.removeprefix(_DECLARATION)
    await send({"type": "http.response.body", "body": body})
    return response, op_name, sent + len(body)
