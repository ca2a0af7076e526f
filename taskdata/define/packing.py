"""``Packing``: a task's request that its cache store packed rows (t5x's layout) instead of examples."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_OPEN_ROWS", "Packing"]

# First fit over 16 open rows fills rows of short examples to ~99% (bench/bench_packing.py); the search
# costs a few microseconds per example in the shard writer.
DEFAULT_OPEN_ROWS = 16


@dataclasses.dataclass(frozen=True)
class Packing:
    """How the cache job packs a task's examples (``taskdata.example.packing``).

    Attributes:
      lengths: the row length of every packed feature; ``None`` takes the task's ``sequence_length``.
        Every output feature of the task must be packed (a row has no place for anything else).
        An example longer than a row is trimmed by the task's rule (EOS kept for ``add_eos`` features)
        and counted in the manifest.
      open_rows: how many rows stay open for later examples to fill (1: each row is closed as soon as an
        example does not fit, seqio's greedy packing).
    """

    lengths: Mapping[str, int] | None = None
    open_rows: int = DEFAULT_OPEN_ROWS

    def __post_init__(self) -> None:
        if self.lengths is not None:
            if not self.lengths:
                raise ValueError("Packing lengths must name at least one feature, e.g. {'targets': 512}.")
            for key, length in self.lengths.items():
                if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
                    raise ValueError(f"Packing length of feature {key!r} must be a positive integer but got {length!r}.")
            object.__setattr__(self, "lengths", dict(sorted(self.lengths.items())))
        if isinstance(self.open_rows, bool) or not isinstance(self.open_rows, int) or self.open_rows < 1:
            raise ValueError(f"Packing open_rows must be a positive integer but got {self.open_rows!r}.")

    def fingerprint_description(self) -> dict[str, Any]:
        return {"lengths": None if self.lengths is None else dict(self.lengths), "open_rows": self.open_rows}
