"""Metrics for pretraining objectives: how much of the masked text a model puts back.

``span_accuracy``: span corruption targets are ``<extra_id_0> span<extra_id_1> span ...``; it reports
the share of examples whose whole target is predicted exactly (``span_exact_match``) and the share of
spans predicted exactly under their own sentinel (``span_accuracy``), so a model that restores some
spans scores above 0 long before it restores whole targets.

``TokenAccuracy(vocabulary)``: the share of target tokens whose prediction has the same token at the
same position (``token_accuracy``), tokens being the vocabulary's pieces, and each sentinel one token.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from taskdata.metrics.base import MetricError, check_aligned

__all__ = ["TokenAccuracy", "span_accuracy", "split_spans"]

_SENTINEL = re.compile(r"<extra_id_(\d+)>")


def split_spans(text: str) -> dict[int, str]:
    """``'<extra_id_0> a b<extra_id_1> c'`` -> ``{0: 'a b', 1: 'c'}``; text before the first sentinel is key -1."""
    parts = _SENTINEL.split(text)
    spans = {-1: parts[0].strip()} if parts[0].strip() else {}
    for index, span in zip(parts[1::2], parts[2::2], strict=True):
        spans.setdefault(int(index), span.strip())
    return spans


def span_accuracy(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """Exact match of whole span-corruption targets, and of each target span under its sentinel (percent)."""
    check_aligned("span_accuracy", targets, predictions)
    exact = spans = correct_spans = 0
    for index, (target, prediction) in enumerate(zip(targets, predictions, strict=True)):
        if not isinstance(target, str) or not isinstance(prediction, str):
            raise MetricError(
                f"span_accuracy: example {index} is not text (target {type(target).__name__}, prediction "
                f"{type(prediction).__name__}); it compares decoded span-corruption targets."
            )
        exact += target.strip() == prediction.strip()
        wanted, got = split_spans(target), split_spans(prediction)
        spans += len(wanted)
        correct_spans += sum(1 for key, span in wanted.items() if got.get(key) == span)
    return {
        "span_exact_match": 100.0 * exact / len(targets),
        "span_accuracy": 100.0 * correct_spans / spans if spans else 0.0,
    }


@dataclasses.dataclass(frozen=True)
class TokenAccuracy:
    """``(targets, predictions) -> {"token_accuracy": percent}`` over the target tokens of ``vocabulary``."""

    vocabulary: Any

    def __call__(self, targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
        check_aligned("token_accuracy", targets, predictions)
        total = correct = 0
        for target, prediction in zip(targets, predictions, strict=True):
            wanted, got = self.tokens(target), self.tokens(prediction)
            total += len(wanted)
            correct += sum(1 for a, b in zip(wanted, got, strict=False) if a == b)
        return {"token_accuracy": 100.0 * correct / total if total else 0.0}

    def tokens(self, text: str) -> list[int]:
        """The text's ids, with ``<extra_id_N>`` as its sentinel id rather than the pieces of its spelling.

        A sentinel the vocabulary does not have (only a prediction can hold one) becomes -1, matching nothing.
        """
        parts = _SENTINEL.split(text)
        ids = self._encode(parts[0])
        for index, span in zip(parts[1::2], parts[2::2], strict=True):
            ids.append(self.vocabulary.sentinel_id(int(index)) if int(index) < self.vocabulary.extra_ids else -1)
            ids.extend(self._encode(span))
        return ids

    def _encode(self, text: str) -> list[int]:
        return [int(i) for i in self.vocabulary.encode(text)] if text else []
