"""No host left hanging: every process of a ``jax.distributed`` job exits, with a message, when a peer stops.

When one process of a multi-process JAX job dies, the others block in their next collective (gloo
on CPU, ICI/NCCL elsewhere), which does not notice. JAX's coordination service aborts them only once
the dead process has missed heartbeats for ``heartbeat_timeout_seconds`` (100 s by default), with
SIGABRT and a C++ log line that says nothing about resuming; a process that fails with a Python error
and exits normally even stays alive in ``jax.distributed``'s shutdown barrier, so nobody is declared
dead until ``shutdown_timeout_seconds`` (300 s).

``PeerWatchdog`` is a daemon thread in every process. Every ``period`` seconds it publishes this
process's heartbeat counter in the coordination service's key-value store and reads every peer's
entries. A peer whose counter has not moved for ``timeout`` seconds, and that did not say it
finished (``stop``), has stopped; a peer that is leaving (``leave``) says why. Either way the
watchdog leaves too: it records the cause for the others, prints it with how to resume, and ends
the process at once with exit code 1 (``os._exit``: the atexit shutdown of ``jax.distributed``
would wait for the dead peer). Process 0 hosts the coordination service, and the others abort the
moment it is gone, so it leaves last: it waits (at most ``timeout``) until every peer has left or
stopped, so that each prints the message itself.

Heartbeats come from a Python thread; XLA compilation and blocking collectives release the GIL, so a
long compile is not mistaken for a dead peer. If process 0 itself dies, JAX aborts the others within
a second, usually before the watchdog's next poll. A poll costs two small requests to the
coordination service (one write, one read of a few entries per process).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = ["EXIT_CODE", "PeerWatchdog"]

EXIT_CODE = 1
_PREFIX = "taskdata_peers"


class PeerWatchdog:
    """Watches the other processes of this ``jax.distributed`` job; ``resume_hint()`` ends the message."""

    def __init__(self, resume_hint: Callable[[], str], *, timeout: float = 10.0, period: float = 1.0):
        import jax
        from jax._src import distributed

        if not 0 < period < timeout:
            raise ValueError(
                f"PeerWatchdog needs 0 < period < timeout but got period {period}, timeout {timeout}."
            )
        # jax.distributed has no public accessor for its client; orbax reads the same attribute.
        self._client: Any = distributed.global_state.client
        if self._client is None:
            raise RuntimeError("PeerWatchdog watches a jax.distributed job: call jax.distributed.initialize first.")
        self.index, self.count = jax.process_index(), jax.process_count()
        self._hint = resume_hint
        self._timeout, self._period = timeout, period
        self._stopped = threading.Event()
        self._leaving = threading.Lock()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="taskdata-peer-watchdog")

    def start(self) -> PeerWatchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        """This process is done with its peers: they stop watching it, and it stops watching them."""
        self._client.key_value_set(f"{_PREFIX}/done/{self.index}", "1", allow_overwrite=True)
        self._stopped.set()
        self._thread.join(timeout=self._period + 10)

    def fail(self, error: BaseException) -> NoReturn:
        """Ends this process after ``error`` (printed by the caller), telling the peers to stop too.

        A failed runtime call (a collective whose peer vanished: gloo's "Connection closed by peer")
        is usually the consequence of a peer that stopped: the watchdog is first given the time to
        name that peer, so that every process reports the cause rather than its consequence.
        """
        if _is_runtime_failure(error) and self._thread.is_alive():
            self._thread.join(timeout=self._timeout + 3 * self._period)
        self.leave(
            f"process {self.index} of {self.count} failed with {type(error).__name__}: {str(error)[:300]}",
            own=True,
        )

    def leave(self, cause: str, *, own: bool = False) -> NoReturn:
        """Records ``cause`` for the peers, prints it with the resume hint, and ends the process (code 1)."""
        with self._leaving:  # the watchdog and the train loop may both get here: one message, one exit
            with contextlib.suppress(Exception):  # the service is gone: JAX aborts the peers itself
                self._client.key_value_set(f"{_PREFIX}/exit/{self.index}", cause, allow_overwrite=True)
            try:
                hint = self._hint()
            except Exception as error:  # the message must go out whatever the hint does
                hint = f"(the resume hint failed: {error})"
            this = f"Process {self.index} of {self.count}"
            effect = (
                f"{this} exits with code {EXIT_CODE}; the other processes stop too"
                if own
                else f"{this} cannot finish a step without it and exits with code {EXIT_CODE}"
            )
            print(f"taskdata: {cause}. {effect}. {hint}", file=sys.stderr, flush=True)
            if self.index == 0:
                self._wait_for_peers_to_leave()
            os._exit(EXIT_CODE)

    def _entries(self) -> dict[str, str]:
        return {key.rsplit(_PREFIX, 1)[-1]: value for key, value in self._client.key_value_dir_get(_PREFIX)}

    def _watch(self) -> None:
        peers = [p for p in range(self.count) if p != self.index]
        seen = {p: ("", time.monotonic()) for p in peers}  # last counter value and when it changed
        beat = 0
        while not self._stopped.wait(self._period):
            beat += 1
            try:
                self._client.key_value_set(f"{_PREFIX}/beat/{self.index}", str(beat), allow_overwrite=True)
                entries = self._entries()
            except Exception as error:  # the service lives in process 0: it is gone, or going
                self.leave(f"process 0 of {self.count}, which hosts the coordination service, stopped ({error})")
            now = time.monotonic()
            stale = []
            for peer in peers:
                if f"/done/{peer}" in entries:
                    continue
                if f"/exit/{peer}" in entries:
                    self.leave(entries[f"/exit/{peer}"])
                value = entries.get(f"/beat/{peer}", "")
                if value != seen[peer][0]:
                    seen[peer] = (value, now)
                elif now - seen[peer][1] > self._timeout:
                    stale.append(peer)
            if stale and not self._stopped.is_set():
                self.leave(
                    f"process{'es' if len(stale) > 1 else ''} {', '.join(map(str, stale))} of {self.count} "
                    f"stopped (no heartbeat for {self._timeout:.0f} s: killed, crashed, or its host was lost)"
                )

    def _wait_for_peers_to_leave(self) -> None:
        """Until every peer has left, finished or stopped beating (at most ``timeout`` seconds)."""
        deadline = time.monotonic() + self._timeout
        last: dict[str, str] = {}
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(self._period / 4)
            try:
                entries = self._entries()
            except Exception:
                return
            beats = {k: v for k, v in entries.items() if k.startswith("/beat/") and k != f"/beat/{self.index}"}
            if beats != last:
                last, quiet_since = beats, time.monotonic()
            gone = {p for p in range(self.count) if f"/exit/{p}" in entries or f"/done/{p}" in entries}
            # Peers still beating must be told; once no counter moves for 3 periods, nobody is left to tell.
            if len(gone | {self.index}) == self.count or time.monotonic() - quiet_since > 3 * self._period:
                return


# XLA's runtime errors carry an absl status code; JAX raises some as JaxRuntimeError, others (a gloo
# collective that lost its peer) as ValueError.
_RUNTIME_STATUS = re.compile(r"^(UNKNOWN|INTERNAL|UNAVAILABLE|ABORTED|CANCELLED|DEADLINE_EXCEEDED|FAILED_PRECONDITION): ")


def _is_runtime_failure(error: BaseException) -> bool:
    import jax

    return isinstance(error, jax.errors.JaxRuntimeError) or bool(_RUNTIME_STATUS.match(str(error)))
