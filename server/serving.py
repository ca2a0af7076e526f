"""How ``taskdata serve`` runs an app: uvicorn's documented ``Config`` and ``Server`` on a guarded event loop.

One uvicorn worker (one core) with httptools and uvloop (declared dependencies: the pure-Python parser and
loop cost more per request), no WebSocket, and the header limits uvicorn lacks: the event loop's servers
put every connection behind a ``server.header_guard.HeaderGuard``. The loop is made here and uvicorn's
server runs in it (``Server.serve``, uvicorn's way to run inside an event loop of one's own).
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn

from server.header_guard import HeaderLimits, guarded_loop_factory
from server.settings import Settings

__all__ = ["serve", "uvicorn_options"]


def uvicorn_options(settings: Settings, *, access_log: bool) -> dict[str, Any]:
    """``uvicorn.Config``'s options for ``settings``."""
    return {
        "host": settings.host,
        "port": settings.port,
        "access_log": access_log,
        "log_level": "info",
        "workers": 1,
        "http": "httptools",
        "ws": "none",  # no WebSocket route exists, so no upgrade is accepted
        # uvicorn annotates int, but only hands it to loop.call_later, which takes float seconds.
        "timeout_keep_alive": settings.keep_alive_seconds,
    }


def serve(app: Any, settings: Settings, *, access_log: bool) -> bool:
    """Serves ``app`` until the process is told to stop (SIGINT, SIGTERM); False if it never started (uvicorn
    logs why, e.g. the port is taken)."""
    server = uvicorn.Server(uvicorn.Config(app, **uvicorn_options(settings, access_log=access_log)))
    limits = HeaderLimits(settings.max_header_bytes, settings.header_timeout_seconds)
    try:
        with asyncio.Runner(loop_factory=guarded_loop_factory(limits)) as runner:
            runner.run(server.serve())
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it stopped on, once stopped: as uvicorn.run, done
        pass
    return server.started
