"""The shared-state drills (deploy/fault_drills/shared_state.py), CI-sized: every count they report must be perfect.

``python deploy/faults.py --only state-`` runs them full size; RELIABILITY.md records those figures.
"""

from __future__ import annotations

import pytest

from deploy import faults
from deploy.fault_drills import shared_state

pytestmark = pytest.mark.slow


def test_the_runner_finds_every_shared_state_drill():
    names = [name for name, _ in faults.drills()]
    assert {name for name, _ in shared_state.DRILLS} <= set(names) and len(names) == len(set(names))


@pytest.mark.parametrize("kind", ["local", "gcs"])
def test_processes_appending_stages_at_once_lose_no_acknowledged_stage(kind):
    figures = shared_state.stage_appends(kind, processes=4, rounds=4)
    assert figures["ok"], figures
    assert figures["acknowledged"] + figures["refused_changed_409"] + figures["refused_other"] == 16
    assert figures["acknowledged_lost"] == figures["refused_but_stored"] == figures["watched_not_an_extension"] == 0


@pytest.fixture(scope="module")
def replicas():
    with shared_state.replicas_of_one_root(3) as running:
        yield running


def test_stages_through_three_replicas_lose_nothing_and_replicas_never_answer_a_step_differently(replicas):
    figures = shared_state.http_stage_appends(processes=4, rounds=4, replicas=replicas)
    assert figures["ok"], figures
    assert figures["refused_served_409"] >= 1  # the stages at a step already answered: refused, not applied
    assert figures["answers_disagreeing"] == figures["answers_unlike_the_final_plan"] == 0


def test_creating_one_name_through_three_replicas_at_once_acknowledges_one_plan(replicas):
    figures = shared_state.http_creates(processes=4, rounds=3, replicas=replicas)
    assert figures["ok"], figures
    assert figures["statuses"]["201"] == 3 and figures["acknowledged_not_stored"] == 0


def test_two_cache_jobs_of_one_task_at_once_leave_one_current_naming_a_complete_version():
    figures = shared_state.cache_current(jobs=2, rounds=1)
    assert figures["ok"], figures
    assert figures["rounds_with_one_mover"] == 1 and figures["current_failing_verify"] == 0
