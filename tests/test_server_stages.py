"""Stages, the ledger and the summary over HTTP: POST /runs/{run}/stages, GET /runs/{run}/ledger and /summary.

The ledger must agree record for record with what /shards hands each host; appending a stage must leave
every earlier step's /shards answer byte for byte as it was, on this replica and on another one.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from server.main import create_app
from server.models import ExampleLedgerResponse, StepLedgerResponse, SummaryResponse
from server.settings import Settings, get_settings
from taskdata.index import BatchSchedule, SkipRange, Stage
from taskdata.index.columns import column_values
from taskdata.runs import RunStore
from tests.run_helpers import copy_caches, make_registry, mix_run

pytestmark = pytest.mark.slow  # cache jobs (Beam)

TOKEN = "stages-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = copy_caches(tmp_path_factory, "stages")
    store = RunStore(str(root))
    store.create(mix_run(root, name="base"))
    stages = (
        Stage(4, {"toy_det": 1, "toy_random": 0, "toy_text": 1}),
        Stage(7, schedule=BatchSchedule.ramp(8, 24, 4, multiple_of=4)),
    )
    store.create(mix_run(root, name="staged", stages=stages, skip=(SkipRange(5, 6),)))
    return root


def make_client(root, **settings) -> TestClient:
    app = create_app(registry=make_registry())
    fields = {"cache_root": str(root), "token": SecretStr(TOKEN), "run_refresh_seconds": 0, **settings}
    app.dependency_overrides[get_settings] = lambda: Settings(**fields)
    return TestClient(app)


@pytest.fixture(scope="module")
def client(root):
    with make_client(root) as client:
        yield client


def get(client, path, **params):
    response = client.get(path, params=params, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


def host_records(body) -> list[tuple[str, int, int]]:
    """(task, shard, record) of every example of a /shards step, in the host's order."""
    step = body["steps"][0]
    queues = []
    for task in step["tasks"]:
        reads = task["reads"]
        records = []
        for shard, first, count in zip(*(column_values(reads[c]) for c in ("shard", "first_record", "count")),
                                       strict=True):
            records += [(task["task"], shard, first + k) for k in range(count)]
        queues.append(iter(records))
    return [next(queues[t]) for t in column_values(step["order"])]


@pytest.mark.parametrize("step", [0, 3, 4, 5, 6, 7, 9, 12, 10**6])
@pytest.mark.parametrize("num_hosts", [8, 2])  # a multiple and a divisor of the run's 4 data shards
def test_the_step_ledger_agrees_record_for_record_with_shards(client, step, num_hosts):
    for host in range(num_hosts):
        shards = get(client, "/shards", run="staged", host=host, num_hosts=num_hosts, step=step, encoding="base64")
        ledger = StepLedgerResponse.model_validate(
            get(client, "/runs/staged/ledger", step=step, host=host, num_hosts=num_hosts)
        ).model_dump()
        assert ledger["fingerprint"] == shards["fingerprint"] and ledger["data_shard"] == shards["data_shard"]
        assert ledger["skipped"] == shards["steps"][0]["skipped"] == (step == 5)
        listed = [(e["task"], e["shard"], e["record"]) for e in ledger["examples"]]
        if ledger["skipped"]:
            assert host_records(shards) == [] and len(listed) == shards["steps"][0]["positions"]["stop"] - \
                shards["steps"][0]["positions"]["start"]
        else:
            assert listed == host_records(shards)


def test_the_example_ledger_finds_every_example_of_a_step_there(client):
    ledger = get(client, "/runs/staged/ledger", step=8)
    for entry in ledger["examples"]:
        found = ExampleLedgerResponse.model_validate(
            get(client, "/runs/staged/ledger", example=entry["id"], from_step=8, until_step=9, limit=5)
        ).model_dump()
        assert found["total"] == 1 and found["reads"][0]["step"] == 8
        assert found["reads"][0]["position"] == entry["position"] and (found["shard"], found["record"]) == (
            entry["shard"],
            entry["record"],
        )


def test_ledger_and_summary_are_bounded_like_shards(client):
    for params, status in [
        ({"step": 1, "example": "toy_det/train/0/1"}, 422),
        ({}, 422),
        ({"example": "toy_det/train/0/1", "limit": 1001}, 422),
        ({"step": 2**53}, 422),
        ({"step": 1, "host": 1}, 422),
        ({"step": 1, "host": 0, "num_hosts": 3}, 400),
        ({"example": "../../etc/passwd/1"}, 422),
        ({"example": "toy_det/train/0/99999"}, 400),
        ({"example": "toy_uncached/train/0/1"}, 400),
        ({"step": 1, "nonsense": 1}, 422),
    ]:
        response = client.get("/runs/staged/ledger", params=params, headers=AUTH)
        assert response.status_code == status, (params, response.text)
    assert client.get("/runs/nope/ledger", params={"step": 1}, headers=AUTH).status_code == 404
    assert client.get("/runs/staged/ledger", params={"step": 1}).status_code == 401
    assert client.get("/runs/staged/summary", params={"step": 1}).status_code == 401
    assert client.get("/runs/staged/summary", params={"step": -1}, headers=AUTH).status_code == 422


def test_the_summary_over_http_is_the_librarys(client, root):
    from taskdata.runs import open_views, summarize

    body = SummaryResponse.model_validate(get(client, "/runs/staged/summary", step=9)).model_dump()
    plan = RunStore(str(root)).get("staged").plan
    views = open_views(plan, str(root))
    try:
        assert get(client, "/runs/staged/summary", step=9) == json.loads(json.dumps(summarize(plan, views, 9)))
    finally:
        for view in views.values():
            view.close()
    assert body["stage"]["index"] == 2 and body["stage"]["batch_size"] == plan.batch_size(9) == 16


def post_stage(client, run, **body):
    return client.post(f"/runs/{run}/stages", json=body, headers=AUTH)


def test_appending_a_stage_leaves_every_earlier_answer_byte_for_byte(root, tmp_path_factory):
    run = "appended"
    RunStore(str(root)).create(mix_run(root, name=run))
    with make_client(root, run_reserve_steps=2) as first, make_client(root, run_reserve_steps=2) as replica:
        def answers(client, steps):
            return {
                (s, h): client.get("/shards", params={"run": run, "host": h, "step": s, "steps": 1},
                                   headers=AUTH).content
                for s in steps for h in range(4)
            }

        before = answers(first, range(8))
        assert answers(replica, range(8)) == before
        # Steps are reserved 2 past a request beyond the reserved ones: at steps 0, 3 and 6, up to 6 + 1 + 2 = 9.
        assert get(first, f"/runs/{run}")["served_before"] == 9
        fingerprint = get(first, f"/runs/{run}")["fingerprint"]
        served = post_stage(first, run, start=8, batch={"start": 16}, current_step=0)
        assert served.status_code == 409 and served.json()["detail"] == (
            f"Run {run!r} cannot take a stage at step 8: servers may have answered steps up to 8 already (they "
            "reserve steps a little ahead of the trainers' requests). The earliest step a new stage may start at "
            "is 9.")
        response = post_stage(first, run, start=10, rates={"toy_det": "0", "toy_random": 1, "toy_text": 1},
                              batch={"start": 8}, current_step=10)
        assert response.status_code == 201, response.text
        detail = response.json()
        assert detail["fingerprint"] != fingerprint and detail["plan"]["stages"][0]["start"] == 10
        assert detail["examples_per_data_shard"] == {"start": 4, "end": 2}
        for client in (first, replica):  # the replica reads the run's file again (refresh 0 s)
            after = answers(client, range(14))
            assert {k: v for k, v in after.items() if k[0] < 8} == before
            body = json.loads(after[(11, 0)])
            assert body["fingerprint"] == detail["fingerprint"] and body["steps"][0]["global_batch_size"] == 8
            assert {t["task"] for t in body["steps"][0]["tasks"] if t["reads"]["shard"]} <= {"toy_random", "toy_text"}
            assert json.loads(after[(9, 0)])["steps"][0]["global_batch_size"] == 16  # the plan before, still
        # The same append again (a retry) changes nothing; a stage in the past names the earliest step allowed.
        again = post_stage(first, run, start=10, rates={"toy_det": 0, "toy_random": 1, "toy_text": 1},
                           batch={"start": 8}, current_step=10)
        assert again.status_code == 200 and again.json()["fingerprint"] == detail["fingerprint"]
        late = post_stage(first, run, start=20, batch={"start": 16}, current_step=30)
        assert late.status_code == 400 and "The earliest step a new stage may start at is 30." in late.json()["detail"]
        early = post_stage(first, run, start=14, batch={"start": 16}, current_step=0)
        assert early.status_code == 409 and "earliest step a new stage may start at is 15." in early.json()["detail"]


def test_stage_requests_are_checked(client, root):
    cases = [
        ({"start": 50, "rates": {"toy_det": 1}, "current_step": 50}, 400, "must give a rate to every task"),
        ({"start": 50, "current_step": 50}, 400, "changes nothing"),
        ({"start": 50, "batch": {"start": 6}, "current_step": 50}, 400, "must divide every global batch size"),
        ({"start": 0, "batch": {"start": 8}, "current_step": 0}, 422, None),
        ({"start": 50, "batch": {"start": 8}}, 422, None),
        ({"start": 50, "batch": {"start": 8}, "current_step": 50, "extra": 1}, 422, None),
    ]
    for body, status, message in cases:
        response = client.post("/runs/base/stages", json=body, headers=AUTH)
        assert response.status_code == status, (body, response.text)
        if message:
            assert message in response.json()["detail"]
    assert client.post("/runs/nope/stages", json={"start": 5, "batch": {"start": 8}, "current_step": 5},
                       headers=AUTH).status_code == 404
    assert client.post("/runs/base/stages", json={"start": 5, "batch": {"start": 8}, "current_step": 5}
                       ).status_code == 401


def test_a_stage_that_other_writers_keep_beating_is_503_and_not_stored(client, monkeypatch):
    from taskdata import cas

    monkeypatch.setattr(cas, "MAX_ATTEMPTS", 2)
    monkeypatch.setattr(cas, "swap", lambda version, data: None)  # another writer was first, each time
    response = post_stage(client, "base", start=500, batch={"start": 8}, current_step=500)
    assert response.status_code == 503, response.text
    assert response.json()["detail"] == ("Gave up changing _runs/base.json: other writers changed it first 2 times "
                                         "in a row, and this change was not stored. Retry when fewer writers are at "
                                         "work.")
    monkeypatch.undo()
    assert [s.start for s in get(client, "/runs/base")["plan"].get("stages", [])] == []


def test_a_run_of_the_runs_file_takes_no_stage(root, tmp_path):
    runs_file = tmp_path / "runs.json"
    runs_file.write_text(json.dumps([mix_run(root, name="configured").to_dict()]))
    with make_client(root, runs_file=str(runs_file)) as client:
        response = post_stage(client, "configured", start=5, batch={"start": 8}, current_step=5)
        assert response.status_code == 409 and "runs file" in response.json()["detail"]
