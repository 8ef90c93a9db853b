"""Streaming decoder for ``Content-Encoding: aws-chunked`` request bodies.

Handles the three framings S3 accepts (selected by x-amz-content-sha256):

* ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD``          signed chunks
* ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER``  signed chunks + signed trailer
* ``STREAMING-UNSIGNED-PAYLOAD-TRAILER``          plain chunks + trailer (boto3/CLI over TLS)

Memory stays bounded by one small read buffer: chunk data is hashed as it streams past
and its signature is checked when its last byte has been read.  So decoded bytes may
reach the caller before their chunk is verified; the caller must only commit the object
after this reader has returned EOF (b"") without raising, which is when every chunk,
the trailer signature and the decoded length have all been checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from ..store.base import Readable
from .errors import S3Error
from .sigv4 import (
    EMPTY_SHA256,
    STREAMING_PAYLOAD,
    STREAMING_PAYLOAD_TRAILER,
    STREAMING_UNSIGNED_TRAILER,
    AuthError,
    SigningContext,
    sign,
    signatures_match,
)

READ_SIZE = 64 * 1024
MAX_HEADER_LINE = 4096          # a chunk header is ~90 bytes; leaves room for extensions
MAX_TRAILER_BYTES = 16 * 1024
MAX_TRAILER_LINES = 64
SIGNATURE_EXTENSION = b"chunk-signature="
TRAILER_SIGNATURE = "x-amz-trailer-signature"

_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
_SIGNATURE_MISMATCH = ("The request signature we calculated does not match the signature "
                       "you provided. Check your key and signing method.")

# Reader states.
_HEADER, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkedError(S3Error):
    """A malformed or incomplete aws-chunked body, with its S3 error code."""


def streaming_mode(payload_hash: str) -> tuple[bool, bool] | None:
    """(signed, trailer) for a STREAMING-* x-amz-content-sha256 value, else None."""
    return {
        STREAMING_PAYLOAD: (True, False),
        STREAMING_PAYLOAD_TRAILER: (True, True),
        STREAMING_UNSIGNED_TRAILER: (False, True),
    }.get(payload_hash)


def _incomplete(message: str = "The request body terminated unexpectedly") -> ChunkedError:
    return ChunkedError("IncompleteBody", message)


def _malformed(message: str) -> ChunkedError:
    return ChunkedError("InvalidRequest", f"Malformed aws-chunked body: {message}")


def _parse_size(text: bytes) -> int:
    if not 0 < len(text) <= 16 or not _HEX_DIGITS.issuperset(text):
        raise ChunkedError("InvalidChunkSizeError", "Invalid chunk size "
                           f"{text[:20].decode('ascii', 'replace')!r}: expected hexadecimal")
    return int(text, 16)


class AwsChunkedReader:
    """Decode an aws-chunked body from ``source``; ``read`` returns payload bytes.

    ``signing`` is the context from ``sigv4.verify`` for signed modes, None for
    STREAMING-UNSIGNED-PAYLOAD-TRAILER.  ``trailer`` says whether trailing headers follow
    the final chunk.  ``decoded_length`` is x-amz-decoded-content-length when known.
    ``declared_trailers`` (x-amz-trailer names) must all be present at EOF when given.
    ``trailers`` holds the trailing headers (lowercase names) once EOF has been reached.
    """

    def __init__(self, source: Readable, *, signing: SigningContext | None, trailer: bool,
                 decoded_length: int | None, declared_trailers: Iterable[str] = ()) -> None:
        if signing is None and not trailer:
            raise ValueError("unsigned aws-chunked bodies always carry a trailer")
        self.trailers: dict[str, str] = {}
        self._source = source
        self._signing = signing
        self._has_trailer = trailer
        self._decoded_length = decoded_length
        self._declared = tuple(n.strip().lower() for n in declared_trailers if n.strip())
        self._buf = b""
        self._pos = 0
        self._state = _HEADER
        self._remaining = 0       # bytes left in the current chunk
        self._total = 0           # decoded bytes so far
        self._chunks = 0
        self._hasher = hashlib.sha256() if signing else None
        self._claimed = ""        # signature the current chunk header claims
        self._previous = signing.seed_signature if signing else ""
        if signing:
            self._chunk_prefix = (f"AWS4-HMAC-SHA256-PAYLOAD\n{signing.amz_date}\n"
                                  f"{signing.scope}\n")

    # ------------------------------------------------------------------ public

    @property
    def decoded_bytes(self) -> int:
        """Payload bytes returned so far."""
        return self._total

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` decoded bytes (all remaining if n < 0); b"" only at a verified EOF."""
        if n is None or n < 0:
            return b"".join(iter(lambda: self.read(READ_SIZE * 16), b""))
        pieces: list[bytes] = []
        want = n
        while want > 0 and self._state != _DONE:
            if self._state == _DATA:
                piece = self._read_data(want)
                pieces.append(piece)
                want -= len(piece)
            else:
                self._step()
        if len(pieces) == 1:
            return pieces[0]
        return b"".join(pieces)

    # ------------------------------------------------------------------ buffer

    def _fill(self) -> bool:
        """Append more source bytes to the unread part of the buffer; False at EOF."""
        more = self._source.read(READ_SIZE)
        if not more:
            return False
        rest = self._buf[self._pos:]
        self._buf = rest + more if rest else more
        self._pos = 0
        return True

    def _line(self, limit: int) -> bytes | None:
        """Next CRLF-terminated line without its CRLF; None at a clean EOF."""
        while True:
            end = self._buf.find(b"\n", self._pos)
            if end >= 0:
                line = self._buf[self._pos:end]
                if len(line) > limit + 1:
                    raise _malformed(f"line longer than {limit} bytes")
                self._pos = end + 1
                if not line.endswith(b"\r"):
                    raise _malformed("line not terminated by CRLF")
                return line[:-1]
            if len(self._buf) - self._pos > limit + 1:
                raise _malformed(f"line longer than {limit} bytes")
            if not self._fill():
                if self._pos < len(self._buf):
                    raise _incomplete()
                return None

    def _more(self) -> bool:
        """Whether any unread input remains (reads ahead into the buffer if needed)."""
        return self._pos < len(self._buf) or self._fill()

    def _expect_crlf(self) -> None:
        while len(self._buf) - self._pos < 2:
            if not self._fill():
                raise _incomplete()
        if self._buf[self._pos:self._pos + 2] != b"\r\n":
            raise _malformed(f"chunk {self._chunks} data is not followed by CRLF "
                             "(chunk size does not match its data)")
        self._pos += 2

    def _read_data(self, want: int) -> bytes:
        take = min(want, self._remaining)
        if self._pos < len(self._buf):
            piece = self._buf[self._pos:self._pos + take]
            self._pos += len(piece)
        else:
            piece = self._source.read(take)
            if not piece:
                raise _incomplete()
            if len(piece) > take:  # a misbehaving source; keep the surplus buffered
                self._buf, self._pos, piece = piece, take, piece[:take]
        if self._hasher is not None:
            self._hasher.update(piece)
        self._remaining -= len(piece)
        self._total += len(piece)
        if self._remaining == 0:
            self._state = _DATA_END
        return piece

    # ------------------------------------------------------------------ framing

    def _step(self) -> None:
        if self._state == _HEADER:
            self._chunk_header()
        elif self._state == _DATA_END:
            self._expect_crlf()
            self._verify_chunk()
            self._state = _HEADER
        elif self._state == _TRAILER:
            self._read_trailer()
            self._finish()

    def _chunk_header(self) -> None:
        line = self._line(MAX_HEADER_LINE)
        if line is None:
            raise _incomplete()
        size_text, _, extension = line.partition(b";")
        size = _parse_size(size_text)
        self._claimed = self._chunk_signature(extension) if self._signing else ""
        self._chunks += 1
        limit = self._decoded_length
        if limit is not None and self._total + size > limit:
            raise _incomplete("The decoded body is longer than x-amz-decoded-content-length")
        if size:
            self._remaining = size
            self._state = _DATA
            return
        self._verify_chunk()  # the final, empty chunk is signed too
        self._state = _TRAILER if self._has_trailer else _DONE
        if not self._has_trailer:
            self._end_without_trailer()
            self._finish()

    def _chunk_signature(self, extension: bytes) -> str:
        if not extension.startswith(SIGNATURE_EXTENSION):
            raise _malformed(f"chunk {self._chunks + 1} has no chunk-signature")
        try:
            return extension[len(SIGNATURE_EXTENSION):].strip().decode("ascii").lower()
        except UnicodeDecodeError:
            raise _malformed("chunk-signature is not ASCII") from None

    def _verify_chunk(self) -> None:
        if self._signing is None:
            return
        digest = self._hasher.hexdigest()
        self._hasher = hashlib.sha256()
        to_sign = f"{self._chunk_prefix}{self._previous}\n{EMPTY_SHA256}\n{digest}"
        expected = sign(self._signing.signing_key, to_sign)
        if not signatures_match(expected, self._claimed):
            raise AuthError("SignatureDoesNotMatch", _SIGNATURE_MISMATCH,
                            details={"Chunk": str(self._chunks),
                                     "SignatureProvided": self._claimed})
        self._previous = expected

    def _end_without_trailer(self) -> None:
        """After ``0;chunk-signature=...`` comes an empty line; tolerate EOF instead."""
        line = self._line(MAX_HEADER_LINE)
        if line:
            raise _malformed("unexpected data after the final chunk")

    # ------------------------------------------------------------------ trailer

    def _read_trailer(self) -> None:
        received: dict[str, str] = {}
        signature = None
        budget = MAX_TRAILER_BYTES
        for index in range(MAX_TRAILER_LINES + 2):
            line = self._line(MAX_HEADER_LINE)
            if not line:  # blank line ends the trailer; some clients just stop (EOF)
                if line is not None and index == 0 and self._more():
                    continue  # tolerate an extra CRLF between the final chunk and trailer
                break
            budget -= len(line)
            if budget < 0:
                raise _malformed("trailer too large")
            name, value = self._trailer_field(line)
            if name == TRAILER_SIGNATURE:
                signature = value
            else:
                received[name] = value
        else:
            raise _malformed("too many trailer lines")
        if self._signing is not None:
            self._verify_trailer(received, signature)
        undeclared = sorted(n for n in received
                            if n.startswith("x-amz-checksum-") and n not in self._declared)
        if undeclared:  # it could not be computed as the body streamed: refuse rather than skip it
            raise ChunkedError("MalformedTrailerError", "The request contained trailing data that "
                               f"was not declared in x-amz-trailer: {', '.join(undeclared)}")
        self.trailers = {n: v for n, v in received.items()
                         if not self._declared or n in self._declared}
        missing = [n for n in self._declared if n not in self.trailers]
        if missing:
            raise ChunkedError("MalformedTrailerError", "The request contained trailing data "
                               f"that was not well-formed: missing {', '.join(missing)}")

    @staticmethod
    def _trailer_field(line: bytes) -> tuple[str, str]:
        try:
            text = line.decode("ascii")
        except UnicodeDecodeError:
            raise _malformed("trailer is not ASCII") from None
        name, sep, value = text.partition(":")
        if not sep or not name.strip():
            raise ChunkedError("MalformedTrailerError", "The request contained trailing data "
                               "that was not well-formed or did not conform to our published "
                               "schema.")
        return name.strip().lower(), " ".join(value.split())

    def _verify_trailer(self, received: dict[str, str], signature: str | None) -> None:
        if signature is None:
            raise AuthError("SignatureDoesNotMatch", "The trailer is missing "
                            "x-amz-trailer-signature.")
        canonical = "".join(f"{n}:{received[n]}\n" for n in sorted(received))
        digest = hashlib.sha256(canonical.encode()).hexdigest()
        to_sign = (f"AWS4-HMAC-SHA256-TRAILER\n{self._signing.amz_date}\n"
                   f"{self._signing.scope}\n{self._previous}\n{digest}")
        expected = sign(self._signing.signing_key, to_sign)
        if not signatures_match(expected, signature.lower()):
            raise AuthError("SignatureDoesNotMatch", _SIGNATURE_MISMATCH,
                            details={"Chunk": "trailer", "SignatureProvided": signature})

    # ------------------------------------------------------------------ end

    def _finish(self) -> None:
        if self._more():
            raise _malformed("unexpected data after the end of the aws-chunked body")
        limit = self._decoded_length
        if limit is not None and self._total != limit:
            raise _incomplete(f"Decoded {self._total} bytes but x-amz-decoded-content-length "
                              f"is {limit}")
        self._state = _DONE
