"""RunPlan: validation that names field, value and fix; JSON round trip; fingerprint; skips; hosts."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest

from taskdata.index import (
    BatchSchedule,
    PlanError,
    RunPlan,
    SkipRange,
    TaskCache,
    data_shard_for_host,
)


def make_plan(**overrides: Any) -> RunPlan:
    fields: dict[str, Any] = {
        "name": "run_1",
        "mixture": "mix",
        "caches": {"a": TaskCache("fp_a", (4, 3, 5)), "b": TaskCache("fp_b", (2, 1))},
        "rates": {"a": 2, "b": 1},
        "seed": 42,
        "schedule": BatchSchedule.constant(8),
        "num_data_shards": 4,
        "skip": (),
    }
    fields.update(overrides)
    return RunPlan(**fields)


def test_round_trips_through_json() -> None:
    plan = make_plan(
        rates={"a": 0.7, "b": "3/10"},
        schedule=BatchSchedule.ramp(8, 64, 100, multiple_of=8),
        skip=(SkipRange(10, 12), SkipRange(40, 41)),
    )
    text = json.dumps(plan.to_dict())
    again = RunPlan.from_dict(json.loads(text))
    assert again == plan
    assert again.fingerprint() == plan.fingerprint()
    assert again.rates == {"a": Fraction(7, 10), "b": Fraction(3, 10)}


def test_pinned_dict_form() -> None:
    assert make_plan().to_dict() == {
        "name": "run_1",
        "mixture": "mix",
        "caches": {
            "a": {"fingerprint": "fp_a", "shard_record_counts": [4, 3, 5]},
            "b": {"fingerprint": "fp_b", "shard_record_counts": [2, 1]},
        },
        "rates": {"a": "2/3", "b": "1/3"},
        "seed": 42,
        "schedule": {"start": 8, "end": 8, "ramp_steps": 0, "multiple_of": 1},
        "num_data_shards": 4,
        "skip": [],
        "split": "train",
    }


def test_pinned_fingerprint() -> None:
    # sha256 of the canonical JSON of to_dict() without name, num_data_shards and skip, plus index_math=1
    # (the split is in it since issue 15: before, this plan's fingerprint was 47b906a0...).
    assert make_plan().fingerprint() == "90de870f61521ba4893562e318683782ba024bbb0d54b562596ada90f4bf0846"


def test_fingerprint_covers_the_data_but_not_the_name_topology_or_skips() -> None:
    base = make_plan()
    assert base.fingerprint() == make_plan().fingerprint()
    assert base.fingerprint() == make_plan(name="other_run", num_data_shards=2).fingerprint()
    # Adding a skip range to a running job's plan must not invalidate its checkpoints.
    assert base.fingerprint() == make_plan(skip=(SkipRange(3, 4),)).fingerprint()
    changed = [
        make_plan(seed=43),
        make_plan(rates={"a": 1, "b": 1}),
        make_plan(caches={"a": TaskCache("fp_a2", (4, 3, 5)), "b": TaskCache("fp_b", (2, 1))}),
        make_plan(caches={"a": TaskCache("fp_a", (4, 3, 6)), "b": TaskCache("fp_b", (2, 1))}),
        make_plan(schedule=BatchSchedule.constant(16)),
        make_plan(split="validation"),
    ]
    assert len({base.fingerprint(), *(plan.fingerprint() for plan in changed)}) == len(changed) + 1


def test_rates_are_exact_and_normalised() -> None:
    plan = make_plan(rates={"a": 0.1, "b": 0.2})
    assert plan.rates == {"a": Fraction(1, 3), "b": Fraction(2, 3)}  # 0.1 is read as 1/10, not binary
    assert make_plan(rates={"a": 4, "b": 2}) == make_plan(rates={"a": "2/3", "b": Fraction(1, 3)})


def test_rates_of_any_scale_are_normalised_exactly() -> None:
    three = {"a": TaskCache("fp_a", (4, 3, 5)), "b": TaskCache("fp_b", (2, 1)), "c": TaskCache("fp_c", (2,))}
    plan = make_plan(caches=three, rates={"a": 3, "b": 2, "c": 1})
    assert plan.rates == {"a": Fraction(1, 2), "b": Fraction(1, 3), "c": Fraction(1, 6)}
    assert plan.to_dict()["rates"] == {"a": "1/2", "b": "1/3", "c": "1/6"}
    assert make_plan(rates={"a": 1, "b": 2}).rates == {"a": Fraction(1, 3), "b": Fraction(2, 3)}


def test_a_stored_plan_with_the_float_rates_of_older_mixtures_loads_unchanged() -> None:
    # What build_run stored for a mixture of rates 3:2:1 when mixtures held floats (0.5,
    # 0.3333333333333333, 0.16666666666666666); the fingerprint was computed by that code, then again
    # once the plan's fingerprint came to cover its split (issue 15): the split is the only difference.
    stored = make_plan(
        caches={"a": TaskCache("fp_a", (4, 3, 5)), "b": TaskCache("fp_b", (2, 1)), "c": TaskCache("fp_c", (2,))},
        rates={"a": 3, "b": 2, "c": 1},
    ).to_dict()
    stored.update(
        name="old",
        mixture="m",
        rates={"a": "12500000000000000/24999999999999999", "b": "5555555555555555/16666666666666666", "c": "1/6"},
    )
    plan = RunPlan.from_dict(json.loads(json.dumps(stored)))
    assert plan.to_dict() == stored
    assert plan.fingerprint() == "a93fe1a2a35383b3a6654a0b0d0524020474a26b68df3e516206b2f684f041a5"
    assert plan.rates["a"] != Fraction(1, 2)  # kept as stored: a plan's data never changes


def test_a_single_task_run_needs_no_rates() -> None:
    plan = make_plan(mixture="a", caches={"a": TaskCache("fp_a", (5,))}, rates=None)
    assert plan.rates == {"a": 1}
    assert plan.task_names == ("a",)


def test_skip_ranges_are_sorted_and_merged() -> None:
    plan = make_plan(skip=(SkipRange(20, 25), SkipRange(5, 7), SkipRange(6, 9), SkipRange(9, 10)))
    assert plan.skip == (SkipRange(5, 10), SkipRange(20, 25))
    assert [s for s in range(30) if plan.is_skipped(s)] == [5, 6, 7, 8, 9, 20, 21, 22, 23, 24]
    assert [plan.next_unskipped_step(s) for s in (4, 5, 9, 10, 24)] == [4, 10, 10, 10, 25]


def test_the_step_after_a_number_of_batches_counts_skipped_steps_too() -> None:
    plan = make_plan(skip=(SkipRange(20, 25), SkipRange(5, 10)))
    delivered = [s for s in range(40) if not plan.is_skipped(s)]
    # After n batches read from step 0, the next step is the one after the n-th delivered step.
    assert [plan.step_after_batches(n) for n in range(1, 25)] == [s + 1 for s in delivered[:24]]
    assert [plan.step_after_batches(n) for n in (0, 4, 5, 6)] == [0, 4, 5, 11]
    assert make_plan().step_after_batches(7) == 7
    with pytest.raises(PlanError, match="must be an integer >= 0"):
        plan.step_after_batches(-1)


def test_hosts_that_share_a_model_replica_share_a_data_shard() -> None:
    assert [data_shard_for_host(h, 8, 2) for h in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [data_shard_for_host(h, 4, 4) for h in range(4)] == [0, 1, 2, 3]
    with pytest.raises(PlanError) as raised:
        data_shard_for_host(0, 6, 4)
    assert str(raised.value) == (
        "Number of hosts (6) must be a multiple of the number of data shards (4): each data shard is read "
        "by the same number of hosts. Use a number of data shards that divides 6."
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_data_shards": 0}, "Number of data shards must be a positive integer but got 0."),
        (
            {"num_data_shards": 3},
            "Number of data shards (3) must divide every global batch size, but it does not divide the "
            "schedule's constant batch size (8). Use a number of data shards that divides 8, or a schedule "
            "whose constant batch size is a multiple of 3.",
        ),
        (
            {"schedule": BatchSchedule.ramp(4, 64, 10, multiple_of=4), "num_data_shards": 8},
            "Number of data shards (8) must divide every global batch size, but it does not divide the "
            "schedule's ramp's multiple_of (4). Use a number of data shards that divides 4, or a schedule "
            "whose ramp's multiple_of is a multiple of 8.",
        ),
        ({"seed": -1}, "Seed must be an integer in [0, 2**63) but got -1. Pick any fixed number, e.g. 0."),
        (
            {"rates": {"a": 1}},
            "Rates and caches must name the same tasks: tasks without a rate ['b'], rates without a cache []. "
            "Give every task both.",
        ),
        (
            {"rates": {"a": 1, "b": -2}},
            "Rate of task 'b' must be > 0 but got -2. Leave the task out instead.",
        ),
        ({"rates": {"a": 1, "b": float("nan")}}, "Rate of task 'b' must be a finite number but got nan."),
        ({"rates": {"a": 0, "b": 1}}, "Rate of task 'a' must be > 0 but got 0. Leave the task out instead."),
        (
            {"rates": {"a": 1, "b": True}},
            "Rate of task 'b' must be a number (int, float, Fraction, Decimal or a string like '1/3') but got "
            "the bool True; write 1 for a rate of one.",
        ),
        (
            {"rates": {"a": 1, "b": "a third"}},
            "Rate of task 'b' must be a number (int, float, Fraction, Decimal or a string like '1/3') but got "
            "the string 'a third'.",
        ),
        (
            {"rates": None},
            "Rates are required for a run over 2 tasks (['a', 'b']); give each a rate, e.g. its number of examples.",
        ),
        ({"schedule": 8}, "Schedule must be a BatchSchedule but got int: 8."),
        ({"name": "../etc"}, "Run name: Invalid run name '../etc'"),
        ({"split": "train\n"}, "Split: Invalid split name 'train\\n'"),
        ({"caches": {}}, "Caches must be a non-empty mapping of task name -> TaskCache but got {}."),
        ({"skip": [(3, 4)]}, "Skip must be a tuple of SkipRange(start, stop) but got [(3, 4)]."),
    ],
)
def test_invalid_plans_name_the_field_value_and_fix(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError) as raised:
        make_plan(**overrides)
    assert str(raised.value).startswith(message)


def test_invalid_parts_name_the_field_value_and_fix() -> None:
    with pytest.raises(
        PlanError,
        match="Skip range must have start < stop but got start=5, stop=5. To skip only step 5, use stop=6.",
    ):
        SkipRange(5, 5)
    with pytest.raises(PlanError, match="Cache fingerprint must be a non-empty string"):
        TaskCache("", (1,))
    with pytest.raises(PlanError, match="Record count of shard 0 must be an integer >= 0 but got -3"):
        TaskCache("fp", (-3,))
    with pytest.raises(PlanError, match=r"missing \['skip'\], unknown \['skips'\]"):
        data = make_plan().to_dict()
        data["skips"] = data.pop("skip")
        RunPlan.from_dict(data)


def test_unknown_task_lists_the_run_tasks() -> None:
    with pytest.raises(PlanError, match=r"Task 'c' is not part of run 'run_1'; its tasks are \['a', 'b'\]."):
        make_plan().task_index("c")
