"""A plan's shards as numpy tables, for the index chain computed as arrays (``chain.example_arrays``).

Every shard of every task is laid end to end: record ``i`` of task ``t`` is record ``record_base[t] + i``
of the concatenation, and ``ShardFinder`` finds the concatenated shard that holds it. ``RunPlan.tables``
builds them once per plan object (with 65,536 shards per task they take megabytes) and drops them with
the plan; this module knows only layouts, so the plan can import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from taskdata.index.layout import ShardLayout

__all__ = ["INT64_LIMIT", "PlanTables", "ShardFinder"]

# The vectorised chain works in int64: positions and record numbers must stay below this.
INT64_LIMIT = 2**63


class ShardFinder:
    """Which shard holds each record: ``searchsorted(ends, indices, side="right")``, in fewer reads.

    Tasks' shards are laid end to end; ``ends`` are their cumulative record counts. A binary search over
    100,000s of shards takes ~18 scattered reads per index, cache misses once a server's other data has
    evicted the table. Here each task's records are cut into buckets of about one of its non-empty
    shards' size; ``first[b]`` is the first non-empty shard that may hold bucket ``b``'s records, and at
    most ``span`` steps to the right (one vectorized compare each) find the one that does: 3-4 reads per
    index. Empty shards hold no record and are left out. Tasks whose shards differ so much in size that
    one bucket crosses more than ``MAX_SPAN`` shards make the whole plan use the binary search.
    """

    MAX_SPAN = 8

    def __init__(self, counts_per_task: Sequence[np.ndarray]):
        counts = (
            np.concatenate([np.asarray(c, np.int64) for c in counts_per_task]) if counts_per_task else None
        )
        self.ends = np.cumsum(counts) if counts is not None else np.zeros(0, np.int64)
        self.nonempty = np.flatnonzero(counts) if counts is not None else np.zeros(0, np.int64)
        self.nonempty_ends = self.ends[self.nonempty]
        firsts, widths, record_bases, bucket_bases = [], [], [], []
        record_base = bucket_base = 0
        self.span = 0
        for task_counts in counts_per_task:
            records = int(np.sum(task_counts))
            width = max(1, records // max(1, int(np.count_nonzero(task_counts))))
            starts = record_base + np.arange(records // width + 2, dtype=np.int64) * width
            first = np.searchsorted(self.nonempty_ends, starts, side="right")
            # The last buckets reach past the task: no record of it lies beyond its last shard.
            last = np.searchsorted(self.nonempty_ends, record_base + max(0, records - 1), side="right")
            np.minimum(first, last, out=first)
            self.span = max(self.span, int(np.diff(first).max(initial=0)))
            firsts.append(first)
            widths.append(width)
            record_bases.append(record_base)
            bucket_bases.append(bucket_base)
            record_base += records
            bucket_base += len(first)
        self.first = np.concatenate(firsts) if firsts else np.zeros(0, np.int64)
        self.widths = np.array(widths, np.int64)
        self.record_bases = np.array(record_bases, np.int64)
        self.bucket_bases = np.array(bucket_bases, np.int64)

    def find(self, indices: np.ndarray, tasks: np.ndarray) -> np.ndarray:
        """For indices into the records laid end to end, each of task ``tasks[i]``: its shard (into ``ends``)."""
        if self.span > self.MAX_SPAN:
            return np.searchsorted(self.ends, indices, side="right")
        widths = self.widths[tasks]
        at = self.first[self.bucket_bases[tasks] + (indices - self.record_bases[tasks]) // widths]
        # The index lies in non-empty shards first[b] .. first[b + 1]: step right while the shard ends
        # at or before it (never past the right shard, which ends after it).
        for _ in range(self.span):
            at += self.nonempty_ends[at] <= indices
        return self.nonempty[at]


@dataclasses.dataclass(frozen=True, eq=False)
class PlanTables:
    """Per plan: record counts per task, and every shard of every task laid end to end.

    With ``INT64_LIMIT`` records or more in all, the arrays are empty: only ``total_records`` is set,
    and callers use the scalar chain.
    """

    num_records: np.ndarray  # per task
    record_base: np.ndarray  # per task: where its records start in the concatenation
    shard_base: np.ndarray  # per task: its first shard's number in the concatenation
    shard_starts: np.ndarray  # per concatenated shard
    shard_finder: ShardFinder  # record index in the concatenation -> concatenated shard
    total_records: int

    @classmethod
    def from_layouts(cls, layouts: Sequence[ShardLayout]) -> PlanTables:
        num_records = [layout.num_records for layout in layouts]
        total = sum(num_records)
        if total >= INT64_LIMIT:
            empty = np.empty(0, np.int64)
            return cls(empty, empty, empty, empty, ShardFinder([]), total)
        finder = ShardFinder([np.array(layout.record_counts, np.int64) for layout in layouts])
        return cls(
            num_records=np.array(num_records, np.int64),
            record_base=finder.record_bases,
            shard_base=np.cumsum([0, *(layout.num_shards for layout in layouts[:-1])], dtype=np.int64),
            shard_starts=np.concatenate(([0], finder.ends[:-1])),
            shard_finder=finder,
            total_records=total,
        )
