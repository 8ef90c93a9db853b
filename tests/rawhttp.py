"""Hand-built S3 requests for bad-input tests: a small independent SigV4 signer and raw sockets.

Real clients refuse to send most malformed requests, so these tests build them
by hand. The signer is written from AWS's documentation, independently of the
gateway's verifier, so the two check each other.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import time
from urllib.parse import quote

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _enc(value: str, safe: str = "-_.~") -> str:
    return quote(value, safe=safe)


def sign(method: str, path: str, query: dict[str, str], headers: dict[str, str], payload_hash: str,
         access: str, secret: str, when: float | None = None, region: str = "us-east-1") -> dict[str, str]:
    """Headers for a SigV4-signed request (adds host-independent x-amz-date and Authorization)."""
    when = time.time() if when is None else when
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    date = amz_date[:8]
    headers = {k.lower(): v for k, v in headers.items()}
    headers["x-amz-date"] = amz_date
    headers["x-amz-content-sha256"] = payload_hash
    signed = sorted(headers)
    canonical = "\n".join([
        method,
        _enc(path, safe="/-_.~"),
        "&".join(f"{_enc(k)}={_enc(v)}" for k, v in sorted(query.items())),
        "".join(f"{k}:{' '.join(headers[k].split())}\n" for k in signed),
        ";".join(signed),
        payload_hash,
    ])
    scope = f"{date}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret).encode()
    for part in (date, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={access}/{scope}, "
                                f"SignedHeaders={';'.join(signed)}, Signature={signature}")
    return headers


def request(port: int, method: str, path: str, headers: dict[str, str], body: bytes = b"",
            query: dict[str, str] | None = None, close_after: int | None = None) -> tuple[int, dict, bytes]:
    """Send one request over a raw socket; ``close_after`` stops sending the body early."""
    qs = "&".join(f"{_enc(k)}={_enc(v)}" if v != "" else _enc(k) for k, v in (query or {}).items())
    target = _enc(path, safe="/-_.~") + (f"?{qs}" if qs else "")
    data = head(method, target, headers) + body[:close_after]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        if close_after is not None:
            sock.shutdown(socket.SHUT_WR)
        return read_response(sock, method)


def head(method: str, target: str, headers: dict[str, str]) -> bytes:
    """A request's line and headers, up to the blank line (``target`` already encoded)."""
    lines = [f"{method} {target} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(sock: socket.socket, method: str) -> tuple[int, dict, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, {}, buf
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", "0")) if method != "HEAD" else 0
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(status_line.split()[1]), headers, rest


def error_code(body: bytes) -> str | None:
    start = body.find(b"<Code>")
    if start < 0:
        return None
    return body[start + 6:body.find(b"</Code>")].decode()
