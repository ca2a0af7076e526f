"""What every request must pass before any route sees it: the bearer token, then a cap on its body.

``RequestGuard`` is a pure ASGI middleware, so it decides from the request line and headers alone,
before FastAPI reads, parses or validates a byte of the body:

- on every path but ``/healthz``, when the settings hold a token, ``Authorization: Bearer <token>``
  (compared in constant time with ``hmac.compare_digest``); otherwise 401, whatever the body;
- a body over ``max_body_bytes`` is refused with 413: at once when its Content-Length says so, else
  when the bytes streamed so far pass the cap (a run plan is a few KB, the cap 1 MiB by default).

A refusal of a request whose body was not read asks the client to close the connection, so the rest of
that body is not read either. Nothing here logs or echoes a token: messages say what is missing, never
what was sent.
"""

from __future__ import annotations

import hmac
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.state import state_of

__all__ = ["OPEN_PATHS", "RequestGuard", "document_bearer_token", "token_problem"]

OPEN_PATHS = frozenset({"/healthz"})  # load balancers probe it without credentials

_MISSING = "This server requires 'Authorization: Bearer <token>' on every route but /healthz."
_INVALID = "The bearer token is not valid for this server."


class RequestGuard:
    """Authenticates, then caps the body, of every HTTP request (see the module docstring)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        app = scope["app"]
        state = app.state.server or state_of(app)
        settings = state.settings
        authorization = length = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = authorization or value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = True
        has_body = chunked or length not in (None, b"0")
        if settings.token is not None and scope["path"] not in OPEN_PATHS:
            problem = token_problem(authorization, settings.token.get_secret_value())
            if problem is not None:
                challenge = "Bearer" if problem == _MISSING else 'Bearer error="invalid_token"'
                await _refuse(scope, receive, send, 401, problem, has_body, {"WWW-Authenticate": challenge})
                return
        limit = settings.max_body_bytes
        if length is not None and not chunked:
            declared = int(length) if length.isdigit() else None
            if declared is None:
                detail = f"Content-Length must be a whole number of bytes but got {length[:40]!r}."
                await _refuse(scope, receive, send, 400, detail, True)
                return
            if declared > limit:
                await _refuse(scope, receive, send, 413, _too_large(limit, declared), True)
                return
        if not has_body:
            await self.app(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Raised inside the route's body read: FastAPI re-raises HTTPExceptions from there, and
                    # the app's handler answers with it (the route never sees a partial body).
                    raise HTTPException(413, _too_large(limit), headers={"Connection": "close"})
            return message

        await self.app(scope, receive_within_limit, send)


def token_problem(authorization: bytes | None, token: str) -> str | None:
    """Why ``authorization`` (the header's value) does not carry ``token``, or None when it does."""
    if authorization is None:
        return _MISSING
    scheme, _, credentials = authorization.partition(b" ")
    if scheme.lower() != b"bearer" or not credentials:
        return _MISSING
    if not hmac.compare_digest(credentials, token.encode()):
        return _INVALID
    return None


def _too_large(limit: int, size: int | None = None) -> str:
    has = f"has {size:,} bytes," if size is not None else "has"
    return (
        f"The request body {has} more than this server accepts ({limit:,} bytes; a run plan takes a few KB). "
        "Send a smaller body, or raise the server's max_body_bytes."
    )


async def _refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    detail: str,
    unread_body: bool,
    headers: dict[str, str] | None = None,
) -> None:
    headers = dict(headers or {})
    if unread_body:
        headers["Connection"] = "close"  # the body is not read: this connection cannot carry another request
    await JSONResponse({"detail": detail}, status_code=status, headers=headers)(scope, receive, send)


def document_bearer_token(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (the app's OpenAPI document, changed in place) with the bearer token on every operation but
    those of ``OPEN_PATHS``.

    The check itself is ``RequestGuard``'s, made before any route is reached, so no route declares it (a
    FastAPI security dependency would only repeat it, after the body is read, on every request).
    """
    schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes["HTTPBearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "Required when the server is configured with a token.",
    }
    for path, operations in schema["paths"].items():
        if path not in OPEN_PATHS:
            for operation in operations.values():
                operation["security"] = [{"HTTPBearer": []}]
    return schema
