"""Clients that send or read slowly, or not at all, hold nothing for long.

A gateway with ``--body-timeout 2``: a connection that sends no request, a request head
trickled in, a head too large, an answer never read, a REST body that stops, and, the
other way round, an upload that is slow but keeps sending (it must go through).
"""

from __future__ import annotations

import hashlib
import socket
import time

import pytest
import rawhttp
from conftest import make_client
from servers import Gateway

from gateway.httpserver import MAX_HEAD_BYTES

STALL = 2


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    g = Gateway(tmp_path_factory.mktemp("slow") / "data", extra_args=["--body-timeout", str(STALL)]).start()
    yield g
    g.stop()


def signed(gw, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> bytes:
    payload = hashlib.sha256(body).hexdigest()
    h = rawhttp.sign(method, path, {}, {"host": f"127.0.0.1:{gw.port}", **(headers or {})}, payload,
                     gw.access_key, gw.secret_key)
    return rawhttp.head(method, path, h)


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed ``sock`` within ``seconds``, and what it sent before."""
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        pass
    return True, got


def test_a_connection_that_sends_nothing_is_closed(gw):
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        closed, got = closed_within(sock, STALL + 5)
    assert closed and got == b""


def test_a_trickled_request_head_is_answered_408_and_closed(gw):
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        sock.settimeout(0.5)
        got = b""
        while time.monotonic() - started < STALL + 5:
            try:
                sock.sendall(b"x-trickle: 1\r\n")
            except OSError:
                break
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
        assert time.monotonic() - started < STALL + 5
    assert got.startswith(b"HTTP/1.1 408")


def test_a_request_head_too_large_is_answered_431(gw):
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        try:
            # past the cap by more than one read's worth (the read a head begins in is not counted)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nx-big: " + b"a" * (4 * MAX_HEAD_BYTES))
        except OSError:
            pass
        closed, got = closed_within(sock, 10)
    assert closed and got.startswith(b"HTTP/1.1 431")


def test_an_answer_never_read_is_cut_off(gw):
    s3 = make_client(gw)
    s3.create_bucket(Bucket="unread")
    size = 48 * 1024 * 1024
    s3.put_object(Bucket="unread", Key="big", Body=b"\0" * size)
    sock = socket.create_connection(("127.0.0.1", gw.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.sendall(signed(gw, "GET", "/unread/big"))
    time.sleep(STALL + 3)  # read nothing meanwhile
    closed, got = closed_within(sock, 20)
    sock.close()
    assert closed and len(got) < size  # cut off, not sent whole
    assert s3.head_object(Bucket="unread", Key="big")["ContentLength"] == size  # still serving


def test_a_download_read_slowly_but_steadily_is_not_cut_off(gw):
    """The answer timeout is for a client that reads nothing, not one that reads slowly: here
    the client reads far less than a send's worth (1 MiB) within the timeout."""
    s3 = make_client(gw)
    s3.create_bucket(Bucket="steady")
    size = 8 * 1024 * 1024  # beyond what the kernel's socket buffers take at once
    s3.put_object(Bucket="steady", Key="big", Body=b"r" * size)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
    sock.connect(("127.0.0.1", gw.port))
    sock.sendall(signed(gw, "GET", "/steady/big"))
    got = b""
    sock.settimeout(STALL + 5)
    while len(got.partition(b"\r\n\r\n")[2]) < size:  # 96 KiB every quarter second: 384 KiB/s
        chunk = sock.recv(96 * 1024)
        if not chunk:
            break
        got += chunk
        time.sleep(0.25)
    sock.close()
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"r" * 1000)
    assert len(got.partition(b"\r\n\r\n")[2]) == size


def test_a_slow_upload_that_keeps_sending_is_taken(gw):
    """The body timeout is for a client that stops, not one that is slow: each pull of the
    body may take longer than the timeout as long as bytes keep coming."""
    make_client(gw).create_bucket(Bucket="slow")
    body = b"s" * (200 * 1024)  # above the size read whole before handling
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(signed(gw, "PUT", "/slow/drip", body, {"content-length": str(len(body))}))
        step = len(body) // 10
        for i in range(0, len(body), step):  # ten pieces over about 1.5 x the timeout
            sock.sendall(body[i:i + step])
            time.sleep(STALL * 0.3)
        status, _, answer = rawhttp.read_response(sock, "PUT")
    assert status == 200, answer


def test_an_upload_that_stops_is_refused_with_request_timeout(gw):
    make_client(gw).create_bucket(Bucket="stops")
    body = b"t" * (200 * 1024)
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(signed(gw, "PUT", "/stops/k", body, {"content-length": str(len(body))}) + body[:1000])
        sock.settimeout(STALL + 10)
        status, _, answer = rawhttp.read_response(sock, "PUT")
    assert status == 400 and rawhttp.error_code(answer) == "RequestTimeout"


def test_a_rest_body_that_stops_is_refused_and_the_connection_closed(gw):
    bearer = f"Bearer {gw.access_key}:{gw.secret_key}"
    head = rawhttp.head("PUT", "/v1/vault/secrets/app/x", {"Host": "x", "Authorization": bearer,
                                                           "Content-Length": "1000"})
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(head + b"only ten b")
        sock.settimeout(STALL + 10)
        status, headers, answer = rawhttp.read_response(sock, "PUT")
    assert status == 400 and b"RequestTimeout" in answer and headers.get("connection") == "close"


def test_a_refused_rest_request_waiting_for_100_continue_is_closed(gw):
    """Answered before its body was read: the connection closes, so the client's next
    request is never read as this one's body."""
    head = rawhttp.head("POST", "/v1/events", {"Host": "x", "Content-Length": "1000000",
                                               "Expect": "100-continue"})
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(head)
        sock.settimeout(10)
        status, headers, _ = rawhttp.read_response(sock, "POST")
    assert status in (401, 403) and headers.get("connection") == "close"


@pytest.mark.parametrize("headers", [
    {"x-amz-decoded-content-length": "\u00b2", "content-length": "0"},
    {"content-length": "0", "x-amz-decoded-content-length": "\u0663"},
])
def test_digits_that_are_not_ascii_are_a_clear_error(gw, headers):
    head = "PUT /b/k HTTP/1.1\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(head.encode())
        sock.settimeout(10)
        status, _, _ = rawhttp.read_response(sock, "PUT")
    assert 400 <= status < 500


@pytest.mark.parametrize("query", ["version=%C2%B2", "version=" + "9" * 5000])
def test_vault_version_numbers_that_are_not_plain_digits_are_400(gw, query):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"{gw.endpoint}/v1/vault/secrets/app/x?{query}",
                                 headers={"Authorization": f"Bearer {gw.access_key}:{gw.secret_key}"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400


def test_a_transfer_coding_other_than_chunked_is_refused(gw):
    make_client(gw).create_bucket(Bucket="coded")
    head = signed(gw, "PUT", "/coded/k", b"", {"transfer-encoding": "gzip, chunked"})
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(head + b"5\r\nhello\r\n0\r\n\r\n")
        sock.settimeout(10)
        status, _, answer = rawhttp.read_response(sock, "PUT")
    assert status == 501 and rawhttp.error_code(answer) == "NotImplemented"


def test_many_pipelined_requests_are_not_taken_for_one_large_head(gw):
    """The head cap counts one head's own bytes: a read that holds hundreds of pipelined
    requests and the start of one more is not one large head."""
    s3 = make_client(gw)
    s3.create_bucket(Bucket="piped")
    s3.put_object(Bucket="piped", Key="k", Body=b"small")
    get = signed(gw, "GET", "/piped/k")
    count = 2 * MAX_HEAD_BYTES // len(get)
    big = b"b" * (8 * 1024 * 1024)  # first, a large upload: reads grow to their largest
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(signed(gw, "PUT", "/piped/big", big, {"content-length": str(len(big))}) + big)
        sock.settimeout(20)
        assert rawhttp.read_response(sock, "PUT")[0] == 200
        sock.sendall(get * count + get[:40])
        time.sleep(0.3)
        sock.sendall(get[40:])
        sock.settimeout(20)
        answers = [_next_answer(stream) for stream in [sock.makefile("rb")] for _ in range(count + 1)]
    assert [a[0] for a in answers] == [200] * (count + 1) and answers[-1][1] == b"small"


def _next_answer(stream) -> tuple[int, bytes]:
    """One answer from a buffered stream of pipelined answers: (status, body)."""
    status = int(stream.readline().split()[1])
    length = 0
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return status, stream.read(length)


def test_connections_beyond_the_limit_are_closed_and_the_gateway_keeps_serving(tmp_path):
    """Under a limit of 256 descriptors the gateway serves at most half as many connections
    (it raises the soft limit to the hard one first: here both are 256); idle sockets beyond
    that are closed at once, and the gateway's own files never run out."""
    from servers import BIN

    g = Gateway(tmp_path / "data", program=["sh", "-c", 'ulimit -n 256 && exec "$0" "$@"', str(BIN / "orgmem")])
    idle = []
    try:
        g.start()
        for _ in range(200):
            idle.append(socket.create_connection(("127.0.0.1", g.port)))
        time.sleep(0.5)
        closed = 0
        for sock in idle:
            sock.settimeout(0.02)
            try:
                closed += sock.recv(1) == b""
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 200 - 128
        for sock in idle:
            sock.close()
        time.sleep(0.5)
        s3 = make_client(g)
        s3.create_bucket(Bucket="still")
        s3.put_object(Bucket="still", Key="k", Body=b"served")
        assert s3.get_object(Bucket="still", Key="k")["Body"].read() == b"served"
        assert "Too many open files" not in g.log() and "log_commit_refused" not in g.log()
    finally:
        for sock in idle:
            sock.close()
        g.stop()


@pytest.mark.parametrize("path", ["/v1/events", "/mcp"])
def test_a_refused_body_that_trickles_does_not_hold_the_connection(gw, path):
    """Answered before its body was read (no credentials here): the rest is dropped only if
    it comes soon; one that trickles gets the answer and a closed connection."""
    head = rawhttp.head("POST", path, {"Host": "x", "Content-Length": "100000000"})
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(head + b"x" * 1000)
        sock.settimeout(20)
        status, headers, _ = rawhttp.read_response(sock, "POST")
        assert status in (401, 403) and headers.get("connection") == "close"
        for _ in range(3):  # a byte now and then does not keep it open
            try:
                sock.sendall(b"x")
            except OSError:
                break
            time.sleep(0.5)
        closed, _ = closed_within(sock, STALL + 10)
    assert closed


def test_a_refused_small_body_keeps_the_connection(gw):
    """A refused request whose (small) body comes at once keeps its connection: the body is
    read and dropped, and the next request on it is answered."""
    body = b'{"session": "s", "kind": "note"}'
    head = rawhttp.head("POST", "/v1/events", {"Host": "x", "Content-Length": str(len(body))})
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(head + body + rawhttp.head("GET", "/health", {"Host": "x"}))
        sock.settimeout(10)
        stream = sock.makefile("rb")
        first, second = _next_answer(stream), _next_answer(stream)
    assert first[0] in (401, 403) and second == (200, b'{"status": "ok"}')
