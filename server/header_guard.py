"""Limits on a request's line and headers that uvicorn does not set: a size cap and a deadline.

uvicorn's httptools protocol buffers headers of any size (a 4 MB header was answered 200) and arms its
keep-alive timer only after an answer, so a client that connects and sends nothing, or sends its headers
a byte at a time, holds its connection as long as it likes. ``HeaderGuard`` sits between the transport
and the HTTP protocol of each connection, sees the bytes first and hands them on unchanged:

- a header deadline: a request's line and headers must be complete ``header_timeout`` seconds after the
  connection is made, or after the first byte of each later request; else 408 and the connection closes;
- a header size cap: a request whose line and headers take more than ``max_header_bytes`` gets 431 and
  the connection closes. Bytes are counted as they arrive, up to the blank line that ends the headers,
  and refused before the HTTP protocol sees them, so no more than the cap and one read is ever buffered.

Where one request ends and the next begins, the guard learns from its own ``httptools`` parser fed the
same bytes. It writes its 408 or 431 only for a connection's first request: for a later one an answer to
the request before may still be under way, and bytes written into it would corrupt it, so the connection
is closed without one. It knows nothing of the HTTP protocol it guards beyond ``asyncio.Protocol``.

``guarded_loop_factory(limits)`` makes the event loop ``server.serving`` runs uvicorn's server in: uvicorn's
default one (uvloop where installed, else asyncio's) whose servers wrap each connection's protocol in a
``HeaderGuard``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
from collections.abc import Callable
from typing import Any

import httptools

try:
    import uvloop
except ImportError:  # (not on Windows)
    uvloop = None  # type: ignore[assignment]

__all__ = ["HeaderGuard", "HeaderLimits", "guarded_loop_factory"]

# The blank line that ends a request's headers (llhttp also takes a bare LF as a line end).
_HEADERS_END = re.compile(rb"\n\r?\n")
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}
# uvicorn's logger for the server's own events (connections, protocol errors); its name is documented.
_log = logging.getLogger("uvicorn.error")


@dataclasses.dataclass(frozen=True)
class HeaderLimits:
    """How large a request's line and headers may be, and how long they may take to arrive."""

    max_header_bytes: int
    header_timeout: float

    def __post_init__(self) -> None:
        if self.max_header_bytes < 1:
            raise ValueError(f"max_header_bytes must be a positive number of bytes but got {self.max_header_bytes}.")
        if not self.header_timeout > 0:
            raise ValueError(f"header_timeout must be a positive number of seconds but got {self.header_timeout}.")


class HeaderGuard(asyncio.Protocol):
    """One connection's ``protocol`` (uvicorn's HTTP protocol), behind the limits (module docstring)."""

    def __init__(self, protocol: asyncio.Protocol, limits: HeaderLimits, loop: asyncio.AbstractEventLoop):
        self._protocol = protocol
        self._limits = limits
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._awaiting_headers = True
        self._header_bytes = 0
        self._tail = b""  # the last bytes of the previous read: a blank line may straddle two reads
        self._deadline: asyncio.TimerHandle | None = None
        self._requests = 0  # requests whose headers were whole

    # asyncio.Protocol takes a BaseTransport; a server's connections have stream transports.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._transport = transport
        self._arm_deadline()
        self._protocol.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self._protocol.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return self._protocol.eof_received()

    def pause_writing(self) -> None:
        self._protocol.pause_writing()

    def resume_writing(self) -> None:
        self._protocol.resume_writing()

    def data_received(self, data: bytes) -> None:
        if self._parser is None:  # past a request the parsers cannot read on from (an upgrade)
            self._refuse(None, "sent bytes after a request that ended HTTP on its connection")
            return
        if self._awaiting_headers:
            seen = self._tail + data
            end = _HEADERS_END.search(seen)
            self._header_bytes += len(data) if end is None else max(0, end.end() - len(self._tail))
            self._tail = seen[-2:]
            if self._header_bytes > self._limits.max_header_bytes:
                self._refuse(
                    431,
                    f"The request line and headers are larger than this server accepts "
                    f"({self._limits.max_header_bytes:,} bytes). Send fewer or shorter headers.",
                )
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The rest of the connection is not HTTP to either parser; the HTTP protocol answers this request.
            self._parser = None
            self._cancel_deadline()
        except httptools.HttpParserError:
            self._parser = None  # the HTTP protocol's parser fails alike: it answers 400 and closes
            self._cancel_deadline()
        self._protocol.data_received(data)

    # The guard's parser's callbacks.
    def on_message_begin(self) -> None:
        if self._deadline is None:
            self._arm_deadline()

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._requests += 1
        self._cancel_deadline()

    def on_message_complete(self) -> None:
        self._awaiting_headers, self._header_bytes, self._tail = True, 0, b""

    def _arm_deadline(self) -> None:
        self._deadline = self._loop.call_later(self._limits.header_timeout, self._headers_too_slow)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_too_slow(self) -> None:
        self._deadline = None
        self._refuse(
            408,
            f"The request line and headers did not arrive within {self._limits.header_timeout:g} s. Send each "
            "request whole, without pauses.",
        )

    def _refuse(self, status: int | None, detail: str) -> None:
        """Answers ``status`` if this is the connection's first request (module docstring); closes it."""
        self._cancel_deadline()
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if status is not None and self._requests == 0:
            body = json.dumps({"detail": detail}).encode()
            transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                % (status, _REASONS[status], len(body))
                + body
            )
        peer = transport.get_extra_info("peername")
        client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "a client"
        _log.warning("Closed the connection of %s: %s, %s", client, status or "no answer", detail)
        transport.close()


# uvicorn's default loop: uvloop where it is installed, else asyncio's.
_DefaultLoop: type[asyncio.AbstractEventLoop] = uvloop.Loop if uvloop is not None else asyncio.SelectorEventLoop


class _GuardedLoop(_DefaultLoop):  # type: ignore[valid-type,misc]  # (a base chosen at import)
    """An event loop whose servers put each connection's protocol behind a ``HeaderGuard``."""

    def __init__(self, limits: HeaderLimits):
        super().__init__()
        self._header_limits = limits

    async def create_server(self, protocol_factory: Callable[[], asyncio.Protocol], *args: Any, **kwargs: Any) -> Any:
        limits = self._header_limits
        return await super().create_server(lambda: HeaderGuard(protocol_factory(), limits, self), *args, **kwargs)


def guarded_loop_factory(limits: HeaderLimits) -> Callable[[], asyncio.AbstractEventLoop]:
    """Makes event loops whose servers guard every connection with ``limits``."""
    return lambda: _GuardedLoop(limits)
