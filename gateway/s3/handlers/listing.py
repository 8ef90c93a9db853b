"""ListObjects (V1) and ListObjectsV2: byte-ordered, paged, with common prefixes."""

from __future__ import annotations

import base64
import binascii

from ...store.base import ListPage
from ..context import S3Context
from ..errors import S3Error
from ..message import Request, Response
from ..xml import Encoder, document, element, iso8601

MAX_KEYS = 1000


def _max_keys(req: Request) -> int:
    raw = req.query.get("max-keys", str(MAX_KEYS))
    try:
        value = int(raw)
    except ValueError:
        raise S3Error("InvalidArgument", "max-keys must be an integer between 0 and 2147483647.") from None
    if value < 0:
        raise S3Error("InvalidArgument", "max-keys must not be negative.")
    return min(value, MAX_KEYS)


#: Listing parameters that name keys: they must be UTF-8, as keys are.
_KEY_PARAMS = ("prefix", "delimiter", "marker", "start-after", "key-marker")


def _check_key_params(req: Request) -> None:
    for name in _KEY_PARAMS:
        value = req.query.get(name)
        if value:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise S3Error("InvalidArgument", f"{name} is not valid UTF-8 once percent-decoded; "
                              "keys are UTF-8.") from None


def encoder(req: Request) -> Encoder:
    """The key encoding a listing asked for (``encoding-type``), its key parameters checked."""
    _check_key_params(req)
    encoding = req.query.get("encoding-type")
    if encoding not in (None, "url"):
        raise S3Error("InvalidArgument", "Invalid Encoding Method specified in Request: only 'url' "
                      "is accepted.")
    return Encoder(url=encoding == "url")


def _page(ctx: S3Context, req: Request, after: str, limit: int) -> ListPage:
    return ctx.store.list_objects(req.bucket, req.query.get("prefix", ""),
                                  req.query.get("delimiter", ""), after, limit)


def _body(ctx: S3Context, req: Request, page: ListPage, enc: Encoder, fetch_owner: bool) -> list[str]:
    owner = ctx.owner_xml() if fetch_owner else ""
    parts = [
        "<Contents>" + f"<Key>{enc.key(e.key)}</Key>" + element("LastModified", iso8601(e.last_modified))
        + element("ETag", f'"{e.etag}"') + element("Size", e.size) + owner
        + "<StorageClass>STANDARD</StorageClass></Contents>"
        for e in page.entries
    ]
    parts.extend(f"<CommonPrefixes><Prefix>{enc.key(p)}</Prefix></CommonPrefixes>"
                 for p in page.common_prefixes)
    return parts


def _common(req: Request, enc: Encoder, limit: int, page: ListPage) -> list[str]:
    head = [element("Name", req.bucket), f"<Prefix>{enc.key(req.query.get('prefix', ''))}</Prefix>"]
    if req.query.get("delimiter"):
        head.append(f"<Delimiter>{enc.key(req.query['delimiter'])}</Delimiter>")
    head.append(element("MaxKeys", limit))
    if enc.url:
        head.append("<EncodingType>url</EncodingType>")
    head.append(element("IsTruncated", "true" if page.is_truncated else "false"))
    return head


def list_objects_v1(ctx: S3Context, req: Request) -> Response:
    enc, limit = encoder(req), _max_keys(req)
    marker = req.query.get("marker", "")
    page = _page(ctx, req, marker, limit)
    head = _common(req, enc, limit, page)
    head.insert(2, f"<Marker>{enc.key(marker)}</Marker>")
    if page.is_truncated and page.next_marker and req.query.get("delimiter"):
        # Without a delimiter AWS leaves NextMarker out: clients resume from the last Key.
        head.append(f"<NextMarker>{enc.key(page.next_marker)}</NextMarker>")
    return Response.xml(document("ListBucketResult", head + _body(ctx, req, page, enc, True)))


def list_objects_v2(ctx: S3Context, req: Request) -> Response:
    enc, limit = encoder(req), _max_keys(req)
    token = req.query.get("continuation-token")
    start_after = req.query.get("start-after", "")
    after = _decode_token(token) if token is not None else start_after
    page = _page(ctx, req, after, limit)
    head = _common(req, enc, limit, page)
    head.append(element("KeyCount", len(page.entries) + len(page.common_prefixes)))
    if token is not None:
        head.append(element("ContinuationToken", token))
    if page.is_truncated and page.next_marker:
        head.append(element("NextContinuationToken", _encode_token(page.next_marker)))
    if start_after:
        head.append(f"<StartAfter>{enc.key(start_after)}</StartAfter>")
    fetch_owner = req.query.get("fetch-owner", "").lower() == "true"
    return Response.xml(document("ListBucketResult", head + _body(ctx, req, page, enc, fetch_owner)))


def _encode_token(after: str) -> str:
    return base64.urlsafe_b64encode(after.encode()).decode()


def _decode_token(token: str) -> str:
    try:
        return base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise S3Error("InvalidArgument", "The continuation token provided is incorrect.") from None
