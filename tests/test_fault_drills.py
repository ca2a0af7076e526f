"""The cache fault drills (deploy/fault_drills/cache.py), CI-sized: every count they report must be perfect.

``python deploy/faults.py --only cache-`` runs them full size; RELIABILITY.md records those figures.
"""

from __future__ import annotations

import pytest

from deploy import faults
from deploy.fault_drills import cache


def test_the_runner_finds_every_cache_drill():
    names = [name for name, _ in faults.drills()]
    assert {name for name, _ in cache.DRILLS} <= set(names) and len(names) == len(set(names))


@pytest.mark.slow
def test_byte_flips_in_every_stratum_are_detected_and_located_by_verify_and_the_reader():
    counts = cache.byte_flips(per_stratum=15, seed=3)
    assert counts.pop("ok") is True
    for stratum in ("length", "length_crc", "payload", "payload_crc", "last_record"):
        assert counts[stratum] == {key: 15 for key in counts[stratum]}, (stratum, counts[stratum])


@pytest.mark.slow
def test_structural_damage_is_detected_and_located():
    counts = cache.structural_damage(truncations=4, swaps=4, seed=3)
    assert counts.pop("ok") is True
    total = counts.pop("total")
    assert total["cases"] >= 30
    for case, found in counts.items():
        assert found["detected"] == found["located"] == found["cases"], (case, found)


@pytest.mark.slow
def test_a_shard_truncated_under_a_reading_process_is_an_error_naming_the_record():
    counts = cache.truncate_under_reader(rounds=4, seed=3)
    assert counts == {"rounds": 4, "corrupt_record_error": 4, "named_the_cut_record": 4, "killed_by_a_signal": 0,
                      "ok": True}


@pytest.mark.slow
def test_a_kill_between_completed_and_current_is_caught_by_plan_and_finished_by_the_rerun():
    counts = cache.kill_between_completed_and_current(rounds=1)
    assert counts == {**dict.fromkeys(counts, 1), "ok": True}


@pytest.mark.timeout(900)  # longer than the default: minutes on a loaded machine
@pytest.mark.slow
@pytest.mark.parametrize("multi_process", [False, True])
def test_random_sigkills_never_leave_a_partial_cache_that_looks_complete(multi_process):
    counts = cache.sigkill(kills=2, seed=5, multi_process=multi_process, max_attempts=6)
    assert counts["killed"] >= 1 and counts["ok"] is (counts["killed"] == 2)
    assert counts["complete_looking_but_failing_verify"] == counts["current_not_naming_a_complete_version"] == 0
    assert counts["rerun_byte_identical_to_unkilled_build"] == 1


@pytest.mark.slow
def test_killed_jobs_versions_are_removed_and_the_live_and_complete_ones_kept():
    counts = cache.abandoned_versions(kills=3, stale_after_s=2.0, seed=5)
    assert counts["removed"] == counts["removals_logged"] == counts["incomplete_versions_left_by_killed_jobs"]
    assert counts["complete_versions_removed"] == counts["incomplete_versions_left_after_cleanup"] == 0
    assert counts["live_version_kept"] == 1 and counts["ok"] is True
