"""T5's span corruption (``t5.data.preprocessors.span_corruption``), vectorized over many chunks.

The pipeline, as in T5: ``select_random_chunk`` (documents of at most ``max_chunk_tokens``),
``reduce_concat_tokens`` (``concat_batch_size`` documents at a time), ``split_tokens`` into raw chunks
of the length ``random_spans_helper`` gives (568 tokens for inputs of 512), then per chunk:

- ``round(L * noise_density)`` noise tokens, clamped to ``[1, L - 1]``;
  ``max(1, round(noise / mean_noise_span_length))`` noise spans, as many non-noise spans;
- span lengths from a uniformly random segmentation of the noise and of the non-noise tokens into
  that many non-empty spans; spans alternate starting with non-noise (so a chunk ends in noise);
- inputs: each noise span replaced by one sentinel; targets: each non-noise span replaced by one
  sentinel; ``<extra_id_0>`` (``vocab_size - 1``) first, counting down.

A chunk's randomness comes from its ordinal in the shard's chunk stream only (see
``counter_random``), so a chunk is the same whether it is computed alone or among thousands.

Two deliberate differences from T5's TensorFlow code, both only where it misbehaves:
``round(L * noise_density)`` and ``round(noise / mean)`` use float64 (Python's ``round``, half to
even) in both the helper and the mask, whereas T5's mask uses float32 and so disagrees with its own
helper on ties (e.g. a 190-token chunk at density 0.15: float32 gives 29 noise tokens, the helper's
``round(28.5)`` 28); and where T5 would fail on a short chunk with more noise spans than non-noise
tokens (high densities only), we use as many spans as there are non-noise tokens.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from taskdata.preprocessors.base import Example, ShardContext
from taskdata.preprocessors.batch import ExampleBatch, Ragged
from taskdata.preprocessors.chunking import (
    ChunkBatch,
    reduce_concat_tokens,
    select_random_chunk,
    split_tokens,
)
from taskdata.preprocessors.counter_random import example_keys, random_words, stream_key, uniform_below
from taskdata.preprocessors.sequence_lengths import required_length

__all__ = [
    "SpanCorruption",
    "random_spans_helper",
    "random_spans_noise_mask",
    "span_corruption_lengths",
]

_STAGE = "span_corruption"
# The random words of a chunk: [0, 2**32) segment its noise tokens, [2**32, ...) its non-noise tokens.
_NONNOISE_COUNTER_BASE = np.uint64(2**32)
# Chunks corrupted per vectorized call: several concatenations' worth, so that numpy's per-call cost
# is spread thin (a chunk's result does not depend on its neighbours, see counter_random).
_WINDOW_ROWS = 512


def span_corruption_lengths(
    tokens_length: int,
    noise_density: float,
    mean_noise_span_length: float,
    extra_tokens_per_span_inputs: int = 1,
    extra_tokens_per_span_targets: int = 1,
) -> tuple[int, int]:
    """(inputs length, targets length), EOS included, of a chunk of ``tokens_length`` raw tokens.

    T5's ``_tokens_length_to_inputs_length_targets_length``: without the clamps the mask applies,
    which matter only for chunks of a handful of tokens.
    """
    num_noise_tokens = round(tokens_length * noise_density)
    num_nonnoise_tokens = tokens_length - num_noise_tokens
    num_noise_spans = round(num_noise_tokens / mean_noise_span_length)
    return (
        num_nonnoise_tokens + num_noise_spans * extra_tokens_per_span_inputs + 1,
        num_noise_tokens + num_noise_spans * extra_tokens_per_span_targets + 1,
    )


def random_spans_helper(
    inputs_length: int,
    noise_density: float,
    mean_noise_span_length: float,
    extra_tokens_per_span_inputs: int = 1,
    extra_tokens_per_span_targets: int = 1,
) -> tuple[int, int]:
    """T5's ``random_spans_helper``: (raw tokens per chunk, targets length) for an inputs length.

    The raw length is the longest whose inputs (EOS included) fit in ``inputs_length``:
    512 -> (568, 114) and 1024 -> (1137, 229) at density 0.15 and mean span length 3.
    """
    if isinstance(inputs_length, bool) or not isinstance(inputs_length, int) or inputs_length < 2:
        raise ValueError(
            f"random_spans_helper: inputs_length must be an integer >= 2 but got {inputs_length!r}."
        )

    def lengths(tokens_length: int) -> tuple[int, int]:
        return span_corruption_lengths(
            tokens_length,
            noise_density,
            mean_noise_span_length,
            extra_tokens_per_span_inputs,
            extra_tokens_per_span_targets,
        )

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    inputs_length, targets_length = lengths(tokens_length)
    # T5's own adjustment: at density 0.5 make the targets no longer than the inputs, which are more
    # likely to have been set to a round number.
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


class _SpanCounts(NamedTuple):
    noise: int
    nonnoise: int
    spans: int


def _span_counts(length: int, noise_density: float, mean_noise_span_length: float) -> _SpanCounts:
    """Noise tokens and spans of a chunk of ``length >= 2`` tokens (T5's clamps included)."""
    noise = min(max(round(length * noise_density), 1), length - 1)
    spans = max(round(noise / mean_noise_span_length), 1)
    # T5 fails here (mismatched span counts); only short chunks at high densities get this far.
    spans = min(spans, length - noise)
    return _SpanCounts(noise, length - noise, spans)


def _span_lengths(keys: np.ndarray, counts: _SpanCounts) -> tuple[np.ndarray, np.ndarray]:
    """(non-noise span lengths, noise span lengths), each (rows, spans), for chunks with ``keys``.

    Segmenting n items into k non-empty spans uniformly at random means choosing k - 1 of the n - 1
    gaps between items uniformly at random. Floyd's algorithm does that with exactly k - 1 random
    draws per segmentation; it runs for all chunks (noise rows, then non-noise rows) at once, one
    vectorized step per draw.
    """
    rows = keys.size
    picks = counts.spans - 1
    items = np.repeat(np.array([counts.noise, counts.nonnoise], dtype=np.int64), rows)
    if picks == 0:
        lengths = items[:, None]
    else:
        counters = np.arange(picks, dtype=np.uint64)
        # Laid out (draw, row) so that each Floyd step below reads contiguous memory.
        words = np.concatenate(
            [
                random_words(keys[:, None], counters),
                random_words(keys[:, None], counters + _NONNOISE_COUNTER_BASE),
            ]
        ).T
        # Gaps of all rows in one flat array: gap g of row r is element r * width + g.
        width = max(counts.noise, counts.nonnoise) - 1
        row_base = np.arange(2 * rows, dtype=np.int64) * width
        # Floyd: for j = n_gaps - picks, ..., n_gaps - 1, draw t in [0, j]; take t, or j if t is taken.
        highest = (items - 1)[None, :] - picks + np.arange(picks)[:, None]
        draws = uniform_below(words, highest + 1) + row_base
        highest += row_base
        taken = np.zeros(2 * rows * width, dtype=bool)
        picked = np.empty((picks, 2 * rows), dtype=np.int64)
        for i in range(picks):
            pick = np.where(taken[draws[i]], highest[i], draws[i])
            taken[pick] = True
            picked[i] = pick
        bounds = np.empty((2 * rows, picks + 2), dtype=np.int64)
        bounds[:, 0] = 0
        bounds[:, 1:-1] = np.sort(picked.T - row_base[:, None], axis=1) + 1
        bounds[:, -1] = items
        lengths = np.diff(bounds, axis=1)
    return lengths[rows:], lengths[:rows]


def random_spans_noise_mask(
    length: int, noise_density: float, keys: np.ndarray, mean_noise_span_length: float = 3.0
) -> np.ndarray:
    """T5's ``random_spans_noise_mask`` for chunks with per-chunk random ``keys``: (len(keys), length) bool."""
    keys = np.asarray(keys, dtype=np.uint64)
    if length < 2:
        # T5 computes the mask for length 2 and keeps its first position, which is never noise.
        return np.zeros((keys.size, length), dtype=bool)
    nonnoise, noise = _span_lengths(keys, _span_counts(length, noise_density, mean_noise_span_length))
    span_lengths = np.stack([nonnoise, noise], axis=2).ravel()
    is_noise = np.tile(np.array([False, True]), span_lengths.size // 2)
    return np.repeat(is_noise, span_lengths).reshape(keys.size, length)


def _corrupt(
    tokens: np.ndarray, keys: np.ndarray, first_sentinel: int, noise_density: float, mean: float
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) without EOS for equal-length chunks ``tokens`` (rows, L)."""
    rows, length = tokens.shape
    if length < 2:
        return tokens, np.full((rows, length), first_sentinel, dtype=tokens.dtype)
    counts = _span_counts(length, noise_density, mean)
    nonnoise, noise = _span_lengths(keys, counts)
    span_lengths = np.stack([nonnoise, noise], axis=2).reshape(rows, 2 * counts.spans)
    span_starts = np.cumsum(span_lengths, axis=1) - span_lengths + (np.arange(rows) * length)[:, None]
    sentinels = np.broadcast_to(
        np.arange(first_sentinel, first_sentinel - counts.spans, -1, dtype=tokens.dtype), (rows, counts.spans)
    ).ravel()
    spans = rows * counts.spans
    # Inputs: the first token of each noise span becomes its sentinel, the rest of the span goes.
    inputs = tokens.ravel().copy()
    inputs[span_starts[:, 1::2].ravel()] = sentinels
    keep = np.repeat(
        np.tile(np.array([True, False]), spans), np.stack([nonnoise + 1, noise - 1], axis=2).ravel()
    )
    inputs = inputs[keep].reshape(rows, counts.nonnoise + counts.spans)
    # Targets: the same with the roles swapped (T5's nonnoise_span_to_unique_sentinel).
    targets = tokens.ravel().copy()
    targets[span_starts[:, 0::2].ravel()] = sentinels
    runs = np.stack([np.ones_like(nonnoise), nonnoise - 1, noise], axis=2).ravel()
    keep = np.repeat(np.tile(np.array([True, False, True]), spans), runs)
    targets = targets[keep].reshape(rows, counts.noise + counts.spans)
    return inputs, targets


@dataclasses.dataclass(frozen=True)
class SpanCorruption:
    """T5's span corruption objective over the tokenized ``targets`` feature.

    Use as T5 does: ``[Rekey({"inputs": None, "targets": "text"}), Tokenize(), SpanCorruption(),
    AppendEosAfterTrim()]`` with sequence lengths such as inputs 512, targets 114. Outputs
    ``inputs`` and ``targets`` (without EOS) plus ``_source_first``/``_source_last``, the
    ``_source_index`` of the first and last document in the chunk. Other features are dropped, as
    concatenation makes them meaningless. Counted: empty documents, pieces of documents longer than
    ``max_chunk_tokens``, PAD ids stripped by the concatenation.

    As in T5, the helper ignores the mask's clamps; so for inputs lengths below about 30 (where
    ``round(noise / mean)`` is 0 and the mask uses 1 span) a chunk can have one input token more than
    planned, which ``AppendEosAfterTrim`` then trims and counts.
    """

    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0
    concat_batch_size: int = 128
    max_chunk_tokens: int = 65536

    def __post_init__(self) -> None:
        for name in ("noise_density", "mean_noise_span_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"SpanCorruption: {name} must be a number but got {value!r}.")
            # 3 and 3.0 must fingerprint alike, and numpy scalars must not leak into the arithmetic.
            object.__setattr__(self, name, float(value))
        if not 0.0 < self.noise_density < 1.0:
            raise ValueError(
                f"SpanCorruption: noise_density must be in (0, 1) but got {self.noise_density!r}."
            )
        if not self.mean_noise_span_length >= 1.0:
            raise ValueError(
                "SpanCorruption: mean_noise_span_length must be >= 1 (a span has at least one token) "
                f"but got {self.mean_noise_span_length!r}."
            )
        for name in ("concat_batch_size", "max_chunk_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SpanCorruption: {name} must be a positive integer but got {value!r}.")

    def lengths(self, inputs_length: int) -> tuple[int, int]:
        """(raw tokens per chunk, targets length with EOS) for inputs of ``inputs_length`` with EOS."""
        return random_spans_helper(inputs_length, self.noise_density, self.mean_noise_span_length)

    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        batches = self.to_batches(examples, ctx)  # checks the configuration now, before any example is read
        return (example for batch in batches for example in batch.rows())

    def to_batches(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[ExampleBatch]:
        """The examples of ``__call__`` in columns (``taskdata.preprocessors.batch``), a window of chunks each."""
        inputs_length = required_length(ctx, "inputs", "SpanCorruption")
        targets_have = required_length(ctx, "targets", "SpanCorruption")
        raw_length, targets_length = self.lengths(inputs_length)
        if targets_have < targets_length:
            raise ValueError(
                f"SpanCorruption in task {ctx.task!r}: sequence_length['targets'] is {targets_have} but span "
                f"corruption of inputs of length {inputs_length} (noise_density={self.noise_density}, "
                f"mean_noise_span_length={self.mean_noise_span_length}) makes targets of length "
                f"{targets_length}. Set sequence_length['targets'] to at least {targets_length}."
            )
        first_sentinel = self._first_sentinel(ctx, raw_length)
        # Checked above, before the first example is pulled: a wrong configuration fails at once.
        return self._generate(examples, ctx, raw_length, first_sentinel)

    def _first_sentinel(self, ctx: ShardContext, raw_length: int) -> int:
        if "targets" not in ctx.output_features:
            raise KeyError(f"SpanCorruption in task {ctx.task!r}: the task has no 'targets' output feature.")
        vocabulary = ctx.output_features["targets"].vocabulary
        inputs_feature = ctx.output_features.get("inputs")
        if inputs_feature is not None and (
            inputs_feature.vocabulary.fingerprint_description() != vocabulary.fingerprint_description()
        ):
            raise ValueError(
                f"SpanCorruption in task {ctx.task!r}: the 'inputs' and 'targets' features use different "
                "vocabularies, but span corruption makes inputs from target tokens. Use one vocabulary."
            )
        spans = _span_counts(raw_length, self.noise_density, self.mean_noise_span_length).spans
        if vocabulary.extra_ids < spans:
            raise ValueError(
                f"SpanCorruption in task {ctx.task!r}: chunks of {raw_length} tokens have up to {spans} noise "
                f"spans, each needing a sentinel, but the 'targets' vocabulary has {vocabulary.extra_ids} "
                f"extra ids. Give the vocabulary at least {spans} extra_ids."
            )
        return vocabulary.vocab_size - 1

    def _generate(
        self, examples: Iterator[Example], ctx: ShardContext, raw_length: int, first_sentinel: int
    ) -> Iterator[ExampleBatch]:
        documents = select_random_chunk(
            examples, ctx, feature="targets", max_length=self.max_chunk_tokens, stage=_STAGE
        )
        groups = reduce_concat_tokens(documents, ctx, batch_size=self.concat_batch_size, stage=_STAGE)
        key = stream_key(ctx, f"{_STAGE}/noise_mask")
        batches = split_tokens(groups, length=raw_length)
        while window := _take_rows(batches, _WINDOW_ROWS):
            yield self._corrupt_window(window, key, first_sentinel)

    def _corrupt_window(self, window: list[ChunkBatch], key: int, first_sentinel: int) -> ExampleBatch:
        """Corrupts the chunks of ``window`` with one ``_corrupt`` call per chunk length; rows in chunk order."""
        by_length: dict[int, list[int]] = {}
        for index, batch in enumerate(window):
            by_length.setdefault(batch.tokens.shape[1], []).append(index)
        results: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}
        for indices in by_length.values():
            batches = [window[i] for i in indices]
            tokens = batches[0].tokens if len(batches) == 1 else np.concatenate([b.tokens for b in batches])
            ordinals = np.concatenate([np.arange(b.ordinal, b.ordinal + b.tokens.shape[0]) for b in batches])
            inputs, targets = _corrupt(
                tokens,
                example_keys(key, ordinals),
                first_sentinel,
                self.noise_density,
                self.mean_noise_span_length,
            )
            offset = 0
            for index, batch in zip(indices, batches, strict=True):
                results[index] = (inputs, targets, offset)
                offset += batch.tokens.shape[0]
        inputs_rows, targets_rows = [], []
        for index, batch in enumerate(window):
            inputs, targets, offset = results[index]
            end = offset + batch.tokens.shape[0]
            inputs_rows.append(inputs[offset:end])
            targets_rows.append(targets[offset:end])
        return ExampleBatch(
            {"inputs": Ragged.from_matrices(inputs_rows), "targets": Ragged.from_matrices(targets_rows)},
            {
                "_source_first": np.concatenate([b.source_first for b in window]).astype(np.int64, copy=False),
                "_source_last": np.concatenate([b.source_last for b in window]).astype(np.int64, copy=False),
            },
        )


def _take_rows(batches: Iterator[ChunkBatch], rows: int) -> list[ChunkBatch]:
    """The next chunk batches from ``batches``, until they hold at least ``rows`` chunks or run out."""
    window: list[ChunkBatch] = []
    total = 0
    for batch in batches:
        window.append(batch)
        total += batch.tokens.shape[0]
        if total >= rows:
            break
    return window
