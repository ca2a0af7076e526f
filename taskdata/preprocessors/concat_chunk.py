"""``ConcatenateAndChunk``: decoder-only language-model rows, documents joined with EOS and cut losslessly.

What current decoder-only models (MaxText, Megatron, GPT-style trainers) train on: a source shard's
documents, in source order, each followed by EOS, concatenated into one stream and cut into rows of
exactly the context length. A document that does not fit at the end of a row goes on at the start of
the next one. Each row says where its documents are, in t5x's packed language-model layout:

- ``{feature}``: the row's ``L`` tokens;
- ``{feature}_segment_ids``: 1 for the row's first (piece of a) document, 2 for the next, ...;
- ``{feature}_positions``: 0, 1, ... within each piece, starting again at 0 at every row start.

A trainer derives its inputs, shifted targets and loss mask from these (``trainer_client.maxtext.fields``
for MaxText: no loss across a document end). Nothing is dropped but the stream's last partial row (shorter
than ``L``): its tokens and the documents it would have held are counted (``ctx.count``), and so are the
empty documents, which hold no token. No randomness: the rows are a pure function of the shard's documents.
Each row keeps the source indices of its first and last document (``_source_first``/``_source_last``), so its
provenance names the documents it holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from taskdata.example.packing import positions_name, segment_ids_name
from taskdata.preprocessors.base import Example, ShardContext
from taskdata.preprocessors.chunking import document_tokens, source_index
from taskdata.preprocessors.sequence_lengths import required_length

__all__ = ["ConcatenateAndChunk"]

_STAGE = "concatenate_and_chunk"
# Rows cut together from one concatenation; speed only (numpy per call), the rows are the same either way.
_ROWS_PER_CUT = 64


@dataclasses.dataclass(frozen=True)
class ConcatenateAndChunk:
    """Joins the tokenized ``feature`` of a shard's documents with EOS and cuts rows of its sequence length.

    The feature must be an output feature with ``add_eos`` (its vocabulary's EOS joins the documents) and a
    ``sequence_length`` (the row length ``L``). Every other feature is dropped. Follows ``Tokenize()``.

    Example usage::

        taskdata.add_task("my_lm", source, [Rekey({"targets": "text"}), Tokenize(), ConcatenateAndChunk()],
                          output_features={"targets": taskdata.Feature(vocabulary)},
                          sequence_length={"targets": 2048})
    """

    feature: str = "targets"

    def __post_init__(self) -> None:
        if not isinstance(self.feature, str) or not self.feature or self.feature.startswith("_"):
            raise ValueError(
                f"ConcatenateAndChunk: feature must be the name of an output feature (not '_'-prefixed metadata) "
                f"but got {self.feature!r}."
            )

    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        length = required_length(ctx, self.feature, "ConcatenateAndChunk")
        declared = ctx.output_features.get(self.feature)
        if declared is None:
            raise KeyError(
                f"ConcatenateAndChunk in task {ctx.task!r}: {self.feature!r} is not an output feature (they are "
                f"{sorted(ctx.output_features)}). Name the feature that holds the documents' tokens."
            )
        if not declared.add_eos:
            raise ValueError(
                f"ConcatenateAndChunk in task {ctx.task!r} joins documents with EOS, but output feature "
                f"{self.feature!r} is declared with add_eos=False. Declare it with add_eos=True."
            )
        return self._rows(examples, ctx, length, int(declared.vocabulary.eos_id))

    def _rows(self, examples: Iterator[Example], ctx: ShardContext, length: int, eos: int) -> Iterator[Example]:
        pending = _Pending()
        for example in examples:
            tokens = document_tokens(example, self.feature, "ConcatenateAndChunk")
            if tokens.size == 0:
                ctx.count(f"{_STAGE}/empty_documents_dropped")
                continue
            document = np.empty(tokens.size + 1, dtype=np.int32)
            document[:-1] = tokens
            document[-1] = eos
            pending.add(document, source_index(example, "ConcatenateAndChunk"))
            if pending.tokens >= length * _ROWS_PER_CUT:
                yield from self._cut(pending, length)
        yield from self._cut(pending, length)
        if pending.tokens:
            ctx.count(f"{_STAGE}/final_partial_rows_dropped")
            ctx.count(f"{_STAGE}/final_partial_row_tokens_dropped", pending.tokens)
            ctx.count(f"{_STAGE}/final_partial_row_documents", len(pending.documents))

    def _cut(self, pending: _Pending, length: int) -> Iterator[Example]:
        """Every whole row the pending documents make; what is left stays pending."""
        rows = pending.tokens // length
        if not rows:
            return
        stream = np.concatenate(pending.documents)[pending.offset :]
        sizes = np.fromiter((d.size for d in pending.documents), dtype=np.int64, count=len(pending.documents))
        sizes[0] -= pending.offset
        ends = np.cumsum(sizes)  # where each document ends in ``stream``
        starts = ends - sizes
        at = np.arange(rows * length, dtype=np.int64)
        document = np.searchsorted(ends, at, side="right").reshape(rows, length)
        row_start = (np.arange(rows, dtype=np.int64) * length)[:, None]
        segment_ids = (document - document[:, :1] + 1).astype(np.int32)
        positions = (at.reshape(rows, length) - np.maximum(starts[document], row_start)).astype(np.int32)
        tokens = stream[: rows * length].reshape(rows, length)
        sources = np.asarray(pending.sources, dtype=np.int64)
        first, last = sources[document[:, 0]], sources[document[:, -1]]
        for r in range(rows):
            yield {
                self.feature: tokens[r],
                segment_ids_name(self.feature): segment_ids[r],
                positions_name(self.feature): positions[r],
                "_source_first": int(first[r]),
                "_source_last": int(last[r]),
            }
        pending.consume(rows * length, ends)


class _Pending:
    """Documents (each ending in EOS) not yet cut into rows: the first ``offset`` tokens of the first one
    went into earlier rows."""

    def __init__(self) -> None:
        self.documents: list[np.ndarray] = []
        self.sources: list[int] = []
        self.offset = 0
        self.tokens = 0

    def add(self, document: np.ndarray, source: int) -> None:
        self.documents.append(document)
        self.sources.append(source)
        self.tokens += document.size

    def consume(self, count: int, ends: np.ndarray) -> None:
        """Drops the first ``count`` pending tokens (``ends``: where each document ends, counted from ``offset``)."""
        done = int(np.searchsorted(ends, count, side="right"))  # documents wholly in the rows cut
        if done:
            self.offset = count - int(ends[done - 1])  # tokens of the next document already cut
        else:
            self.offset += count
        del self.documents[:done], self.sources[:done]
        self.tokens -= count
