"""``taskdata plan --stage/--add-stage``, ``taskdata ledger``, ``summary`` and ``plot`` on small real caches."""

from __future__ import annotations

import json
import shutil

import pytest

from taskdata.cli import main
from taskdata.index import BatchSchedule, PlanError, Stage, global_batch, parse_stage
from taskdata.runs import RunStore
from tests.run_helpers import shared_caches

pytestmark = pytest.mark.slow  # cache jobs (Beam)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-runs") / "caches"
    shutil.copytree(shared_caches(tmp_path_factory), root)
    return root


def plan_cli(root, *args):
    modules = ["--module", "tests.cache_tasks", "--module", "tests.stage_tasks"]
    return main(["plan", *modules, "--cache-root", str(root), *args])


def test_plan_creates_a_run_with_stages_and_appends_more(root, capsys):
    create = ["--name", "cli_staged", "--mixture", "toy_pair", "--seed", "3", "--batch-size", "8",
              "--num-data-shards", "2", "--stage", "10:toy_det=1,toy_random=0",
              "--stage", "20:batch=4..12/8,multiple-of=2"]  # fmt: skip
    assert plan_cli(root, *create) == 0
    assert "created" in capsys.readouterr().out
    plan = RunStore(str(root)).get("cli_staged").plan
    assert plan.stages == (
        Stage(10, {"toy_det": 1, "toy_random": 0}),
        Stage(20, schedule=BatchSchedule.ramp(4, 12, 8, multiple_of=2)),
    )
    assert plan_cli(root, *create) == 0 and "unchanged" in capsys.readouterr().out
    add = ["--name", "cli_staged", "--add-stage", "40:batch=16", "--current-step", "35"]
    assert plan_cli(root, *add) == 0
    out = capsys.readouterr().out
    longer = RunStore(str(root)).get("cli_staged").plan
    assert "added stage at step 40 to" in out and longer.fingerprint() in out
    assert f"(steps before 40: {plan.fingerprint()})" in out
    assert all(global_batch(longer, s) == global_batch(plan, s) for s in range(40))
    # Creating it again as first planned still says it is that run (with the stages appended since).
    assert plan_cli(root, *create) == 0 and "unchanged" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--add-stage", "50:batch=16"], "--add-stage needs --current-step"),
        (["--add-stage", "30:batch=16", "--current-step", "45"], "The earliest step a new stage may start at is 45."),
        (["--add-stage", "50:batch=16", "--current-step", "5", "--seed", "1"], "--seed only apply when creating"),
        (["--add-stage", "50:toy_det=1", "--current-step", "5"], "must give a rate to every task"),
        (["--add-stage", "50:batch=abc", "--current-step", "5"], "batch must be a whole number but got 'abc'"),
        (["--current-step", "5"], "--current-step goes with --add-stage"),
        (["--mixture", "toy_pair"], "Creating run 'cli_staged' needs --seed, --batch-size, --num-data-shards"),
    ],
)
def test_plan_errors_name_the_fix(root, capsys, args, message):
    if RunStore(str(root)).get("cli_staged") is None:
        test_plan_creates_a_run_with_stages_and_appends_more(root, capsys)
    assert plan_cli(root, "--name", "cli_staged", *args) == 2
    assert message in capsys.readouterr().err


def test_stage_syntax() -> None:
    assert parse_stage(" 7 : a = 1/3 , b=0 ") == Stage(7, {"a": 1, "b": 0})
    assert parse_stage("9:batch=2..8/6,multiple-of=2,a=1") == Stage(9, {"a": 1}, BatchSchedule.ramp(2, 8, 6, multiple_of=2))
    for bad, message in [
        ("x:batch=4", "expected STEP:ITEM"),
        ("9", "expected STEP:ITEM"),
        ("9:batch", "is not KEY=VALUE"),
        ("9:a=1,a=2", "gives 'a' twice"),
        ("9:batch=4,multiple-of=2", "multiple-of applies to a ramp"),
        ("9:batch=2..8", "a ramp is batch=START..END/STEPS"),
        ("9:batch=3", None),
    ]:
        if message is None:
            assert parse_stage(bad).schedule == BatchSchedule.constant(3)
            continue
        with pytest.raises(PlanError, match=message):
            parse_stage(bad)


def test_ledger_summary_and_plot_commands(root, capsys, tmp_path):
    if RunStore(str(root)).get("cli_staged") is None:
        test_plan_creates_a_run_with_stages_and_appends_more(root, capsys)
    capsys.readouterr()
    base = ["--cache-root", str(root)]
    assert main(["ledger", "cli_staged", "--step", "12", "--json", *base]) == 0
    step = json.loads(capsys.readouterr().out)
    assert step["step"] == 12 and step["stage"] == 1 and len(step["examples"]) == 8
    assert {e["task"] for e in step["examples"]} == {"toy_det"}
    assert main(["ledger", "cli_staged", "--step", "12", "--host", "1", "--num-hosts", "2", *base]) == 0
    text = capsys.readouterr().out
    assert "data shard 1 of 2" in text and all(e["id"] in text for e in step["examples"][4:])
    example = step["examples"][5]["id"]
    assert main(["ledger", "cli_staged", "--example", example, "--until-step", "500", "--json", *base]) == 0
    found = json.loads(capsys.readouterr().out)
    assert any(read["step"] == 12 and read["position"] == step["examples"][5]["position"] for read in found["reads"])
    assert main(["ledger", "cli_staged", "--example", example, "--until-step", "500", "--limit", "2", *base]) == 0
    text = capsys.readouterr().out
    assert f"read {found['total']:,} times in steps 0..499" in text and "raise --limit" in text
    assert main(["summary", "cli_staged", "--step", "45", *base]) == 0
    text = capsys.readouterr().out
    assert "stage 3 (from step 40): batch 16, rates toy_det=1, toy_random=0" in text and "toy_random" in text
    assert main(["summary", "cli_staged", "--step", "45", "--json", *base]) == 0
    assert json.loads(capsys.readouterr().out)["stage"]["index"] == 3
    out = tmp_path / "run.png"
    assert main(["plot", "cli_staged", "--out", str(out), *base]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG" and "3 stage starts marked" in capsys.readouterr().out
    assert main(["ledger", "nope", "--step", "1", *base]) == 2
    assert "There is no run 'nope'" in capsys.readouterr().err
    assert main(["ledger", "cli_staged", "--example", example, "--host", "1", *base]) == 2
    assert "--host and --num-hosts go with --step" in capsys.readouterr().err
