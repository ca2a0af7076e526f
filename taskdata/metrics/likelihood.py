"""Score metrics over the model's log-likelihoods of the targets.

A score is either one number, the log-likelihood of the whole target sequence (what t5x's scoring
writes), or a list of per-token log-likelihoods. Log-likelihoods are natural-log probabilities, so
every value must be <= 0; a positive value almost always means a loss (negative log-likelihood) was
written instead, and is rejected rather than turned into a meaningless perplexity.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, TypeGuard

from taskdata.metrics.base import MetricError, check_aligned

__all__ = ["log_likelihood", "perplexity"]


def log_likelihood(targets: Sequence[Any], scores: Sequence[float | Sequence[float]]) -> dict[str, float]:
    """``log_likelihood``: the mean over examples of each target sequence's total log-likelihood."""
    check_aligned("log_likelihood", targets, scores, kind="scores")
    total = 0.0
    for index, score in enumerate(scores):
        if _is_number(score):
            total += _checked("log_likelihood", index, score)
        else:
            total += sum(
                _checked("log_likelihood", index, value)
                for value in _token_values("log_likelihood", index, score)
            )
    return {"log_likelihood": total / len(scores)}


def perplexity(targets: Sequence[Any], scores: Sequence[Sequence[float]]) -> dict[str, float]:
    """``token_log_likelihood`` (mean over all target tokens) and ``perplexity`` = exp(-that).

    Token-weighted over the whole split, as language-model perplexity is usually reported: a long
    target counts more than a short one. Needs per-token scores, because a sequence total alone does
    not say how many tokens it covers.
    """
    check_aligned("perplexity", targets, scores, kind="scores")
    total = 0.0
    tokens = 0
    for index, score in enumerate(scores):
        if _is_number(score):
            raise MetricError(
                f"perplexity: example {index} has a single score ({score!r}) but perplexity needs per-token "
                "log-likelihoods. Write each prediction's 'score' as the list of its target tokens' "
                "log-probabilities, or use log_likelihood for whole-sequence scores."
            )
        values = _token_values("perplexity", index, score)
        total += sum(_checked("perplexity", index, value) for value in values)
        tokens += len(values)
    if tokens == 0:
        raise MetricError("perplexity: every score list is empty, so there are no tokens to average over.")
    mean = total / tokens
    return {"token_log_likelihood": mean, "perplexity": math.exp(-mean)}


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _token_values(metric: str, index: int, score: Any) -> list[float]:
    if (
        isinstance(score, str | bytes)
        or not isinstance(score, Sequence)
        or not all(_is_number(v) for v in score)
    ):
        raise MetricError(
            f"{metric}: the score of example {index} must be a number or a list of numbers but got {score!r:.80}."
        )
    return [float(v) for v in score]


def _checked(metric: str, index: int, value: float) -> float:
    value = float(value)
    if math.isnan(value) or value > 0:
        raise MetricError(
            f"{metric}: example {index} has log-likelihood {value!r}, but log-likelihoods are log-probabilities "
            "and must be <= 0 (and not NaN). If you wrote a loss (negative log-likelihood), negate it."
        )
    return value
