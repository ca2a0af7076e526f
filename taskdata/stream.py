"""A run's example stream on one host: step -> this host's examples, read, verified and batched.

``RunReader`` only calls the index math (``taskdata.index``) and the cache reader; it holds no state
between steps, so reading from step k gives exactly what an uninterrupted run read at step k.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from taskdata.cache.format import CacheFormatError
from taskdata.cache.reader import CacheReader
from taskdata.index import ExampleRef, RunPlan, assign

__all__ = ["HostBatch", "RunReader", "pad_features"]


@dataclasses.dataclass(frozen=True)
class HostBatch:
    """One host's examples of one step: padded int32 arrays [examples, length] per feature."""

    step: int
    skipped: bool
    positions: range
    examples: tuple[ExampleRef, ...]
    features: Mapping[str, np.ndarray]
    records: tuple[bytes, ...]


def pad_features(decoded: Mapping[str, Any], lengths: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Ragged features -> zero-padded [n, length] int32 arrays (0 is PAD, so padding is the mask)."""
    out = {}
    for name, length in lengths.items():
        ragged = decoded[name]
        splits = ragged.row_splits
        rows = len(splits) - 1
        row_lengths = np.diff(splits)
        if rows and row_lengths.max() > length:
            raise ValueError(f"Feature {name!r} has an example of {int(row_lengths.max())} tokens, longer than {length}.")
        padded = np.zeros((rows, length), dtype=np.int32)
        # Scatter all values at once: row i's values go to columns [0, len_i) of row i.
        row_of = np.repeat(np.arange(rows), row_lengths)
        column = np.arange(len(ragged.values)) - np.repeat(splits[:-1], row_lengths)
        padded[row_of, column] = ragged.values
        out[name] = padded
    return out


class RunReader:
    """Reads the host batches of a run plan from the cache versions it names."""

    def __init__(self, plan: RunPlan, readers: Mapping[str, CacheReader], *, split: str = "train",
                 features: Sequence[str] = ("inputs", "targets"), lengths: Mapping[str, int] | None = None):
        missing = [t for t in plan.task_names if t not in readers]
        if missing:
            raise ValueError(f"Run {plan.name!r} reads tasks {list(plan.task_names)}; no cache reader for {missing}.")
        for task in plan.task_names:
            expected = plan.caches[task].fingerprint
            if readers[task].manifest_sha256 != expected:
                raise CacheFormatError(
                    f"Run {plan.name!r} was planned on cache version {expected[:12]} of task {task!r} but the reader "
                    f"opened version {readers[task].manifest_sha256[:12]} ({readers[task].version_dir}).")
            if readers[task].record_counts(split) != tuple(plan.caches[task].shard_record_counts):
                raise CacheFormatError(f"Cache of task {task!r} has other shard sizes than run {plan.name!r} expects.")
        self.plan = plan
        self._readers = readers
        self._split = split
        self._lengths = dict(lengths) if lengths else self._default_lengths(features)

    def _default_lengths(self, features: Sequence[str]) -> dict[str, int]:
        lengths: dict[str, int] = {}
        for task in self.plan.task_names:
            reader = self._readers[task]
            for name in features:
                # The task's declared length, else the longest example the cache holds.
                length = reader.manifest.sequence_length.get(name) or reader.max_tokens(self._split, name)
                lengths[name] = max(lengths.get(name, 0), int(length))
        return lengths

    @property
    def lengths(self) -> dict[str, int]:
        return dict(self._lengths)

    def read_examples(self, examples: Sequence[ExampleRef]) -> tuple[dict[str, np.ndarray], list[bytes]]:
        """Padded features and raw records of ``examples``, in their order."""
        records: list[bytes] = [b""] * len(examples)
        by_task: dict[str, list[int]] = {}
        for slot, example in enumerate(examples):
            by_task.setdefault(example.task, []).append(slot)
        for task, slots in by_task.items():
            data = self._readers[task].read_records(
                self._split, [examples[s].shard for s in slots], [examples[s].record for s in slots])
            for slot, record in zip(slots, data, strict=True):
                records[slot] = record
        spec = {name: "int32" for name in self._lengths}
        decoded = next(iter(self._readers.values())).decode(records, spec)
        return pad_features(decoded, self._lengths), records

    def host_batch(self, step: int, data_shard: int, num_data_shards: int | None = None) -> HostBatch:
        assignment = assign(self.plan, step, data_shard, num_data_shards)
        features, records = self.read_examples(assignment.examples)
        return HostBatch(step, assignment.skipped, assignment.positions, assignment.examples, features, tuple(records))

    def iterate(self, start_step: int, data_shard: int, num_data_shards: int | None = None,
                stop_step: int | None = None) -> Iterator[HostBatch]:
        step = start_step
        while stop_step is None or step < stop_step:
            yield self.host_batch(step, data_shard, num_data_shards)
            step += 1
