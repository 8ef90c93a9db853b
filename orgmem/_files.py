"""Workspace files over the gateway's S3 API (path-style), written once for both clients.

Plain S3 calls signed like every other request: GetObject, PutObject (with the conditional
headers the gateway honours), CopyObject, DeleteObject, ListObjectsV2 and CreateBucket.
"""

from __future__ import annotations

import mimetypes
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import unquote

from ._http import Op, Request
from ._sigv4 import encode_segment
from .errors import Conflict, InvalidRequest, NotFound, OrgmemError
from .models import FileData

JSON = dict[str, Any]


def object_path(bucket: str, key: str | None = None) -> str:
    """``/bucket`` or ``/bucket/key`` with every key segment encoded (slashes kept)."""
    if not isinstance(bucket, str) or not bucket or "/" in bucket:
        raise InvalidRequest(0, "InvalidBucketName", f"{bucket!r} is not a bucket name")
    if key is None:
        return "/" + encode_segment(bucket)
    if not isinstance(key, str) or not key:
        raise InvalidRequest(0, "InvalidArgument", "an object key is a non-empty string")
    return "/" + encode_segment(bucket) + "/" + "/".join(encode_segment(s) for s in key.split("/"))


def content_type_for(key: str, given: str | None) -> str:
    if given:
        return given
    guessed, _ = mimetypes.guess_type(key, strict=False)
    if key.endswith((".md", ".markdown")):
        guessed = "text/markdown"
    if guessed and guessed.startswith("text/"):
        return guessed + "; charset=utf-8"
    return guessed or "application/octet-stream"


def _conditions(if_match: str | None, create_only: bool) -> dict[str, str]:
    if if_match is not None and create_only:
        raise InvalidRequest(0, "InvalidArgument", "if_match and create_only exclude each other")
    if if_match is not None:
        return {"if-match": f'"{str(if_match).strip(chr(34))}"'}
    return {"if-none-match": "*"} if create_only else {}


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def parse_listing(body: bytes) -> tuple[list[JSON], list[str], str | None]:
    """(objects, common prefixes, next continuation token) of a ListObjectsV2 answer
    requested with ``encoding-type=url``."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        raise OrgmemError(200, "InvalidResponse", "the gateway's listing is not valid XML") from None
    objects, prefixes, token = [], [], None
    for child in root:
        name = _local(child.tag)
        if name == "Contents":
            fields = {_local(c.tag): (c.text or "") for c in child}
            objects.append({"key": unquote(fields.get("Key", "")), "size": int(fields.get("Size") or 0),
                            "etag": fields.get("ETag", "").strip('"'),
                            "last_modified": fields.get("LastModified")})
        elif name == "CommonPrefixes":
            prefixes += [unquote(c.text or "") for c in child if _local(c.tag) == "Prefix"]
        elif name == "NextContinuationToken":
            token = child.text or None
    return objects, prefixes, token


class Files:
    def read_file(self, bucket: str, key: str) -> Op[FileData]:
        answer = yield Request("GET", object_path(bucket, key))
        return FileData(answer.body, answer.etag, answer.headers.get("content-type"))

    def write_file(self, bucket: str, key: str, data: bytes | str, content_type: str | None = None,
                   if_match: str | None = None, create_only: bool = False) -> Op[str]:
        if isinstance(data, str):
            data = data.encode("utf-8")
        elif not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidRequest(0, "InvalidArgument",
                                 f"file data is bytes or str, not {type(data).__name__}")
        headers = {"content-type": content_type_for(key, content_type), **_conditions(if_match, create_only)}
        answer = yield Request("PUT", object_path(bucket, key), body=bytes(data), headers=headers)
        return answer.etag

    def copy_file(self, src_bucket: str, src_key: str, dst_bucket: str, dst_key: str,
                  create_only: bool = False) -> Op[str]:
        headers = {"x-amz-copy-source": object_path(src_bucket, src_key), **_conditions(None, create_only)}
        answer = yield Request("PUT", object_path(dst_bucket, dst_key), headers=headers)
        try:
            root = ET.fromstring(answer.body)
            etag = next((c.text for c in root if _local(c.tag) == "ETag"), None)
        except ET.ParseError:
            etag = None
        return (etag or "").strip('"')

    def delete_file(self, bucket: str, key: str) -> Op[None]:
        yield Request("DELETE", object_path(bucket, key))

    def list_files(self, bucket: str, prefix: str = "", delimiter: str | None = None) -> Op[list[JSON]]:
        """Every object under ``prefix``, following continuation tokens; with a ``delimiter``
        the folders below come too, as ``{"prefix": ...}`` entries."""
        out: list[JSON] = []
        token = None
        while True:
            query = {"list-type": 2, "prefix": prefix or None, "delimiter": delimiter,
                     "encoding-type": "url", "continuation-token": token}
            objects, prefixes, token = parse_listing((yield Request("GET", object_path(bucket), query)).body)
            out += objects + [{"prefix": p} for p in prefixes]
            if not token:
                return out

    def create_bucket(self, bucket: str) -> Op[bool]:
        """Create a bucket; False (not an error) when the caller already owns it."""
        try:
            yield Request("PUT", object_path(bucket))
        except Conflict as exc:
            if exc.code == "BucketAlreadyOwnedByYou":
                return False
            raise
        return True

    def bucket_exists(self, bucket: str) -> Op[bool]:
        try:
            yield Request("HEAD", object_path(bucket))
        except NotFound:
            return False
        return True
