"""``encode_int_rows``: the ``tf.train.Example`` bytes of many examples of integer features at once.

``encode_example`` is built for one call per example; a batch of examples whose features are all
integer lists (the cache job's span-corruption records: inputs, targets and their provenance numbers)
can do the costly part, turning every value into its varint, in a few numpy calls per feature for the
whole batch. What is left per example is cutting each feature's bytes out and framing them, which
reuses ``encode_example``'s own framing, so the bytes are the same by construction (tests check it).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from taskdata.example.encode import _ENTRY_HEADS, _WORD_DTYPES, _WORDS_16, _entry_head, _packed, _varint_rows
from taskdata.example.wire import _INT_TAG, _varint

__all__ = ["encode_int_rows"]


def encode_int_rows(columns: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> list[bytes]:
    """``encode_example({key: values[offsets[i]:offsets[i + 1]] for key, (values, offsets) in columns})`` for
    every row ``i``: each column is a 1-D integer array and the row offsets into it (all columns the same
    number of rows)."""
    features = []
    rows = None
    for key in sorted(columns):
        values, offsets = columns[key]
        if values.ndim != 1 or values.dtype.kind not in "iub":
            raise TypeError(f"encode_int_rows: column {key!r} must be a 1-D integer array but got dtype "
                            f"{values.dtype} with shape {values.shape}.")
        if rows is not None and offsets.size - 1 != rows:
            raise ValueError(f"encode_int_rows: column {key!r} has {offsets.size - 1} rows but the others {rows}.")
        rows = offsets.size - 1
        blob, bounds = _varints(values)
        features.append((key, blob, bounds[offsets].tolist()))
    records = []
    for i in range(rows or 0):
        parts = []
        for key, blob, bounds in features:
            feature = _packed(_INT_TAG, blob[bounds[i]:bounds[i + 1]])
            parts.append(_ENTRY_HEADS.get((key, len(feature))) or _entry_head(key, len(feature)))
            parts.append(feature)
        body = b"".join(parts)
        records.append(b"\x0a" + _varint(len(body)) + body)
    return records


def _varints(values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """(the varints of ``values`` back to back, where each value's varint starts: len(values) + 1 entries)."""
    bounds = np.zeros(values.size + 1, dtype=np.int64)
    if values.size == 0:
        return b"", bounds
    if values.dtype in _WORD_DTYPES:
        # Token ids (1..65535): one gather and one delete, as encode_example does.
        words = _WORDS_16.take(values, mode="clip").tobytes()
        if words[3::4].isascii():
            sizes = 1 + (values >= 0x80).astype(np.int64) + (values >= 0x4000)
            np.cumsum(sizes, out=bounds[1:])
            return words.translate(None, b"\x00"), bounds
    unsigned = values.astype(np.int64).view(np.uint64)  # negatives: 64-bit two's complement, as encode_example
    padded = _varint_rows(unsigned)  # one zero-padded row per value
    width = padded.shape[1]
    sizes = np.ones(values.size, dtype=np.int64)
    for k in range(1, width):
        sizes += unsigned >= np.uint64(1 << (7 * k))
    np.cumsum(sizes, out=bounds[1:])
    return padded[np.arange(width) < sizes[:, None]].tobytes(), bounds
