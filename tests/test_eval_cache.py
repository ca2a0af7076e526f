"""``taskdata eval --cache``: targets and ids read from a cache version."""

from __future__ import annotations

import json

import pytest

from taskdata.cli import main
from taskdata.define.registry import Registry
from taskdata.evaluation import SourceTargets
from taskdata.evaluation.targets import CacheTargets
from tests.cache_helpers import build

pytestmark = pytest.mark.slow  # cache jobs (Beam)


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalcache")
    build(root, task="toy_random", seed=3, num_shards=2)
    return root


def test_cache_targets_equal_the_targets_recomputed_from_source(cache_root):
    registry = Registry()
    registry.load_module("tests.cache_tasks")
    task = registry.get_task("toy_random")
    from_cache = sorted((i, t) for i, t, _ in CacheTargets(str(cache_root), seed=3)(task, "validation"))
    from_source = sorted((i, t) for i, t, _ in SourceTargets(seed=3)(task, "validation"))
    assert from_cache == from_source and len(from_cache) == 87


def test_eval_cli_scores_predictions_against_the_cache(cache_root, tmp_path, capsys):
    registry = Registry()
    registry.load_module("tests.cache_tasks")
    task = registry.get_task("toy_random")
    records = list(CacheTargets(str(cache_root))(task, "validation"))
    predictions = tmp_path / "preds.jsonl"
    with predictions.open("w") as f:
        for i, (example_id, text, _) in enumerate(records):
            f.write(json.dumps({"id": example_id, "prediction": text if i % 3 else "wrong"}) + "\n")
    report = tmp_path / "report.json"
    assert main(["eval", "toy_random", "--module", "tests.cache_tasks", "--cache", str(cache_root),
                 "--predictions", str(predictions), "--output", str(report)]) == 0
    assert "toy_random" in capsys.readouterr().out
    [task_report] = json.loads(report.read_text())["tasks"]
    assert task_report["num_scored"] == 87
    wrong = len(range(0, 87, 3))
    assert task_report["metrics"]["sequence_accuracy"] == pytest.approx(100 * (87 - wrong) / 87)


def test_wrong_seed_is_refused(cache_root):
    registry = Registry()
    registry.load_module("tests.cache_tasks")
    with pytest.raises(ValueError, match="was built with seed 3, not 4"):
        list(CacheTargets(str(cache_root), seed=4)(registry.get_task("toy_random"), "validation"))


def test_missing_cache_says_what_it_expected(tmp_path):
    registry = Registry()
    registry.load_module("tests.cache_tasks")
    with pytest.raises(ValueError, match="holds no complete cache of task 'toy_det'"):
        list(CacheTargets(str(tmp_path))(registry.get_task("toy_det"), "validation"))


def test_a_cache_of_other_source_files_names_the_source_as_the_difference(tmp_path, monkeypatch):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("one\ntwo\n")
    monkeypatch.setenv("TASKDATA_TEST_TEXT_DIR", str(texts))
    build(tmp_path / "cache", task="toy_text", num_shards=2)
    (texts / "a.txt").write_text("one\ntwo\nthree\n")
    registry = Registry()
    registry.load_module("tests.cache_tasks")
    with pytest.raises(ValueError, match=r"differing: source; .*The source files differ: pass the --c4-dir"):
        list(CacheTargets(str(tmp_path / "cache"))(registry.get_task("toy_text"), "train"))
