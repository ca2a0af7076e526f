"""Stages: rates and batch schedules that change at a step, prefix-stable, with each task's stream unbroken.

The reference (``brute_stream``) walks the run step by step and example by example: it switches to a
stage's rates and schedule at its start step and hands each task its next example from a counter, so a
task's stream continues across stages by construction. ``RunPlan`` computes the same in closed form.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.index import (
    BatchSchedule,
    Mixing,
    PlanError,
    RunPlan,
    SkipRange,
    Stage,
    TaskCache,
    assign,
    examples_at,
    global_batch,
    locate_example,
)
from tests.index_references import range_task_positions, reference_assign, reference_examples

D = 2  # data shards of every drawn plan


def make_plan(stages: tuple[Stage, ...] = (), **overrides: Any) -> RunPlan:
    fields: dict[str, Any] = {
        "name": "staged",
        "mixture": "mix",
        "caches": {"a": TaskCache("fp_a", (4, 3, 5)), "b": TaskCache("fp_b", (2, 1)), "c": TaskCache("fp_c", (7,))},
        "rates": {"a": 2, "b": 1, "c": 1},
        "seed": 42,
        "schedule": BatchSchedule.constant(4),
        "num_data_shards": 2,
        "stages": stages,
    }
    fields.update(overrides)
    return RunPlan(**fields)


def brute_batch_sizes(plan: RunPlan, num_steps: int) -> list[int]:
    starts = {stage.start: stage for stage in plan.stages}
    schedule, origin, sizes = plan.schedule, 0, []
    for step in range(num_steps):
        stage = starts.get(step)
        if stage is not None and stage.schedule is not None:
            schedule, origin = stage.schedule, step
        sizes.append(schedule.batch_size(step - origin))
    return sizes


def brute_stream(plan: RunPlan, num_steps: int) -> list[tuple[int, int]]:
    """(task, task position) of every position of steps ``0 .. num_steps - 1``, example by example."""
    starts = {stage.start: stage for stage in plan.stages}
    names = plan.task_names
    taken = [0] * len(names)
    rates = [plan.rates[n] for n in names]
    out: list[tuple[int, int]] = []
    local = 0
    for step, size in enumerate(brute_batch_sizes(plan, num_steps)):
        stage = starts.get(step)
        if step == 0 or (stage is not None and stage.rates is not None):
            if step:
                rates = [stage.rates[n] for n in names]
            active = [t for t, r in enumerate(rates) if r > 0]
            mixing = Mixing.from_rates([rates[t] for t in active])
            local = 0
        for _ in range(size):
            task = active[mixing.locate(local)[0]]
            out.append((task, taken[task]))
            taken[task] += 1
            local += 1
    return out


shard_size = st.integers(0, 9)
rate = st.one_of(st.just(0), st.integers(1, 9), st.sampled_from([Fraction(1, 1000), Fraction(7, 3), 10**6]))


@st.composite
def schedules(draw: st.DrawFn) -> BatchSchedule:
    if draw(st.booleans()):
        return BatchSchedule.constant(D * draw(st.integers(1, 12)))
    low, high = draw(st.lists(st.integers(1, 12), min_size=2, max_size=2))
    return BatchSchedule.ramp(D * low, D * high, draw(st.integers(1, 40)), multiple_of=D)


@st.composite
def stage_at(draw: st.DrawFn, start: int, tasks: tuple[str, ...]) -> Stage:
    kind = draw(st.sampled_from(["rates", "schedule", "both"]))
    rates = None
    if kind != "schedule":
        rates = {t: draw(rate) for t in tasks}
        if not any(rates.values()):
            rates[draw(st.sampled_from(tasks))] = 1
    return Stage(start, rates, draw(schedules()) if kind != "rates" else None)


@st.composite
def staged_plans(draw: st.DrawFn, max_start: int = 60, max_stages: int = 6) -> RunPlan:
    num_tasks = draw(st.integers(1, 5))
    caches = {
        f"t{i}": TaskCache(f"fp_{i}", tuple(draw(st.lists(shard_size, min_size=1, max_size=4).filter(any))))
        for i in range(num_tasks)
    }
    tasks = tuple(caches)
    starts = sorted(draw(st.sets(st.integers(1, max_start), max_size=max_stages)))
    stages = tuple(draw(stage_at(start, tasks)) for start in starts)
    return RunPlan(
        name="drawn",
        mixture="drawn_mix",
        caches=caches,
        rates={t: draw(st.integers(1, 9)) for t in tasks},
        seed=draw(st.integers(0, 2**63 - 1)),
        schedule=draw(schedules()),
        num_data_shards=D,
        stages=stages,
    )


# --- the closed form equals the walk -----------------------------------------------------------------


@given(plan=staged_plans())
@settings(max_examples=150, deadline=None)
def test_positions_and_tasks_equal_the_step_by_step_walk(plan: RunPlan) -> None:
    num_steps = 80
    sizes = brute_batch_sizes(plan, num_steps)
    first = list(itertools.accumulate(sizes, initial=0))
    assert [plan.batch_size(s) for s in range(num_steps)] == sizes
    assert [plan.first_position(s) for s in range(num_steps + 1)] == first
    assert all(plan.step_of(p) == s for s in range(num_steps) for p in (first[s], first[s + 1] - 1))
    stream = brute_stream(plan, num_steps)
    tasks = plan.mixing.tasks_in_range(0, len(stream))
    assert list(zip(tasks.tolist(), range_task_positions(plan.mixing, 0, tasks), strict=True)) == stream
    # Ranges that cross stage boundaries anywhere, the scalar lookup, and its inverse.
    for a, b in [(0, 1), (3, 50), (len(stream) // 3, len(stream) - 7), (len(stream) - 5, len(stream))]:
        tasks = plan.mixing.tasks_in_range(a, b)
        assert list(zip(tasks.tolist(), range_task_positions(plan.mixing, a, tasks), strict=True)) == stream[a:b]
    for p in range(0, len(stream), 7):
        assert plan.mixing.locate(p) == stream[p]
        assert plan.mixing.position_of(*stream[p]) == p
        expected = [sum(1 for t, _ in stream[:p] if t == i) for i in range(len(plan.task_names))]
        assert list(plan.mixing.counts(p)) == expected


@given(plan=staged_plans())
@settings(max_examples=150, deadline=None)
def test_every_task_stream_continues_across_stages_without_gap_or_repeat(plan: RunPlan) -> None:
    end = plan.first_position(80)
    tasks = plan.mixing.tasks_in_range(0, end)
    positions = range_task_positions(plan.mixing, 0, tasks)
    for task in range(len(plan.task_names)):
        mine = [p for t, p in zip(tasks.tolist(), positions, strict=True) if t == task]
        assert mine == list(range(len(mine)))  # 0, 1, 2, ...: nothing skipped, nothing read twice
        # Epochs are the task's own: every record once per epoch, whatever the stages did to the rates.
        n = plan.layouts[task].num_records
        refs = [e for e in examples_at(plan, range(end)) if e.task == plan.task_names[task]]
        for epoch in range(len(mine) // n):
            assert sorted(e.index for e in refs[epoch * n : (epoch + 1) * n]) == list(range(n))
            assert {e.epoch for e in refs[epoch * n : (epoch + 1) * n]} == {epoch}


@given(plan=staged_plans())
@settings(max_examples=100, deadline=None)
def test_each_stage_keeps_the_mixing_bounds_of_its_rates(plan: RunPlan) -> None:
    starts = [0] + [s.start for s in plan.stages if s.rates is not None]
    ends = [*starts[1:], 90]
    for stage_start, stage_end in zip(starts, ends, strict=True):
        rates = plan.rates_at(stage_start)
        shares = [rates[t] for t in plan.task_names]
        active = [r for r in shares if r > 0]
        bounds = iter(Mixing.from_rates(active).lag_bounds())
        bound_of = [next(bounds) if r > 0 else Fraction(0) for r in shares]
        first = plan.first_position(stage_start)
        base = plan.mixing.counts(first)
        for n in range(0, plan.first_position(stage_end) - first, 3):
            counts = plan.mixing.counts(first + n)
            for t, share in enumerate(shares):
                assert abs(counts[t] - base[t] - n * share) <= bound_of[t]


@given(plan=staged_plans(max_start=10**9, max_stages=4), data=st.data())
@settings(max_examples=100, deadline=None)
def test_far_out_steps_equal_the_scalar_chain_across_stages(plan: RunPlan, data: st.DataObject) -> None:
    boundary = [s.start for s in plan.stages] or [10**9]
    step = data.draw(st.sampled_from(boundary)) + data.draw(st.integers(-2, 2))
    step = max(0, step)
    hosts = data.draw(st.sampled_from([1, 2]))
    host = data.draw(st.integers(0, hosts - 1))
    assert assign(plan, step, host, hosts) == reference_assign(plan, step, host, hosts)
    positions = plan.positions(step)
    for ref in reference_examples(plan, positions):
        task = plan.task_index(ref.task)
        assert plan.mixing.position_of(task, plan.mixing.locate(ref.position)[1]) == ref.position
        assert locate_example(plan, ref.task, ref.epoch, ref.index) == (step, ref.position)


def test_positions_beyond_int64_are_exact_across_stages() -> None:
    big = 2**61 - 2  # batches of 4: its stage starts at position 2**63 - 8
    stages = (Stage(big, {"a": 1, "b": 0, "c": 1}), Stage(big + 3, schedule=BatchSchedule.constant(6)))
    plan = make_plan(stages=stages)
    start = plan.first_position(big) - 5
    tasks = plan.mixing.tasks_in_range(start, start + 40)  # ends past 2**63
    assert list(zip(tasks.tolist(), range_task_positions(plan.mixing, start, tasks), strict=True)) == [
        plan.mixing.locate(p) for p in range(start, start + 40)
    ]
    assert examples_at(plan, range(start, start + 40)) == reference_examples(plan, range(start, start + 40))
    assert plan.step_of(plan.first_position(big + 4)) == big + 4 and plan.batch_size(big + 4) == 6


# --- prefix stability ------------------------------------------------------------------------------


@given(plan=staged_plans(), data=st.data())
@settings(max_examples=150, deadline=None)
def test_appending_a_stage_changes_no_step_before_it(plan: RunPlan, data: st.DataObject) -> None:
    last = plan.stages[-1].start if plan.stages else 0
    current = data.draw(st.integers(0, 80))
    start = max(current, last + 1) + data.draw(st.integers(0, 20))
    stage = data.draw(stage_at(start, plan.task_names))
    longer = plan.with_stage(stage, current_step=current)
    for step in range(start):
        assert global_batch(longer, step) == global_batch(plan, step)
        assert assign(longer, step, 1) == assign(plan, step, 1)
        assert longer.fingerprint_before(step + 1) == plan.fingerprint_before(step + 1)
    assert longer.fingerprint_before(start) == plan.fingerprint()
    # Negative control: the plan itself, and what decides step `start`, did change.
    assert longer.fingerprint() != plan.fingerprint() == longer.fingerprint_before(start)
    assert longer.fingerprint_before(start + 1) != plan.fingerprint_before(start + 1)


@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_appending_a_stage_far_out_changes_no_step_before_it(data: st.DataObject) -> None:
    plan = make_plan()
    start = 10**9 + data.draw(st.integers(0, 10**6))
    stage = data.draw(stage_at(start, plan.task_names))
    longer = plan.with_stage(stage, current_step=start)
    for step in (0, 1, start // 2, start - 2, start - 1):
        assert global_batch(longer, step) == global_batch(plan, step)


def test_a_stage_changes_the_data_from_its_step_on() -> None:
    plan = make_plan()
    longer = plan.with_stage(Stage(10, {"a": 0, "b": 0, "c": 1}), current_step=10)
    assert {e.task for s in range(10, 20) for e in global_batch(longer, s)} == {"c"}
    assert {e.task for s in range(10, 20) for e in global_batch(plan, s)} == {"a", "b", "c"}
    bigger = longer.with_stage(Stage(20, schedule=BatchSchedule.constant(8)), current_step=12)
    assert [bigger.batch_size(s) for s in (19, 20, 10**6)] == [4, 8, 8]
    assert {e.task for e in global_batch(bigger, 25)} == {"c"}  # a schedule stage keeps the rates


def test_a_rates_stage_leaves_a_running_ramp_running() -> None:
    ramp = BatchSchedule.ramp(2, 20, 18, multiple_of=2)
    plan = make_plan(schedule=ramp, stages=(Stage(5, {"a": 1, "b": 1, "c": 1}),))
    assert [plan.batch_size(s) for s in range(30)] == [ramp.batch_size(s) for s in range(30)]
    restart = make_plan(schedule=ramp, stages=(Stage(5, schedule=ramp),))  # its ramp counts from step 5
    assert [restart.batch_size(s) for s in range(3, 8)] == [ramp.batch_size(s) for s in (3, 4, 0, 1, 2)]


def test_skip_ranges_work_across_stages() -> None:
    stages = (Stage(6, {"a": 1, "b": 3, "c": 0}), Stage(9, schedule=BatchSchedule.constant(8)))
    plain = make_plan(stages=stages)
    skipping = make_plan(stages=stages, skip=(SkipRange(4, 7), SkipRange(8, 10)))
    for step in range(14):
        skipped = step in (4, 5, 6, 8, 9)
        assert skipping.is_skipped(step) == skipped
        assert global_batch(skipping, step) == (() if skipped else global_batch(plain, step))
    assert skipping.fingerprint() == plain.fingerprint()


# --- rules ----------------------------------------------------------------------------------------


def test_a_stage_may_not_start_before_the_current_step_or_its_last_stage() -> None:
    plan = make_plan(stages=(Stage(100, {"a": 1, "b": 1, "c": 1}),))
    with pytest.raises(PlanError, match=r"its current step is 500: .* The earliest step a new stage may start at is 500\."):
        plan.with_stage(Stage(400, schedule=BatchSchedule.constant(8)), current_step=500)
    with pytest.raises(PlanError, match=r"its last stage starts at step 100, .* earliest step a new stage may start at is 101\."):
        plan.with_stage(Stage(100, schedule=BatchSchedule.constant(8)), current_step=50)
    assert plan.with_stage(Stage(500, schedule=BatchSchedule.constant(8)), current_step=500).stages[-1].start == 500
    with pytest.raises(PlanError, match="current step must be an integer >= 0"):
        plan.with_stage(Stage(600, schedule=BatchSchedule.constant(8)), current_step=-1)


def test_stage_and_plan_rules_name_the_fix() -> None:
    with pytest.raises(PlanError, match="start step must be an integer >= 1"):
        Stage(0, {"a": 1})
    with pytest.raises(PlanError, match="changes nothing: give it rates, a batch schedule, or both"):
        Stage(5)
    with pytest.raises(PlanError, match="gives every task rate 0"):
        Stage(5, {"a": 0, "b": "0"})
    with pytest.raises(PlanError, match=r"rate of task 'a' must be > 0 but got -1"):
        Stage(5, {"a": -1, "b": 1})
    with pytest.raises(PlanError, match=r"must give a rate to every task of the run.*without a rate \['c'\].*Give 0"):
        make_plan(stages=(Stage(5, {"a": 1, "b": 1}),))
    with pytest.raises(PlanError, match="Stages must start at increasing steps"):
        make_plan(stages=(Stage(9, schedule=BatchSchedule.constant(8)), Stage(5, schedule=BatchSchedule.constant(8))))
    with pytest.raises(PlanError, match=r"The stage at step 5: Number of data shards \(2\) must divide"):
        make_plan(stages=(Stage(5, schedule=BatchSchedule.constant(3)),))
    assert Stage(5, {"a": 0.5, "b": "1/2", "c": 0}).rates == {"a": Fraction(1, 2), "b": Fraction(1, 2), "c": 0}


def test_a_task_left_out_of_the_last_stage_is_never_read_again() -> None:
    plan = make_plan(stages=(Stage(3, {"a": 1, "b": 0, "c": 1}),))
    read = plan.mixing.counts(plan.first_position(3))[1]
    assert plan.mixing.total(1) == read and plan.mixing.total(0) is None
    assert plan.mixing.position_of(1, read - 1) < plan.first_position(3)
    with pytest.raises(PlanError, match=r"Example \d+ of task 1's stream is never read: the run's last stage"):
        plan.mixing.position_of(1, read)


def test_plans_with_stages_round_trip_and_chain_their_fingerprints() -> None:
    stages = (Stage(6, {"a": 1, "b": 3, "c": 0}), Stage(9, schedule=BatchSchedule.ramp(4, 8, 4, multiple_of=2)))
    plan = make_plan(stages=stages)
    assert RunPlan.from_dict(plan.to_dict()) == plan
    assert plan.to_dict()["stages"] == [
        {"start": 6, "rates": {"a": "1/4", "b": "3/4", "c": "0"}, "schedule": None},
        {"start": 9, "rates": None, "schedule": {"start": 4, "end": 8, "ramp_steps": 4, "multiple_of": 2}},
    ]
    base = make_plan()
    assert "stages" not in base.to_dict()  # the dict form of a plan without stages is as it was
    one = make_plan(stages=stages[:1])
    assert [plan.fingerprint_before(s) for s in (0, 6, 7, 9, 10, 10**9)] == [
        base.fingerprint(), base.fingerprint(), one.fingerprint(), one.fingerprint(), plan.fingerprint(), plan.fingerprint()
    ]
    assert len({base.fingerprint(), one.fingerprint(), plan.fingerprint()}) == 3
    # sha256 of the canonical JSON of {"after": <the plan before its last stage>, "stage": <that stage>}.
    chain = base.fingerprint()
    for stage in plan.to_dict()["stages"]:
        text = json.dumps({"after": chain, "stage": stage}, sort_keys=True, separators=(",", ":"))
        chain = hashlib.sha256(text.encode()).hexdigest()
    assert plan.fingerprint() == chain == "f0519a72a95d7cb06fae933dde3dc78d02763ef8d6997352a6e8b4f8f8a6751d"
