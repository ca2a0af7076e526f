"""The trainer's periodic progress line: step, loss, examples per second and time spent waiting for data.

``data wait`` is the share of wall time the train loop spent blocked on the next batch: near 0 %, the
data pipeline keeps up; near 100 %, the model waits for data (raise ``--prefetch`` or check the server).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["StepReporter"]


class StepReporter:
    """Prints one line every ``every_s`` seconds of training (and after the last step), summing in between.

    Steps are shown as finished out of ``total_steps`` (``--steps``): step 0 done is ``step 1/N``.
    """

    def __init__(
        self,
        total_steps: int,
        every_s: float,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if every_s < 0:
            raise ValueError(f"--print-every must be >= 0 seconds but got {every_s}.")
        self._total, self._every_s, self._out, self._clock = total_steps, every_s, out, clock
        self._since = clock()
        self._examples = 0
        self._wait_s = 0.0
        self._losses: list[float] = []

    def record(self, step: int, loss: float | None, examples: int, data_wait_s: float) -> None:
        """One finished step; ``loss`` is ``None`` for a skipped step (no data)."""
        self._examples += examples
        self._wait_s += data_wait_s
        if loss is not None:
            self._losses.append(loss)
        now = self._clock()
        elapsed = now - self._since
        if elapsed < self._every_s and step + 1 < self._total:
            return
        loss_text = f"{sum(self._losses) / len(self._losses):.4f}" if self._losses else "-"
        rate = self._examples / elapsed if elapsed > 0 else 0.0
        wait = 100 * self._wait_s / elapsed if elapsed > 0 else 0.0
        print(
            f"step {step + 1}/{self._total}  loss {loss_text}  {rate:,.1f} examples/s  data wait {wait:.0f}%",
            file=self._out or sys.stderr,
            flush=True,
        )
        self._since, self._examples, self._wait_s, self._losses = now, 0, 0.0, []
