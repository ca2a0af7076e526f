"""Seeds and shuffle keys derived by hashing stable names (never from processing order).

A stable example id is a tuple of plain values, e.g. ``("c4_span_corruption", "train", 3, 1207)``
for the 1207th example that source shard 3 produces. Everything random about that example (its
preprocessing RNG, its shuffle key) is a keyed hash of (seed, stable id), so it does not depend on
which worker produced it, in which order, or how many workers there were.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

__all__ = [
    "check_seed",
    "derive_seed",
    "example_rng",
    "format_example_id",
    "parse_example_id",
    "seed_hasher",
    "stable_id_bytes",
]

_MAX_SEED = 2**63 - 1


def check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"A seed must be an integer in [0, 2**63) but got {seed!r}.")
    return seed


def stable_id_bytes(*parts: str | int) -> bytes:
    """An unambiguous byte encoding of a stable id (length-prefixed, typed parts)."""
    out = bytearray()
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, str | int):
            raise TypeError(f"Stable id parts must be str or int but got {type(part).__name__}: {part!r}")
        if isinstance(part, int):
            out += b"i" + struct.pack("<q", part)
        else:
            encoded = part.encode("utf-8")
            out += b"s" + struct.pack("<I", len(encoded)) + encoded
    return bytes(out)


def derive_seed(seed: int, *parts: str | int) -> int:
    """A 64-bit value that is a keyed hash of (seed, parts): the same everywhere, for any process."""
    return struct.unpack("<Q", seed_hasher(seed, *parts).digest())[0]


def seed_hasher(seed: int, *parts: str | int) -> hashlib.blake2b:
    """``derive_seed``'s keyed hash with ``parts`` fed in. The id's bytes are its parts' bytes in a row, so
    a copy updated with ``stable_id_bytes(*more)`` digests to ``derive_seed(seed, *parts, *more)``: ids that
    share a prefix (every example of a source shard) need not hash it again."""
    check_seed(seed)
    return hashlib.blake2b(stable_id_bytes(*parts), digest_size=8, key=struct.pack("<Q", seed), person=b"taskdata")


def example_rng(seed: int, *parts: str | int) -> np.random.Generator:
    """A local RNG for one example (or one stage of one example), seeded from (seed, stable id)."""
    return np.random.Generator(np.random.Philox(key=derive_seed(seed, *parts)))


def format_example_id(task: str, split: str, shard_index: int, ordinal: int) -> str:
    """The printable stable id of an example: ``task/split/shard/ordinal`` (names never contain '/').

    This is the id written into the cache's provenance features and the key a multi-host inference
    job writes its predictions under.
    """
    return f"{task}/{split}/{shard_index}/{ordinal}"


def parse_example_id(example_id: str) -> tuple[str, str, int, int]:
    parts = example_id.split("/")
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
        raise ValueError(
            f"Invalid example id {example_id!r}: expected 'task/split/shard/ordinal', e.g. "
            "'c4_span_corruption/validation/3/1207'."
        )
    return parts[0], parts[1], int(parts[2]), int(parts[3])
