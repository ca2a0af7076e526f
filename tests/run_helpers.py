"""Caches and runs shared by the tests of runs, the server and the CLI (not a test module).

``shared_caches`` builds three small real caches once per session with the in-process Beam runner; a test
that uses it (or ``copy_caches``) runs a Beam job the first time and is slow. Tests that damage a cache
work on a copy.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from taskdata.beam.job import CacheOptions, run_cache_job
from taskdata.define.registry import Registry
from taskdata.define.task import Task
from taskdata.index import BatchSchedule
from taskdata.runs import StoredRun, build_run
from tests.cache_helpers import MODULE

__all__ = ["SHARDS", "TASKS", "build_caches", "copy_caches", "current_dir", "make_registry", "mix_run", "shared_caches"]

TASKS = ("toy_det", "toy_random", "toy_text")
SHARDS = {"toy_det": 3, "toy_random": 4, "toy_text": 2}
_built: dict[str, Path] = {}


def make_registry() -> Registry:
    """The cache-test tasks, a 3-task mixture of them and a task that is never cached."""
    from taskdata.sources import FunctionSource
    from tests.cache_tasks import FEATURES, SPLITS, EncodeText, synthetic_documents

    registry = Registry()
    registry.load_module(MODULE)
    registry.add_mixture("toy_mix", [("toy_det", 3), ("toy_random", 2), ("toy_text", 1)])
    registry.add(Task("toy_uncached", FunctionSource(synthetic_documents, SPLITS), [EncodeText(9)], FEATURES))
    return registry


def build_caches(root: Path, seed: int = 0, tasks: tuple[str, ...] = TASKS) -> None:
    text_dir = root.parent / f"{root.name}-text"
    text_dir.mkdir(parents=True, exist_ok=True)
    for i in range(2):
        (text_dir / f"part{i}.txt").write_text(
            "".join(f"line {i}.{j}: some text {j * j}\n" for j in range(30 + i))
        )
    repo = str(Path(__file__).resolve().parent.parent)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TASKDATA_TEST_TEXT_DIR", str(text_dir))
        patch.setenv(
            "PYTHONPATH", repo + os.pathsep + os.environ.get("PYTHONPATH", "")
        )  # Beam workers import tasks
        for task in tasks:
            options = CacheOptions(
                task=task,
                output=str(root),
                seed=seed,
                num_shards=SHARDS[task],
                splits=("train",),
                modules=(MODULE,),
                progress=False,
            )
            run_cache_job(options, make_registry(), log=lambda message: None)


def shared_caches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache root with toy_det, toy_random and toy_text (seed 0), built once per session: do not modify."""
    if "root" not in _built:
        root = tmp_path_factory.mktemp("shared-caches") / "caches"
        build_caches(root)
        _built["root"] = root
    return _built["root"]


def copy_caches(tmp_path_factory: pytest.TempPathFactory, name: str = "caches") -> Path:
    target = tmp_path_factory.mktemp(name) / "caches"
    shutil.copytree(shared_caches(tmp_path_factory), target)
    return target


def mix_run(root: Path, name: str = "mix", seed: int = 7, **overrides) -> StoredRun:
    fields = dict(
        name=name, mixture="toy_mix", seed=seed, schedule=BatchSchedule.constant(16), num_data_shards=4
    )
    fields.update(overrides)
    return build_run(make_registry(), str(root), **fields)


def current_dir(root: Path, task: str) -> Path:
    return root / task / (root / task / "CURRENT").read_text().strip()
