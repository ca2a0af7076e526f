"""The cache job's progress lines: which stage runs, counts, rate and time left.

Stage 1 preprocesses the source shards (each writes its result file when done), stage 2 sorts and
writes the output shards (likewise), stage 3 verifies and commits (the job logs that itself). The
estimate of time left assumes the rest goes at the rate so far, counted in source shards for stage 1
and in records for stage 2.
"""

from __future__ import annotations

import dataclasses

__all__ = ["JobProgress", "progress_line"]


@dataclasses.dataclass(frozen=True)
class JobProgress:
    """What the result files say at one moment (see the module docstring)."""

    sources_done: int
    sources_total: int
    examples: int
    shards_done: int
    shards_total: int
    records: int

    def __post_init__(self) -> None:
        if not (0 <= self.sources_done <= self.sources_total and 0 <= self.shards_done <= self.shards_total):
            raise ValueError(f"Inconsistent job progress {self}.")

    @property
    def stage(self) -> int:
        return 1 if self.sources_done < self.sources_total else 2


def progress_line(progress: JobProgress, stage_elapsed_s: float, job_elapsed_s: float) -> str:
    """``[cache] 1/3 preprocessing: source shards 4/10, 10,336 examples (1,716/s), 6 s, about 9 s left``."""
    p = progress
    if p.stage == 1:
        head = (f"[cache] 1/3 preprocessing: source shards {p.sources_done}/{p.sources_total}, {p.examples:,} examples"
                + _rate(p.examples, stage_elapsed_s))
        left = _time_left(stage_elapsed_s, p.sources_done, p.sources_total)
    else:
        head = (f"[cache] 2/3 sorting and writing: output shards {p.shards_done}/{p.shards_total}, {p.records:,} of "
                f"{p.examples:,} records" + _rate(p.records, stage_elapsed_s))
        left = _time_left(stage_elapsed_s, p.records, p.examples)
    return f"{head}, {job_elapsed_s:.0f} s, {left}"


def _rate(count: int, elapsed_s: float) -> str:
    return f" ({count / elapsed_s:,.0f}/s)" if elapsed_s >= 1 else ""


def _time_left(elapsed_s: float, done: int, total: int) -> str:
    if done == 0:
        return "time left unknown yet"
    return f"about {elapsed_s * (total - done) / done:.0f} s left"
