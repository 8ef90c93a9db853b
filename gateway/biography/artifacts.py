"""Artifact events: what an agent wrote, copied or deleted in a workspace bucket.

Called after a successful S3 change. Every change of a workspace object (by anyone) also
becomes a ``DocChanged("file", "<bucket>/<key>")`` notice for the search index. Only
agents have biographies written for them (a human's or the root's workspace changes are
audited, not narrated), and only workspace buckets count: the gateway's own buckets carry
their own records. The events are buffered (durable within the log's flush interval) so a
PUT never waits for them.
"""

from __future__ import annotations

import re
import time
from urllib.parse import unquote

from ..log import DocChanged
from ..s3.message import Response
from ..s3.names import RESERVED_BUCKETS
from .bucket import BUCKET as BIOGRAPHIES
from .service import Biographies

#: S3 operations that change an object, and the verb the event records.
CHANGES = {"PutObject": "put", "CopyObject": "copy", "CompleteMultipartUpload": "put",
           "DeleteObject": "delete", "DeleteObjects": "delete"}


def record_change(bios: Biographies, principal, op_name: str, bucket: str, key: str | None,
                  headers: dict[str, str], response: Response) -> None:
    op = CHANGES.get(op_name)
    if op is None or principal is None or bucket == BIOGRAPHIES:
        return
    etag = next((v.strip('"') for k, v in response.headers if k == "etag"), None)
    if not bucket.startswith(".") and bucket not in RESERVED_BUCKETS:
        _notice_files(bios, principal.name, op_name, bucket, key, etag, response)
    if principal.kind != "agent":
        return
    if op_name == "DeleteObjects":
        for deleted in response.changed_keys or ():
            bios.artifact(principal.name, op, bucket, deleted)
        return
    if key is None:
        return
    size = None
    if op_name == "PutObject":
        declared = headers.get("x-amz-decoded-content-length") or headers.get("content-length")
        size = int(declared) if declared and declared.isascii() and declared.isdigit() else None
    source = unquote(headers["x-amz-copy-source"]) if op_name == "CopyObject" else None
    etag = etag or _copy_etag(response.body)
    bios.artifact(principal.name, op, bucket, key, size=size, etag=etag, source=source)


def _notice_files(bios: Biographies, by: str, op_name: str, bucket: str, key: str | None,
                  etag: str | None, response: Response) -> None:
    """"A workspace file changed" notices for the search index (buffered, like artifacts)."""
    now = time.time()
    if op_name == "DeleteObjects":
        keys = list(response.changed_keys or ())
    elif key is not None:
        keys = [key]
    else:
        return
    op = "delete" if op_name in ("DeleteObject", "DeleteObjects") else "put"
    if op == "put" and op_name == "CopyObject":
        etag = etag or _copy_etag(response.body)
    bios.log.append_nowait([DocChanged("file", f"{bucket}/{k}", op, now, etag=etag if op == "put" else None,
                                       by=by) for k in keys])


def _copy_etag(body: bytes) -> str | None:
    found = re.search(rb"<ETag>(?:&quot;|\")?([^<&\"]*)", body)
    return found.group(1).decode() if found else None
