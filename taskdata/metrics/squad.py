"""SQuAD v1.1 exact match and token F1, with the official evaluation script's normalisation."""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

from taskdata.metrics.base import MetricError, check_aligned

__all__ = ["normalize_squad", "squad"]

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_squad(text: str) -> str:
    """Lower case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace (in that order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def squad(targets: Sequence[str | Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
    """``em`` and ``f1`` in percent, each the mean over examples of the best score over the answers.

    A target is one answer string or a list of acceptable answers (SQuAD has up to six per question);
    T5 calls this metric ``squad`` and reports the same two keys.
    """
    check_aligned("squad", targets, predictions)
    exact_total = 0.0
    f1_total = 0.0
    for index, (target, prediction) in enumerate(zip(targets, predictions, strict=True)):
        answers = [target] if isinstance(target, str) else list(target)
        if not answers or not all(isinstance(a, str) for a in answers) or not isinstance(prediction, str):
            raise MetricError(
                f"squad: example {index} must pair a string prediction with an answer string or a non-empty "
                f"list of answer strings but got target {target!r:.80} and prediction {prediction!r:.80}. "
                "For SQuAD tasks, postprocess targets to the example's answers (taskdata.define.postprocessors.qa)."
            )
        normalized_prediction = normalize_squad(prediction)
        normalized_answers = [normalize_squad(a) for a in answers]
        exact_total += max(float(a == normalized_prediction) for a in normalized_answers)
        f1_total += max(_token_f1(a, normalized_prediction) for a in normalized_answers)
    return {"em": 100.0 * exact_total / len(targets), "f1": 100.0 * f1_total / len(targets)}


def _token_f1(answer: str, prediction: str) -> float:
    answer_tokens = answer.split()
    prediction_tokens = prediction.split()
    common = collections.Counter(answer_tokens) & collections.Counter(prediction_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(prediction_tokens)
    recall = same / len(answer_tokens)
    return 2 * precision * recall / (precision + recall)
