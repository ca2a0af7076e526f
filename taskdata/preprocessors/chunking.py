"""T5's document handling before a self-supervised objective: select, concatenate, split into chunks.

These are the numpy counterparts of ``select_random_chunk``, ``reduce_concat_tokens`` and
``split_tokens`` in ``t5.data.preprocessors``, run over one source shard's stream in source order:

- ``select_random_chunk``: drops empty documents (counted) and cuts a document longer than
  ``max_length`` tokens down to one random aligned piece ``[i * max_length, (i + 1) * max_length)``.
- ``reduce_concat_tokens``: concatenates ``batch_size`` consecutive documents and strips PAD (0) ids,
  exactly as T5's padded-batch-then-strip does (counted: real text never contains PAD).
- ``split_tokens``: cuts each concatenation into chunks of ``length`` tokens; only the last chunk of a
  concatenation may be shorter.

Every chunk gets its ordinal in the shard's chunk stream (its stable identity) and the
``_source_index`` of the first and last document its tokens came from.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from taskdata.define.vocabularies import PAD_ID
from taskdata.preprocessors.base import Example, ShardContext

__all__ = [
    "ChunkBatch",
    "Document",
    "DocumentGroup",
    "document_tokens",
    "reduce_concat_tokens",
    "select_random_chunk",
    "single_documents",
    "source_index",
    "split_tokens",
]


class Document(NamedTuple):
    tokens: np.ndarray
    source_index: int


class DocumentGroup(NamedTuple):
    """Documents concatenated: ``tokens``, where each document ends in it, and their source indices."""

    tokens: np.ndarray
    ends: np.ndarray
    source_indices: np.ndarray


class ChunkBatch(NamedTuple):
    """Consecutive chunks of equal length: rows ``ordinal``, ``ordinal + 1``, ... of the chunk stream."""

    tokens: np.ndarray
    ordinal: int
    source_first: np.ndarray
    source_last: np.ndarray


def document_tokens(example: Example, feature: str, stage: str) -> np.ndarray:
    """The 1-D token array ``example[feature]``, or an error that says which step is missing."""
    if feature not in example:
        raise KeyError(
            f"{stage}: the example has no {feature!r} feature (it has "
            f"{sorted(k for k in example if not k.startswith('_'))}). Rekey the text to {feature!r} first, "
            f"e.g. Rekey({{{feature!r}: 'text'}})."
        )
    tokens = example[feature]
    # dtype.kind rather than np.issubdtype: this runs once per document and issubdtype costs ~0.6 us.
    if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise TypeError(
            f"{stage}: feature {feature!r} must be a 1-D integer token array but got "
            f"{type(tokens).__name__}{getattr(tokens, 'shape', '')}. Put Tokenize() before {stage}."
        )
    return tokens


def source_index(example: Example, stage: str) -> int:
    try:
        return int(example["_source_index"])
    except KeyError:
        raise KeyError(
            f"{stage}: the example has no '_source_index' (Task.process_shard sets it on every raw record, "
            "and preprocessors must carry '_'-prefixed metadata along)."
        ) from None


def select_random_chunk(
    examples: Iterator[Example], ctx: ShardContext, *, feature: str, max_length: int, stage: str
) -> Iterator[Document]:
    """Non-empty documents, each cut to at most ``max_length`` tokens as T5's select_random_chunk does.

    A longer document yields one random piece among its ``ceil(n / max_length)`` aligned pieces
    (random from ``ctx.rng(f"{stage}/select_random_chunk", ordinal)``, ordinal = the document's position
    among this step's outputs); the rest of its tokens are dropped and counted.
    """
    ordinal = 0
    for example in examples:
        tokens = document_tokens(example, feature, stage)
        if tokens.size == 0:
            ctx.count(f"{stage}/empty_documents_dropped")
            continue
        if tokens.size > max_length:
            num_pieces = -(-tokens.size // max_length)
            start = max_length * int(ctx.rng(f"{stage}/select_random_chunk", ordinal).integers(num_pieces))
            piece = tokens[start : start + max_length]
            ctx.count(f"{stage}/long_documents_cut")
            ctx.count(f"{stage}/long_document_tokens_dropped", tokens.size - piece.size)
            tokens = piece
        yield Document(tokens, source_index(example, stage))
        ordinal += 1


def single_documents(documents: Iterator[Document]) -> Iterator[DocumentGroup]:
    """Each document on its own (T5's prefix_lm splits documents without concatenating them)."""
    for document in documents:
        yield DocumentGroup(
            document.tokens,
            np.array([document.tokens.size], dtype=np.int64),
            np.array([document.source_index], dtype=np.int64),
        )


def reduce_concat_tokens(
    documents: Iterator[Document], ctx: ShardContext, *, batch_size: int, stage: str
) -> Iterator[DocumentGroup]:
    """Concatenations of ``batch_size`` consecutive documents (the last group may have fewer)."""
    group: list[Document] = []
    for document in documents:
        group.append(document)
        if len(group) == batch_size:
            yield _concatenate(group, ctx, stage)
            group = []
    if group:
        yield _concatenate(group, ctx, stage)


def _concatenate(group: list[Document], ctx: ShardContext, stage: str) -> DocumentGroup:
    tokens = np.concatenate([d.tokens for d in group]).astype(np.int32, copy=False)
    lengths = np.fromiter((d.tokens.size for d in group), dtype=np.int64, count=len(group))
    sources = np.fromiter((d.source_index for d in group), dtype=np.int64, count=len(group))
    is_pad = tokens == PAD_ID
    if is_pad.any():
        # T5 batches documents with zero padding and then removes every 0, including any inside a
        # document; we do the same so that outputs match, and count what went.
        # Documents are never empty here (select_random_chunk drops those), as reduceat needs.
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        lengths = lengths - np.add.reduceat(is_pad.astype(np.int64), starts)
        tokens = tokens[~is_pad]
        ctx.count(f"{stage}/pad_tokens_dropped", int(is_pad.sum()))
    return DocumentGroup(tokens, np.cumsum(lengths), sources)


def split_tokens(groups: Iterator[DocumentGroup], *, length: int) -> Iterator[ChunkBatch]:
    """Chunks of ``length`` tokens: per group one batch of full chunks, then its shorter last chunk."""
    ordinal = 0
    for group in groups:
        total = group.tokens.size
        if total == 0:
            continue
        starts = np.arange(0, total, length, dtype=np.int64)
        last_tokens = np.minimum(starts + length, total) - 1
        # A chunk's first document is the one whose end lies after the chunk's first token.
        source_first = group.source_indices[np.searchsorted(group.ends, starts, side="right")]
        source_last = group.source_indices[np.searchsorted(group.ends, last_tokens, side="right")]
        num_full = total // length
        if num_full:
            full = group.tokens[: num_full * length].reshape(num_full, length)
            yield ChunkBatch(full, ordinal, source_first[:num_full], source_last[:num_full])
            ordinal += num_full
        if num_full < starts.size:
            rest = group.tokens[num_full * length :][None, :]
            yield ChunkBatch(rest, ordinal, source_first[num_full:], source_last[num_full:])
            ordinal += 1
