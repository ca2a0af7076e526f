"""What a preprocessor is: a function over one source shard's example stream.

A preprocessor is any callable ``(examples, ctx) -> examples`` where ``examples`` is an iterator of
dicts (numpy arrays for token features, ``str`` for text) and ``ctx`` is the ``ShardContext`` of the
shard being processed. Preprocessors run inside one source shard, in source order, so steps that
cross examples (T5 concatenates documents before splitting them into chunks) are deterministic too.

Randomness comes only from ``ctx.rng(stage, ordinal)``: a local RNG seeded from (seed, task, split,
source shard, stage, ordinal), where ``ordinal`` is the example's position in the stream the stage
produces. Prefer frozen dataclasses for preprocessors: their fields are their parameters and go into
the task's fingerprint.

Keys starting with ``_`` are metadata carried along (e.g. ``_source_index``, the ordinal of the source
record an example came from; ``_source_first``/``_source_last`` after concatenation).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from taskdata.seeding import example_rng

if TYPE_CHECKING:
    from taskdata.define.features import Feature

__all__ = ["Example", "Preprocessor", "ShardContext"]

Example = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ShardContext:
    """Where a preprocessor runs: which task, split and source shard, with which seed and lengths."""

    task: str
    split: str
    shard_index: int
    seed: int
    sequence_length: Mapping[str, int]
    output_features: Mapping[str, Feature]
    counters: collections.Counter = dataclasses.field(default_factory=collections.Counter, compare=False)

    def rng(self, stage: str, ordinal: int) -> np.random.Generator:
        """The RNG for example ``ordinal`` of the stream that preprocessor ``stage`` produces."""
        return example_rng(self.seed, self.task, self.split, self.shard_index, stage, ordinal)

    def count(self, name: str, n: int = 1) -> None:
        """Counts an event (e.g. an empty document dropped) so that it is reported, never silent."""
        self.counters[name] += n


class Preprocessor(Protocol):
    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]: ...


PreprocessorLike = Preprocessor | Callable[[Iterator[Example], ShardContext], Iterator[Example]]
