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
    limits = [int(c) for c in capacity]
    closed: list[list[int]] = []
    members: list[list[int]] = []
    room: list[list[int]] = []  # free tokens per feature of each open row, oldest row first
    for index, size in enumerate(sizes.tolist()):
        for row, free in enumerate(room):
            if all(s <= f for s, f in zip(size, free, strict=True)):
                members[row].append(index)
                room[row] = [f - s for f, s in zip(free, size, strict=True)]
                break
        else:
            if len(members) == open_rows:
                closed.append(members.pop(0))
                room.pop(0)
            members.append([index])
            room.append([c - s for c, s in zip(limits, size, strict=True)])
    return closed + members


def assemble_row(examples: Sequence[Mapping[str, np.ndarray]], lengths: Mapping[str, int]) -> dict[str, np.ndarray]:
    """The packed row of ``examples`` (in segment order): tokens, segment ids and positions per feature."""
    row: dict[str, np.ndarray] = {}
    for key, length in lengths.items():
        parts = [np.asarray(example[key]) for example in examples]
        sizes = np.array([part.shape[0] for part in parts], dtype=np.int64)
        used = int(sizes.sum())
        if used > length:
            raise ValueError(f"Feature {key!r}: {used} tokens do not fit a row of {length}.")
        tokens = np.zeros(length, dtype=parts[0].dtype if parts else np.int32)
        segment_ids = np.zeros(length, dtype=np.int32)
        positions = np.zeros(length, dtype=np.int32)
        if used:
            tokens[:used] = np.concatenate(parts)
            segment_ids[:used] = np.repeat(np.arange(1, len(parts) + 1, dtype=np.int32), sizes)
            starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
            positions[:used] = np.arange(used, dtype=np.int32) - starts
        row[key] = tokens
        row[segment_ids_name(key)] = segment_ids
        row[positions_name(key)] = positions
    return row


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
