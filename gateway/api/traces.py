"""OTLP/HTTP trace ingestion (``POST /v1/traces``): GenAI spans become biography events.

Thin: check the content type, undo the Content-Encoding, let
:mod:`gateway.biography.otlp` decode and map the spans, ingest the events, and answer
an ``ExportTraceServiceResponse`` in the request's encoding. The events go to the
caller's own biography (``bio:PutEvents`` on ``arn:orgmem:bio:::<caller>/*``), whatever
agent a span names. A malformed request is refused whole (400, nothing stored); spans
that decode but cannot become valid events are reported in ``partial_success``.

Errors answer the gateway's usual JSON error body rather than a ``google.rpc.Status``:
the authentication and size checks that come before this handler answer that way too,
and OTLP exporters only log the body.
"""

from __future__ import annotations

import threading
import zlib

from ..biography import otlp
from ..biography.service import Biographies
from .rest import ApiError, Call, Reply, Router

ARN = "arn:orgmem:bio:::"
#: Bytes of a request body as sent (413 beyond; checked before the body is read).
MAX_BODY = 16 * 1024 * 1024
#: Bytes of a compressed body once decompressed (413 beyond). Decoding OTLP costs many
#: times its size in memory (JSON about 30x), so this stays at the body limit: the OTel
#: exporters' batches (512 spans) are far below it.
MAX_DECODED = 16 * 1024 * 1024
#: gzip members in one body: exporters send one; many tiny ones only cost CPU.
MAX_MEMBERS = 16
#: Trace requests decoded at once: each may hold several hundred MiB while it is.
DECODES = threading.BoundedSemaphore(2)
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_TYPES = {PROTOBUF: PROTOBUF, "application/protobuf": PROTOBUF, JSON: JSON}


def add_routes(r: Router, bios: Biographies) -> None:
    api = TracesApi(bios)
    r.add("POST", "/v1/traces", "PutTraces", "bio:PutEvents", api.own_arn, api.put_traces,
          durable=False, max_body=MAX_BODY)


class TracesApi:
    def __init__(self, bios: Biographies) -> None:
        self.bios = bios

    def own_arn(self, call: Call) -> str:
        return f"{ARN}{call.principal.name}/*"

    def put_traces(self, call: Call) -> Reply:
        media = _media_type(call.headers.get("content-type"))
        body = _decompressed(call.body, call.headers.get("content-encoding"))
        try:
            with DECODES:
                request = otlp.decode_json(body) if media == JSON else otlp.decode_protobuf(body)
                result = otlp.convert(request, caller=call.principal.name)
                del request
        except otlp.OtlpError as exc:
            raise ApiError("InvalidTraces", f"{exc.message}; nothing was stored.") from None
        if result.events:
            self.bios.ingest(result.events)
        return Reply(200, raw=otlp.encode_response(result, media == JSON), content_type=media,
                     headers=[("x-orgmem-events", str(len(result.events))),
                              ("x-orgmem-spans-converted", str(result.converted)),
                              ("x-orgmem-spans-skipped", str(result.skipped)),
                              ("x-orgmem-spans-rejected", str(result.rejected))])


def _media_type(value: str | None) -> str:
    """The OTLP encoding the Content-Type names; anything else is a 415."""
    media = (value or "").split(";", 1)[0].strip().lower()
    found = _TYPES.get(media)
    if found is None:
        got = f"got {value!r}" if value else "none was sent"
        raise ApiError("UnsupportedMediaType", f"OTLP traces are sent as {PROTOBUF} or {JSON} "
                       f"({got}); nothing was stored.", 415)
    return found


def _decompressed(body: bytes, encoding: str | None) -> bytes:
    """The body without its Content-Encoding (gzip, deflate or identity), refused past
    MAX_DECODED bytes without inflating further."""
    coding = (encoding or "identity").strip().lower()
    if coding in ("", "identity"):
        return body
    if coding in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif coding == "deflate":
        wbits = zlib.MAX_WBITS if body[:1] == b"\x78" else -zlib.MAX_WBITS  # zlib, or raw deflate
    else:
        raise ApiError("UnsupportedMediaType", f"Content-Encoding {encoding!r} is not supported: "
                       "use gzip, deflate or none; nothing was stored.", 415)
    out = bytearray()
    rest = body
    members = 0
    try:
        while rest:  # gzip allows several members one after another
            members += 1
            if members > MAX_MEMBERS:
                raise ApiError("InvalidTraces", f"The {coding} body has more than {MAX_MEMBERS} members; "
                               "send one. Nothing was stored.")
            inflater = zlib.decompressobj(wbits)
            out += inflater.decompress(rest, MAX_DECODED + 1 - len(out))
            if len(out) > MAX_DECODED:
                raise ApiError("EntityTooLarge", f"The body decompresses to more than {MAX_DECODED} "
                               "bytes; send smaller batches. Nothing was stored.", 413)
            if not inflater.eof:
                raise ApiError("InvalidTraces", f"The {coding} body is truncated; nothing was stored.")
            rest = inflater.unused_data if wbits > 0 and coding != "deflate" else b""
    except zlib.error as exc:
        raise ApiError("InvalidTraces", f"The body is not valid {coding} data ({exc}); "
                       "nothing was stored.") from None
    return bytes(out)
