"""Packing several examples into one fixed-length row, in t5x's feature layout (pure functions).

A packed row holds, for every packed feature ``k`` of length ``L``: ``k`` (the examples' tokens one after
another, zero-padded to ``L``), ``k_segment_ids`` (1 for the row's first example, 2 for its second, ...;
0 on padding) and ``k_positions`` (0, 1, ... within each example; 0 on padding): what seqio's
``trim_and_pack_dataset`` produces and t5x's feature converters read. Segment ``s`` is the same example in
every feature of the row, also where that example has no tokens in a feature (seqio then numbers that
feature's segments one lower, so its encoder and decoder ids would disagree).

Which examples share a row is decided from their lengths alone (``plan_rows``), in the order given, so
it is a pure function of that order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "assemble_row",
    "assemble_rows",
    "packed_feature_names",
    "plan_rows",
    "positions_name",
    "segment_ids_name",
    "trim_to_length",
    "unpack_row",
]


def segment_ids_name(feature: str) -> str:
    return f"{feature}_segment_ids"


def positions_name(feature: str) -> str:
    return f"{feature}_positions"


def packed_feature_names(features: Sequence[str]) -> list[str]:
    """``k``, ``k_segment_ids``, ``k_positions`` for every packed feature ``k``."""
    return [name for k in features for name in (k, segment_ids_name(k), positions_name(k))]


def trim_to_length(value: np.ndarray, length: int, eos_id: int | None) -> np.ndarray:
    """``value`` cut to ``length`` tokens by the task's rule: with ``eos_id`` (an ``add_eos`` feature) the
    first ``length - 1`` tokens then EOS, as seqio's ``append_eos_after_trim``; else the first ``length``."""
    if value.shape[0] <= length:
        return value
    if eos_id is None:
        return value[:length]
    out = value[:length].copy()
    out[-1] = eos_id
    return out


def plan_rows(sizes: np.ndarray, capacity: Sequence[int], open_rows: int) -> list[list[int]]:
    """Which examples share a row: lists of indices into ``sizes`` ([examples, features] token counts).

    First fit over a window of at most ``open_rows`` open rows, taking the examples in the order given:
    an example goes into the oldest open row where every feature still fits; if none has room, a new row
    is opened, closing the oldest open row first when ``open_rows`` are open. Rows are returned in the
    order they close (the rows still open at the end last, oldest first), and every row lists its examples
    in the order they came. ``open_rows=1`` is next fit, seqio's greedy packing.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.ndim != 2 or sizes.shape[1] != len(capacity):
        raise ValueError(f"sizes must be [examples, {len(capacity)}] token counts but has shape {sizes.shape}.")
    if isinstance(open_rows, bool) or not isinstance(open_rows, int) or open_rows < 1:
        raise ValueError(f"open_rows must be a positive integer but got {open_rows!r}.")
    too_long = np.flatnonzero((sizes > np.asarray(capacity, dtype=np.int64)).any(axis=1))
    if too_long.size:
        i = int(too_long[0])
        raise ValueError(f"Example {i} has {sizes[i].tolist()} tokens, more than a row holds ({list(capacity)}); "
                         "trim examples to the row lengths before planning rows.")
    # Each row's free tokens, all features in one int: field f is bits [f * width, (f + 1) * width), and
    # the top bit of every field is a guard, so "every feature fits" is one subtraction (no borrow can
    # cross a field): (free + guards - size) & guards == guards exactly when free_f >= size_f for all f.
    width = max(int(c) for c in capacity).bit_length() + 1
    guards = sum(1 << (f * width + width - 1) for f in range(len(capacity)))
    weights = np.array([1 << (f * width) for f in range(len(capacity))], dtype=object)
    full = int(np.asarray(capacity, dtype=object) @ weights)
    closed: list[list[int]] = []
    members: list[list[int]] = []
    room: list[int] = []  # of each open row, oldest row first
    for index, size in enumerate((sizes.astype(object) @ weights).tolist() if len(sizes) else []):
        for row, free in enumerate(room):
            if (free + guards - size) & guards == guards:
                members[row].append(index)
                room[row] = free - size
                break
        else:
            if len(members) == open_rows:
                closed.append(members.pop(0))
                room.pop(0)
            members.append([index])
            room.append(full - size)
    return closed + members


def assemble_rows(
    tokens: Mapping[str, tuple[np.ndarray, np.ndarray]], rows: Sequence[Sequence[int]], lengths: Mapping[str, int]
) -> dict[str, np.ndarray]:
    """The packed rows ``rows`` (lists of example indices, in segment order) as [rows, length] arrays.

    ``tokens[k]`` is feature ``k`` of every example as (flat values, row splits): example ``i`` holds
    ``values[splits[i]:splits[i + 1]]``. Gives ``k``, ``k_segment_ids`` and ``k_positions`` per feature.
    """
    order = np.fromiter((i for row in rows for i in row), dtype=np.int64)
    row_sizes = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    row_of = np.repeat(np.arange(len(rows)), row_sizes)
    first = np.cumsum(row_sizes) - row_sizes  # where each row's examples start in ``order``
    segment = np.arange(len(order)) - np.repeat(first, row_sizes) + 1
    out: dict[str, np.ndarray] = {}
    for key, length in lengths.items():
        values, splits = tokens[key]
        sizes = splits[1:][order] - splits[:-1][order]
        ends = np.cumsum(sizes)
        starts = ends - sizes  # of each example's tokens in the concatenation of all rows
        offset = starts - starts[first][row_of] if len(order) else starts  # within its row
        if len(order) and (offset + sizes > length).any():
            i = int(np.flatnonzero(offset + sizes > length)[0])
            raise ValueError(f"Feature {key!r}: row {int(row_of[i])}'s tokens do not fit a row of {length}.")
        total = int(ends[-1]) if len(order) else 0
        within = np.arange(total) - np.repeat(starts, sizes)  # position of each token in its example
        source = np.repeat(splits[:-1][order], sizes) + within
        dest_row, dest_col = np.repeat(row_of, sizes), np.repeat(offset, sizes) + within
        packed = np.zeros((len(rows), length), dtype=values.dtype)
        packed[dest_row, dest_col] = values[source]
        segment_ids = np.zeros((len(rows), length), dtype=np.int32)
        segment_ids[dest_row, dest_col] = np.repeat(segment, sizes)
        positions = np.zeros((len(rows), length), dtype=np.int32)
        positions[dest_row, dest_col] = within
        out[key], out[segment_ids_name(key)], out[positions_name(key)] = packed, segment_ids, positions
    return out


def assemble_row(examples: Sequence[Mapping[str, np.ndarray]], lengths: Mapping[str, int]) -> dict[str, np.ndarray]:
    """The packed row of ``examples`` (in segment order): tokens, segment ids and positions per feature."""
    tokens = {}
    for key in lengths:
        parts = [np.asarray(example[key]) for example in examples]
        splits = np.concatenate([[0], np.cumsum([part.shape[0] for part in parts])]).astype(np.int64)
        tokens[key] = (np.concatenate(parts) if parts else np.zeros(0, np.int64), splits)
    return {name: array[0] for name, array in assemble_rows(tokens, [list(range(len(examples)))], lengths).items()}


def unpack_row(row: Mapping[str, np.ndarray], features: Sequence[str], num_segments: int) -> list[dict[str, np.ndarray]]:
    """The examples of a packed row, segment 1 first: for each, every feature's tokens of that segment."""
    out: list[dict[str, np.ndarray]] = [{} for _ in range(num_segments)]
    for key in features:
        tokens = np.asarray(row[key])
        segment_ids = np.asarray(row[segment_ids_name(key)])
        if segment_ids.shape != tokens.shape:
            raise ValueError(f"Feature {key!r}: {segment_ids.shape[0]} segment ids for {tokens.shape[0]} tokens.")
        if segment_ids.size and int(segment_ids.max()) > num_segments:
            raise ValueError(f"Feature {key!r} has segment id {int(segment_ids.max())} in a row of {num_segments} "
                             "examples.")
        for s in range(num_segments):
            out[s][key] = tokens[segment_ids == s + 1]
    return out
