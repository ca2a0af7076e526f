"""SplitMix64 (Steele, Lea and Flood, 2014): its constants and its finalizer, on Python ints and numpy arrays.

The finalizer ``mix64`` is a bijection of 64-bit integers whose every output bit depends on every input
bit. Output ``i`` of the generator seeded with ``s`` is ``mix64(s + (i + 1) * GAMMA)`` (mod 2**64), so any
output is computed directly from (seed, index). The index math's permutations use the finalizer as their
round function (``taskdata.index.orders``); the counter-based preprocessors use the generator's outputs
(``taskdata.preprocessors.counter_random``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["GAMMA", "MUL1", "MUL2", "mix64", "mix64_array", "outputs"]

# The generator's increment (2**64 / golden ratio) and the finalizer's two multipliers.
GAMMA = 0x9E3779B97F4A7C15
MUL1 = 0xBF58476D1CE4E5B9
MUL2 = 0x94D049BB133111EB
_M64 = (1 << 64) - 1
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_U_GAMMA, _U_MUL1, _U_MUL2 = np.uint64(GAMMA), np.uint64(MUL1), np.uint64(MUL2)


def mix64(x: int) -> int:
    """The finalizer of one integer in [0, 2**64)."""
    x = ((x ^ (x >> 30)) * MUL1) & _M64
    x = ((x ^ (x >> 27)) * MUL2) & _M64
    return x ^ (x >> 31)


def mix64_array(z: np.ndarray) -> np.ndarray:
    """The finalizer of every entry of a uint64 array (whose arithmetic wraps as ``& _M64`` does), in place."""
    z ^= z >> _S30
    z *= _U_MUL1
    z ^= z >> _S27
    z *= _U_MUL2
    z ^= z >> _S31
    return z


def outputs(seeds: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Output ``indices`` of the generators seeded with ``seeds`` (uint64, broadcast)."""
    return mix64_array(seeds + (indices.astype(np.uint64) + np.uint64(1)) * _U_GAMMA)
