"""The report of an evaluation: per-task metrics, a mixture's overall row, as a table or JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from taskdata import fs

__all__ = ["EvalReport", "TaskReport", "format_report", "write_report"]



@dataclasses.dataclass(frozen=True)
class TaskReport:
    """One task's metrics over the examples that have a prediction."""

    task: str
    num_examples: int
    num_scored: int
    metrics: Mapping[str, float]

    def __post_init__(self) -> None:
        if not isinstance(self.num_examples, int) or self.num_examples <= 0:
            raise ValueError(
                f"TaskReport {self.task!r}: num_examples must be a positive integer but got {self.num_examples!r}."
            )
        if not isinstance(self.num_scored, int) or not 0 <= self.num_scored <= self.num_examples:
            raise ValueError(
                f"TaskReport {self.task!r}: num_scored must be in [0, {self.num_examples}] but got {self.num_scored!r}."
            )
        if self.num_scored == 0 and self.metrics:
            raise ValueError(f"TaskReport {self.task!r}: metrics without any scored example.")
        object.__setattr__(self, "metrics", {k: float(v) for k, v in sorted(self.metrics.items())})

    @property
    def num_missing(self) -> int:
        return self.num_examples - self.num_scored

    @property
    def coverage(self) -> float:
        return self.num_scored / self.num_examples

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "num_examples": self.num_examples,
            "num_scored": self.num_scored,
            "num_missing": self.num_missing,
            "coverage": self.coverage,
            "metrics": _json_metrics(self.metrics),
        }


@dataclasses.dataclass(frozen=True)
class EvalReport:
    """The evaluation of a task or mixture on one split."""

    name: str
    kind: str
    split: str
    prediction_files: tuple[str, ...]
    targets_source: Mapping[str, Any]
    allow_partial: bool
    tasks: tuple[TaskReport, ...]
    overall: Mapping[str, float]
    overall_tasks: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.kind not in ("task", "mixture"):
            raise ValueError(f"EvalReport kind must be 'task' or 'mixture' but got {self.kind!r}.")
        if not self.tasks:
            raise ValueError(f"EvalReport {self.name!r} has no task reports.")
        if self.num_missing and not self.allow_partial:
            raise ValueError(
                f"EvalReport {self.name!r}: {self.num_missing} examples unscored without allow_partial."
            )
        unknown = set(self.overall_tasks) - {t.task for t in self.tasks}
        if unknown:
            raise ValueError(
                f"EvalReport {self.name!r}: overall_tasks {sorted(unknown)} have no task report."
            )
        object.__setattr__(self, "prediction_files", tuple(self.prediction_files))
        object.__setattr__(self, "overall", {k: float(v) for k, v in sorted(self.overall.items())})

    @property
    def num_examples(self) -> int:
        return sum(t.num_examples for t in self.tasks)

    @property
    def num_scored(self) -> int:
        return sum(t.num_scored for t in self.tasks)

    @property
    def num_missing(self) -> int:
        return self.num_examples - self.num_scored

    @property
    def coverage(self) -> float:
        return self.num_scored / self.num_examples

    @property
    def overall_method(self) -> str:
        if self.kind == "task":
            return "the task's own metrics"
        return (
            f"unweighted mean over the tasks {list(self.overall_tasks)} of each metric that all of them "
            "report (tasks without any scored example are left out)"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; non-finite metric values become "NaN", "Infinity" or "-Infinity"."""
        return {
            "name": self.name,
            "kind": self.kind,
            "split": self.split,
            "prediction_files": list(self.prediction_files),
            "targets_source": dict(self.targets_source),
            "allow_partial": self.allow_partial,
            "num_examples": self.num_examples,
            "num_scored": self.num_scored,
            "num_missing": self.num_missing,
            "coverage": self.coverage,
            "overall": _json_metrics(self.overall),
            "overall_method": self.overall_method,
            "overall_tasks": list(self.overall_tasks),
            "tasks": [t.to_dict() for t in self.tasks],
        }


def _json_metrics(metrics: Mapping[str, float]) -> dict[str, float | str]:
    # Strict JSON has no NaN or infinities; these strings are protobuf's JSON mapping for them.
    special = {math.inf: "Infinity", -math.inf: "-Infinity"}
    return {k: ("NaN" if math.isnan(v) else special.get(v, v)) for k, v in metrics.items()}


def write_report(report: EvalReport, path: str) -> None:
    """Writes the report as JSON to ``path`` (local or remote), atomically."""
    text = json.dumps(report.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"
    fs.write_atomic(path, text.encode("utf-8"))


def format_report(report: EvalReport) -> str:
    """The report as a plain-text table: one row per task, plus an overall row for mixtures."""
    names = sorted({m for t in report.tasks for m in t.metrics} | set(report.overall))
    header = ["task", "examples", "scored", *names]
    rows = [
        [t.task, str(t.num_examples), str(t.num_scored), *(_cell(t.metrics, m) for m in names)]
        for t in report.tasks
    ]
    if report.kind == "mixture":
        rows.append(
            [
                "overall",
                str(report.num_examples),
                str(report.num_scored),
                *(_cell(report.overall, m) for m in names),
            ]
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    scored = f"{report.num_scored} of {report.num_examples} examples scored ({report.coverage:.2%})"
    if report.num_missing:
        scored += f"; PARTIAL: {report.num_missing} examples have no prediction"
    out = [
        f"{report.kind} {report.name!r}, split {report.split!r}: {scored}",
        line(header),
        line(["-" * w for w in widths]),
        *(line(r) for r in rows),
    ]
    if report.kind == "mixture":
        out.append(f"overall = {report.overall_method}")
    return "\n".join(out)


def _cell(metrics: Mapping[str, float], name: str) -> str:
    return f"{metrics[name]:.4f}" if name in metrics else "-"
