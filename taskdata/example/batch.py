"""Batch decoding of ``tf.train.Example`` records into one ragged numpy array per feature.

``decode_batch`` / ``decode_buffer`` decode many records at once: when every record shares one layout
(what a writer of one feature set produces), all of them are parsed together with numpy, each step
vectorized over records; otherwise (or when anything differs from that layout) they fall back to the
generic parser of :mod:`taskdata.example`, record by record, which decodes them or raises the
precise error.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from taskdata.example.decode import _decode_example
from taskdata.example.wire import (
    _BYTES_TAG,
    _FLOAT_TAG,
    _INT_TAG,
    _PAD,
    Value,
    _iter_fields,
    _varint,
    _varints_at,
    has_kind,
)

__all__ = ["DTYPES", "ExampleDecodeError", "RaggedFeature", "decode_batch", "decode_buffer"]

# Feature dtypes of a batch spec (the dtypes of ``taskdata.define.features.Feature``) and their proto kinds.
DTYPES = {"int32": "int", "int64": "int", "float32": "float", "string": "bytes"}
_TAG_KIND = {_BYTES_TAG: "bytes", _FLOAT_TAG: "float", _INT_TAG: "int"}
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_SHIFTS32 = np.array([0, 24, 16, 8, 0], dtype=np.uint32)  # by varint size: bring its first byte to bit 0


class ExampleDecodeError(ValueError):
    """A record of a batch that is not a valid example for the requested features."""

    def __init__(self, record_index: int, reason: str):
        self.record_index = record_index
        self.reason = reason
        super().__init__(f"Record {record_index} of the batch: {reason}")


@dataclasses.dataclass(frozen=True, eq=False)
class RaggedFeature:
    """One feature over a batch of records: all values flat, and where each record's values start.

    Record ``i`` holds ``values[row_splits[i]:row_splits[i + 1]]``. ``values`` is a numpy array for
    numeric features and a list of bytes for string features.
    """

    values: np.ndarray | list[bytes]
    row_splits: np.ndarray

    def __post_init__(self) -> None:
        splits = self.row_splits
        if (
            not isinstance(splits, np.ndarray)
            or splits.ndim != 1
            or len(splits) < 1
            or splits.dtype != np.int64
        ):
            raise ValueError(
                f"row_splits must be a 1-D int64 array with at least one entry but got {splits!r}."
            )
        if splits[0] != 0 or splits[-1] != len(self.values) or np.any(np.diff(splits) < 0):
            raise ValueError(
                f"row_splits must rise from 0 to len(values)={len(self.values)} but got {splits.tolist()[:8]}..."
            )

    def __len__(self) -> int:
        return len(self.row_splits) - 1

    @property
    def row_lengths(self) -> np.ndarray:
        return np.diff(self.row_splits)

    def row(self, index: int) -> np.ndarray | list[bytes]:
        return self.values[int(self.row_splits[index]) : int(self.row_splits[index + 1])]

    def to_padded(self, length: int, pad_value: int | float = 0) -> np.ndarray:
        """A ``(records, length)`` array, each row padded with ``pad_value``; numeric features only."""
        if not isinstance(self.values, np.ndarray):
            raise TypeError("to_padded() needs a numeric feature; string features stay as lists of bytes.")
        lengths = self.row_lengths
        too_long = np.flatnonzero(lengths > length)
        if len(too_long):
            i = int(too_long[0])
            raise ValueError(
                f"Record {i} of the batch has {int(lengths[i])} values, more than the padded length {length}; "
                "pad to a larger length or trim the feature during preprocessing."
            )
        out = np.full((len(lengths), length), pad_value, dtype=self.values.dtype)
        rows = np.repeat(np.arange(len(lengths)), lengths)
        cols = np.arange(len(self.values)) - np.repeat(self.row_splits[:-1], lengths)
        out[rows, cols] = self.values
        return out


def _kind_of(value: Value) -> str:
    if isinstance(value, list):
        return "bytes" if value else "empty"
    return "int" if value.dtype.kind in "iu" else "float"


def decode_batch(records: Sequence[bytes], feature_spec: Mapping[str, str]) -> dict[str, RaggedFeature]:
    """Decodes serialized examples into one :class:`RaggedFeature` per feature of ``feature_spec``.

    ``feature_spec`` maps feature names to dtypes: "int32", "int64", "float32" or "string". Other
    features in the records are ignored; a missing feature, a feature of another kind or an int
    that does not fit int32 raises :class:`ExampleDecodeError` naming the record.
    """
    lengths = np.fromiter((len(r) for r in records), dtype=np.int64, count=len(records))
    ends = np.cumsum(lengths)
    return decode_buffer(b"".join(records), ends - lengths, ends, feature_spec)


def decode_buffer(
    buffer: bytes, starts: np.ndarray, ends: np.ndarray, feature_spec: Mapping[str, str]
) -> dict[str, RaggedFeature]:
    """:func:`decode_batch` over records that lie at ``[starts[i], ends[i])`` of one buffer.

    A reader can pass the bytes of a ranged read and the records' data spans inside it, with no copy
    per record.
    """
    for name, dtype in feature_spec.items():
        if dtype not in DTYPES:
            raise ValueError(f"Feature {name!r}: unknown dtype {dtype!r}; use one of {sorted(DTYPES)}.")
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if len(starts) == 0:
        return {name: _empty(dtype) for name, dtype in feature_spec.items()}
    raw = _WORKSPACE.get("raw", len(buffer) + _PAD, np.uint8)
    raw[: len(buffer)] = np.frombuffer(buffer, dtype=np.uint8)
    raw[len(buffer) :] = 0
    decoded = _decode_uniform(buffer, raw, starts, ends, feature_spec)
    if decoded is None:
        decoded = _decode_each(buffer, starts, ends, feature_spec)
    return decoded


def _empty(dtype: str) -> RaggedFeature:
    values: np.ndarray | list[bytes] = [] if dtype == "string" else np.zeros(0, dtype=dtype)
    return RaggedFeature(values, np.zeros(1, dtype=np.int64))


def _decode_each(
    buffer: bytes, starts: np.ndarray, ends: np.ndarray, feature_spec: Mapping[str, str]
) -> dict[str, RaggedFeature]:
    """The generic path: each record parsed on its own, then checked and concatenated."""
    examples: list[dict[str, Any]] = []
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        try:
            examples.append(_decode_example(bytes(buffer[s:e]), feature_spec))
        except ValueError as err:
            raise ExampleDecodeError(i, f"not a valid tf.train.Example: {err}") from err
    out = {}
    for name, dtype in feature_spec.items():
        kind = DTYPES[dtype]
        rows = []
        for i, example in enumerate(examples):
            if name not in example:
                raise ExampleDecodeError(i, f"has no feature {name!r}; it has {sorted(example)}")
            value = example[name]
            if not has_kind(value, kind):
                raise ExampleDecodeError(
                    i, f"feature {name!r} holds {_kind_of(value)} values but the spec asks for {dtype}"
                )
            rows.append(value)
        counts = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        splits = np.concatenate(([0], np.cumsum(counts)))
        if kind == "bytes":
            out[name] = RaggedFeature([v for row in rows for v in row], splits)
            continue
        arrays = [np.asarray(r, dtype=np.int64 if kind == "int" else np.float32) for r in rows]
        out[name] = RaggedFeature(_cast(name, np.concatenate(arrays), dtype, splits), splits)
    return out


def _cast(name: str, values: np.ndarray, dtype: str, splits: np.ndarray) -> np.ndarray:
    if dtype == "int32" and values.dtype != np.int32 and len(values):
        outside = np.flatnonzero((values < _INT32_MIN) | (values > _INT32_MAX))
        if len(outside):
            record = int(np.searchsorted(splits, outside[0], side="right")) - 1
            raise ExampleDecodeError(
                record,
                f"feature {name!r} holds {int(values[outside[0]])}, outside int32; declare it int64",
            )
    return values.astype(dtype, copy=False)


def _layout(buffer: bytes, start: int, end: int) -> list[tuple[bytes, int]] | None:
    """(key, list tag) of each feature of one record, in stored order; None if it has no usable layout."""
    try:
        entries = []
        for field, wire, s, e in _iter_fields(buffer, start, end, "Example"):
            if (field, wire) != (1, 2):
                return None
            for f, w, es, ee in _iter_fields(buffer, s, e, "Features"):
                if (f, w) != (1, 2):
                    return None
                fields = list(_iter_fields(buffer, es, ee, "entry"))
                if [(f2, w2) for f2, w2, _, _ in fields] != [(1, 2), (2, 2)] or fields[1][2] == fields[1][3]:
                    return None
                entries.append((buffer[fields[0][2] : fields[0][3]], buffer[fields[1][2]]))
    except ValueError:
        return None
    keys = [k for k, _ in entries]
    if len(set(keys)) != len(keys) or any(tag not in _TAG_KIND for _, tag in entries):
        return None
    return entries


def _decode_uniform(
    buffer: bytes, raw: np.ndarray, starts: np.ndarray, ends: np.ndarray, feature_spec: Mapping[str, str]
) -> dict[str, RaggedFeature] | None:
    """Decodes all records at once, each step vectorized over records, if they share record 0's layout.

    Every tag, length and key of every record is checked against that layout; any difference (or a
    spec the layout cannot satisfy) returns None and the caller takes the generic path, which either
    decodes the records or raises the precise error.
    """
    layout = _layout(buffer, int(starts[0]), int(ends[0]))
    if layout is None:
        return None
    kinds = {key: _TAG_KIND[tag] for key, tag in layout}
    for name, dtype in feature_spec.items():
        if kinds.get(name.encode("utf-8")) != DTYPES[dtype]:
            return None
    wanted = {name.encode("utf-8"): name for name in feature_spec}

    pos = starts
    ok = raw[pos] == 0x0A
    size, pos, fine = _varints_at_positions(raw, pos + 1)
    ok &= fine & (pos + size == ends)
    spans: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    items: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for key, tag in layout:
        if not ok.all():
            return None
        ok &= raw[pos] == 0x0A
        size, pos, fine = _varints_at_positions(raw, pos + 1)
        entry_end = pos + size
        # The entry's key field and the value's tag are the same bytes in every record.
        prefix = np.frombuffer(b"\x0a" + _varint(len(key)) + key + b"\x12", dtype=np.uint8)
        ok &= fine & (pos + len(prefix) < entry_end) & (entry_end <= ends)
        if not ok.all():
            return None
        ok &= (raw[pos[:, None] + np.arange(len(prefix))] == prefix).all(axis=1)
        size, pos, fine = _varints_at_positions(raw, pos + len(prefix))
        ok &= fine & (pos + size == entry_end) & (raw[pos] == tag)
        size, pos, fine = _varints_at_positions(raw, pos + 1)
        ok &= fine & (pos + size == entry_end)
        wanted_name = wanted.get(key)
        if wanted_name is not None and ok.all():
            if tag == _BYTES_TAG:
                found = _bytes_items(raw, pos, entry_end)
                if found is None:
                    return None
                items[wanted_name] = found
            else:
                nonempty = pos < entry_end
                ok &= ~nonempty | (raw[pos] == 0x0A)
                size, payload, fine = _varints_at_positions(raw, pos + 1)
                ok &= ~nonempty | (fine & (payload + size == entry_end))
                spans[wanted_name] = (np.where(nonempty, payload, entry_end), entry_end)
        pos = entry_end
    ok &= pos == ends
    if not ok.all():
        return None

    out: dict[str, RaggedFeature] = {}
    for name, dtype in feature_spec.items():
        if name in items:
            record_ids, item_starts, item_ends = items[name]
            splits = np.concatenate(([0], np.cumsum(np.bincount(record_ids, minlength=len(starts)))))
            values = [buffer[s:e] for s, e in zip(item_starts.tolist(), item_ends.tolist(), strict=True)]
            out[name] = RaggedFeature(values, splits)
        elif DTYPES[dtype] == "float":
            floats = _floats(raw, *spans.pop(name))
            if floats is None:
                return None
            out[name] = floats
    if spans:
        table_raw, length = raw, len(buffer)
        if 0 < sum(int((end - begin).sum()) for begin, end in spans.values()) * 8 < len(buffer):
            # The int features asked for are a small part of the records (say, the provenance ids of
            # examples of 600 tokens): their payloads alone are decoded, not every byte of the records.
            table_raw, length, spans = _compact(raw, spans)
        ints = _VarintTable(table_raw, length).features(spans, feature_spec)
        if ints is None:
            return None
        out.update(ints)
    return {name: out[name] for name in feature_spec}


def _compact(
    raw: np.ndarray, spans: Mapping[str, tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, int, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The bytes of ``spans`` alone, one after another in their order (record by record, in layout
    order), padded; their length; and where each span lies in them.

    A varint table over them finds the same values: each payload ends on a varint's last byte (< 0x80),
    so the next payload's first varint starts right after it, as it did after its length prefix.
    """
    names = list(spans)
    begins = np.stack([spans[name][0] for name in names], axis=1).ravel()
    sizes = np.stack([spans[name][1] for name in names], axis=1).ravel() - begins
    length = int(sizes.sum())
    compact = np.zeros(length + _PAD, dtype=np.uint8)
    compact[:length] = raw[_ranges(begins, sizes)]
    starts = (np.cumsum(sizes) - sizes).reshape(-1, len(names))
    stops = starts + sizes.reshape(-1, len(names))
    return compact, length, {name: (starts[:, i], stops[:, i]) for i, name in enumerate(names)}


def _bytes_items(
    raw: np.ndarray, pos: np.ndarray, entry_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(record id, start, end) of every BytesList value, in record order; None if malformed."""
    record_ids, item_starts, item_ends = [], [], []
    pos = pos.copy()
    active = np.flatnonzero(pos < entry_end)
    while len(active):
        at = pos[active]
        size, start, fine = _varints_at_positions(raw, at + 1)
        if not (fine & (raw[at] == 0x0A) & (start + size <= entry_end[active])).all():
            return None
        record_ids.append(active)
        item_starts.append(start)
        item_ends.append(start + size)
        pos[active] = start + size
        active = active[pos[active] < entry_end[active]]
    if not record_ids:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    ids = np.concatenate(record_ids)
    order = np.argsort(ids, kind="stable")  # rounds are item order within a record: keep it
    return ids[order], np.concatenate(item_starts)[order], np.concatenate(item_ends)[order]


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(starts[i], starts[i] + counts[i])``."""
    offsets = np.cumsum(counts) - counts
    index = np.repeat(starts - offsets, counts)
    index += np.arange(len(index), dtype=np.int64)
    return index


def _floats(raw: np.ndarray, begin: np.ndarray, end: np.ndarray) -> RaggedFeature | None:
    sizes = end - begin
    if np.any(sizes % 4):
        return None
    values = np.take(raw, _ranges(begin, sizes)).view("<f4").astype(np.float32, copy=False)
    splits = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes // 4, out=splits[1:])
    return RaggedFeature(values, splits)


class _Workspace(threading.local):
    """Scratch arrays reused across batches (one set per thread).

    Fresh multi-megabyte temporaries cost more in page faults than the arithmetic done in them, so
    the batch decoder writes its temporaries into these instead; they grow to the largest batch seen
    (about 13 bytes per byte of records read at once) and stay.
    """

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, size: int, dtype: Any) -> np.ndarray:
        array = self._arrays.get(name)
        if array is None or len(array) < size:
            array = np.empty(max(size, len(array) * 3 // 2 if array is not None else 0), dtype=dtype)
            self._arrays[name] = array
        return array[:size]


_WORKSPACE = _Workspace()


class _VarintTable:
    """Every varint of a buffer of records, decoded at once, for the int features to pick from.

    Each byte < 0x80 ends a varint, which starts right after the previous such byte. Inside a packed
    payload, that is exactly the list's values (the first one starts after the last byte of the
    payload's length prefix, itself < 0x80). Elsewhere (headers, keys, CRCs, floats) the "varints"
    are meaningless but harmless: no feature picks them. Varints of up to 4 bytes (values < 2**28,
    every token id) are decoded here with 32-bit word tricks; longer ones are flagged and redone.
    """

    def __init__(self, raw: np.ndarray, length: int):
        work = _WORKSPACE
        self.raw = raw
        # One more byte than the buffer (padding, so "true") lets every payload end be a boundary below.
        self.is_end = np.less(raw[: length + 1], 0x80, out=work.get("is_end", length + 1, bool))
        self.ends = np.flatnonzero(self.is_end[:length])
        count = len(self.ends)
        self.sizes = sizes = work.get("sizes", count, np.int64)
        if count:
            sizes[0] = self.ends[0] + 1
            np.subtract(self.ends[1:], self.ends[:-1], out=sizes[1:])
        is_long = np.greater(sizes, 4, out=work.get("is_long", count, bool))
        self.long = np.flatnonzero(is_long) if is_long.any() else np.zeros(0, dtype=np.int64)
        # The 4-byte little-endian word ending at every byte, so that a varint read at its last byte
        # has that byte on top (np.take on the overlapping strided view itself would allocate this
        # copy on every call).
        words_at = work.get("words_at", length, np.uint32)
        for i in range(min(3, length)):
            words_at[i] = int.from_bytes(bytes(3 - i) + raw[: i + 1].tobytes(), "little")
        if length > 3:
            np.copyto(words_at[3:], np.ndarray((length - 3,), dtype="<u4", buffer=raw, strides=(1,)))
        words = np.take(words_at, self.ends, out=work.get("words", count, np.uint32), mode="clip")
        # Drop the bytes below each varint's first byte (mode="clip": sizes above 4 keep the word).
        words >>= np.take(_SHIFTS32, sizes, out=work.get("shifts", count, np.uint32), mode="clip")
        low = np.bitwise_and(words, np.uint32(0x007F007F), out=work.get("low", count, np.uint32))
        words &= np.uint32(0x7F007F00)
        words >>= np.uint32(1)
        words |= low
        np.bitwise_and(words, np.uint32(0x00003FFF), out=low)
        words &= np.uint32(0x3FFF0000)
        words >>= np.uint32(2)
        words |= low
        self.values = words

    def features(
        self, spans: Mapping[str, tuple[np.ndarray, np.ndarray]], feature_spec: Mapping[str, str]
    ) -> dict[str, RaggedFeature] | None:
        """The packed varints at ``[begin[i], end[i])`` of every record, per feature; None if malformed.

        ``spans`` must be in the records' layout order, so that all payload boundaries, record by
        record, are sorted.
        """
        names = list(spans)
        bounds = np.stack([bound for name in names for bound in spans[name]], axis=1).ravel()
        if np.any(np.diff(bounds) < 0):
            return None
        # How many varints end before each boundary: one pass of sums between boundaries (a binary
        # search of every boundary among all varint ends costs twice as much). reduceat returns the
        # element itself, not 0, for an empty segment; those are zeroed.
        between = np.add.reduceat(self.is_end.view(np.uint8), bounds, dtype=np.uint32)
        between[:-1][bounds[1:] == bounds[:-1]] = 0
        before = np.empty(len(bounds), dtype=np.int64)
        before[0] = np.count_nonzero(self.is_end[: bounds[0]])
        np.cumsum(between[:-1], out=before[1:])
        before[1:] += before[0]
        lows, highs = before.reshape(-1, len(names), 2).transpose(2, 1, 0)
        begins, ends = bounds.reshape(-1, len(names), 2).transpose(2, 1, 0)
        counts = highs - lows
        last = self.ends[np.maximum(highs - 1, 0)]
        if np.any((ends > begins) & ((counts <= 0) | (last != ends - 1))):
            return None  # a payload that does not end on a varint's last byte
        has_long = np.zeros(len(names), dtype=bool)
        if len(self.long):
            has_long[:] = (np.searchsorted(self.long, highs) > np.searchsorted(self.long, lows)).any(axis=1)
        out = {}
        for i, name in enumerate(names):
            decoded = self._feature(name, lows[i], highs[i], counts[i], feature_spec[name], bool(has_long[i]))
            if decoded is None:
                return None
            out[name] = decoded
        return out

    def _feature(
        self, name: str, low: np.ndarray, high: np.ndarray, counts: np.ndarray, dtype: str, has_long: bool
    ) -> RaggedFeature | None:
        splits = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=splits[1:])
        if has_long:
            index = _ranges(low, counts)
            sizes = self.sizes[index]
            values, error = _varints_at(self.raw, self.ends[index] - sizes + 1, sizes)
            if error is not None:
                return None
            return RaggedFeature(_cast(name, values.view(np.int64), dtype, splits), splits)
        if splits[-1] >= 16 * len(counts):
            # Long rows: copying slices beats building an index of every value.
            picked = np.concatenate(
                [self.values[a:b] for a, b in zip(low.tolist(), high.tolist(), strict=True)]
            )
        else:
            picked = np.take(self.values, _ranges(low, counts))
        # Values below 2**28 fit int32 exactly, so int32 needs no check and no copy.
        values = picked.view(np.int32) if dtype == "int32" else picked.astype(np.int64)
        return RaggedFeature(values, splits)


def _varints_at_positions(raw: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, Any]:
    """Reads one small varint (a length or tag, < 2**35) at each position.

    Returns (values, positions after them, ok): ``ok`` is True, or a boolean array that is False
    where a varint is longer than 5 bytes.
    """
    byte = raw[pos]
    more = byte >= 0x80
    if not more.any():  # the common case: every value < 128
        return byte.astype(np.int64), pos + 1, True
    values = (byte & 0x7F).astype(np.int64)
    size = 1
    while more.any():
        if size == 5:
            return values, pos + 1, ~more
        byte = raw[pos + size]
        values |= np.where(more, (byte & 0x7F).astype(np.int64) << (7 * size), 0)
        pos = pos + more
        more &= byte >= 0x80
        size += 1
    return values, pos + 1, True


# ---------------------------------------------------------------------------------------------------------
