"""Ragged token features -> fixed-length int32 arrays, zero-padded (0 is PAD, so padding is the mask)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from taskdata.example.batch import RaggedFeature

__all__ = ["pad_features"]


def pad_features(decoded: Mapping[str, RaggedFeature], lengths: Mapping[str, int]) -> dict[str, np.ndarray]:
    """``decoded[name]`` for each name of ``lengths`` as a zero-padded [examples, length] int32 array.

    ValueError names the feature if an example is longer than its length.
    """
    out = {}
    for name, length in lengths.items():
        ragged = decoded[name]
        splits = ragged.row_splits
        rows = len(splits) - 1
        row_lengths = np.diff(splits)
        if rows and row_lengths.max() > length:
            raise ValueError(
                f"Feature {name!r} has an example of {int(row_lengths.max())} tokens, longer than {length}."
            )
        padded = np.zeros((rows, length), dtype=np.int32)
        # Scatter all values at once: row i's values go to columns [0, len_i) of row i.
        row_of = np.repeat(np.arange(rows), row_lengths)
        column = np.arange(len(ragged.values)) - np.repeat(splits[:-1], row_lengths)
        padded[row_of, column] = ragged.values
        out[name] = padded
    return out
