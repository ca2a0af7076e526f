"""uvicorn's httptools protocol with the limits it lacks: a cap on header size and a deadline for headers.

What uvicorn 0.54 offers for the httptools protocol: ``timeout_keep_alive`` (an idle connection is
closed that long after its last response), ``limit_concurrency`` (503 past a number of connections or
tasks), ``limit_max_requests`` (the process exits after that many requests) and ``backlog``. Nothing
bounds a request's headers: httptools buffers a header of any size (a 4 MB header got 200), and the
keep-alive timer is armed only after a response, so a client that connects and sends nothing, or
sends its headers a byte at a time, holds its connection as long as it likes (``h11`` has
``h11_max_incomplete_event_size`` but no deadline either, and is slower).

``LimitedHttpToolsProtocol`` adds, per connection:

- a header deadline: the request line and headers must be complete ``header_timeout`` seconds after
  the connection is made, or after the first byte of each later request; else 408 and the
  connection is closed;
- a header size cap: a request whose line and headers take more than ``max_header_bytes`` gets 431
  and the connection is closed. Bytes are counted as they arrive, up to the blank line that ends the
  headers, and refused before the parser sees them: no more than the cap is ever buffered;
- a response sent before its request's body has arrived whole (a refused upload) closes the
  connection: the rest of that body is never read to find the next request in it.

It also answers ``GET /shards`` requests the app can answer at once without an ASGI task (the door,
below). ``taskdata serve`` uses ``limited_protocol(settings, app)`` as uvicorn's ``http`` protocol.

The door: every request of a training run is a ``/shards`` request, and uvicorn's per-request work
around an app (a ``RequestResponseCycle``, an ``asyncio.Event``, a task scheduled on the loop, the ASGI
messages and their header checks) costs about as much as a cached answer. For a ``GET /shards`` with
no body, on a connection with no answer under way, the protocol asks the app's ``answer_now``
(``server.shards_fast``) for the body; if it has one (a plainly valid query, the run's caches found,
at most one step of index math), the answer is written here, with the head uvicorn would write for
the app's ``http.response.start`` (the server's default headers, ``content-length``, ``content-type``,
``connection: close`` when the request did not keep the connection alive). Anything else (None, any
other request, an access log to write, a root path, a concurrency limit, a paused transport) goes to
uvicorn's cycle as before, and the app answers it: the same bytes either way
(``tests/test_server_door.py`` compares them).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from server.routers.shards import PATH
from server.settings import Settings

__all__ = ["LimitedHttpToolsProtocol", "limited_protocol"]

_DOOR_PATH = PATH.encode()  # the raw path of the requests the door answers: GET /shards
# The blank line that ends a request's headers (llhttp also takes a bare LF as a line end).
_HEADERS_END = re.compile(rb"\n\r?\n")


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """See the module docstring; the limits are class attributes (``limited_protocol`` sets them)."""

    max_header_bytes: ClassVar[int] = 64 << 10
    header_timeout: ClassVar[float] = 10.0
    # The door: (lower-cased headers, query string) -> a 200 answer's JSON body as pieces to write one
    # after another, or None (module docstring).
    door: ClassVar[Callable[[list[tuple[bytes, bytes]], bytes], list[bytes] | None] | None] = None

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._awaiting_headers = True
        self._header_bytes = 0
        self._tail = b""  # the last bytes of the previous read: a blank line may straddle two reads
        self._header_deadline: asyncio.TimerHandle | None = None
        self._answered_at_door = False  # the request being parsed was answered by the door

    # asyncio.Protocol takes a BaseTransport; uvicorn narrows it to Transport too (with the same ignore).
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._awaiting_headers:
            if self._header_deadline is None:  # the first byte of a request after the previous one
                self._arm_header_deadline()
            seen = self._tail + data
            end = _HEADERS_END.search(seen)
            self._header_bytes += len(data) if end is None else max(0, end.end() - len(self._tail))
            self._tail = seen[-2:]
            if self._header_bytes > self.max_header_bytes:
                self._refuse(
                    431,
                    f"The request line and headers are larger than this server accepts "
                    f"({self.max_header_bytes:,} bytes). Send fewer or shorter headers.",
                )
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        self._answered_at_door = False
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._cancel_header_deadline()
        if self._answer_at_door():
            return
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope["method"] != "HEAD":  # a HEAD answer is its head alone
            cycle.transport = _HeadWithBody(cycle, self.transport)  # type: ignore[assignment]

    def on_body(self, body: bytes) -> None:
        if not self._answered_at_door:  # (the door takes no request with a body)
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._awaiting_headers, self._header_bytes, self._tail = True, 0, b""  # next: another request
        if not self._answered_at_door:
            super().on_message_complete()

    def _answer_at_door(self) -> bool:
        """Answers the request whose headers just ended if the door can (module docstring); whether it did."""
        door = type(self).door  # a function kept on the class (staticmethod), not a method of the protocol
        if door is None:
            return False
        cycle = self.cycle
        if (cycle is not None and not cycle.response_complete) or self.pipeline or self.flow.write_paused:
            return False  # an answer is under way: uvicorn queues this request behind it, in order
        if self.access_log or self.root_path or self.limit_concurrency is not None:
            return False  # the cycle logs, routes under a root path or counts tasks
        parser = self.parser
        if parser.get_method() != b"GET" or parser.get_http_version() != "1.1" or parser.should_upgrade():
            return False
        url = httptools.parse_url(self.url)
        if url.path != _DOOR_PATH:
            return False  # (a percent-encoded path is not the door's either)
        body = door(self.headers, url.query or b"")
        if body is None:
            return False
        keep_alive = parser.should_keep_alive()
        head = [STATUS_LINE[200]]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head.append(b"content-length: %d\r\ncontent-type: application/json\r\n" % sum(map(len, body)))
        head.append(b"\r\n" if keep_alive else b"connection: close\r\n\r\n")
        # One send of the head and the body's pieces (uvloop: one writev), as _HeadWithBody makes the cycle's;
        # the pieces are not joined first: that would copy every step of the answer once more.
        self.transport.writelines((b"".join(head), *body))
        self._answered_at_door = True
        if not keep_alive:
            self.transport.close()
        # uvicorn's bookkeeping after an answer: the request count, reading resumed, the keep-alive timer.
        HttpToolsProtocol.on_response_complete(self)
        return True

    def on_response_complete(self) -> None:
        # With no request queued behind it, the cycle that answered is the newest; more_body means its
        # body is still arriving. Reading on would only skip it: close instead.
        if not self.pipeline and self.cycle is not None and self.cycle.more_body:
            self.transport.close()
        super().on_response_complete()

    def _arm_header_deadline(self) -> None:
        self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _cancel_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        self._refuse(
            408,
            f"The request line and headers did not arrive within {self.header_timeout:g} s. Send each request "
            "whole, without pauses.",
        )

    def _refuse(self, status: int, detail: str) -> None:
        """Answers ``status`` (unless a response is under way) and closes the connection."""
        self._cancel_header_deadline()
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            body = json.dumps({"detail": detail}).encode()
            head = [STATUS_LINE[status]]
            head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
            head += [
                b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body),
                b"connection: close\r\n\r\n",
            ]
            self.transport.write(b"".join(head) + body)
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        self.logger.warning("Closed the connection of %s: %d, %s", client, status, detail)
        # Through the cycle's transport: a response head it holds is written before the connection closes.
        (self.transport if self.cycle is None else self.cycle.transport).close()


class _HeadWithBody:
    """A response's transport that writes its head together with its first body bytes.

    uvicorn writes a response's status line and headers when the app sends ``http.response.start`` and
    its body at each ``http.response.body``: two ``send()`` calls, two TCP segments, two wake-ups of the
    client. Holding the head until the body's first write makes them one (py-spy under wrk, /shards
    answers of 31 KB: the head's own write took 20% of the server's samples and the body's 8%; written
    together, 20-24%, on a machine shared with other work). Every app of this server
    sends its body right after its head (no streaming route). A head is written on its own only if the
    connection closes first (the app failed after starting its answer): then as before.
    """

    def __init__(self, cycle: RequestResponseCycle, transport: asyncio.Transport):
        self._cycle = cycle
        self._transport = transport
        self._head: bytes | None = None
        self._head_seen = False

    def write(self, data: bytes) -> None:
        if not self._head_seen and self._cycle.response_started:  # the first write of the response: its head
            self._head_seen, self._head = True, data
            return
        if self._head is None:
            self._transport.write(data)
        else:
            self._transport.writelines((self._head, data))  # one send (uvloop: writev, no copy)
            self._head = None

    def close(self) -> None:
        if self._head is not None:
            self._transport.write(self._head)
            self._head = None
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


def limited_protocol(settings: Settings, app: Any = None) -> type[LimitedHttpToolsProtocol]:
    """The protocol class with ``settings``' limits, for ``uvicorn.run(http=...)``; with the door if ``app``
    has one (``AssignmentService.answer_now``: the app uvicorn runs, so that both answer alike)."""
    door = getattr(app, "answer_now", None)
    return type(
        "LimitedHttpToolsProtocol",
        (LimitedHttpToolsProtocol,),
        {
            "max_header_bytes": settings.max_header_bytes,
            "header_timeout": settings.header_timeout_seconds,
            "door": staticmethod(door) if door is not None else None,
        },
    )
