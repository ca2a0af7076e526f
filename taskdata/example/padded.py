"""Int features of a batch of ``tf.train.Example`` records decoded straight into zero-padded arrays.

``decode_padded`` is the trainer's hot path: records that lie at spans of one buffer (a ranged read)
become one ``[records, length]`` int32 array per feature, without a Python object per record or per
value. It is a fast path only: it takes the layout of record 0 (its feature keys and kinds, in stored
order, whatever they are) and checks every byte of every record's structure against it with numpy,
one step per feature entry for all records at once; the values of the wanted features are decoded
together as varints. Whatever it cannot prove (another layout in some record, a malformed length, a
value of 2**28 or more, a row longer than its length) makes it return None, and the caller takes the
generic path (``decode_buffer`` + ``pad_features``), which decodes the records or raises the precise
error. It never returns another answer than that path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import numpy as np

from taskdata.example.batch import _WORKSPACE, _layout
from taskdata.example.wire import _INT_TAG, _varint

__all__ = ["Allocate", "decode_padded"]

# Where a feature's padded array goes: called with (name, rows, length), it returns a writable C-contiguous
# int32 array of that shape, whatever it holds (decode_padded writes every element). A read worker passes
# one that carves the arrays out of the memory it shares with the iterator, so that the batch is decoded
# where it is delivered instead of into fresh arrays copied there.
Allocate = Callable[[str, int, int], np.ndarray]


def decode_padded(
    buffer: bytes | bytearray | memoryview,
    starts: np.ndarray,
    ends: np.ndarray,
    lengths: Mapping[str, int],
    out: Allocate | None = None,
) -> dict[str, np.ndarray] | None:
    """``{name: int32 [records, lengths[name]]}``, record ``i`` read from ``buffer[starts[i]:ends[i]]``
    and its values zero-padded; None if the generic path must decide (see the module docstring).

    Spans may come in any order and repeat. Every feature of ``lengths`` must be an Int64List. With
    ``out``, every array returned is one that ``out`` gave (asked for in the order of ``lengths``); when
    None is returned, the arrays it gave hold anything.
    """
    if not lengths:
        return None  # nothing to decode, but the records are still checked: the generic path's call
    if len(starts) == 0:
        return {name: _zeros(out, name, 0, length) for name, length in lengths.items()}
    view = memoryview(buffer).cast("B")
    size = len(view)
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    first = bytes(view[int(starts[0]) : int(ends[0])])
    layout = _layout(first, 0, len(first))
    if layout is None:
        return None
    # Positions are clamped to the buffer's end once per entry; the padding holds what an entry's
    # structure can read past that (a few varints and its key).
    raw = _WORKSPACE.get("padded_records", size + 64 + max((len(key) for key, _ in layout), default=0), np.uint8)
    raw[:size] = np.frombuffer(view, dtype=np.uint8)
    raw[size:] = 0
    wanted = {name.encode("utf-8"): name for name in lengths}
    if {key: tag for key, tag in layout if key in wanted} != dict.fromkeys(wanted, _INT_TAG):
        return None
    try:
        spans = _int_payloads(raw, size, starts, ends, layout, wanted)
        if spans is None:
            return None
    except _Refused:
        return None
    names = list(lengths)
    begins = np.concatenate([spans[name][0] for name in names]).tolist()
    ends_of = np.concatenate([spans[name][1] for name in names]).tolist()
    payloads = b"".join(map(view.__getitem__, map(slice, begins, ends_of)))
    return _varint_rows(payloads, [spans[name][1] - spans[name][0] for name in names], lengths, out)


def _zeros(out: Allocate | None, name: str, rows: int, length: int) -> np.ndarray:
    if out is None:
        return np.zeros((rows, length), dtype=np.int32)  # calloc: fresh pages come zeroed
    array = out(name, rows, length)
    if array.shape != (rows, length) or array.dtype != np.int32 or not array.flags.c_contiguous:
        raise ValueError(f"out gave a {array.dtype} array of shape {array.shape} for feature {name!r}, "
                         f"which needs a C-contiguous int32 array of shape {(rows, length)}.")
    array.fill(0)
    return array


class _Refused(Exception):
    """Records this path does not take (a length of 2**21 or more)."""


def _int_payloads(
    raw: np.ndarray, size: int, starts: np.ndarray, ends: np.ndarray, layout: list[tuple[bytes, int]],
    wanted: Mapping[bytes, str],
) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """(begin, end) of the packed values of each wanted feature in every record; None unless every
    record is exactly ``Example{features{entry...}}`` with ``layout``'s entries, in order, and nothing else.

    Each entry is ``0A len 0A len(key) key 12 len Feature``; a wanted one's Feature is ``1A len`` then
    an empty Int64List or ``0A len values``. Every length must end exactly where its message ends.
    """
    words = np.ndarray((len(raw) - 3,), dtype="<u4", buffer=raw, strides=(1,))
    checks = [raw[starts] == 0x0A]
    length, pos = _lengths_at(raw, words, starts + 1)
    checks.append(pos + length == ends)
    found = {}
    for key, _tag in layout:
        checks.append(raw[pos] == 0x0A)
        length, pos = _lengths_at(raw, words, pos + 1)
        entry_end = np.minimum(pos + length, size + 1)
        prefix = np.frombuffer(b"\x0a" + _varint(len(key)) + key + b"\x12", dtype=np.uint8)
        checks.append((raw[pos[:, None] + np.arange(len(prefix))] == prefix).all(axis=1))
        length, pos = _lengths_at(raw, words, pos + len(prefix))
        checks.append(pos + length == entry_end)
        name = wanted.get(key)
        if name is not None:
            checks.append(raw[pos] == _INT_TAG)
            length, pos = _lengths_at(raw, words, pos + 1)
            checks.append(pos + length == entry_end)
            # An empty Int64List has no packed field: its payload is empty.
            nonempty = pos < entry_end
            checks.append(~nonempty | (raw[pos] == 0x0A))
            length, payload = _lengths_at(raw, words, pos + 1)
            checks.append(~nonempty | (payload + length == entry_end))
            found[name] = (np.where(nonempty, payload, entry_end), entry_end)
        pos = entry_end
    checks.append(pos == ends)
    if not np.logical_and.reduce(checks, axis=None):
        return None
    return found


def _lengths_at(raw: np.ndarray, words: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, position after it) of the varint at each of ``pos``; ``_Refused`` if one is longer than
    3 bytes (2**21 or more: no length of a record this path takes).

    Lengths of one or two bytes (below 16,384: every length but a whole record's of more than 16 KB) are
    one lookup of the 16-bit word at each position; longer ones are put together from 32-bit words.
    """
    small = _SMALL_VARINTS[words[pos] & 0xFFFF]
    if small.min() >= 0:
        return small & 0xFFFF, pos + (small >> 16)
    word = words[pos].astype(np.int64)
    more = (word >> 7) & 1
    more2 = more & (word >> 15)
    if np.any(more2 & (word >> 23)):
        raise _Refused
    value = (word & 0x7F) | (((word >> 8) & 0x7F) << 7) * more | (((word >> 16) & 0x7F) << 14) * more2
    return value, pos + 1 + more + more2


def _small_varints() -> np.ndarray:
    """The varint that starts with each 16-bit little-endian word, if it has one or two bytes: its value
    plus its size times 2**16; -1 if it has three bytes or more."""
    word = np.arange(1 << 16, dtype=np.int32)
    first, second = word & 0xFF, word >> 8
    two_bytes = np.where(second < 0x80, (first & 0x7F) | (second << 7) | (2 << 16), -1)
    return np.where(first < 0x80, first | (1 << 16), two_bytes).astype(np.int32)


_SMALL_VARINTS = _small_varints()


@functools.lru_cache(maxsize=16)
def _filled_rows(length: int) -> np.ndarray:
    """Row ``n`` is the mask of a padded row of ``length`` that holds ``n`` values (read-only: shared)."""
    rows = np.less(np.arange(length)[None, :], np.arange(length + 1)[:, None])
    rows.setflags(write=False)
    return rows


def _varint_rows(
    data: bytes, row_bytes: list[np.ndarray], lengths: Mapping[str, int], out: Allocate | None = None
) -> dict[str, np.ndarray] | None:
    """Decodes ``data``: for each feature of ``lengths`` in turn, one packed varint payload per record,
    of ``row_bytes[f][i]`` bytes. None if a payload does not end on a varint's last byte, a value needs
    more than 4 bytes (2**28 or more) or a row has more values than its length.

    Each byte < 0x80 ends a varint, which starts right after the previous one. Values of one or two
    bytes (below 16,384) are worked out at every byte from it and the byte before it (a continuation
    byte there is the varint's first byte, any other byte ends the varint before), in whole-buffer
    steps, then taken at each varint's last byte: one gather. (Two gathers at each varint's first and
    last bytes made the whole function ~30% dearer: a gather costs ~0.7 ns an element, a whole-buffer step ~0.1.)
    When there are longer ones (a larger vocabulary's ids), those are put together from 32-bit words at
    their first bytes. Temporaries live in the thread's workspace: fresh arrays of this size cost more
    in page faults than the arithmetic done in them.
    """
    work = _WORKSPACE
    total = len(data)
    # One zero byte before the data, so that every data byte has a byte before it; 3 after, for 32-bit words.
    raw = work.get("padded_raw", total + 4, np.uint8)
    raw[0] = 0
    data_bytes, before_bytes = raw[1 : total + 1], raw[:total]
    data_bytes[:] = np.frombuffer(data, dtype=np.uint8)
    raw[total + 1 :] = 0
    bounds = np.concatenate(([0], np.cumsum(np.concatenate(row_bytes))))
    nonempty = np.flatnonzero(np.diff(bounds))
    if len(nonempty) and data_bytes[bounds[nonempty + 1] - 1].max() >= 0x80:
        return None  # a payload ends inside a varint
    varint_ends = np.flatnonzero(np.less(data_bytes, 0x80, out=work.get("padded_is_end", total, bool)))
    # At each byte: 1 if the byte before it continues a varint; then the value of a varint of one or two
    # bytes that would end here: this byte shifted by 7 if so, plus the byte before's low 7 bits.
    continued = np.right_shift(before_bytes, 7, out=work.get("padded_continued", total, np.uint8))
    shift = np.multiply(continued, 7, out=work.get("padded_shift", total, np.uint8))
    two_bytes = np.left_shift(data_bytes, shift, out=work.get("padded_two_bytes", total, np.uint16), dtype=np.uint16)
    low = np.bitwise_and(before_bytes, 0x7F, out=work.get("padded_low", total, np.uint8))
    low *= continued
    two_bytes |= low
    values = np.take(two_bytes, varint_ends, out=work.get("padded_values", len(varint_ends), np.uint16))
    # Two continuation bytes in a row belong to one varint of 3 bytes or more.
    both = np.bitwise_and(before_bytes, data_bytes, out=low)
    if both.max(initial=0) >= 0x80:
        firsts = np.concatenate(([0], varint_ends[:-1] + 1))
        sizes = varint_ends - firsts
        longer = np.flatnonzero(sizes >= 2)
        if sizes[longer].max() >= 4:
            return None  # a varint of 5 bytes or more
        word = np.ndarray((total,), dtype="<u4", buffer=raw[1:], strides=(1,))[firsts[longer]].astype(np.int32)
        # 3 or 4 bytes: the 7-bit groups of bytes 0-2, and byte 3's if byte 2 continues.
        fourth = (word >> 23) & 1
        values = values.astype(np.int32)
        values[longer] = ((word & 0x7F) | ((word >> 1) & (0x7F << 7)) | ((word >> 2) & (0x7F << 14))
                          | ((word >> 3) & (0x7F << 21)) * fourth)  # fmt: skip
    before = np.searchsorted(varint_ends, bounds)  # varints that end before each row's first byte
    features = {}
    records = len(row_bytes[0])
    for f, (name, length) in enumerate(lengths.items()):
        first = before[f * records : (f + 1) * records + 1]
        counts = np.diff(first)
        if counts.max() > length:
            return None  # the generic path names the feature and the length
        padded = _zeros(out, name, records, length)
        filled = np.take(_filled_rows(length), counts, axis=0,
                         out=work.get("padded_filled", records * length, bool).reshape(records, length))
        padded[filled] = values[first[0] : first[-1]]
        features[name] = padded
    return features
