"""``AppendEos`` and ``AppendEosAfterTrim``: seqio's EOS handling for features with ``add_eos``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from taskdata.preprocessors.base import Example, ShardContext
from taskdata.preprocessors.batch import ExampleBatch

__all__ = ["AppendEos", "AppendEosAfterTrim", "append_to_innermost_axis"]


def append_to_innermost_axis(value: np.ndarray, token: int) -> np.ndarray:
    """A new array: ``value`` with ``token`` appended along its last axis."""
    if value.ndim == 1:
        out = np.empty(value.shape[0] + 1, dtype=value.dtype)
        out[:-1] = value
        out[-1] = token
        return out
    return np.concatenate([value, np.full((*value.shape[:-1], 1), token, dtype=value.dtype)], axis=-1)


def _eos_features(ctx: ShardContext) -> list[tuple[str, int]]:
    return [
        (key, feature.vocabulary.eos_id)
        for key, feature in ctx.output_features.items()
        if feature.add_eos and feature.dtype != "string"
    ]


def _token_array(value: object, key: str, stage: str) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.ndim == 0:
        raise TypeError(
            f"{stage}: feature {key!r} must be a token array but got {type(value).__name__}. "
            f"Put Tokenize() before {stage}."
        )
    return value


@dataclasses.dataclass(frozen=True)
class AppendEos:
    """Appends EOS to every output feature with ``add_eos`` (seqio's ``append_eos``); no trimming."""

    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        features = _eos_features(ctx)
        for example in examples:
            out = dict(example)
            for key, eos_id in features:
                if key in out:
                    out[key] = append_to_innermost_axis(_token_array(out[key], key, "AppendEos"), eos_id)
            yield out


@dataclasses.dataclass(frozen=True)
class AppendEosAfterTrim:
    """seqio's ``append_eos_after_trim``: for features with ``add_eos``, trim to length - 1, add EOS.

    A feature without a ``sequence_length`` entry just gets EOS. So an ``add_eos`` feature always
    ends in EOS even when trimmed; trimmed examples and tokens are counted per feature.
    """

    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        features = [(key, eos_id, ctx.sequence_length.get(key)) for key, eos_id in _eos_features(ctx)]
        for example in examples:
            out = dict(example)
            for key, eos_id, length in features:
                if key not in out:
                    continue
                value = _token_array(out[key], key, "AppendEosAfterTrim")
                if length is not None and value.shape[-1] > length - 1:
                    ctx.count(f"append_eos_after_trim/{key}_examples_trimmed")
                    ctx.count(
                        f"append_eos_after_trim/{key}_tokens_trimmed",
                        (value.shape[-1] - (length - 1)) * (value.size // max(value.shape[-1], 1)),
                    )
                    value = value[..., : length - 1]
                out[key] = append_to_innermost_axis(value, eos_id)
            yield out

    def map_batches(self, batches: Iterator[ExampleBatch], ctx: ShardContext) -> Iterator[ExampleBatch]:
        """``__call__`` on columns (``taskdata.preprocessors.batch``): the same rows, the same counts."""
        features = [(key, eos_id, ctx.sequence_length.get(key)) for key, eos_id in _eos_features(ctx)]
        for batch in batches:
            tokens = {}
            for key, eos_id, length in features:
                column = batch.tokens.get(key)
                if column is None:  # as __call__: a feature the examples lack is left alone
                    continue
                limit = None
                if length is not None:
                    over = column.lengths - (length - 1)
                    trimmed = int(np.count_nonzero(over > 0))
                    if trimmed:
                        ctx.count(f"append_eos_after_trim/{key}_examples_trimmed", trimmed)
                        ctx.count(f"append_eos_after_trim/{key}_tokens_trimmed", int(over[over > 0].sum()))
                        limit = length - 1
                tokens[key] = column.appended(eos_id, limit)
            yield batch.replace_tokens(tokens)
