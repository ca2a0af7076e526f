"""Bearer-token check for every route but ``/healthz``, when the settings hold a token.

The comparison is constant-time (``hmac.compare_digest``) and nothing here logs or echoes a token:
error messages say what is missing, never what was sent.
"""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request
from fastapi.security import HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from server.state import get_state

__all__ = ["require_token"]


class _BearerTokenCheck(HTTPBearer):
    """The token check itself is the security dependency.

    As an ``HTTPBearer`` it documents the scheme in the OpenAPI schema; doing the check in its own
    ``__call__`` (rather than in a second dependency that receives its credentials) makes the check one
    dependency with one parameter, which FastAPI resolves in a few microseconds per request.
    """

    async def __call__(self, request: Request) -> None:  # type: ignore[override]
        token = (await get_state(request)).settings.token
        if token is None:
            return
        scheme, credentials = get_authorization_scheme_param(request.headers.get("Authorization"))
        if scheme.lower() != "bearer" or not credentials:
            raise HTTPException(
                401,
                "This server requires 'Authorization: Bearer <token>' on every route but /healthz.",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(credentials.encode(), token.get_secret_value().encode()):
            raise HTTPException(
                401,
                "The bearer token is not valid for this server.",
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )


require_token = _BearerTokenCheck(
    auto_error=False,
    scheme_name="HTTPBearer",
    description="Required when the server is configured with a token.",
)
