"""Where a run stands before a step, in words: per task, per host, and the stage in force.

Per task (``taskdata.index.progress``, closed form): the examples taken (delivered, and skipped), the
epoch and the examples repeated so far, the task's share of the stream against the share its rates
call for, and the tokens delivered. Tokens come from the cache's ``stats.{split}.json``, which holds
each split's total per feature, not each record's: whole epochs are exact (epochs times the total),
anything else is estimated at the mean length and marked so. Per host (data shard): the examples and
bytes it reads at the step (framed record sizes, from the offsets sidecars).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from taskdata.index import RunPlan, example_arrays, examples_at, fits_int64, progress
from taskdata.runs.ledger import TaskCacheView

__all__ = ["format_summary", "summarize"]


def _share(part: Fraction | int, whole: int) -> float | None:
    return None if whole == 0 else float(Fraction(part) / whole)


def _tokens(stats: Mapping[str, Any], delivered: int, taken: int, skipped: int, records: int) -> dict[str, Any]:
    out = {}
    examples = int(stats["examples"])
    for key, total in sorted(stats.items()):
        if not key.endswith("_tokens") or key.endswith("_max_tokens"):
            continue
        feature = key[: -len("_tokens")]
        exact = skipped == 0 and taken % records == 0 and examples == records
        value = taken // records * int(total) if exact else round(delivered * int(total) / max(1, examples))
        out[feature] = {"value": value, "exact": exact}
    return out


def summarize(plan: RunPlan, views: Mapping[str, TaskCacheView], step: int) -> dict[str, Any]:
    """The run before ``step`` (steps ``0 .. step - 1`` done) and what ``step`` itself reads, as JSON values."""
    state = progress(plan, step)
    tasks = []
    for t in state.tasks:
        tasks.append(
            {
                "task": t.task,
                "records": t.records,
                "taken": t.taken,
                "delivered": t.delivered,
                "skipped": t.skipped,
                "epoch": t.epoch,
                "repeated": t.repeated,
                "share": _share(t.taken, state.positions),
                "target_share": _share(t.target, state.positions),
                "stage_rate": float(t.rate),
                "exact_stage_rate": str(t.rate),
                "tokens": _tokens(views[t.task].stats(), t.delivered, t.taken, t.skipped, t.records),
            }
        )
    return {
        "run": plan.name,
        "fingerprint": plan.fingerprint_before(step + 1),
        "step": step,
        "positions": state.positions,
        "stage": {
            "index": state.stage,
            "start": state.stage_start,
            "batch_size": state.batch_size,
            "rates": {task: str(rate) for task, rate in plan.rates_at(step).items()},
        },
        "tasks": tasks,
        "hosts": _hosts(plan, views, step),
    }


def _hosts(plan: RunPlan, views: Mapping[str, TaskCacheView], step: int) -> dict[str, Any]:
    """Examples and bytes of each data shard at ``step`` (none for a skipped step)."""
    shards = plan.num_data_shards
    if plan.is_skipped(step):
        return {"skipped": True, "examples": [0] * shards, "bytes": [0] * shards}
    positions = plan.positions(step)
    if fits_int64(plan, positions):
        arrays = example_arrays(plan, positions)
        task_of, cache_shards, records = arrays.tasks, arrays.shards, arrays.records
    else:
        refs = examples_at(plan, positions)
        task_of = np.array([plan.task_index(e.task) for e in refs], np.int64)
        cache_shards = np.array([e.shard for e in refs], np.int64)
        records = np.array([e.record for e in refs], np.int64)
    sizes = np.zeros(len(positions), np.int64)
    for t, name in enumerate(plan.task_names):
        mine = np.flatnonzero(task_of == t)
        if len(mine):
            sizes[mine] = views[name].byte_lengths(cache_shards[mine], records[mine])
    per_shard = len(positions) // shards
    return {
        "skipped": False,
        "examples": [per_shard] * shards,
        "bytes": sizes.reshape(shards, per_shard).sum(axis=1).tolist(),
    }


def format_summary(summary: Mapping[str, Any]) -> str:
    """The summary as a few aligned lines of text (``~`` marks token counts estimated from mean lengths)."""
    stage = summary["stage"]
    lines = [
        f"run {summary['run']} before step {summary['step']:,} ({summary['positions']:,} examples covered); "
        f"fingerprint {summary['fingerprint']}",
        f"stage {stage['index']} (from step {stage['start']:,}): batch {stage['batch_size']:,}, rates "
        + ", ".join(f"{task}={rate}" for task, rate in stage["rates"].items()),
        "",
        f"{'task':<28} {'taken':>14} {'skipped':>10} {'epoch':>7} {'repeated':>14} {'share':>8} {'target':>8}  tokens",
    ]
    estimated = False
    for t in summary["tasks"]:
        share = "-" if t["share"] is None else f"{t['share']:.2%}"
        target = "-" if t["target_share"] is None else f"{t['target_share']:.2%}"
        tokens = []
        for feature, count in t["tokens"].items():
            estimated |= not count["exact"]
            tokens.append(f"{feature} {'' if count['exact'] else '~'}{count['value']:,}")
        lines.append(
            f"{t['task']:<28} {t['taken']:>14,} {t['skipped']:>10,} {t['epoch']:>7,} {t['repeated']:>14,} "
            f"{share:>8} {target:>8}  {', '.join(tokens) or '-'}"
        )
    hosts = summary["hosts"]
    lines.append("")
    if hosts["skipped"]:
        lines.append(f"step {summary['step']:,} is skipped: no host reads anything")
    else:
        total = sum(hosts["bytes"])
        lines.append(
            f"step {summary['step']:,} reads {total:,} bytes: per data shard "
            + ", ".join(f"{i}: {b:,}" for i, b in enumerate(hosts["bytes"]))
        )
    if estimated:
        lines.append("~ estimated: the examples delivered times the split's mean length (stats.*.json)")
    return "\n".join(lines)

