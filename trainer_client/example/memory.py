"""Does the train step fit on a device? Asked of XLA before anything is allocated.

The compiled step's memory analysis gives the bytes one device needs (arguments, outputs, temporaries;
donated buffers counted once). The logits alone are batch x targets length x vocabulary floats, so a
plan that fits a TPU pod can need 100 GB on a laptop; the trainer asks first and refuses with the
batch size that would fit instead of dying in the allocator.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["BatchTooLargeError", "StepMemory", "available_bytes", "check_fits", "step_memory"]

# Headroom for what the analysis does not see: the runtime, prefetched host batches, fragmentation.
_USABLE_FRACTION = 0.85


class BatchTooLargeError(ValueError):
    """The train step of the run's largest global batch needs more memory than a device has."""


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """What one device needs for one train step, split into what grows with the batch and what does not.

    Attributes:
      total_bytes: the compiled step's arguments + outputs + temporaries, donated buffers counted once.
      fixed_bytes: parameters and optimizer state (the donated arguments): independent of the batch.
      per_device_batch: examples of the global batch this device computes.
    """

    total_bytes: int
    fixed_bytes: int
    per_device_batch: int

    def __post_init__(self) -> None:
        if min(self.total_bytes, self.fixed_bytes) < 0 or self.per_device_batch < 1:
            raise ValueError(f"Invalid step memory {self}: sizes must be >= 0 and the batch >= 1.")

    @property
    def bytes_per_example(self) -> float:
        return max(self.total_bytes - self.fixed_bytes, 0) / self.per_device_batch


def step_memory(compiled: Any, per_device_batch: int) -> StepMemory:
    """The ``StepMemory`` of a ``jax.stages.Compiled`` step whose donated arguments are the fixed state."""
    stats = compiled.memory_analysis()
    total = stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
    return StepMemory(total + stats.temp_size_in_bytes, stats.alias_size_in_bytes, per_device_batch)


def available_bytes(device: Any) -> int | None:
    """Bytes a device can still allocate: an accelerator's own memory, or the host's for CPU devices.

    ``None`` when the platform does not say (then nothing is checked).
    """
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    if device.platform != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(
    memory: StepMemory,
    available: int | None,
    *,
    global_batch: int,
    data_devices: int,
    num_data_shards: int,
    devices_sharing_memory: int = 1,
) -> None:
    """Raises ``BatchTooLargeError`` unless one step of ``global_batch`` fits in what a device has.

    ``devices_sharing_memory``: devices that draw on the same ``available`` bytes (CPU devices of one host).
    The message names the need, what there is, and the largest global batch (a multiple of
    ``num_data_shards``) that would fit at the same lengths and model.
    """
    if available is None:
        return
    usable = int(available * _USABLE_FRACTION) // max(devices_sharing_memory, 1)
    if memory.total_bytes <= usable:
        return
    per_example = memory.bytes_per_example
    fitting_per_device = math.floor((usable - memory.fixed_bytes) / per_example) if per_example else 0
    fitting = (max(fitting_per_device, 0) * data_devices) // num_data_shards * num_data_shards
    advice = (
        f"Plan the run with --batch-size {fitting} or less ('taskdata plan ... --batch-size {fitting}'), or give "
        "shorter --inputs-length/--targets-length or a smaller model"
        if fitting
        else "Even one example per device does not fit: give shorter --inputs-length/--targets-length or a "
        "smaller model (--d-model, --d-ff, --vocab-size)"
    )
    raise BatchTooLargeError(
        f"The train step for a global batch of {global_batch} ({memory.per_device_batch} examples per device) "
        f"needs {_gib(memory.total_bytes)} per device, but {_gib(usable)} is usable here "
        f"({_USABLE_FRACTION:.0%} of {_gib(available // max(devices_sharing_memory, 1))} available). {advice}; "
        "or pass --skip-memory-check to try anyway."
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
