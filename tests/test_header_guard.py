"""``server.header_guard`` in one process: a fake transport and a recording HTTP protocol, no socket.

The real server's limits (431, 408, slow clients) are tested through ``taskdata serve`` in
tests/test_server_limits.py; here, what the guard hands on and when it refuses, request by request.
"""

from __future__ import annotations

import asyncio

import pytest

from server.header_guard import HeaderGuard, HeaderLimits


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 5000) if name == "peername" else default


class Recorder(asyncio.Protocol):
    """The guarded protocol: what it was handed."""

    def __init__(self) -> None:
        self.received = b""
        self.made = self.lost = False

    def connection_made(self, transport) -> None:
        self.made = True

    def data_received(self, data: bytes) -> None:
        self.received += data

    def connection_lost(self, exc) -> None:
        self.lost = True


def guard(loop: asyncio.AbstractEventLoop, max_header_bytes: int = 100, header_timeout: float = 30.0):
    inner, transport = Recorder(), Transport()
    guarded = HeaderGuard(inner, HeaderLimits(max_header_bytes, header_timeout), loop)
    guarded.connection_made(transport)
    return guarded, inner, transport


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_header_limits_check_themselves():
    with pytest.raises(ValueError, match="max_header_bytes must be a positive number of bytes but got 0"):
        HeaderLimits(0, 1.0)
    with pytest.raises(ValueError, match="header_timeout must be a positive number of seconds but got 0"):
        HeaderLimits(1024, 0.0)


def test_requests_within_the_limits_are_handed_on_unchanged_byte_for_byte(loop):
    guarded, inner, transport = guard(loop)
    body = b"x" * 500  # bodies do not count against the header cap
    stream = (b"POST /runs HTTP/1.1\r\nHost: t\r\nContent-Length: 500\r\n\r\n" + body
              + b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n" + b"GET /shards?host=0&step=0 HTTP/1.1\r\nHost: t\r\n\r\n")
    for i in range(0, len(stream), 7):  # in pieces, blank lines straddling reads
        guarded.data_received(stream[i : i + 7])
    assert inner.received == stream and not transport.closed and transport.written == b""


def test_headers_over_the_cap_are_refused_before_the_protocol_sees_them(loop):
    guarded, inner, transport = guard(loop)
    guarded.data_received(b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 60)
    assert not transport.closed
    guarded.data_received(b"a" * 60)
    assert transport.closed and transport.written.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"larger than this server accepts (100 bytes)" in transport.written
    assert len(inner.received) < 100  # the read that crossed the cap was not handed on


def test_a_later_request_over_the_cap_closes_the_connection_without_an_answer(loop):
    guarded, _, transport = guard(loop)
    guarded.data_received(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    guarded.data_received(b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 200 + b"\r\n\r\n")
    assert transport.closed and transport.written == b""  # an answer to the first may be under way


def test_headers_must_arrive_within_the_deadline(loop):
    guarded, inner, transport = guard(loop, header_timeout=0.05)
    guarded.data_received(b"GET /hea")
    loop.run_until_complete(asyncio.sleep(0.2))
    assert transport.closed and transport.written.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    # Whole headers in time: no deadline left armed, however long the answer or the idle time after it.
    guarded, inner, transport = guard(loop, header_timeout=0.05)
    guarded.data_received(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    loop.run_until_complete(asyncio.sleep(0.2))
    assert not transport.closed
    guarded.data_received(b"GET /he")  # the next request's first bytes arm it again
    loop.run_until_complete(asyncio.sleep(0.2))
    assert transport.closed and transport.written == b""
    guarded.connection_lost(None)
    assert inner.lost
