"""``RunPlan.tables``: the plan's shards as numpy tables, kept on the plan object, not in a module global."""

from __future__ import annotations

import ast
import gc
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.index import BatchSchedule, RunPlan, TaskCache, example_arrays, fits_int64
from taskdata.index.tables import INT64_LIMIT, PlanTables, ShardFinder

INDEX_PACKAGE = Path(__file__).resolve().parent.parent / "taskdata" / "index"


def make_plan(counts_b: tuple[int, ...] = (2, 0, 1), name: str = "run") -> RunPlan:
    return RunPlan(
        name=name,
        mixture="mix",
        caches={"a": TaskCache("fp_a", (4, 3, 5)), "b": TaskCache("fp_b", counts_b)},
        rates={"a": 2, "b": 1},
        seed=42,
        schedule=BatchSchedule.constant(8),
        num_data_shards=4,
    )


def test_tables_lay_every_shard_of_every_task_end_to_end():
    tables = make_plan().tables
    assert tables.num_records.tolist() == [12, 3]
    assert tables.record_base.tolist() == [0, 12]
    assert tables.shard_base.tolist() == [0, 3]
    assert tables.shard_starts.tolist() == [0, 4, 7, 12, 14, 14]
    assert tables.total_records == 15
    # Record 1 of task b's shard 2 (its third shard; the second is empty) is record 14 of the whole.
    assert tables.shard_finder.find(np.array([14]), np.array([1])).tolist() == [5]


def test_tables_are_built_once_per_plan_object_on_first_use():
    plan = make_plan()
    assert "tables" not in vars(plan)  # nothing built by the constructor
    example_arrays(plan, range(0, 8))
    built = vars(plan)["tables"]
    example_arrays(plan, range(8, 16))
    assert plan.tables is built
    # An equal plan is another object with its own tables; the tables take no part in equality.
    other = make_plan()
    assert other == plan and other.fingerprint() == plan.fingerprint()
    assert other.tables is not built


def test_tables_are_dropped_with_their_plan():
    plan = make_plan()
    tables = weakref.ref(plan.tables)
    assert tables() is not None
    del plan
    gc.collect()
    assert tables() is None


def test_a_plan_of_2_63_records_or_more_has_empty_tables_and_no_int64_chain():
    plan = make_plan(counts_b=(2**62, 2**62))
    assert plan.tables.total_records == 2**63 + 12 >= INT64_LIMIT
    assert all(len(a) == 0 for a in (plan.tables.num_records, plan.tables.shard_starts))
    assert not fits_int64(plan, range(0, 8))
    assert fits_int64(make_plan(), range(0, 8))


def test_tables_of_layouts_equal_those_of_the_plan():
    plan = make_plan()
    again = PlanTables.from_layouts(plan.layouts)
    for field in ("num_records", "record_base", "shard_base", "shard_starts"):
        assert getattr(again, field).tolist() == getattr(plan.tables, field).tolist()


def _module_state(source: str) -> list[str]:
    """Module-level names bound to a mutable container: state that outlives the objects it is about."""
    containers = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
    factories = {
        "dict",
        "list",
        "set",
        "defaultdict",
        "OrderedDict",
        "WeakKeyDictionary",
        "WeakValueDictionary",
    }
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            value = node.value
            is_factory = (
                isinstance(value, ast.Call)
                and getattr(value.func, "id", getattr(value.func, "attr", None)) in factories
            )
            if isinstance(value, containers) or is_factory:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [ast.unparse(t) for t in targets if ast.unparse(t) != "__all__"]
    return found


@pytest.mark.parametrize("path", sorted(INDEX_PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_the_index_package_keeps_no_state_in_module_globals(path):
    assert _module_state(path.read_text()) == []


def test_the_state_finder_finds_a_global_cache():  # the negative control of the test above
    assert _module_state("_TABLES: dict[int, object] = {}\nLIMIT = 2**63\nSEEN = set()\n") == [
        "_TABLES",
        "SEEN",
    ]


shard_counts = st.lists(
    st.lists(st.one_of(st.just(0), st.integers(1, 5), st.integers(1, 10**6)), min_size=1, max_size=30).filter(
        any
    ),
    min_size=1,
    max_size=3,
)


@given(counts_per_task=shard_counts, data=st.data())
@settings(max_examples=200, deadline=None)
def test_the_shard_finder_equals_a_binary_search(counts_per_task: list[list[int]], data: Any) -> None:
    finder = ShardFinder([np.array(c, np.int64) for c in counts_per_task])
    counts = np.array([c for task in counts_per_task for c in task], np.int64)
    ends = np.cumsum(counts)
    task_of_shard = np.repeat(np.arange(len(counts_per_task)), [len(c) for c in counts_per_task])
    picks = data.draw(st.lists(st.integers(0, int(ends[-1]) - 1), min_size=1, max_size=50))
    # Every shard's first and last record too: the boundaries are where an off-by-one would show.
    starts = ends - counts
    edges = [int(x) for s, e in zip(starts, ends, strict=True) if e > s for x in (s, e - 1)]
    indices = np.array(picks + edges, np.int64)
    expected = np.searchsorted(ends, indices, side="right")
    assert finder.find(indices, task_of_shard[expected]).tolist() == expected.tolist()


def test_the_shard_finder_takes_few_steps_on_even_layouts_and_falls_back_on_uneven_ones() -> None:
    rng = np.random.default_rng(0)
    # A big task of bucketed shards next to a small one with most of its shards empty, as in a mixture.
    small = np.zeros(65_536, np.int64)
    small[rng.choice(65_536, 1_000, replace=False)] = 1
    even = ShardFinder([rng.integers(900, 1_100, 65_536), small])
    assert even.span <= 3
    tasks = rng.integers(0, 2, 10_000)
    indices = np.where(
        tasks == 0,
        rng.integers(0, even.record_bases[1], 10_000),
        even.record_bases[1] + rng.integers(0, 1_000, 10_000),
    )
    assert (even.find(indices, tasks) == np.searchsorted(even.ends, indices, side="right")).all()
    uneven = ShardFinder([np.array([10**9] + [1] * 1000, np.int64)])
    assert uneven.span > ShardFinder.MAX_SPAN  # binary search then
    assert uneven.find(np.array([0, 10**9 - 1, 10**9, 10**9 + 999]), np.zeros(4, np.int64)).tolist() == [
        0,
        0,
        1,
        1000,
    ]
