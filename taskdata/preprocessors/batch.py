"""``ExampleBatch``: many examples in columns, the form the cache job's hot path runs in.

A preprocessor runs per example (``(examples, ctx) -> examples``, see ``base``). Where that costs more
Python than the work itself (span corruption makes ~90k examples per 100k documents, and each one
became a dict, passed through the EOS step and the output checks, then was encoded on its own), a
preprocessor may also offer a batch form that gives exactly the same examples in columns:

- ``to_batches(examples, ctx) -> Iterator[ExampleBatch]``: examples in, batches out (``SpanCorruption``);
- ``map_batches(batches, ctx) -> Iterator[ExampleBatch]``: batches in, batches out (``AppendEosAfterTrim``).

``Task.process_shard_batches`` uses them when the task's last preprocessors allow it (one with
``to_batches``, then only ones with ``map_batches``); every other task, and every per-example caller,
gets the examples as before. ``ExampleBatch.rows()`` is the per-example form: a preprocessor's batch
form must give, row by row, what its ``__call__`` gives (tests compare the two).

A token feature is a ``Ragged`` column (one flat array of every row's tokens, plus row offsets);
metadata (``_source_first``...) is one int64 entry per row.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from taskdata.preprocessors.base import Example

__all__ = ["ExampleBatch", "Ragged"]


@dataclasses.dataclass(frozen=True)
class Ragged:
    """Rows of tokens of varying length: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    values: np.ndarray  # 1-D
    offsets: np.ndarray  # int64, rows + 1 entries, offsets[0] == 0, non-decreasing

    def __post_init__(self) -> None:
        if self.values.ndim != 1 or self.offsets.ndim != 1 or self.offsets.size == 0:
            raise ValueError(f"Ragged: values must be 1-D and offsets 1-D and non-empty, but got shapes "
                             f"{self.values.shape} and {self.offsets.shape}.")
        if self.offsets[0] != 0 or self.offsets[-1] != self.values.size:
            raise ValueError(f"Ragged: offsets must run from 0 to len(values) = {self.values.size} but run from "
                             f"{self.offsets[0]} to {self.offsets[-1]}.")

    @classmethod
    def from_matrices(cls, matrices: Sequence[np.ndarray]) -> Ragged:
        """The rows of 2-D arrays (each of its own row length), in order."""
        lengths = np.concatenate([np.full(m.shape[0], m.shape[1], dtype=np.int64) for m in matrices])
        values = matrices[0].ravel() if len(matrices) == 1 else np.concatenate([m.ravel() for m in matrices])
        return cls(values, _offsets(lengths))

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return self.offsets.size - 1

    def rows(self) -> list[np.ndarray]:
        """Each row as a view of ``values``."""
        bounds = self.offsets.tolist()
        values = self.values
        return [values[a:b] for a, b in itertools.pairwise(bounds)]

    def appended(self, token: int, limit: int | None = None) -> Ragged:
        """Each row cut to at most ``limit`` tokens (None: not cut), then ``token`` appended to it."""
        values, lengths = self.values, self.lengths
        if limit is not None and (lengths > limit).any():
            # Drop the positions from ``limit`` on in each longer row: +1 where such a run starts, -1 where it ends.
            over = np.flatnonzero(lengths > limit)
            marks = np.zeros(values.size + 1, dtype=np.int64)
            np.add.at(marks, self.offsets[over] + limit, 1)
            np.add.at(marks, self.offsets[over + 1], -1)
            values = values[np.cumsum(marks[:-1]) == 0]
            lengths = np.minimum(lengths, limit)
        # One insert call: each token goes at the end of its row (empty rows included, in row order).
        return Ragged(np.insert(values, _offsets(lengths)[1:], token), _offsets(lengths + 1))


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


@dataclasses.dataclass(frozen=True)
class ExampleBatch:
    """Examples in columns: ``tokens`` (feature -> Ragged) and ``meta`` ('_'-key -> int64 per row).

    Row ``i`` is the example ``{feature: tokens[feature] row i, ..., key: int(meta[key][i]), ...}``,
    token features first, in the order of ``tokens``, then the metadata in the order of ``meta``.
    """

    tokens: Mapping[str, Ragged]
    meta: Mapping[str, np.ndarray]

    def __post_init__(self) -> None:
        sizes = {key: len(column) for key, column in self.tokens.items()}
        sizes.update({key: column.shape[0] for key, column in self.meta.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(f"ExampleBatch: every column must have one entry per row, but the columns have {sizes}.")
        bad = [key for key in self.meta if not key.startswith("_")] + [key for key in self.tokens if key.startswith("_")]
        if bad:
            raise ValueError(f"ExampleBatch: metadata keys start with '_' and token features do not; got {bad}.")

    def __len__(self) -> int:
        for column in self.tokens.values():
            return len(column)
        for values in self.meta.values():
            return int(values.shape[0])
        return 0

    def replace_tokens(self, tokens: Mapping[str, Ragged]) -> ExampleBatch:
        return ExampleBatch({**self.tokens, **tokens}, self.meta)

    def rows(self) -> Iterator[Example]:
        """The examples, one dict each (token features as views of the columns, metadata as ints)."""
        token_rows = [(key, column.rows()) for key, column in self.tokens.items()]
        meta_rows = [(key, values.tolist()) for key, values in self.meta.items()]
        for i in range(len(self)):
            example: Example = {key: rows[i] for key, rows in token_rows}
            for key, values in meta_rows:
                example[key] = values[i]
            yield example
