"""``MaskedLM``: BERT/RoBERTa masked language modeling over concatenated documents."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Iterator

import numpy as np

from taskdata.define.vocabularies import EOS_ID, PAD_ID
from taskdata.preprocessors.base import Example, ShardContext
from taskdata.preprocessors.chunking import (
    ChunkBatch,
    Document,
    document_tokens,
    reduce_concat_tokens,
    source_index,
    split_tokens,
)
from taskdata.preprocessors.counter_random import example_keys, random_words, stream_key, uniform_below
from taskdata.preprocessors.eos import append_to_innermost_axis
from taskdata.preprocessors.sequence_lengths import required_length

__all__ = ["MaskedLM"]

_STAGE = "masked_lm"
# Random decisions are made on 24-bit fractions of each position's random word.
_FRACTION_BITS = 24
_TOKEN_COUNTER_BASE = np.uint64(2**32)
# Ids below this are PAD, EOS and UNK: never drawn as random replacement tokens.
_FIRST_ORDINARY_ID = 3


@dataclasses.dataclass(frozen=True)
class MaskedLM:
    """Masked LM as in Hugging Face's TPU pretraining example (BERT's 80/10/10 rule).

    Documents from ``feature`` (default 'inputs'; empty ones dropped and counted) each get EOS
    appended as their separator, are concatenated ``concat_batch_size`` at a time and split into
    chunks of ``sequence_length['inputs']`` tokens (the last chunk of a concatenation may be shorter;
    nothing is dropped). Each token other than EOS and PAD is chosen with probability ``mask_rate``;
    a chosen token becomes ``mask_token`` (default: the vocabulary's ``<extra_id_0>``) with
    probability ``1 - random_rate - keep_rate``, a random ordinary token (ids 3 .. base vocabulary
    size - 1, never a special or sentinel id) with probability ``random_rate``, and stays itself with
    probability ``keep_rate``.

    Outputs ``inputs`` (the corrupted chunk) and ``targets`` of the same length: the original id at
    chosen positions and PAD (0) elsewhere, so the loss weights are ``targets != 0`` (Hugging Face
    uses -100 for "not chosen"; 0 keeps the ids unsigned and the features alike). No EOS is appended.
    Plus ``_source_first``/``_source_last``.
    """

    mask_rate: float = 0.15
    mask_token: int | None = None
    random_rate: float = 0.1
    keep_rate: float = 0.1
    concat_batch_size: int = 128
    feature: str = "inputs"

    def __post_init__(self) -> None:
        for name in ("mask_rate", "random_rate", "keep_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"MaskedLM: {name} must be a number but got {value!r}.")
            object.__setattr__(self, name, float(value))
        if not 0.0 < self.mask_rate < 1.0:
            raise ValueError(f"MaskedLM: mask_rate must be in (0, 1) but got {self.mask_rate!r}.")
        if not (
            self.random_rate >= 0.0 and self.keep_rate >= 0.0 and self.random_rate + self.keep_rate <= 1.0
        ):
            raise ValueError(
                "MaskedLM: random_rate and keep_rate must be >= 0 with a sum <= 1 but got "
                f"{self.random_rate!r} and {self.keep_rate!r}."
            )
        if self.mask_token is not None and (
            isinstance(self.mask_token, bool) or not isinstance(self.mask_token, int) or self.mask_token < 0
        ):
            raise ValueError(
                f"MaskedLM: mask_token must be a non-negative id or None but got {self.mask_token!r}."
            )
        size = self.concat_batch_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"MaskedLM: concat_batch_size must be a positive integer but got {size!r}.")

    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        length = required_length(ctx, "inputs", "MaskedLM")
        targets_length = required_length(ctx, "targets", "MaskedLM")
        if targets_length < length:
            raise ValueError(
                f"MaskedLM in task {ctx.task!r}: targets are as long as inputs ({length}) but "
                f"sequence_length['targets'] is {targets_length}. Set it to at least {length}."
            )
        if self.feature not in ctx.output_features:
            raise KeyError(
                f"MaskedLM in task {ctx.task!r}: {self.feature!r} is not an output feature of the task."
            )
        vocabulary = ctx.output_features[self.feature].vocabulary
        mask_token = self.mask_token
        if mask_token is None:
            if vocabulary.extra_ids < 1:
                raise ValueError(
                    f"MaskedLM in task {ctx.task!r}: the default mask token is <extra_id_0> but the "
                    f"{self.feature!r} vocabulary has no extra ids. Pass mask_token=... or add extra_ids."
                )
            mask_token = vocabulary.sentinel_id(0)
        if mask_token >= vocabulary.vocab_size:
            raise ValueError(
                f"MaskedLM in task {ctx.task!r}: mask_token {mask_token} is outside the {self.feature!r} "
                f"vocabulary (size {vocabulary.vocab_size}). Use an id below {vocabulary.vocab_size}."
            )
        if vocabulary.base_vocab_size <= _FIRST_ORDINARY_ID:
            raise ValueError(
                f"MaskedLM in task {ctx.task!r}: the {self.feature!r} vocabulary has no ordinary tokens (ids >= "
                f"{_FIRST_ORDINARY_ID}) to draw random replacements from. Use a real vocabulary."
            )
        return self._generate(examples, ctx, length, mask_token, vocabulary.base_vocab_size)

    def _generate(
        self, examples: Iterator[Example], ctx: ShardContext, length: int, mask_token: int, base_size: int
    ) -> Iterator[Example]:
        groups = reduce_concat_tokens(
            self._documents(examples, ctx), ctx, batch_size=self.concat_batch_size, stage=_STAGE
        )
        key = stream_key(ctx, f"{_STAGE}/mask")
        for batch in split_tokens(groups, length=length):
            yield from self._mask_batch(batch, key, mask_token, base_size)

    def _documents(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Document]:
        for example in examples:
            tokens = document_tokens(example, self.feature, _STAGE)
            if tokens.size == 0:
                ctx.count(f"{_STAGE}/empty_documents_dropped")
                continue
            yield Document(append_to_innermost_axis(tokens, EOS_ID), source_index(example, _STAGE))

    def _mask_batch(self, batch: ChunkBatch, key: int, mask_token: int, base_size: int) -> Iterator[Example]:
        tokens = batch.tokens
        rows, length = tokens.shape
        keys = example_keys(key, np.arange(batch.ordinal, batch.ordinal + rows))
        words = random_words(keys[:, None], np.arange(length, dtype=np.uint64))
        scale = 1 << _FRACTION_BITS
        # Two independent 24-bit fractions per position: whether it is chosen, and what happens to it.
        chosen_at = (words >> np.uint64(64 - _FRACTION_BITS)).astype(np.int64)
        action_at = ((words >> np.uint64(16)) & np.uint64(scale - 1)).astype(np.int64)
        chosen = (chosen_at < round(self.mask_rate * scale)) & (tokens != EOS_ID) & (tokens != PAD_ID)
        random_below = round(self.random_rate * scale)
        keep_below = random_below + round(self.keep_rate * scale)
        inputs = tokens.copy()
        inputs[chosen & (action_at >= keep_below)] = mask_token
        row, col = np.nonzero(chosen & (action_at < random_below))
        token_words = random_words(keys[row], _TOKEN_COUNTER_BASE + col.astype(np.uint64))
        inputs[row, col] = _FIRST_ORDINARY_ID + uniform_below(token_words, base_size - _FIRST_ORDINARY_ID)
        targets = np.where(chosen, tokens, PAD_ID).astype(tokens.dtype)
        for i, (first, last) in enumerate(
            zip(batch.source_first.tolist(), batch.source_last.tolist(), strict=True)
        ):
            yield {"inputs": inputs[i], "targets": targets[i], "_source_first": first, "_source_last": last}
