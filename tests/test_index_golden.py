"""Golden values of the index math, pinned so that a refactor cannot move them: for each epoch order
and a staged plan, what every position reads (task, epoch, record index, shard, record) and the
``/shards`` JSON of every host slice of a step in every encoding.

Recipe (all of it pure: no cache, no server): tasks ``a`` (shards of 7, 0, 9, 5 records) and ``b`` (4,
6), rates 3:1, seed 11, global batch 8, 4 data shards; byte ranges from ``tests.index_helpers.MemoryTable``.
Plans: ``feistel`` (the default order), ``block`` (blocks of 3 records), ``staged`` (blocks of 3; from
step 6 rates 1:1, from step 9 a global batch of 16). Steps: 0 and 1 (epoch 0), 5-12 (the stages, later
epochs of ``b``), 10**6 and 2**61 (positions past 2**63: the scalar chain). Hashes are SHA-256 of the
JSON of the examples, and of the slices' JSON bodies one after another. Change a pinned value only with
an ``INDEX_MATH_VERSION`` bump (the examples) or a wire change in CHANGELOG.md (the bodies).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from taskdata.index import (
    FEISTEL,
    BatchSchedule,
    BlockOrder,
    RunPlan,
    RunTables,
    Stage,
    StepJson,
    TaskCache,
    global_batch,
    step_slices,
    to_json,
)
from tests.index_references import MemoryTable

STEPS = (0, 1, *range(5, 13), 10**6, 2**61)
HOSTS = 4


def plan_of(name: str) -> RunPlan:
    order = FEISTEL if name == "feistel" else BlockOrder(3)
    stages = (
        (Stage(6, rates={"a": 1, "b": 1}), Stage(9, schedule=BatchSchedule.constant(16)))
        if name == "staged"
        else ()
    )
    return RunPlan(
        name=name,
        mixture="mix",
        caches={"a": TaskCache("fp_a", (7, 0, 9, 5)), "b": TaskCache("fp_b", (4, 6))},
        rates={"a": 3, "b": 1},
        seed=11,
        schedule=BatchSchedule.constant(8),
        num_data_shards=HOSTS,
        stages=stages,
        epoch_order=order,
    )


def examples_json(plan: RunPlan) -> bytes:
    rows = [
        [[e.position, e.task, e.epoch, e.index, e.shard, e.record] for e in global_batch(plan, step)]
        for step in STEPS
    ]
    return json.dumps(rows, separators=(",", ":")).encode()


def bodies(plan: RunPlan, encoding: str) -> bytes:
    tables = RunTables.of(plan, [MemoryTable(t, plan.caches[t].shard_record_counts) for t in plan.task_names])
    out = []
    for step in STEPS:
        slices = step_slices(tables, step, HOSTS)
        for host in range(HOSTS):
            body = to_json(step_slices(tables, step, HOSTS, only=host)[0], encoding)
            assert StepJson(slices, encoding)[host] == body
            out.append(body)
    return b"\n".join(out)


EXAMPLES_SHA256 = {
    "feistel": "8bc6a4378751fbe21ef35bcfb14246b49dba1dd322f2e86431d7a06fd350cd73",
    "block": "c6cfb1d563c0426b7422e6ff9d3ac31f985d62ca2040af2d57723d9e02a8ce73",
    "staged": "18b3446b10fc731bf854e194faee615e2a6b2b15cbbfd3a30f21c4f3478e9146",
}

BODIES_SHA256 = {
    "feistel/ints": "8d4724a1c2ccf5412268b7dfe9308561bb9403a8cf9755d1ec1a6fd0293d5202",
    "feistel/base64": "38844cf291cbca788e51758b56f92eca12312fcd3593ac17ed2f57b15ab93a06",
    "feistel/compact": "8e120f29cc4105a489c727dd715e31133f900e7696a4aa6125fce001cce82676",
    "block/ints": "a00f624b6fcbec678188e236aecdcf37693cd373a6a6ccbcdb1e5c78db46a62f",
    "block/base64": "02b4276043f74b3558cbd5da01a79ff5c85666858c63ccab72074117adf906e1",
    "block/compact": "52b86ce12e9c5c64cfc31bbdef534b844c9a1feaed9ee8da23e9a49659b7f0d7",
    "staged/ints": "1b20735caa2060d772708b7b2b7d28d664e51545372138dec96e47efa5459ba9",
    "staged/base64": "2a73b16f831786f29ccafb7bdb44f165c729a983d2acd791f06535e7e437087e",
    "staged/compact": "3392fd3457139d532c93c400a5bf3fe036b7203043896cdbb44d582a372896f0",
}


@pytest.mark.parametrize("name", sorted(EXAMPLES_SHA256))
def test_positions_to_records_are_pinned(name):
    plan = plan_of(name)
    assert hashlib.sha256(examples_json(plan)).hexdigest() == EXAMPLES_SHA256[name]


def test_the_pins_see_the_seed_and_the_order():
    # Negative controls: another seed, or the other order, moves the examples of later epochs.
    feistel = examples_json(plan_of("feistel"))
    assert examples_json(plan_of("block")) != feistel
    assert examples_json(dataclasses.replace(plan_of("feistel"), seed=12)) != feistel


def test_a_block_epoch_reads_blocks_of_the_cache_order():
    # Step 7 of the block plan: task a (21 records) is in epoch 2, read in blocks of 3 consecutive
    # records of the cache's order (8-10, then 14-16); b (10 records) in epoch 1.
    rows = [(e.task, e.epoch, e.index) for e in global_batch(plan_of("block"), 7)]
    assert rows == [
        ("a", 2, 8), ("a", 2, 9), ("b", 1, 2), ("a", 2, 10), ("a", 2, 14), ("a", 2, 15), ("b", 1, 3), ("a", 2, 16)
    ]


@pytest.mark.parametrize("encoding", ["ints", "base64", "compact"])
@pytest.mark.parametrize("name", sorted(EXAMPLES_SHA256))
def test_slice_bodies_are_pinned(name, encoding):
    body = bodies(plan_of(name), encoding)
    assert hashlib.sha256(body).hexdigest() == BODIES_SHA256[f"{name}/{encoding}"]
