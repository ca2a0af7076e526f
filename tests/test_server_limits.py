"""Header limits and timeouts of ``taskdata serve`` (issue 15): a real uvicorn process on 127.0.0.1, raw sockets.

uvicorn's httptools protocol bounds neither the size of a request's headers nor the time they take to
arrive; ``server.header_guard`` does, in front of it. Every wait here has a deadline, and the servers are
stopped by their pid.
"""

from __future__ import annotations

import contextlib
import io
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from server.settings import Settings
from taskdata.cli import build_parser
from tests.server_helpers import Server, environment

pytestmark = pytest.mark.slow  # servers

TOKEN = "limits-token-6f1e"
READ_DEADLINE = 20.0  # seconds any one read may take before the test gives up


def serve(tmp_path: Path, *flags: str) -> Server:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    args = ["--cache-root", str(tmp_path / "caches"), "--token-file", str(token), "--no-access-log", *flags]
    return Server(args, environment(tmp_path), tmp_path / "server.log")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """A server with limits small enough to test in seconds."""
    server = serve(
        tmp_path_factory.mktemp("limits"),
        "--max-header-bytes",
        "8192",
        "--header-timeout",
        "1",
        "--keep-alive-timeout",
        "1",
    )
    yield server
    server.stop()


def connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=READ_DEADLINE)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def send(sock: socket.socket, data: bytes) -> bool:
    """False if the server closed the connection before it took everything."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed (monotonic)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data, time.monotonic()


def read_response(sock: socket.socket) -> bytes:
    """One whole response (headers and a Content-Length body) from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or pytest.fail(f"closed after {data!r}")
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
    )
    while len(body) < length:
        body += sock.recv(65536) or pytest.fail(f"closed after {data + body!r}")
    return head + b"\r\n\r\n" + body


def get(path: str, extra: bytes = b"") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + extra + b"\r\n"


def status_of(answer: bytes) -> int | None:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def test_a_4_mb_header_is_refused_under_the_default_limits(tmp_path):
    # Before: uvicorn read the whole header and the app answered 200 OK.
    server = serve(tmp_path)
    try:
        with connect(server) as sock:
            send(sock, get("/healthz", b"X-Big: " + b"a" * (4 << 20) + b"\r\n"))
            answer, _ = read_until_closed(sock)
        assert status_of(answer) in (431, None), answer[:200]  # 431, or closed before it could be read
        assert b"200 OK" not in answer
        with connect(server) as sock:  # the server is unharmed
            send(sock, get("/healthz", b"Connection: close\r\n"))
            assert status_of(read_until_closed(sock)[0]) == 200
    finally:
        server.stop()


def test_headers_over_the_limit_get_431_and_under_it_200(quick):
    with connect(quick) as sock:
        send(sock, get("/healthz", b"X-Big: " + b"a" * 9000 + b"\r\n"))
        answer, _ = read_until_closed(sock)
    assert status_of(answer) == 431
    assert b'"The request line and headers are larger than this server accepts (8,192 bytes).' in answer
    with connect(quick) as sock:
        send(sock, get("/healthz", b"X-Big: " + b"a" * 7000 + b"\r\nConnection: close\r\n"))
        assert status_of(read_until_closed(sock)[0]) == 200


def test_a_client_sending_its_headers_a_byte_at_a_time_is_cut_off_at_the_deadline(quick):
    request = get("/healthz", b"X-Slow: " + b"s" * 200 + b"\r\n")
    with connect(quick) as sock:
        started = time.monotonic()
        for i in range(len(request)):
            if not send(sock, request[i : i + 1]):
                break
            sock.settimeout(0.1)
            try:
                if sock.recv(65536, socket.MSG_PEEK):
                    break  # the server answered (and is closing)
            except TimeoutError:
                pass
            if time.monotonic() - started > READ_DEADLINE:
                pytest.fail("the slow client was never cut off")
        sock.settimeout(READ_DEADLINE)
        answer, closed = read_until_closed(sock)
    assert status_of(answer) == 408, answer
    assert b"did not arrive within 1 s" in answer
    assert 0.9 <= closed - started < 5  # the 1 s deadline, not the whole request at 10 bytes/s (~23 s)


def test_a_connection_that_sends_nothing_is_closed_at_the_deadline(quick):
    with connect(quick) as sock:
        started = time.monotonic()
        answer, closed = read_until_closed(sock)
    assert status_of(answer) == 408 and 0.9 <= closed - started < 5


def test_a_slow_but_timely_client_and_keep_alive(quick):
    with connect(quick) as sock:
        request = get("/healthz")
        for i in range(0, len(request), 8):  # the whole request within the deadline, in pieces
            send(sock, request[i : i + 8])
            time.sleep(0.02)
        sock.settimeout(READ_DEADLINE)
        assert status_of(read_response(sock)) == 200
        send(sock, get("/healthz"))  # the same connection serves the next request...
        assert status_of(read_response(sock)) == 200
        idle_from = time.monotonic()
        answer, closed = read_until_closed(sock)  # ...and is closed after the keep-alive timeout
    assert answer == b"" and 0.9 <= closed - idle_from < 5


def test_a_refused_upload_is_not_read_on(quick):
    # No token and a 10 MB body announced: 401 at once, and the connection closes instead of reading it.
    with connect(quick) as sock:
        send(
            sock,
            b"POST /runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000000\r\n\r\n{",
        )
        answer, _ = read_until_closed(sock)
    assert status_of(answer) == 401 and b"connection: close" in answer.lower()


def test_slow_clients_do_not_hold_up_legitimate_ones(quick):
    cut_after: list[float] = []  # seconds from each slow client's start to the server's 408 or close

    def slowloris() -> None:
        started = time.monotonic()
        with connect(quick) as sock:
            sock.settimeout(0.1)  # also the pace: about a byte every 0.1 s, ~14 s for the whole request
            for byte in get("/healthz", b"X-Slow: " + b"s" * 100 + b"\r\n"):
                try:
                    sock.sendall(bytes([byte]))
                    sock.recv(65536)  # an answer (408) or b"" (closed): cut off either way
                except TimeoutError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    pass
                cut_after.append(time.monotonic() - started)
                return

    threads = [threading.Thread(target=slowloris) for _ in range(50)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(20):  # meanwhile, whole requests are answered
            with connect(quick) as sock:
                headers = f"Authorization: Bearer {TOKEN}\r\nConnection: close\r\n".encode()
                send(sock, get("/runs", headers))
                assert status_of(read_until_closed(sock)[0]) == 200
            time.sleep(0.03)
    finally:
        for thread in threads:
            thread.join(READ_DEADLINE)
    assert len(cut_after) == 50 and max(cut_after) < 5, cut_after  # 1 s deadline, not the ~14 s they take


def test_the_help_states_the_settings_defaults():
    with pytest.raises(SystemExit), contextlib.redirect_stdout(io.StringIO()) as out:
        build_parser().parse_args(["serve", "--help"])
    serve_help = out.getvalue()
    defaults = Settings.model_fields
    text = " ".join(serve_help.split())
    assert f"(default {defaults['max_body_bytes'].default})" in text
    assert f"(default {defaults['max_header_bytes'].default})" in text
    assert f"(default {defaults['header_timeout_seconds'].default:g})" in text
    assert f"(default {defaults['keep_alive_seconds'].default:g};" in text


def test_head_and_get_answers_arrive_whole_on_one_kept_alive_connection(quick):
    sock = connect(quick)
    assert send(sock, get("/healthz"))
    assert read_response(sock).endswith(b'{"status":"ok"}')
    assert send(sock, b"HEAD /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += sock.recv(1) or pytest.fail(f"closed after {head!r}")
    assert status_of(head) == 405
    assert send(sock, get("/healthz"))
    assert read_response(sock).endswith(b'{"status":"ok"}')
    sock.close()


def test_a_later_request_that_breaks_a_limit_closes_its_connection_without_an_answer(quick):
    # An answer to the request before may still be under way on a kept-alive connection: nothing is written
    # into it, the connection is closed. The guard finds where each request ends, bodies and pipelining too.
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    body = b'{"name": "x"}' + b" " * 3000
    post = b"POST /runs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + auth
    post += b"Content-Length: %d\r\n\r\n" % len(body) + body
    with connect(quick) as sock:
        send(sock, post + get("/healthz"))  # two requests in one send, the first with a body
        answers = b""
        while not answers.endswith(b'{"status":"ok"}'):  # both answers (they may come in one read)
            answers += sock.recv(65536) or pytest.fail(f"closed after {answers!r}")
        assert status_of(answers) == 422 and answers.count(b"HTTP/1.1 ") == 2
        send(sock, get("/healthz", b"X-Big: " + b"a" * 9000 + b"\r\n"))
        assert read_until_closed(sock)[0] == b""
    with connect(quick) as sock:
        send(sock, get("/healthz"))
        assert status_of(read_response(sock)) == 200
        started = time.monotonic()
        send(sock, b"GET /hea")  # the next request's first bytes, and nothing more
        answer, closed = read_until_closed(sock)
    assert answer == b"" and 0.9 <= closed - started < 5  # the 1 s header deadline


def test_bytes_after_an_upgrade_request_close_the_connection(quick):
    # No upgrade is accepted (no WebSocket route); uvicorn answers such a request as any other but reads no
    # further request on its connection, so nothing more may be sent on it.
    with connect(quick) as sock:
        send(sock, get("/healthz", b"Connection: Upgrade\r\nUpgrade: h2c\r\n"))
        assert read_response(sock).endswith(b'{"status":"ok"}')
        send(sock, get("/healthz"))
        assert read_until_closed(sock)[0] == b""


def test_serve_exits_3_when_it_cannot_listen(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "taskdata", "serve", "--cache-root", str(tmp_path), "--port", str(port)],
            env=environment(tmp_path), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "address already in use" in done.stderr
