"""The assignment service in-process (FastAPI TestClient) over small real caches.

Runs: ``mix`` (toy_mix: 3 tasks, batch 16, 4 data shards, seed 7; the default run) and ``solo`` (toy_det,
ramp 4 -> 8 over 6 steps, 2 data shards, steps [2, 4) skipped), both from the runs file.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import shutil
import threading
import time
import types
from pathlib import Path

import numpy as np
import prometheus_client
import pytest
from fastapi.testclient import TestClient
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

import server.assignments as assignments
from server.assignments import AnswerCache, step_json
from server.metrics import BUCKETS
from server.models import MAX_STEP, ReadColumns, ShardsResponse, TaskReads
from server.settings import Settings, get_settings
from taskdata.cache.tfrecord import iter_records
from taskdata.index import (
    PlanError,
    RunPlan,
    RunTables,
    assign,
    chain,
    from_json,
    global_batch,
    slice_positions,
    step_slices,
    to_json,
)
from taskdata.index.columns import column_values
from tests.helpers import metric_samples
from tests.run_helpers import copy_caches, current_dir, mix_run
from tests.server_helpers import TOKEN, make_app, server_env

pytestmark = pytest.mark.slow  # cache jobs (Beam)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return server_env(tmp_path_factory)


def make_client(env, **settings) -> TestClient:
    return TestClient(make_app(env, **settings))


@pytest.fixture(scope="module")
def client(env):
    with make_client(env) as client:
        yield client


def shards(client, **params):
    response = client.get("/shards", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def examples_of(step: dict) -> list[tuple[str, int, int]]:
    """(task, shard, record) of every example of a step, rebuilt the way a client does from order + reads."""
    queues = []
    for task in step["tasks"]:
        queue = [
            (task["task"], r["shard"], r["first_record"] + i)
            for r in reads_of(task)
            for i in range(r["count"])
        ]
        queues.append(iter(queue))
    return [next(queues[i]) for i in step["order"]]


def reads_of(task: dict) -> list[dict]:
    """A task's read columns as one dict per read, with its shard's URI from ``files``."""
    uris = {f["shard"]: f["uri"] for f in task["files"]}
    columns = task["reads"]
    return [
        {**{name: values[i] for name, values in columns.items()}, "uri": uris[columns["shard"][i]]}
        for i in range(len(columns["shard"]))
    ]


def test_shards_follow_the_index_math_and_the_offsets_sidecars(client, env):
    plan = env.mix.plan
    for host in range(4):
        answer = shards(client, host=host, step=0, steps=6)
        ShardsResponse.model_validate(answer)
        assert (answer["run"], answer["fingerprint"], answer["data_shard"], answer["num_hosts"]) == (
            "mix",
            plan.fingerprint(),
            host,
            4,
        )
        for offset, step in enumerate(answer["steps"]):
            expected = assign(plan, offset, host)
            assert step["step"] == offset and not step["skipped"] and step["global_batch_size"] == 16
            assert range(step["positions"]["start"], step["positions"]["stop"]) == slice_positions(
                plan, offset, host
            )
            assert examples_of(step) == [(e.task, e.shard, e.record) for e in expected.examples]
            for task in step["tasks"]:
                assert task["version"] == current_dir(env.root, task["task"]).name
                for read in reads_of(task):
                    uri = Path(read["uri"])
                    assert uri.parent == current_dir(env.root, task["task"]).resolve()
                    with open(uri, "rb") as f:
                        f.seek(read["byte_offset"])
                        chunk = f.read(read["byte_length"])
                    assert len(list(iter_records(io.BytesIO(chunk), str(uri)))) == read["count"]


def test_answers_are_compact_canonical_json(client):
    # The server writes the JSON text itself; it must be exactly what json.dumps writes.
    for params in (
        {"host": 0, "step": 0, "steps": 3},
        {"host": 1, "step": 2, "run": "solo"},
        {"host": 3, "step": 10**9},
    ):
        body = client.get("/shards", params=params).content
        assert json.dumps(json.loads(body), separators=(",", ":")).encode() == body


def as_ints(answer: dict) -> dict:
    """An ``encoding=base64`` answer with every column decoded to a list of integers."""
    steps = []
    for step in answer["steps"]:
        tasks = [
            {**task, "reads": {name: column_values(column) for name, column in task["reads"].items()}}
            for task in step["tasks"]
        ]
        steps.append({**step, "tasks": tasks, "order": column_values(step["order"])})
    return {**answer, "steps": steps}


@pytest.mark.parametrize(
    "params",
    [
        {"host": 0, "step": 0, "steps": 3},
        {"host": 1, "step": 0, "steps": 7, "run": "solo"},  # ramp, skipped steps
        {"host": 3, "step": 10**9, "steps": 2},
        {"host": 2, "step": MAX_STEP},
    ],
)
def test_base64_and_compact_answers_hold_the_same_integers_as_int_answers(client, params):
    ints = shards(client, **params)
    packed = shards(client, **params, encoding="base64")
    ShardsResponse.model_validate(packed)
    assert isinstance(packed["steps"][0]["order"], str)
    assert as_ints(packed) == ints
    compact = shards(client, **params, encoding="compact")
    ShardsResponse.model_validate(compact)
    assert compact["steps"][0]["order"].startswith("u1:")
    # The same integers, and each task's files, named by its pattern, are the files the other answers list.
    got = as_ints(compact)
    for step in got["steps"]:
        for task in step["tasks"]:
            names = task.pop("names")
            task["files"] = [{"shard": s, "uri": f"{names['prefix']}{s:0{names['digits']}d}{names['suffix']}"}
                             for s in sorted(set(task["reads"]["shard"]))]  # fmt: skip
    assert [[dict(sorted(t.items())) for t in s["tasks"]] for s in got["steps"]] == [
        [dict(sorted(t.items())) for t in s["tasks"]] for s in ints["steps"]
    ]
    assert [{k: v for k, v in s.items() if k != "tasks"} for s in got["steps"]] == [
        {k: v for k, v in s.items() if k != "tasks"} for s in ints["steps"]
    ]
    assert {k: v for k, v in got.items() if k != "steps"} == {k: v for k, v in ints.items() if k != "steps"}


def test_the_scalar_chain_past_int64_writes_the_same_answers_as_the_arrays(client, monkeypatch):
    # Positions past 2**63 take the exact scalar chain; here it is forced on ordinary steps to compare.
    state = client.app.state.server
    cases = [("mix", d, 4, s) for d in range(4) for s in (0, 1, 9, 10**6)] + [
        ("solo", d, 2, s) for d in (0, 1) for s in range(7)
    ]
    cases += [("mix", h, 2, s) for h in range(2) for s in (0, 10**6)] + [("mix", 0, 1, 5)]
    answers = {}
    for fits in (True, False):
        if not fits:
            monkeypatch.setattr(chain, "fits_int64", lambda plan, positions: False)
        for name, index, count, step in cases:
            run, _ = state.find_run(name)
            caches = state.resolver.cached(run) or state.resolver.resolve_run(run)
            tables = RunTables.of(run.plan, caches)
            for encoding in ("ints", "base64", "compact"):
                body = step_json(AnswerCache(0), name, tables, step, index, count, encoding)
                answers.setdefault((name, index, count, step, encoding), []).append(body)
    assert all(first == second for first, second in answers.values())
    assert len({bodies[0] for bodies in answers.values()}) == len(answers)  # distinct cases, distinct answers


def test_the_answer_model_refuses_inconsistent_columns():
    good = {
        "shard": [1, 1],
        "first_record": [0, 5],
        "count": [2, 1],
        "byte_offset": [0, 90],
        "byte_length": [40, 20],
    }
    ReadColumns.model_validate(good)
    TaskReads.model_validate(
        {"task": "t", "version": "v", "files": [{"shard": 1, "uri": "/x"}], "reads": good}
    )
    for bad, message in (
        ({**good, "count": [2]}, "one length"),
        ({**good, "count": [2, 0]}, "greater than or equal to 1"),
        (
            {**good, "count": base64.b64encode(np.array([2, 0], "<i8").tobytes()).decode()},
            "below its minimum 1",
        ),
        ({**good, "shard": "AAAA"}, "whole int64 values"),
    ):
        with pytest.raises(ValueError, match=message):
            ReadColumns.model_validate(bad)
    names = {"prefix": "/x/train-", "digits": 5, "suffix": ""}
    compact = {**good, "count": "u1:AgE=", "byte_length": "u1:KBQ="}
    ReadColumns.model_validate(compact)
    TaskReads.model_validate({"task": "t", "version": "v", "names": names, "reads": compact})
    for bad, message in (
        ({**good, "count": "u1:AgA="}, "below its minimum 1"),
        ({**good, "count": "u3:AgE="}, "u3"),
    ):
        with pytest.raises(ValueError, match=message):
            ReadColumns.model_validate(bad)
    with pytest.raises(ValueError, match="either files .ints, base64. or names .compact."):
        TaskReads.model_validate({"task": "t", "version": "v", "reads": good})
    with pytest.raises(ValueError, match="digits"):
        TaskReads.model_validate({"task": "t", "version": "v", "names": {**names, "digits": 0}, "reads": good})
    with pytest.raises(ValueError, match=r"files name shards \[0\] but the reads are of shards \[1\]"):
        TaskReads.model_validate(
            {"task": "t", "version": "v", "files": [{"shard": 0, "uri": "/x"}], "reads": good}
        )


def test_reads_merge_a_tasks_consecutive_records_across_other_tasks_examples(client, env):
    # Epoch 0 reads each task's cache in order: per step and task, one read unless a shard ends.
    step = shards(client, host=0, step=0)["steps"][0]
    assert len(set(step["order"])) > 1
    for task in step["tasks"]:
        assert len(task["reads"]["shard"]) <= 2 and len(task["files"]) <= 2


def test_hosts_share_data_shards_and_the_global_batch_does_not_depend_on_the_host_count(client, env):
    for step in range(4):
        by_shard_4 = [shards(client, host=d, step=step)["steps"][0] for d in range(4)]
        by_host_8 = [shards(client, host=h, step=step, num_hosts=8)["steps"][0] for h in range(8)]
        assert [by_host_8[2 * d] for d in range(4)] == [by_host_8[2 * d + 1] for d in range(4)] == by_shard_4
        union = [example for part in by_shard_4 for example in examples_of(part)]
        assert union == [(e.task, e.shard, e.record) for e in global_batch(env.mix.plan, step)]
    answer = shards(client, host=5, step=0, num_hosts=8)
    assert (answer["data_shard"], answer["num_hosts"], answer["num_data_shards"]) == (2, 8, 4)


@pytest.mark.parametrize("encoding", ["ints", "base64", "compact"])
def test_decoded_answers_equal_the_reads_the_index_math_computes(client, env, encoding):
    tables = RunTables.of(env.mix.plan, client.app.state.server.resolver.resolve_run(env.mix))
    for num_hosts in (1, 2, 4, 8):
        for host in range(num_hosts):
            index, count = (host // 2, 4) if num_hosts == 8 else (host, num_hosts)
            params = {"host": host, "num_hosts": num_hosts, "encoding": encoding}
            for first in (0, 29, 10**9):
                answer = shards(client, step=first, steps=3, **params)
                for step in answer["steps"]:
                    assert from_json(step) == step_slices(tables, step["step"], count, only=index)[0]


def test_fewer_hosts_than_data_shards_read_the_union_of_consecutive_data_shards_as_one_slice(client):
    for num_hosts in (1, 2):
        for host in range(num_hosts):
            answer = shards(client, host=host, step=0, steps=3, num_hosts=num_hosts)
            ShardsResponse.model_validate(answer)
            assert (answer["host"], answer["num_hosts"], answer["num_data_shards"]) == (host, num_hosts, 4)
            assert answer["data_shard"] == host * (4 // num_hosts)  # the first data shard of the slice
            per_host = 4 // num_hosts
            for step in answer["steps"]:
                s = step["step"]
                union = [
                    example
                    for d in range(host * per_host, (host + 1) * per_host)
                    for example in examples_of(shards(client, host=d, step=s)["steps"][0])
                ]
                assert examples_of(step) == union
    # The slice is computed as one: a task's records that continue across a seam make one read.
    whole = shards(client, host=0, step=0, num_hosts=1)["steps"][0]
    quarters = [shards(client, host=d, step=0)["steps"][0] for d in range(4)]
    assert sum(len(t["reads"]["shard"]) for t in whole["tasks"]) < sum(
        len(t["reads"]["shard"]) for q in quarters for t in q["tasks"]
    )


def test_a_lookahead_window_is_the_single_steps_side_by_side(client):
    window = shards(client, host=2, step=10, steps=5)["steps"]
    assert window == [shards(client, host=2, step=s)["steps"][0] for s in range(10, 15)]


def test_skipped_steps_read_nothing_and_leave_every_other_step_in_place(client, env):
    unskipped = RunPlan.from_dict({**env.solo.plan.to_dict(), "skip": []})
    answer = shards(client, host=1, step=0, steps=7, run="solo")
    assert [s["skipped"] for s in answer["steps"]] == [False, False, True, True, False, False, False]
    assert [s["global_batch_size"] for s in answer["steps"]] == [4, 4, 4, 4, 4, 4, 8]
    for step in answer["steps"]:
        if step["skipped"]:
            assert step["order"] == [] and all(reads_of(t) == [] == t["files"] for t in step["tasks"])
            assert step["positions"]["stop"] - step["positions"]["start"] == 2  # positions stay reserved
        else:
            expected = assign(unskipped, step["step"], 1).examples
            assert examples_of(step) == [(e.task, e.shard, e.record) for e in expected]


def test_the_run_parameter_picks_a_run_and_unknown_runs_list_the_known_ones(client):
    assert shards(client, host=0, step=0)["run"] == "mix"  # the default run
    assert shards(client, host=0, step=0, run="solo")["run"] == "solo"
    response = client.get("/shards", params={"host": 0, "step": 0, "run": "nope"})
    assert response.status_code == 404
    assert "Unknown run 'nope'; known runs: ['mix', 'solo']" in response.json()["detail"]


def test_without_a_default_run_the_run_parameter_is_required(env):
    with make_client(env, runs_file=None, default_run=None) as client:
        response = client.get("/shards", params={"host": 0, "step": 0})
    assert response.status_code == 400 and "Query parameter 'run' is required" in response.json()["detail"]


@pytest.mark.parametrize(
    ("params", "status", "message"),
    [
        ({"host": -1, "step": 0}, 422, "host"),
        ({"host": "x", "step": 0}, 422, "host"),
        ({"step": 0}, 422, "host"),
        ({"host": 4, "step": 0}, 400, "Host 4 is outside [0, 4)"),
        ({"host": 8, "step": 0, "num_hosts": 8}, 400, "Host 8 is outside [0, 8)"),
        (
            {"host": 0, "step": 0, "num_hosts": 6},
            400,
            "must be a multiple or a divisor of the number of data shards (4)",
        ),
        (
            {"host": 0, "step": 0, "num_hosts": 3},
            400,
            "must be a multiple or a divisor of the number of data shards (4)",
        ),
        ({"host": 2, "step": 0, "num_hosts": 2}, 400, "Host 2 is outside [0, 2)"),
        ({"host": 0, "step": 0, "num_hosts": 0}, 422, "num_hosts"),
        ({"host": 0, "step": 0, "num_hosts": 65_537}, 422, "num_hosts"),
        ({"host": 0, "step": -1}, 422, "step"),
        ({"host": 0, "step": MAX_STEP + 1}, 422, "step"),
        ({"host": 0, "step": "1e3"}, 422, "step"),
        ({"host": 0, "step": MAX_STEP, "steps": 2}, 400, "beyond the last step this server answers"),
        ({"host": 0, "step": 0, "steps": 0}, 422, "steps"),
        ({"host": 0, "step": 0, "steps": 65}, 422, "steps"),
        ({"host": 0, "step": 0, "run": "..:..:etc"}, 422, "run"),
        ({"host": 0, "step": 0, "run": "../x"}, 422, "run"),
        ({"host": 0, "step": 0, "run": "a/b"}, 422, "run"),
        ({"host": 0, "step": 0, "run": "a..b"}, 400, "do not use '..'"),
        ({"host": 0, "step": 0, "run": "_runs"}, 422, "run"),  # '_' names are the cache root's own folders
        ({"host": 0, "step": 0, "run": "x" * 201}, 422, "run"),
        ({"host": 0, "step": 0, "setps": 2}, 422, "setps"),  # a typo is an error, not a default
        ({"host": 0, "step": 0, "encoding": "hex"}, 422, "encoding"),
    ],
)
def test_bad_parameters_are_client_errors_that_say_which_and_what_is_allowed(client, params, status, message):
    response = client.get("/shards", params=params)
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    if status == 422:
        assert any(message in error["loc"] for error in detail)
        assert all(error["msg"] for error in detail)
    else:
        assert message in detail


def test_the_last_answerable_step_is_answered(client):
    answer = shards(client, host=3, step=MAX_STEP)
    assert (
        answer["steps"][0]["step"] == MAX_STEP
        and answer["steps"][0]["positions"]["start"] == MAX_STEP * 16 + 12
    )


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/tasks/..%2F..%2Fetc%2Fpasswd", 404),
        ("/tasks/..:..:etc", 422),
        ("/tasks/%2e%2e", 422),
        ("/tasks/a..b", 400),
        ("/tasks/toy_det%00", 422),
        ("/runs/..%2Fx", 404),
        ("/runs/..:..:etc", 422),
        ("/runs/a..b", 400),
        ("/runs/%2e%2e%2f_runs%2fmix", 404),
    ],
)
def test_names_never_reach_the_file_system(client, env, path, status):
    before = sorted(p.name for p in env.root.parent.iterdir())
    response = client.get(path)
    assert response.status_code == status, response.text
    assert sorted(p.name for p in env.root.parent.iterdir()) == before


def test_tasks_lists_tasks_and_mixtures(client):
    listed = {t["name"]: t for t in client.get("/tasks").json()["tasks"]}
    assert {"toy_det", "toy_random", "toy_text", "toy_mix", "toy_uncached"} <= set(listed)
    assert listed["toy_mix"]["kind"] == "mixture" and listed["toy_det"]["kind"] == "task"
    assert len(listed["toy_det"]["fingerprint"]) == 64


def test_a_task_shows_its_definition_fingerprint_versions_and_stats(client, env, monkeypatch):
    monkeypatch.setenv("TASKDATA_TEST_TEXT_DIR", str(env.text_dir))
    shards(client, host=0, step=0)  # serving the run verifies its caches
    detail = client.get("/tasks/toy_text").json()
    assert detail["kind"] == "task" and detail["definition"]["task"] == "toy_text"
    [version] = detail["versions"]
    assert version["current"] and version["complete"] and version["matches_definition"]
    assert version["manifest_sha256"] == env.mix.plan.caches["toy_text"].fingerprint
    train = version["splits"]["train"]
    assert (
        train["num_records"]
        == sum(env.mix.plan.caches["toy_text"].shard_record_counts)
        == train["stats"]["examples"]
    )
    assert train["verification"] == "verified"
    assert detail["tasks"] == [{"task": "toy_text", "rate": 1.0, "exact_rate": "1"}]
    mixture = client.get("/tasks/toy_mix").json()
    assert mixture["tasks"] == [
        {"task": "toy_det", "rate": 0.5, "exact_rate": "1/2"},
        {"task": "toy_random", "rate": 1 / 3, "exact_rate": "1/3"},
        {"task": "toy_text", "rate": 1 / 6, "exact_rate": "1/6"},
    ]
    assert mixture["versions"] == []
    assert [rate for _, _, rate in mixture["definition"]["tasks"]] == ["3", "2", "1"]  # as registered
    assert client.get("/tasks/toy_uncached").json()["versions"] == []


def test_a_definition_that_cannot_be_fingerprinted_here_is_reported_not_a_server_error(client, monkeypatch):
    monkeypatch.delenv("TASKDATA_TEST_TEXT_DIR", raising=False)
    response = client.get("/tasks/toy_text")
    assert response.status_code == 200
    assert response.json()["fingerprint"] is None and "TASKDATA_TEST_TEXT_DIR" in response.json()["problem"]
    assert response.json()["versions"][0]["matches_definition"] is None


def test_unknown_tasks_list_close_matches(client):
    response = client.get("/tasks/toy_dett")
    assert response.status_code == 404 and "Did you mean: toy_det" in response.json()["detail"]


def test_runs_are_listed_and_described(client, env):
    listed = client.get("/runs").json()["runs"]
    assert [(r["name"], r["source"], r["split"]) for r in listed][:2] == [
        ("mix", "config", "train"),
        ("solo", "config", "train"),
    ]
    detail = client.get("/runs/mix").json()
    assert detail["plan"] == env.mix.plan.to_dict() and detail["fingerprint"] == env.mix.plan.fingerprint()
    assert detail["hosts"]["num_data_shards"] == 4 and "h // (H / 4)" in detail["hosts"]["rule"]
    assert detail["examples_per_data_shard"] == {"start": 4, "end": 4}
    assert client.get("/runs/nope").status_code == 404


def create(client, name="created", seed=1, **overrides):
    body = {"name": name, "mixture": "toy_mix", "seed": seed, "schedule": {"start": 8}, "num_data_shards": 2}
    body.update(overrides)
    return client.post("/runs", json=body)


def test_post_runs_is_durable_idempotent_and_refuses_another_plan_under_a_taken_name(client, env):
    first = create(client)
    assert first.status_code == 201, first.text
    stored = json.loads((env.root / "_runs" / "created.json").read_text())
    assert stored["plan"] == first.json()["plan"] and first.json()["source"] == "store"
    again = create(client)
    assert again.status_code == 200 and again.json() == first.json()
    conflict = create(client, seed=2)
    assert conflict.status_code == 409
    assert "Run 'created' already exists with a different plan" in conflict.json()["detail"]
    # A configured name: the same plan is accepted, another one is refused.
    same_as_config = create(client, name="mix", seed=7, schedule={"start": 16}, num_data_shards=4)
    assert same_as_config.status_code == 200 and same_as_config.json()["source"] == "config"
    assert create(client, name="mix", seed=8, schedule={"start": 16}, num_data_shards=4).status_code == 409
    # A fresh app on the same cache root (another replica, or a restart) serves the stored run identically.
    body = client.get("/shards", params={"host": 1, "step": 5, "run": "created"}).content
    with make_client(env) as replica:
        assert replica.get("/shards", params={"host": 1, "step": 5, "run": "created"}).content == body
        assert "created" in [r["name"] for r in replica.get("/runs").json()["runs"]]


@pytest.mark.parametrize(
    ("overrides", "status", "message"),
    [
        ({"mixture": "toy_mixx"}, 404, "Did you mean: toy_mix"),
        ({"mixture": "toy_uncached"}, 503, "taskdata cache --task toy_uncached"),
        ({"name": "a..b"}, 400, "do not use '..'"),
        ({"name": "../x"}, 422, "name"),
        ({"num_data_shards": 3}, 400, "Number of data shards (3) must divide every global batch size"),
        (
            {"schedule": {"start": 6, "end": 16, "ramp_steps": 10, "multiple_of": 4}},
            400,
            "multiple of multiple_of=4",
        ),
        ({"schedule": {"start": 8, "end": 16}}, 400, "ramp_steps=0 is constant"),
        ({"skip": [[5, 5]]}, 400, "start < stop"),
        ({"split": "validation"}, 400, "Split 'validation' is not in the cache"),
        ({"seed": -1}, 422, "seed"),
        ({"extra": 1}, 422, "extra"),
    ],
)
def test_bad_run_creations_are_client_errors_or_cache_unavailable(client, env, overrides, status, message):
    response = create(client, name=overrides.pop("name", "bad_run"), **overrides)
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    if status == 422:
        assert any(message in error["loc"] for error in detail)
    else:
        assert message in detail
    assert not (env.root / "_runs" / "bad_run.json").exists()


def test_a_cache_failing_verification_or_without_completed_is_never_served(env, tmp_path_factory):
    root = copy_caches(tmp_path_factory, "damaged")
    shutil.copy(env.runs_file, root.parent / "runs.json")
    (current_dir(root, "toy_random") / "COMPLETED").unlink()
    shard = current_dir(root, "toy_det") / "train.tfrecord-00002-of-00003"
    original = shard.read_bytes()
    shard.write_bytes(original[:100] + bytes([original[100] ^ 1]) + original[101:])
    damaged = types.SimpleNamespace(root=root, runs_file=root.parent / "runs.json")
    with make_client(damaged) as client:
        response = client.get("/shards", params={"host": 0, "step": 0, "run": "solo"})
        assert response.status_code == 503
        assert "Cache of task 'toy_det' is not available: verification of" in response.json()["detail"]
        assert "train.tfrecord-00002-of-00003" in response.json()["detail"]
        assert client.get("/healthz").status_code == 200
        shard.write_bytes(original)
        # Checked once per process: the failure is remembered until a restart.
        assert client.get("/shards", params={"host": 0, "step": 0, "run": "solo"}).status_code == 503
        version = client.get("/tasks/toy_det").json()["versions"][0]
        assert version["splits"]["train"]["verification"].startswith("failed: verification of")
    with make_client(damaged) as restarted:
        assert restarted.get("/shards", params={"host": 0, "step": 0, "run": "solo"}).status_code == 200
        response = restarted.get("/shards", params={"host": 0, "step": 0, "run": "mix"})
        assert response.status_code == 503
        assert "Cache of task 'toy_random' is not available: no complete version" in response.json()["detail"]


def test_a_listing_first_use_check_refuses_resized_files_and_leaves_flipped_bytes_to_the_reader(
    env, tmp_path_factory
):
    from taskdata.cache.reader import CacheReader
    from taskdata.cache.tfrecord import CorruptRecordError

    with make_client(env) as full:
        expected = full.get("/shards", params={"host": 0, "step": 0, "run": "solo"}).content
    root = copy_caches(tmp_path_factory, "listing")
    shutil.copy(env.runs_file, root.parent / "runs.json")
    listing = types.SimpleNamespace(root=root, runs_file=root.parent / "runs.json")
    version = current_dir(root, "toy_det")
    read = reads_of(json.loads(expected)["steps"][0]["tasks"][0])[0]
    shard = version / read["uri"].rsplit("/", 1)[-1]
    original = shard.read_bytes()
    shard.write_bytes(original + b"x")
    with make_client(listing, first_use_check="listing") as client:
        response = client.get("/shards", params={"host": 0, "step": 0, "run": "solo"})
        assert response.status_code == 503
        assert f"{shard.name} has {len(original) + 1} bytes but the manifest says {len(original)}" in (
            response.json()["detail"]
        )
    # A flipped byte keeps every size: the listing check serves the same answer a full check does, and
    # the reader a trainer uses refuses the damaged record, naming it.
    offset = read["byte_offset"] + 13
    shard.write_bytes(original[:offset] + bytes([original[offset] ^ 1]) + original[offset + 1 :])
    with make_client(listing, first_use_check="listing", verify_workers=2) as client:
        response = client.get("/shards", params={"host": 0, "step": 0, "run": "solo"})
        assert response.status_code == 200 and response.content == expected.replace(
            str(env.root).encode(), str(root).encode()
        )
        detail = client.get("/tasks/toy_det").json()["versions"][0]["splits"]["train"]["verification"]
        assert detail == "listing verified"
    with CacheReader(str(version)) as reader, pytest.raises(CorruptRecordError) as error:
        reader.read("train", read["shard"], read["first_record"], read["count"])
    assert (error.value.record_index, error.value.byte_offset) == (read["first_record"], read["byte_offset"])


def test_a_first_use_that_outlasts_its_wait_is_a_503_to_retry_while_verification_goes_on(env):
    with make_client(env, first_use_wait_seconds=0) as client:
        response = client.get("/shards", params={"host": 0, "step": 0})
        assert response.status_code == 503 and response.headers["retry-after"] == "5"
        assert "The caches of run 'mix' are being verified" in response.json()["detail"]
        deadline = time.monotonic() + 30
        while response.status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.05)
            response = client.get("/shards", params={"host": 0, "step": 0})
        assert response.status_code == 200


def test_every_route_but_healthz_needs_the_bearer_token_and_no_log_shows_it(env, caplog):
    caplog.set_level(logging.DEBUG)
    with make_client(env, token=SecretStr(TOKEN)) as client:
        assert client.get("/healthz").status_code == 200
        good = {"Authorization": f"Bearer {TOKEN}"}
        for path in (
            "/shards?host=0&step=0",
            "/runs",
            "/runs/mix",
            "/tasks",
            "/tasks/toy_det",
            "/metrics",
            "/openapi.json",
        ):
            missing = client.get(path)
            assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
            for wrong in (f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", TOKEN):
                response = client.get(path, headers={"Authorization": wrong})
                assert response.status_code == 401 and TOKEN not in response.text
            assert client.get(path, headers=good).status_code == 200, path
        assert create(client, name="authed").status_code == 401
        assert (
            client.post(
                "/runs",
                headers=good,
                json={
                    "name": "authed",
                    "mixture": "toy_det",
                    "seed": 0,
                    "schedule": {"start": 4},
                    "num_data_shards": 1,
                },
            ).status_code
            == 201
        )
        settings = client.app.dependency_overrides[get_settings]()
        assert TOKEN not in repr(settings) and TOKEN not in str(settings.model_dump())
    logged = "\n".join(f"{r.getMessage()} {r.args!r}" for r in caplog.records)
    assert caplog.records and TOKEN not in logged


def test_the_token_can_come_from_a_file(tmp_path, env):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    assert Settings(cache_root=str(env.root), token_file=str(path)).token.get_secret_value() == TOKEN
    with pytest.raises(ValueError, match="either as token or as token_file"):
        Settings(cache_root=str(env.root), token_file=str(path), token=TOKEN)
    path.write_text("\n")
    with pytest.raises(ValueError, match="token file .* is empty"):
        Settings(cache_root=str(env.root), token_file=str(path))
    with pytest.raises(ValueError, match="Cannot read the token file"):
        Settings(cache_root=str(env.root), token_file=str(tmp_path / "missing"))


def _known_requests(client) -> str:
    for step in range(3):
        shards(client, host=0, step=step)
    shards(client, host=0, step=0)  # from the step cache
    client.get("/shards", params={"host": 9, "step": 0})
    client.get("/runs/mix")
    client.get("/runs/solo")
    client.get("/nowhere")
    response = client.get("/metrics")
    assert response.status_code == 200
    return response


def _check_known_metrics(families: dict[str, str], samples: dict) -> None:
    assert {
        "taskdata_http_requests": "counter",
        "taskdata_http_errors": "counter",
        "taskdata_http_request_duration_seconds": "histogram",
        "taskdata_step_cache_lookups": "counter",
        "taskdata_step_cache_entries": "gauge",
    }.items() <= families.items()
    # Besides them only prometheus_client's creation times of its counters and histograms.
    assert all(
        name.endswith("_created")
        for name in families.keys()
        - {
            "taskdata_http_requests",
            "taskdata_http_errors",
            "taskdata_http_request_duration_seconds",
            "taskdata_step_cache_lookups",
            "taskdata_step_cache_entries",
        }
    )

    def labels(**kv):
        return tuple(sorted(kv.items()))

    assert samples["taskdata_http_requests_total"] == {
        labels(route="/shards", method="GET", status="200"): 4,
        labels(route="/shards", method="GET", status="400"): 1,
        labels(route="/runs/{name}", method="GET", status="200"): 2,
        labels(route="unmatched", method="GET", status="404"): 1,
    }
    assert samples["taskdata_http_errors_total"] == {
        labels(route="/shards", method="GET", kind="client"): 1,
        labels(route="unmatched", method="GET", kind="client"): 1,
    }
    assert samples["taskdata_step_cache_lookups_total"] == {labels(result="hit"): 1, labels(result="miss"): 3}
    assert samples["taskdata_step_cache_entries"] == {(): 3}
    counts = samples["taskdata_http_request_duration_seconds_count"]
    assert counts == {
        labels(route="/shards", method="GET"): 5,
        labels(route="/runs/{name}", method="GET"): 2,
        labels(route="unmatched", method="GET"): 1,
    }
    buckets = {
        dict(key)["le"]: value
        for key, value in samples["taskdata_http_request_duration_seconds_bucket"].items()
        if dict(key)["route"] == "/shards"
    }
    bounds = [*(float(b) for b in BUCKETS), float("inf")]
    assert sorted(float(le) for le in buckets) == bounds
    cumulative = [buckets[le] for le in sorted(buckets, key=float)]
    assert cumulative == sorted(cumulative) and cumulative[-1] == 5
    assert (
        0 < samples["taskdata_http_request_duration_seconds_sum"][labels(route="/shards", method="GET")] < 60
    )


def test_metrics_are_prometheus_families_with_the_names_types_labels_and_values_of_known_requests(env):
    with make_client(env) as client:
        response = _known_requests(client)
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {family.name: family.type for family in text_string_to_metric_families(response.text)}
    _check_known_metrics(families, metric_samples(response.text))


def test_metrics_speak_openmetrics_to_a_scraper_that_asks_for_it(env):
    with make_client(env) as client:
        _known_requests(client)
        accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        response = client.get("/metrics", headers={"Accept": accept})
    assert response.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert response.text.endswith("# EOF\n")
    families = {family.name: family.type for family in openmetrics_families(response.text)}
    samples = metric_samples(response.text, openmetrics_families)
    # The scrape before this one is counted now; the rest is as in the text format.
    metrics_key = (("method", "GET"), ("route", "/metrics"), ("status", "200"))
    assert samples["taskdata_http_requests_total"].pop(metrics_key) == 1
    samples["taskdata_http_request_duration_seconds_count"].pop((("method", "GET"), ("route", "/metrics")))
    _check_known_metrics(families, samples)


def test_each_app_counts_in_its_own_registry(env):
    with make_client(env) as first, make_client(env) as second:
        for _ in range(3):
            first.get("/runs/mix")
        second.get("/runs/solo")
        counted = [
            metric_samples(client.get("/metrics").text)["taskdata_http_requests_total"]
            for client in (first, second)
        ]
    runs = (("method", "GET"), ("route", "/runs/{name}"), ("status", "200"))
    assert [c[runs] for c in counted] == [3, 1]
    # Nothing went into prometheus_client's process-wide default registry.
    assert not [m.name for m in prometheus_client.REGISTRY.collect() if m.name.startswith("taskdata_")]


def test_answers_are_identical_across_apps_and_the_step_cache_never_changes_them(env, tmp_path):
    params = [{"host": h, "step": s, "steps": k} for h in (0, 3) for s in (0, 7, 10**12) for k in (1, 4)]
    with make_client(env) as first, make_client(env, step_cache_entries=0) as uncached:
        answers = [first.get("/shards", params=p).content for p in params]
        assert [first.get("/shards", params=p).content for p in params] == answers  # from the step cache
        assert [uncached.get("/shards", params=p).content for p in params] == answers
    # Negative control: another seed gives other answers.
    other = tmp_path / "runs.json"
    other.write_text(json.dumps([mix_run(env.root, seed=8).to_dict()]))
    with make_client(types.SimpleNamespace(root=env.root, runs_file=other)) as reseeded:
        assert [reseeded.get("/shards", params=p).content for p in params] != answers


def test_errors_inside_an_answer_are_worded_by_the_apps_handlers_and_counted(env, monkeypatch):
    async def plan_error(state, **fields):
        raise PlanError("No such step in this plan.")

    async def bug(state, **fields):
        raise RuntimeError("a bug")

    for failure, status, body in ((plan_error, 400, b'{"detail":"No such step in this plan."}'),
                                  (bug, 500, b"Internal Server Error")):  # fmt: skip
        monkeypatch.setattr("server.routers.shards._answer", failure)
        with TestClient(make_app(env), raise_server_exceptions=False) as client:
            response = client.get("/shards?host=0&step=0")
            scraped = metric_samples(client.get("/metrics").text)["taskdata_http_requests_total"]
        assert (response.status_code, response.content) == (status, body)
        assert scraped[(("method", "GET"), ("route", "/shards"), ("status", str(status)))] == 1


# --- the step cache: whole steps when hosts share them, bounded memory ----------------------------------


@pytest.fixture
def tables(env):
    app = make_app(env)
    with TestClient(app):
        state = app.state.server
        run, _ = state.find_run("mix")
        caches = state.resolver.resolve_run(run)
    return RunTables.of(run.plan, caches)


def counting(monkeypatch) -> dict[str, int]:
    calls = {"alone": 0, "whole": 0}
    real = assignments.step_slices

    def counted(*args, only=None):
        calls["whole" if only is None else "alone"] += 1
        return real(*args, only=only)

    monkeypatch.setattr(assignments, "step_slices", counted)
    return calls


def test_hosts_of_a_step_share_its_index_math_and_lone_requests_compute_their_slice_alone(tables, monkeypatch):
    calls = counting(monkeypatch)
    cache = AnswerCache(0)

    def ask(step, hosts):
        for host in hosts:
            body = step_json(cache, "mix", tables, step, host, 4, "base64")
            assert body == to_json(step_slices(tables, step, 4, only=host)[0], "base64")

    ask(5, [2])  # a new step, nothing known of the run: this slice alone
    assert calls == {"alone": 1, "whole": 0}
    ask(5, [0, 1, 3])  # its second host computes the whole step; the others cut from it
    assert calls == {"alone": 1, "whole": 1}
    ask(6, [1, 0, 2, 3])  # the run's last new step was shared: the whole of the next at once
    assert calls == {"alone": 1, "whole": 2}
    ask(7, [0])  # one of the last two was shared: whole (two steps too many when the hosts stop sharing)
    ask(8, [3])
    assert calls == {"alone": 1, "whole": 4}
    ask(9, [1])  # the last two were asked for once each: alone again
    ask(10, [2])
    assert calls == {"alone": 3, "whole": 4}
    # Hosts in step again, two steps in flight: the first of a step comes before the second of the step
    # before. Once they share, a new step is computed whole even then.
    ask(12, [0])
    ask(13, [0])
    ask(12, [1, 2, 3])
    ask(13, [1, 2, 3])
    assert calls == {"alone": 5, "whole": 6}
    ask(14, [0])
    ask(15, [0])  # the step before has one host so far, the one before that all four: whole
    ask(14, [1, 2, 3])
    ask(15, [1, 2, 3])
    assert calls == {"alone": 5, "whole": 8}
    step_json(cache, "mix", tables, 21, 0, 2, "ints")  # another slice count keeps its own record
    assert calls["alone"] == 6


def test_hosts_arriving_while_a_step_is_computed_wait_for_it_instead_of_computing_it_again(tables, monkeypatch):
    calls = counting(monkeypatch)
    counted = assignments.step_slices
    started, release = threading.Event(), threading.Event()

    def slow(*args, only=None):  # the first whole computation holds until every other host has asked
        if only is None:
            started.set()
            assert release.wait(30)
        return counted(*args, only=only)

    monkeypatch.setattr(assignments, "step_slices", slow)
    cache = AnswerCache(0)
    release.set()
    step_json(cache, "mix", tables, 3, 0, 4, "base64")  # a step asked for twice: the run's hosts share steps
    step_json(cache, "mix", tables, 3, 1, 4, "base64")
    assert calls == {"alone": 1, "whole": 1}
    release.clear()
    started.clear()
    bodies: dict[int, bytes] = {}
    threads = [threading.Thread(target=lambda h=h: bodies.__setitem__(h, step_json(cache, "mix", tables, 4, h % 4, 4,
                                                                                     "base64"))) for h in range(8)]
    threads[0].start()
    assert started.wait(30)
    for thread in threads[1:]:
        thread.start()
    time.sleep(0.2)  # the others are in, waiting on the first
    release.set()
    for thread in threads:
        thread.join(30)
    assert calls == {"alone": 1, "whole": 2}  # step 4 computed whole once for its 8 hosts
    assert all(bodies[h] == to_json(step_slices(tables, 4, 4, only=h % 4)[0], "base64") for h in range(8))


def test_the_next_window_of_hosts_that_share_steps_is_computed_ahead_once(env, tables, monkeypatch):
    calls = counting(monkeypatch)
    cache = AnswerCache(0)

    def ready(steps):
        deadline = time.monotonic() + 30
        while cache._ahead_running or not all(cache.kept("mix", tables, s, 4) for s in steps):
            assert time.monotonic() < deadline, f"steps {steps} not computed ahead"
            time.sleep(0.01)

    cache.ahead("mix", tables, range(2, 4), 4, "compact")  # nothing known of the run's hosts: nothing ahead
    step_json(cache, "mix", tables, 1, 0, 4, "compact")
    step_json(cache, "mix", tables, 1, 1, 4, "compact")  # hosts share step 1 (its second host computes it whole)
    time.sleep(0.2)
    assert calls == {"alone": 1, "whole": 1} and not cache.kept("mix", tables, 2, 4)
    cache.ahead("mix", tables, range(2, 4), 4, "compact")
    ready(range(2, 4))
    assert calls == {"alone": 1, "whole": 3}
    cache.ahead("mix", tables, range(2, 4), 4, "compact")  # a window is computed ahead once
    for host in range(4):  # its hosts cut their answers from it, and the JSON's shared part is there already
        for step in (2, 3):
            assert step_json(cache, "mix", tables, step, host, 4, "compact") == to_json(
                step_slices(tables, step, 4, only=host)[0], "compact")
    assert calls == {"alone": 1, "whole": 3}
    # A pod resumed at an earlier checkpoint asks for lower steps again: their window is computed ahead too.
    cache.ahead("mix", tables, range(20, 22), 4, "compact")
    ready(range(20, 22))
    cache.ahead("mix", tables, range(10, 12), 4, "compact")
    ready(range(10, 12))
    assert calls == {"alone": 1, "whole": 7}
    # Through the route: hosts of a window asked for, the next window is computed ahead.
    app = make_app(env)
    with TestClient(app) as client:
        for host in (0, 1):
            assert client.get(f"/shards?host={host}&step=40&steps=3").status_code == 200
        answers = app.state.server.answers
        deadline = time.monotonic() + 30
        while not all(answers.kept("mix", tables, s, 4) for s in range(43, 46)):
            assert time.monotonic() < deadline, "the route's next window was not computed ahead"
            time.sleep(0.01)


def test_the_step_caches_are_bounded(tables):
    cache = AnswerCache(5)
    for step in range(3 * assignments._STEPS):
        for host in (0, 1):
            step_json(cache, "mix", tables, step, host, 4, "ints")
        cache.put(("mix", "f", 4, 0, step, "ints"), b"{}")
    for count in range(1, 2 * assignments._STEPS):  # many (run, slice count) records
        cache.step_reads(f"run{count}", tables, 0, 0, 1)
    assert len(cache) == 5 and len(cache._steps) == assignments._STEPS
    assert len(cache._latest) == assignments._STEPS
    nothing = AnswerCache(0)
    nothing.put(("mix", "f", 4, 0, 0, "ints"), b"{}")
    assert len(nothing) == 0
