"""``decode_example``: a generic parser of one ``tf.train.Example``.

It accepts anything a protobuf library would write (packed or unpacked lists, any order, unknown
fields); ``taskdata.example.batch`` decodes many records of one layout at once and falls back to it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

import numpy as np

from taskdata.example.wire import Value, _iter_fields, _packed_varints

__all__ = ["decode_example"]

# ---------------------------------------------------------------------------------------------------------
# Generic decoding (any valid serialization)


def decode_example(data: bytes, features: Collection[str] | None = None) -> dict[str, Value]:
    """Parses a serialized ``tf.train.Example`` into ``{name: values}``.

    Int64List -> int64 array, FloatList -> float32 array, BytesList -> list of bytes; a feature with
    no kind set -> ``[]``. Malformed input raises ValueError saying what and where. With ``features``,
    only those are parsed and returned (the others are skipped by their lengths, unparsed: reading two
    small features of a record with 600 tokens costs a few microseconds).
    """
    decoded = _decode_example(bytes(data), features)
    if features is None:
        # With wanted=None every value is parsed, so none is None; the helper's type covers both uses.
        return decoded  # type: ignore[return-value]
    return {name: value for name, value in decoded.items() if value is not None}


def _decode_example(data: bytes, wanted: Collection[str] | None) -> dict[str, Value | None]:
    """:func:`decode_example`, parsing only the values of ``wanted`` features (others map to None).

    Features outside ``wanted`` are skipped unparsed, as ``tf.io.parse_example`` skips features that
    are not in its spec, so a damaged feature nobody asked for does not fail a batch.
    """
    features: dict[str, Value | None] = {}
    for field, wire, start, end in _iter_fields(data, 0, len(data), "Example"):
        if field == 1 and wire == 2:
            # Repeated occurrences of a message field merge; map entries with the same key: last wins.
            for key, value in _parse_features(data, start, end, wanted):
                features[key] = value
        elif field == 1:
            raise ValueError(
                f"Example.features at byte {start} has wire type {wire}, expected 2 (a message)."
            )
    return features


def _parse_features(
    data: bytes, start: int, end: int, wanted: Collection[str] | None
) -> Iterator[tuple[str, Value | None]]:
    for field, wire, entry_start, entry_end in _iter_fields(data, start, end, "Features"):
        if field != 1:
            continue
        if wire != 2:
            raise ValueError(f"Features.feature at byte {entry_start} has wire type {wire}, expected 2.")
        key = b""
        value_spans = []
        for f, w, s, e in _iter_fields(data, entry_start, entry_end, "a Features map entry"):
            if f == 1 and w == 2:
                key = data[s:e]
            elif f == 2 and w == 2:
                value_spans.append((s, e))
            elif f in (1, 2):
                raise ValueError(
                    f"A Features map entry has field {f} with wire type {w} at byte {s}, expected 2."
                )
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"Feature name {key!r} at byte {entry_start} is not valid UTF-8.") from err
        if wanted is not None and name not in wanted:
            yield name, None
            continue
        feature: tuple[str | None, list[Any]] = (None, [])
        for s, e in value_spans:  # a repeated message field merges
            feature = _parse_feature(data, s, e, name, feature)
        yield name, _finish_feature(feature)


def _parse_feature(
    data: bytes, start: int, end: int, name: str, merged: tuple[str | None, list[Any]]
) -> tuple[str | None, list[Any]]:
    kind, parts = merged
    where = f"feature {name!r}"
    for field, wire, s, e in _iter_fields(data, start, end, where):
        if field not in (1, 2, 3):
            continue
        if wire != 2:
            raise ValueError(
                f"In {where}: the list field {field} at byte {s} has wire type {wire}, expected 2."
            )
        new_kind = ("bytes", "float", "int")[field - 1]
        if new_kind != kind:  # a different member of the oneof replaces the previous one
            kind, parts = new_kind, []
        parts.extend(_parse_list(data, s, e, new_kind, where))
    return kind, parts


def _parse_list(data: bytes, start: int, end: int, kind: str, where: str) -> Iterator[Any]:
    for field, wire, s, e in _iter_fields(data, start, end, f"the {kind} list of {where}"):
        if field != 1:
            continue
        if kind == "bytes" and wire == 2:
            yield data[s:e]
        elif kind == "int" and wire == 2:
            yield _packed_varints(data, s, e, where)
        elif kind == "int" and wire == 0:
            yield np.array([s], dtype=np.uint64).view(np.int64)
        elif kind == "float" and wire in (2, 5):
            if (e - s) % 4:
                raise ValueError(
                    f"In {where}: packed floats at byte {s} take {e - s} bytes, not a multiple of 4."
                )
            yield np.frombuffer(data, dtype="<f4", count=(e - s) // 4, offset=s)
        else:
            raise ValueError(f"In {where}: a {kind} list value at byte {s} has the wrong wire type {wire}.")


def _finish_feature(feature: tuple[str | None, list[Any]]) -> Value:
    kind, parts = feature
    if kind == "bytes":
        return list(parts)
    if kind == "int":
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if kind == "float":
        return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, dtype=np.float32)
    return []
