"""``GET /shards`` answered before FastAPI's routing, for the plainly valid requests trainer hosts send.

Every request of a training run is a ``/shards`` request, and the layers around a route (FastAPI's
telemetry check, Starlette's error and exception middleware, routing, the request object, the response
class) cost as much as a cached answer. ``AssignmentService`` is the FastAPI app with one addition: a
``GET /shards`` request that carries no body, passes the bearer-token check (``server.auth``) and has a
plainly valid query string (``parse_query``) is answered at the door, by the route's own ``answer``,
with the headers the route's ``Response`` sends, recorded in the same metrics series as the route
would (``server.metrics``), and with the app's own exception handlers turning an exception into its
answer, as for the route. Every other request goes through the whole app, where the guard refuses a bad
token and the route validates the query with ``ShardsQuery`` and says what is wrong. Either way: the same
bytes, the same status, the same metrics.

One step earlier, ``answer_now`` lets the server's protocol (``server.protocol``) answer such a request
before uvicorn makes an ASGI task for it, when its body can be had without waiting (the run's caches
already found and verified, at most one step of index math) and nothing goes wrong; otherwise it returns
None and the request comes here as before.

What this mirrors is the app's middleware (``MetricsMiddleware``, ``RequestGuard``) and Starlette's
choice of exception handler; ``tests/test_server_fast.py`` pins both, so a middleware added to the app
cannot be skipped here unnoticed.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send

from server.auth import token_problem
from server.models import MAX_HOSTS, MAX_LOOKAHEAD, MAX_STEP, NAME_PATTERN
from server.routers.shards import PATH, answer, answer_now

__all__ = ["AssignmentService", "parse_query"]

_MAX_DIGITS = 16  # MAX_STEP has 16 digits
# Each integer parameter's bounds, as ShardsQuery declares them: [low, high].
_BOUNDS = {
    b"host": (0, MAX_HOSTS - 1),
    b"step": (0, MAX_STEP),
    b"steps": (1, MAX_LOOKAHEAD),
    b"num_hosts": (1, MAX_HOSTS),
}
_ENCODINGS = {b"ints": "ints", b"base64": "base64", b"compact": "compact"}
_NAME_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:")
_NAME_FIRST = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_NAME_MAX = 200
_DEFAULTS = {"steps": 1, "run": None, "num_hosts": None, "encoding": "ints"}
_JSON = (b"content-type", b"application/json")
assert NAME_PATTERN == r"^[A-Za-z0-9][A-Za-z0-9_.:]*$", "the name rule changed: update _NAME_CHARS"


def parse_query(query_string: bytes) -> dict[str, Any] | None:
    """The fields (``ShardsQuery.model_dump()``) of a plainly valid query string, else None.

    Plainly valid: ``name=value`` pairs of known parameters, each at most once, host and step given,
    integers written in plain digits within their bounds, a run name of the name rule, an encoding
    ``ints``, ``base64`` or ``compact``, and no percent-encoding or ``+`` anywhere. What this accepts, ShardsQuery
    accepts with the same values (``tests/test_server_fast.py`` checks that on random query strings).
    """
    if b"%" in query_string or b"+" in query_string:
        return None
    fields = dict(_DEFAULTS)
    given = set()
    for pair in query_string.split(b"&"):
        name, equals, value = pair.partition(b"=")
        if not equals or name in given:
            return None
        given.add(name)
        bounds = _BOUNDS.get(name)
        if bounds is not None:
            # Plain digits only: no sign, space, underscore or leading zero, which pydantic also reads.
            if not value.isdigit() or len(value) > _MAX_DIGITS or (value[0] == 48 and len(value) > 1):
                return None
            number = int(value)
            if not bounds[0] <= number <= bounds[1]:
                return None
            fields[name.decode()] = number
        elif name == b"run":
            if not value or len(value) > _NAME_MAX or value[0] not in _NAME_FIRST or not _NAME_CHARS.issuperset(value):
                return None
            fields["run"] = value.decode()
        elif name == b"encoding":
            if value not in _ENCODINGS:
                return None
            fields["encoding"] = _ENCODINGS[value]
        else:
            return None
    if b"host" not in given or b"step" not in given:
        return None
    return fields


class AssignmentService(FastAPI):
    """The FastAPI app, with plainly valid ``GET /shards`` requests answered at the door (module docstring)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fields = None
        if scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "GET":
            fields = self._plain_shards_request(scope)
        if fields is None:
            await super().__call__(scope, receive, send)
        else:
            await self._answer_shards(fields, scope, receive, send)

    def _plain_shards_request(self, scope: Scope) -> dict[str, Any] | None:
        """The query fields of a GET /shards that the whole app would route to ``get_shards`` and that its
        middleware would let through untouched (no body, the token if one is set), else None."""
        if self.root_path or scope.get("root_path"):
            return None  # the whole app routes under a root path
        return self.plain_shards_fields(scope["headers"], scope["query_string"])

    def plain_shards_fields(self, headers: list[tuple[bytes, bytes]], query_string: bytes) -> dict[str, Any] | None:
        """The query fields of a ``GET /shards`` request with these (lower-cased) headers and query string if
        the app's middleware would let it through untouched and its query is plainly valid, else None."""
        state = self.state.server
        if state is None:
            return None  # the whole app builds the state (or says why it cannot)
        authorization = None
        for name, value in headers:
            if name == b"authorization":
                authorization = authorization or value
            elif name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
                return None  # a body: the guard's limits apply
        token = state.settings.token
        if token is not None and token_problem(authorization, token.get_secret_value()) is not None:
            return None  # the guard answers 401
        return parse_query(query_string)

    def answer_now(self, headers: list[tuple[bytes, bytes]], query_string: bytes) -> list[bytes] | None:
        """The body of a 200 answer to ``GET /shards`` with these headers and query string, computed now, as
        pieces to write one after another (joined, they are the body the app would send), or None where the
        app must answer it: not plainly valid, a first use or several steps of index math to wait for, or an
        error (the app's handlers word it). A 200 is counted in the metrics as the
        app's answer would be. ``server.protocol`` calls it before it makes an ASGI task for the request."""
        started = time.perf_counter()
        try:
            fields = None if self.root_path else self.plain_shards_fields(headers, query_string)
            body = None if fields is None else answer_now(self.state.server, **fields)
        except Exception:
            return None  # the app answers again and its exception handlers say what is wrong
        if body is not None:
            self.state.metrics.observe(PATH, "GET", 200, time.perf_counter() - started)
        return body

    async def _answer_shards(self, fields: dict[str, Any], scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        scope["app"] = self
        status = 500  # if answering raises an exception no handler takes, the server answers 500
        started_response = False
        try:
            body = await answer(self.state.server, **fields)
            status, started_response = 200, True
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"%d" % len(body)), _JSON]})  # fmt: skip
            await send({"type": "http.response.body", "body": body})
        except Exception as error:
            handler = _handler_for(self.exception_handlers, error)
            if handler is None or started_response:
                # As Starlette's ServerErrorMiddleware (not in debug): a plain 500 if nothing was sent yet,
                # then the error goes on to the server, which logs it.
                if not started_response:
                    await PlainTextResponse("Internal Server Error", status_code=500)(scope, receive, send)
                raise
            response = handler(Request(scope, receive, send), error)
            if inspect.isawaitable(response):  # the app's handlers are coroutines (server.main)
                response = await response
            status = response.status_code
            await response(scope, receive, send)
        finally:
            self.state.metrics.observe(PATH, "GET", status, time.perf_counter() - started)


def _handler_for(handlers: dict[Any, Callable], error: Exception) -> Callable | None:
    """The handler Starlette's exception middleware picks for ``error``: by status code for an HTTP
    exception, else that of the closest class in its MRO. Those of 500 and ``Exception`` belong to the
    server error middleware (``Starlette.build_middleware_stack``), which answers what is left."""
    if isinstance(error, HTTPException) and error.status_code != 500 and error.status_code in handlers:
        return handlers[error.status_code]
    for cls in type(error).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None
