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

from taskdata.example.encode import (
    _ENTRY_HEADS,
    _MAX_MEMO_ENTRIES,
    _WORD_DTYPES,
    _WORDS_16,
    _entry_head,
    _packed,
    _varint_rows,
)
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
        blob, bounds = _varints(values, offsets)
        features.append((key, blob, bounds.tolist()))
    records = []
    for i in range(rows or 0):
        parts = []
        for key, blob, bounds in features:
            start, end = bounds[i], bounds[i + 1]
            # Everything before a row's payload depends on its size only: one lookup per feature and row.
            parts.append(_FEATURE_HEADS.get((key, end - start)) or _feature_head(key, end - start))
            parts.append(blob[start:end])
        body = b"".join(parts)
        records.append(b"\x0a" + _varint(len(body)) + body)
    return records


def _feature_head(key: str, payload_size: int) -> bytes:
    """The bytes of a Features map entry before its packed Int64List payload of ``payload_size`` bytes."""
    feature = _packed(_INT_TAG, bytes(payload_size))  # the framing depends on the payload's size alone
    feature_head = feature[: len(feature) - payload_size]
    head = (_ENTRY_HEADS.get((key, len(feature))) or _entry_head(key, len(feature))) + feature_head
    if len(_FEATURE_HEADS) >= _MAX_MEMO_ENTRIES:
        _FEATURE_HEADS.clear()
    _FEATURE_HEADS[key, payload_size] = head
    return head


# Memo of _feature_head by (feature name, payload size), cleared when full (as encode's memos): a batch
# of span-corruption records has a few hundred distinct sizes per feature.
_FEATURE_HEADS: dict[tuple[str, int], bytes] = {}


def _varints(values: np.ndarray, offsets: np.ndarray) -> tuple[bytes, np.ndarray]:
    """(the varints of ``values`` back to back, where each row's varints start: rows + 1 entries)."""
    if values.size == 0:
        return b"", np.zeros(offsets.size, dtype=np.int64)
    if values.dtype in _WORD_DTYPES:
        # Token ids (1..16383, every vocabulary up to 16k pieces): a 2-byte word each, the second byte 0
        # for ids below 128, which one delete then drops; an id outside that range gets a word whose
        # second byte is not ASCII, and the next path.
        words = _WORDS_14.take(values, mode="clip").tobytes()
        if words[1::2].isascii():
            return words.translate(None, b"\x00"), _row_starts(offsets, values >= 0x80)
        # Token ids up to 65535: a 4-byte word each, as encode_example does.
        words = _WORDS_16.take(values, mode="clip").tobytes()
        if words[3::4].isascii():
            extra = (values >= 0x80).view(np.int8) + (values >= 0x4000).view(np.int8)
            return words.translate(None, b"\x00"), _row_starts(offsets, extra)
    unsigned = values.astype(np.int64).view(np.uint64)  # negatives: 64-bit two's complement, as encode_example
    padded = _varint_rows(unsigned)  # one zero-padded row per value
    width = padded.shape[1]
    extra = np.zeros(values.size, dtype=np.int8)
    for k in range(1, width):
        extra += unsigned >= np.uint64(1 << (7 * k))
    return padded[np.arange(width) <= extra[:, None]].tobytes(), _row_starts(offsets, extra)


def _row_starts(offsets: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """Where each row's varints start (and the last one ends): a value takes one byte plus ``extra`` (per
    value: a bool or small int array). Summed per row, so nothing runs over every value but one reduceat."""
    lengths = np.diff(offsets)
    filled = lengths > 0  # reduceat gives an empty row the next value, not 0
    sizes = lengths.copy()
    sizes[filled] += np.add.reduceat(extra.view(np.int8), offsets[:-1][filled], dtype=np.int64)
    starts = np.zeros(offsets.size, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    return starts


# Indexed by value: the 2-byte varint word (little-endian) of 1..16383; a word whose second byte is not
# ASCII at 0 (0 would leave a 0 byte) and at 16384, where ``take(mode="clip")`` sends every larger value.
_WORDS_14 = np.concatenate([[0xFFFF], [v if v < 0x80 else (v & 0x7F | 0x80) | (v >> 7) << 8
                                       for v in range(1, 1 << 14)], [0xFFFF]]).astype("<u2")
