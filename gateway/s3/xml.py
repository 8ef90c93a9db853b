"""S3 XML: rendering responses by hand (fast, exact) and parsing the few request bodies."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from urllib.parse import quote
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from .errors import S3Error

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
HEADER = '<?xml version="1.0" encoding="UTF-8"?>\n'
#: The largest XML body parsed; each handler bounds its own body below it (a CompleteMultipartUpload
#: of 10,000 parts with SHA-256 checksums is ~1.7 MB, a DeleteObjects of 1,000 long keys ~1.1 MB).
MAX_XML_BODY = 4 * 1024 * 1024
#: Beyond the three entities escape() handles: a CR in a key would be read back as LF.
_ENTITIES = {"\r": "&#13;"}


def iso8601(ts: float) -> str:
    """AWS's timestamp form in XML bodies: 2006-02-03T16:45:09.000Z."""
    ms = int(ts * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{ms:03d}Z"


def http_date(ts: float) -> str:
    """RFC 7231 date for Last-Modified."""
    return _http_date(int(ts))


@functools.lru_cache(maxsize=4096)
def _http_date(seconds: int) -> str:
    return time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(seconds))


class Encoder:
    """Escapes text for XML, and URL-encodes keys when ``encoding-type=url``."""

    def __init__(self, url: bool = False) -> None:
        self.url = url

    def key(self, value: str) -> str:
        if self.url:
            return quote(value, safe="/")
        return escape(value, _ENTITIES)


def element(tag: str, value: object) -> str:
    return f"<{tag}>{escape(str(value), _ENTITIES)}</{tag}>"


def document(root: str, parts: Iterable[str]) -> bytes:
    return (HEADER + f'<{root} xmlns="{NS}">' + "".join(parts) + f"</{root}>").encode()


def error_document(err: S3Error, resource: str, request_id: str) -> bytes:
    extra = "".join(element(k, v) for k, v in err.extra.items())
    return (HEADER + "<Error>" + element("Code", err.code) + element("Message", err.message)
            + extra + element("Resource", resource) + element("RequestId", request_id)
            + "</Error>").encode()


def parse(body: bytes) -> ElementTree.Element:
    """Parse a request body, refusing DTDs and entities (no XML bombs, no XXE)."""
    if len(body) > MAX_XML_BODY:
        raise S3Error("MalformedXML", "The XML you provided is too large.")
    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:
        raise S3Error("MalformedXML", "The XML you provided may not contain a DTD or entities.")
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        raise S3Error("MalformedXML", "The XML you provided was not well-formed or did not "
                      f"validate against our published schema ({exc}).") from None
    return root


def local(tag: str) -> str:
    """A tag name without its namespace."""
    return tag.rsplit("}", 1)[-1]


def children(node: ElementTree.Element, name: str) -> list[ElementTree.Element]:
    return [c for c in node if local(c.tag) == name]


def child_text(node: ElementTree.Element, name: str, strip: bool = True) -> str | None:
    """The text of the first child named ``name``; object keys pass ``strip=False``,
    since leading and trailing spaces are part of a key."""
    for c in node:
        if local(c.tag) == name:
            return (c.text or "").strip() if strip else (c.text or "")
    return None
