"""A seqio task's metric functions as taskdata metrics.

seqio sorts a task's ``metric_fns`` by their positional arguments: ``(targets, predictions)`` and
``(targets, scores)`` are taskdata's two kinds of metrics too, called the same way on postprocessed
targets and predictions (the task's ``postprocess_fn`` keeps seqio's ``(text, example=, is_target=)``
signature). A ``seqio.metrics.Scalar`` in a result becomes its number. What taskdata's evaluation does
not have, ``(targets, predictions, aux_values)`` functions and clu ``metric_objs``, becomes a metric that
fails with a clear error when evaluated, so that it is never silently left out.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from taskdata.seqio_bridge.describe import qualified_name
from taskdata.seqio_bridge.runtime import import_seqio

__all__ = ["UnsupportedSeqioMetric", "bridge_metrics"]


def bridge_metrics(seqio_task: Any) -> tuple[list[Callable[..., Any]], list[Callable[..., Any]]]:
    """(prediction metrics, score metrics) of a ``seqio.Task``."""
    predict = [_plain_numbers(fn) for fn in seqio_task.predict_metric_fns]
    scores = [_plain_numbers(fn) for fn in seqio_task.score_metric_fns]
    for fn in seqio_task.predict_with_aux_metric_fns:
        predict.append(UnsupportedSeqioMetric(seqio_task.name, qualified_name(fn),
                                              "takes aux_values (model outputs besides the text)"))
    legacy = len(seqio_task.metric_fns)  # seqio lists the task's own metric_objs first, then the metric_fns
    for metric in list(seqio_task.metric_objs)[: len(seqio_task.metric_objs) - legacy]:
        predict.append(UnsupportedSeqioMetric(seqio_task.name, qualified_name(type(metric)),
                                              "is a clu metric object (metric_objs)"))
    return predict, scores


@dataclasses.dataclass(frozen=True)
class UnsupportedSeqioMetric:
    """A seqio metric taskdata cannot compute: calling it raises an error that says so and why."""

    task: str
    metric: str
    reason: str

    def __call__(self, targets: Any, values: Any) -> Mapping[str, float]:
        from taskdata.evaluation.predictions import EvaluationError

        raise EvaluationError(
            f"Task {self.task!r}: seqio metric {self.metric} {self.reason}, which taskdata eval does not have. "
            "Compute it with seqio's Evaluator, or register a variant of the seqio task without it."
        )


def _plain_numbers(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def metric(targets: Any, values: Any) -> Any:
        result = fn(targets, values)
        if not isinstance(result, Mapping):
            return result  # taskdata's evaluation names the metric and what it returned
        scalar = import_seqio().metrics.Scalar
        return {key: value.value if isinstance(value, scalar) else value for key, value in result.items()}

    return metric
