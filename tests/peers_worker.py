"""One process of a two-process ``jax.distributed`` job watched by ``PeerWatchdog``: ``python -m tests.peers_worker``.

    PORT PROCESS_ID SCENARIO

Both processes start a watchdog (timeout ``TIMEOUT`` s) and wait until each has seen the other's heartbeat. Then,
by SCENARIO: ``finished``, both stop their watchdog and exit 0; ``failed``, process 1 fails with a ``ValueError``
(``PeerWatchdog.fail``); ``killed``, process 1 SIGKILLs itself. Process 0 idles until its watchdog ends it; if it
is still there after ``IDLE`` s it exits with ``NOT_ENDED``.
"""

from __future__ import annotations

import os
import signal
import sys
import time

TIMEOUT, PERIOD = 6.0, 0.5
IDLE = 60.0
NOT_ENDED = 5
HINT = "resume as the test says"


def main(argv: list[str]) -> int:
    port, process, scenario = int(argv[0]), int(argv[1]), argv[2]
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # the barriers below are cross-process programs
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process, initialization_timeout=60)
    from jax.experimental import multihost_utils

    from trainer_client.peers import PeerWatchdog

    watchdog = PeerWatchdog(lambda: HINT, timeout=TIMEOUT, period=PERIOD).start()
    # Every watchdog runs before either process goes on (a barrier through the coordination service).
    multihost_utils.sync_global_devices("watchdogs started")
    time.sleep(2 * PERIOD)
    if scenario == "finished":
        watchdog.stop()
        multihost_utils.sync_global_devices("watchdogs stopped")
        print(f"process {process} finished", file=sys.stderr, flush=True)
        return 0
    if process == 1:
        if scenario == "failed":
            watchdog.fail(ValueError("the test's failure"))
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(IDLE)
    return NOT_ENDED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
