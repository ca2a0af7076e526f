"""Evaluation: join an inference job's predictions to their targets by stable id, postprocess, score.

Predictions come from ``taskdata.evaluation.predictions`` (JSON lines keyed by stable example id),
targets from a ``taskdata.evaluation.targets.TargetsSource`` (recomputed from source, or read from a
cache version).

Every target must have exactly one prediction and every prediction exactly one target; anything else
is an error naming the file, line and id (``allow_partial=True`` scores the examples that have a
prediction and reports how many do not). Each task's ``postprocess_fn`` turns targets and predictions
into what its ``metric_fns`` compare; its ``score_metric_fns`` read the scores.

For a mixture the report also has an ``overall`` row: for each metric that every scored task reports,
the unweighted mean over those tasks (a macro average, like GLUE's average score). It is not weighted
by mixing rates or example counts, so a small task counts as much as a large one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from taskdata.define.mixture import Mixture
from taskdata.define.task import Task
from taskdata.evaluation.predictions import (
    EvaluationError,
    MissingPredictionsError,
    Prediction,
    is_number,
    read_predictions,
)
from taskdata.evaluation.report import EvalReport, TaskReport
from taskdata.evaluation.targets import TargetsSource
from taskdata.seeding import parse_example_id

__all__ = ["evaluate"]

_SHOWN_IDS = 5  # how many ids an error message quotes before summarising the rest as a count


# Evaluation --------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Joined:
    num_examples: int = 0
    matched: list[tuple[str, Mapping[str, Any], Prediction]] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)


def evaluate(
    task_or_mixture: Task | Mixture,
    split: str,
    prediction_files: Sequence[str],
    targets: TargetsSource,
    *,
    allow_partial: bool = False,
) -> EvalReport:
    """Joins predictions to targets by stable id, postprocesses both and scores them, task by task."""
    if isinstance(task_or_mixture, Mixture):
        kind, tasks = "mixture", task_or_mixture.tasks
    elif isinstance(task_or_mixture, Task):
        kind, tasks = "task", (task_or_mixture,)
    else:
        raise TypeError(f"evaluate needs a Task or a Mixture but got {type(task_or_mixture).__name__}.")
    name = task_or_mixture.name
    for task in tasks:
        if split not in task.splits:
            raise EvaluationError(
                f"Task {task.name!r} has no split {split!r} (it has {list(task.splits)}); choose one of those."
            )
    predictions = read_predictions(list(prediction_files))
    _check_ids_in_scope(predictions, kind, name, {t.name for t in tasks}, split)
    joined = {task.name: _join(task, split, targets, predictions) for task in tasks}
    if predictions:
        _raise_unknown(predictions, joined, split)
    missing = sum(len(j.missing) for j in joined.values())
    if missing and not allow_partial:
        _raise_missing(joined, split, prediction_files)
    reports = tuple(_score_task(task, joined[task.name]) for task in tasks)
    overall, overall_tasks = _overall(reports)
    return EvalReport(
        name=name,
        kind=kind,
        split=split,
        prediction_files=tuple(prediction_files),
        targets_source=targets.describe(),
        allow_partial=allow_partial,
        tasks=reports,
        overall=overall,
        overall_tasks=overall_tasks,
    )


def _check_ids_in_scope(
    predictions: Mapping[str, Prediction], kind: str, name: str, task_names: set[str], split: str
) -> None:
    # Checked before any target is computed, so that predictions for the wrong task or split fail fast.
    for prediction in predictions.values():
        task, id_split, _, _ = parse_example_id(prediction.example_id)
        if task not in task_names:
            scope = f"the {kind} {name!r}" + (f" (tasks {sorted(task_names)})" if kind == "mixture" else "")
            raise prediction.error(
                f"unknown id: task {task!r} is not part of {scope}. Evaluate the name the "
                "predictions were made for, or remove the lines of other tasks."
            )
        if id_split != split:
            raise prediction.error(
                f"unknown id: it is from split {id_split!r} but this evaluates split {split!r}. "
                f"Pass --split {id_split} if that is the split the predictions are for."
            )


def _join(task: Task, split: str, targets: TargetsSource, predictions: dict[str, Prediction]) -> _Joined:
    """Pairs each target with its prediction, removing the paired predictions from ``predictions``."""
    joined = _Joined()
    seen: set[str] = set()
    for example_id, text, example in targets(task, split):
        owner, id_split, _, _ = parse_example_id(example_id)
        if owner != task.name or id_split != split or example_id in seen:
            problem = "a second time" if example_id in seen else f"for task {task.name!r} split {split!r}"
            raise EvaluationError(
                f"The targets source {targets.describe()} yielded id {example_id!r} {problem}; a targets "
                "source must yield each example of the task's split exactly once."
            )
        seen.add(example_id)
        joined.num_examples += 1
        prediction = predictions.pop(example_id, None)
        if prediction is None:
            joined.missing.append(example_id)
        else:
            joined.matched.append((text, example, prediction))
    if joined.num_examples == 0:
        raise EvaluationError(
            f"Task {task.name!r} split {split!r} has no examples, so there is nothing to evaluate."
        )
    return joined


def _raise_unknown(leftover: Mapping[str, Prediction], joined: Mapping[str, _Joined], split: str) -> None:
    first = next(iter(leftover.values()))
    task = parse_example_id(first.example_id)[0]
    others = (
        f" {len(leftover) - 1} more predictions also have ids without a target." if len(leftover) > 1 else ""
    )
    raise first.error(
        f"unknown id: task {task!r} split {split!r} has no such example (it has {joined[task].num_examples} "
        f"examples).{others} Predictions must be made on the same task version, split and seed as the "
        "targets; check --split and --seed."
    )


def _raise_missing(joined: Mapping[str, _Joined], split: str, prediction_files: Sequence[str]) -> None:
    total = sum(j.num_examples for j in joined.values())
    missing = sum(len(j.missing) for j in joined.values())
    per_task = "; ".join(
        f"task {name!r}: {len(j.missing)} of {j.num_examples} missing, e.g. {j.missing[:_SHOWN_IDS]}"
        for name, j in joined.items()
        if j.missing
    )
    raise MissingPredictionsError(
        f"{missing} of {total} examples ({missing / total:.2%}) of split {split!r} have no prediction in "
        f"{list(prediction_files)}: {per_task}. Add the prediction files that hold them (one per inference "
        f"host), or pass allow_partial=True (--allow-partial) to score only the {total - missing} examples "
        "that have one.",
        missing=missing,
        total=total,
    )


def _unchanged(text: str, example: Mapping[str, Any] | None = None, is_target: bool = False) -> str:
    del example, is_target  # a task without postprocess_fn compares the texts as they are
    return text


def _score_task(task: Task, joined: _Joined) -> TaskReport:
    if not joined.matched:
        return TaskReport(task=task.name, num_examples=joined.num_examples, num_scored=0, metrics={})
    targets, outputs = _postprocess(task, joined)
    metrics: dict[str, float] = {}
    sources: dict[str, str] = {}
    for fn in task.metric_fns:
        _add_metrics(task, fn, _call_metric(task, fn, targets, outputs), metrics, sources)
    if task.score_metric_fns:
        for _, _, prediction in joined.matched:
            if prediction.score is None:
                raise prediction.error(
                    f"no 'score', but task {task.name!r} has score metrics "
                    f"{[_fn_name(f) for f in task.score_metric_fns]}; write the model's log-likelihood of the "
                    "target (a number, or a list of per-token values) as 'score'."
                )
        scores = [list(p.score) if isinstance(p.score, tuple) else p.score for _, _, p in joined.matched]
        for fn in task.score_metric_fns:
            _add_metrics(task, fn, _call_metric(task, fn, targets, scores), metrics, sources)
    return TaskReport(
        task=task.name, num_examples=joined.num_examples, num_scored=len(joined.matched), metrics=metrics
    )


def _postprocess(task: Task, joined: _Joined) -> tuple[list[Any], list[Any]]:
    postprocess = task.postprocess_fn or _unchanged
    targets: list[Any] = []
    outputs: list[Any] = []
    for text, example, prediction in joined.matched:
        try:
            targets.append(postprocess(text, example=example, is_target=True))
            outputs.append(postprocess(prediction.text, example=example, is_target=False))
        except Exception as e:
            e.add_note(
                f"(while postprocessing example {prediction.example_id!r} of task {task.name!r}; its prediction "
                f"is at {prediction.path}, line {prediction.line})"
            )
            raise
    return targets, outputs


def _call_metric(task: Task, fn: Callable[..., Any], targets: list[Any], values: list[Any]) -> Any:
    try:
        return fn(targets, values)
    except Exception as e:
        e.add_note(
            f"(while computing metric {_fn_name(fn)} of task {task.name!r} on {len(targets)} examples)"
        )
        raise


def _add_metrics(
    task: Task, fn: Callable[..., Any], result: Any, metrics: dict[str, float], sources: dict[str, str]
) -> None:
    name = _fn_name(fn)
    if not isinstance(result, Mapping):
        raise EvaluationError(
            f"Task {task.name!r}: metric {name} returned a {type(result).__name__}; a metric must return a "
            "dict of {metric name: number}."
        )
    for key, value in result.items():
        if not isinstance(key, str) or not is_number(value):
            raise EvaluationError(
                f"Task {task.name!r}: metric {name} reported {key!r}: {value!r:.80}; a report holds string names "
                "and plain numbers only. Reduce arrays to a number, or report their entries under separate names."
            )
        if key in metrics:
            raise EvaluationError(
                f"Task {task.name!r}: metrics {sources[key]} and {name} both report {key!r}; wrap one of them "
                "so that each metric name is reported once."
            )
        metrics[key] = float(value)
        sources[key] = name


def _fn_name(fn: Callable[..., Any]) -> str:
    if isinstance(fn, functools.partial):
        return _fn_name(fn.func)
    return getattr(fn, "__qualname__", type(fn).__name__)


def _overall(reports: Sequence[TaskReport]) -> tuple[dict[str, float], tuple[str, ...]]:
    scored = [r for r in reports if r.num_scored]
    if not scored:
        return {}, ()
    shared = set.intersection(*(set(r.metrics) for r in scored))
    overall = {m: math.fsum(r.metrics[m] for r in scored) / len(scored) for m in sorted(shared)}
    return overall, tuple(r.task for r in scored)
