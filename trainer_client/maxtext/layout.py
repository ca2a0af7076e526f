"""Where the rows of a plan's step go in MaxText's batch, device by device (pure functions of integers).

MaxText takes every batch at one shape, ``global_batch_size_to_load`` rows (``G``), and builds it from the
processes' rows (``multihost_dataloading.MultiHostDataLoadIterator``): each process's array is cut into equal
pieces, one per local device in the mesh's order, and the batch axis is sharded over every mesh axis, so the
device at flat position ``p`` of ``mesh.devices`` holds global rows ``[p * c, (p + 1) * c)``, ``c = G / D``
rows per device. MaxText trains on the first ``global_batch_size_to_train_on`` rows (``T``; less than ``G``
only when ``per_device_batch_size < 1``, one row per device, the devices past ``T`` holding rows it cuts off).

A plan's step has ``B`` rows (a ramp or a later stage may make it fewer than ``T``; a skipped step has none).
They are spread evenly over the ``D_t = T / c`` trained devices: device ``p < D_t`` holds rows
``[p * B / D_t, (p + 1) * B / D_t)`` of the step, then zero rows up to ``c``. Zero rows have a zero loss mask
(``fields``), so every step has MaxText's fixed shape and exactly the plan's rows carry weight; and the layout
depends on the devices only, never on how many processes hold them, so a run resumed on another number of
processes computes on the same arrays.

A process reads the rows of its trained devices: runs of neighbouring devices, each one ``HostSlice`` of
every step (``pieces``), so an ordinary ``DataIterator`` per run reads them, whatever the step's ``B``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from trainer_client.assignments import HostSlice
from trainer_client.maxtext.errors import MaxTextConfigError

__all__ = ["BatchLayout", "DevicePiece"]


@dataclasses.dataclass(frozen=True)
class DevicePiece:
    """Neighbouring devices of one process, from flat mesh position ``first``: their rows of every step are
    ``host_slice`` of it (None: devices past the trained rows, which hold zeros)."""

    first: int
    count: int
    host_slice: HostSlice | None


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """MaxText's batch over ``devices`` devices: ``rows`` rows (``G``), the first ``trained_rows`` (``T``) trained."""

    rows: int
    trained_rows: int
    devices: int

    def __post_init__(self) -> None:
        for name in ("rows", "trained_rows", "devices"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BatchLayout {name} must be a positive integer but got {value!r}.")
        if self.rows % self.devices:
            raise MaxTextConfigError(
                f"MaxText's batch of {self.rows} rows (global_batch_size_to_load) does not split over the mesh's "
                f"{self.devices} devices. Use a per_device_batch_size that gives a whole number of rows per device."
            )
        if self.trained_rows > self.rows or self.trained_rows % self.rows_per_device:
            raise MaxTextConfigError(
                f"MaxText trains on {self.trained_rows} of its {self.rows} rows (global_batch_size_to_train_on of "
                f"global_batch_size_to_load), which is not a whole number of devices' rows ({self.rows_per_device} "
                "each): with per_device_batch_size < 1 use gradient_accumulation_steps=1."
            )

    @property
    def rows_per_device(self) -> int:
        """``c``: the rows every device holds."""
        return self.rows // self.devices

    @property
    def trained_devices(self) -> int:
        """``D_t``: the devices (the first in the mesh's order) whose rows MaxText trains on."""
        return self.trained_rows // self.rows_per_device

    def rows_per_trained_device(self, step: int, batch_size: int) -> int:
        """The plan's rows each trained device holds at ``step``, whose batch has ``batch_size`` rows."""
        share, left = divmod(batch_size, self.trained_devices)
        if left or share > self.rows_per_device:
            raise MaxTextConfigError(
                f"Step {step} of the plan has a global batch of {batch_size} rows, which MaxText's "
                f"{self.trained_devices} trained devices of {self.rows_per_device} rows each cannot hold evenly. "
                f"Plan batch sizes (and every step of a ramp: --ramp-to with multiple-of={self.trained_devices}) that "
                f"are multiples of {self.trained_devices} and at most {self.trained_rows} "
                "(global_batch_size_to_train_on)."
            )
        return share

    def pieces(self, positions: Sequence[int]) -> tuple[DevicePiece, ...]:
        """The pieces of the devices at flat mesh ``positions`` (one process's, increasing): each run of
        neighbouring trained devices cut where a ``HostSlice`` needs it, then the untrained ones."""
        positions = [int(p) for p in positions]
        if not positions or positions != sorted(set(positions)) or positions[0] < 0 or positions[-1] >= self.devices:
            raise ValueError(
                f"Device positions must be distinct, increasing and in [0, {self.devices}) but got {positions}."
            )
        pieces: list[DevicePiece] = []
        trained = [p for p in positions if p < self.trained_devices]
        run_start = 0
        for i in range(1, len(trained) + 1):
            if i == len(trained) or trained[i] != trained[i - 1] + 1:
                pieces += _aligned(trained[run_start], i - run_start, self.trained_devices)
                run_start = i
        untrained = [p for p in positions if p >= self.trained_devices]
        pieces += [DevicePiece(p, 1, None) for p in untrained]
        return tuple(pieces)

    def process_rows(self, pieces: Sequence[DevicePiece], real: Sequence[np.ndarray | None], share: int,
                     ) -> np.ndarray:
        """One process's ``[devices * c, L]`` array: for each device of ``pieces`` (in order) its ``share`` real rows
        (from ``real``, one ``[count * share, L]`` array per piece, None for untrained ones), then zero rows."""
        if len(real) != len(pieces):
            raise ValueError(f"{len(pieces)} pieces but {len(real)} arrays of rows.")
        length = next((a.shape[1] for a in real if a is not None), None)
        if length is None:
            raise ValueError("No piece holds trained devices: the process's rows would be all padding.")
        c = self.rows_per_device
        out = np.zeros((sum(p.count for p in pieces), c, length), dtype=np.int32)
        device = 0
        for piece, rows in zip(pieces, real, strict=True):
            if rows is not None:
                if rows.shape != (piece.count * share, length):
                    raise ValueError(
                        f"The piece of devices {piece.first}..{piece.first + piece.count - 1} needs "
                        f"{piece.count * share} rows of {length} but got {rows.shape}."
                    )
                out[device : device + piece.count, :share] = rows.reshape(piece.count, share, length)
            device += piece.count
        return out.reshape(-1, length)


def _aligned(first: int, count: int, trained: int) -> list[DevicePiece]:
    """Devices ``first .. first + count - 1`` as pieces that are each one equal slice of the trained devices."""
    size = math.gcd(math.gcd(first, count), trained)
    return [
        DevicePiece(start, size, HostSlice(start // size, trained // size)) for start in range(first, first + count, size)
    ]
