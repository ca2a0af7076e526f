"""Per-feature statistics of a cache split, in seqio's ``stats.{split}.json`` vocabulary.

Counts are accumulated per source shard (in workers) and merged by addition, so the result does
not depend on how the work was split.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["FeatureStats"]


class FeatureStats:
    """examples; per token feature: tokens, max_tokens, length histogram; per text feature: chars."""

    def __init__(self) -> None:
        self.examples = 0
        self.tokens: collections.Counter[str] = collections.Counter()
        self.max_tokens: dict[str, int] = {}
        self.chars: collections.Counter[str] = collections.Counter()
        self.histograms: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)

    def add(self, example: Mapping[str, Any], token_features: Iterable[str], text_features: Iterable[str] = ()) -> None:
        self.examples += 1
        for key in token_features:
            value = example.get(key)
            if value is None:
                continue
            n = value.shape[0] if type(value) is np.ndarray else int(np.shape(value)[0])
            self.tokens[key] += n
            if n > self.max_tokens.get(key, -1):
                self.max_tokens[key] = n
            self.histograms[key][n] += 1
        for key in text_features:
            value = example.get(key)
            if isinstance(value, str):
                self.chars[key] += len(value)

    def add_lengths(self, examples: int, lengths: Mapping[str, np.ndarray]) -> None:
        """``add`` for ``examples`` examples at once, given each token feature's lengths (one per example)."""
        self.examples += examples
        for key, n in lengths.items():
            if n.size == 0:
                continue
            self.tokens[key] += int(n.sum())
            self.max_tokens[key] = max(int(n.max()), self.max_tokens.get(key, -1))
            counts, occurrences = np.unique(n, return_counts=True)
            self.histograms[key].update(dict(zip(counts.tolist(), occurrences.tolist(), strict=True)))

    def merge(self, other: FeatureStats) -> None:
        self.examples += other.examples
        self.tokens.update(other.tokens)
        self.chars.update(other.chars)
        for key, n in other.max_tokens.items():
            self.max_tokens[key] = max(n, self.max_tokens.get(key, -1))
        for key, histogram in other.histograms.items():
            self.histograms[key].update(histogram)

    def to_json(self) -> dict[str, Any]:
        """seqio's keys (examples, {f}_tokens, {f}_max_tokens, {f}_chars) plus length histograms."""
        out: dict[str, Any] = {"examples": self.examples}
        for key in sorted(self.tokens.keys() | self.max_tokens.keys()):
            out[f"{key}_tokens"] = int(self.tokens[key])
            out[f"{key}_max_tokens"] = int(self.max_tokens.get(key, 0))
        for key in sorted(self.chars):
            out[f"{key}_chars"] = int(self.chars[key])
        out["length_histograms"] = {
            key: [[int(length), int(count)] for length, count in sorted(h.items())]
            for key, h in sorted(self.histograms.items())
        }
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FeatureStats:
        stats = cls()
        stats.examples = int(data["examples"])
        for key, value in data.items():
            if key.endswith("_max_tokens"):
                stats.max_tokens[key[: -len("_max_tokens")]] = int(value)
            elif key.endswith("_tokens"):
                stats.tokens[key[: -len("_tokens")]] = int(value)
            elif key.endswith("_chars"):
                stats.chars[key[: -len("_chars")]] = int(value)
        for key, pairs in data.get("length_histograms", {}).items():
            stats.histograms[key] = collections.Counter({int(n): int(c) for n, c in pairs})
        return stats
