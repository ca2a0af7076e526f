"""Metric functions for evaluating tasks, with T5's names and conventions.

Prediction metrics ``(targets, predictions) -> {name: value}``: ``accuracy``, ``sequence_accuracy``,
``bleu``, ``rouge``, ``squad``, ``span_accuracy`` and ``TokenAccuracy(vocabulary)`` (the built-in
pretraining tasks'). Score metrics ``(targets, scores) -> {name: value}``:
``log_likelihood``, ``perplexity``. Put them in a task's ``metric_fns`` / ``score_metric_fns``.
"""

from taskdata.metrics.base import MetricError, MetricFn
from taskdata.metrics.bleu import bleu
from taskdata.metrics.classification import accuracy, sequence_accuracy
from taskdata.metrics.likelihood import log_likelihood, perplexity
from taskdata.metrics.rouge import DEFAULT_ROUGE_KEYS, rouge
from taskdata.metrics.spans import TokenAccuracy, span_accuracy
from taskdata.metrics.squad import normalize_squad, squad

__all__ = [
    "DEFAULT_ROUGE_KEYS",
    "MetricError",
    "MetricFn",
    "TokenAccuracy",
    "accuracy",
    "bleu",
    "log_likelihood",
    "normalize_squad",
    "perplexity",
    "rouge",
    "sequence_accuracy",
    "span_accuracy",
    "squad",
]
