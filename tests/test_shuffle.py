"""Shuffle keys: keyed hashes of (seed, stable id), computed per source shard from a kept prefix hash."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.cache.shuffle import shard_of_key, shuffle_key
from taskdata.seeding import derive_seed, seed_hasher, stable_id_bytes


def test_shuffle_keys_are_pinned_values_and_another_seed_gives_others():
    keys = [shuffle_key(0, "c4_span_corruption", "train", 0, ordinal) for ordinal in range(3)]
    assert keys == [9980778418762526334, 94350344615903682, 8716623280216866324]
    other = [shuffle_key(1, "c4_span_corruption", "train", 0, ordinal) for ordinal in range(3)]
    assert other == [3887334688606335206, 2568027219454742489, 9884828227621359131]
    assert sorted(range(3), key=keys.__getitem__) != sorted(range(3), key=other.__getitem__)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), task=st.text(max_size=20), split=st.sampled_from(["train", "validation"]),
       shard=st.integers(0, 10**6), ordinals=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=5))
def test_a_kept_prefix_hash_gives_derive_seeds_key(seed, task, split, shard, ordinals):
    for ordinal in ordinals:
        assert shuffle_key(seed, task, split, shard, ordinal) == derive_seed(seed, "shuffle", task, split, shard, ordinal)


def test_a_copied_prefix_hasher_extended_by_more_parts_digests_to_the_whole_ids_seed():
    prefix = seed_hasher(7, "stage", "task")
    extended = prefix.copy()
    extended.update(stable_id_bytes("split", 3))
    assert int.from_bytes(extended.digest(), "little") == derive_seed(7, "stage", "task", "split", 3)
    assert int.from_bytes(prefix.digest(), "little") == derive_seed(7, "stage", "task")  # the copy left it alone


@pytest.mark.parametrize("seed", [True, -1, 2**63, 1.0])
def test_bad_seeds_are_refused_even_after_a_good_seed_was_kept(seed):
    shuffle_key(1, "t", "train", 0, 0)  # keeps the prefix hash of seed 1, which True must not reuse
    with pytest.raises(ValueError, match=r"A seed must be an integer in \[0, 2\*\*63\)"):
        shuffle_key(seed, "t", "train", 0, 0)


def test_keys_fall_into_their_key_range_shard():
    assert [shard_of_key(k, 4) for k in (0, 2**62 - 1, 2**62, 2**64 - 1)] == [0, 0, 1, 3]
