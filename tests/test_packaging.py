"""The packaging path a Dataflow/Flink/Spark user takes, as far as it runs here.

Remote Beam workers need taskdata and the user's task modules. Beam's stager builds an sdist of this
project from ``--setup_file=pyproject.toml`` and ships any ``--extra_package``; the workers install
both and the cache job imports the user's module by name (``--module``). Here we stage both with
Beam's own stager, install the staged user package into a separate folder, and run a multi-process
cache job whose workers can only find the task module there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("taskdata", "server", "trainer_client")  # the packages users import

USER_TASKS = '''
import dataclasses
from taskdata.define.features import Feature
from taskdata.sources import FunctionSource
from taskdata.define.task import Task
from taskdata.define.vocabularies import ByteVocabulary

def documents(split, shard):
    for i in range(30):
        yield {"text": f"{split} {shard} user document {i}"}

@dataclasses.dataclass(frozen=True)
class ToTargets:
    def __call__(self, examples, ctx):
        vocab = ctx.output_features["targets"].vocabulary
        for example in examples:
            yield {"targets": vocab.encode(example["text"]), "_source_index": example["_source_index"]}

def register_tasks(registry):
    registry.add(Task("user_pkg_task", FunctionSource(documents, {"train": ["0", "1", "2"]}), [ToTargets()],
                      {"targets": Feature(ByteVocabulary())}))
'''


def _user_package(folder: Path) -> Path:
    (folder / "my_tasks").mkdir(parents=True)
    (folder / "my_tasks" / "__init__.py").write_text("")
    (folder / "my_tasks" / "tasks.py").write_text(textwrap.dedent(USER_TASKS))
    (folder / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "my-tasks"
        version = "1.0"
        [tool.setuptools]
        packages = ["my_tasks"]
    '''))
    out = folder / "dist"
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--outdir", str(out), str(folder)],
                   check=True, capture_output=True, timeout=300)
    [sdist] = out.glob("*.tar.gz")
    return sdist


def _staged_name(artifact) -> str:
    from apache_beam.portability.api import beam_runner_api_pb2

    payload = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(artifact.role_payload)
    return payload.staged_name


@pytest.mark.slow
def test_beam_stager_ships_taskdata_and_user_tasks_and_workers_run_them(tmp_path):
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.stager import Stager

    user_sdist = _user_package(tmp_path / "user")
    staging = tmp_path / "staging"
    staging.mkdir()
    options = PipelineOptions([f"--setup_file={ROOT / 'pyproject.toml'}", f"--extra_package={user_sdist}"])
    resources = Stager.create_job_resources(options, str(staging))
    staged = {_staged_name(r) for r in resources}
    assert "workflow.tar.gz" in staged and user_sdist.name in staged

    [own_sdist] = [p for p in staging.glob("taskdata-*.tar.gz")]
    with tarfile.open(own_sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for module in ("taskdata/cli.py", "taskdata/beam/pipeline.py", "taskdata/beam/job.py", "taskdata/tasks/c4.py",
                   "taskdata/preprocessors/span_corruption.py", "taskdata/index/assign.py", "pyproject.toml"):
        assert module in names, f"{module} is not in the staged sdist"

    # A worker environment: the user's package installed somewhere only the workers are told about.
    site = tmp_path / "worker_site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(user_sdist)], check=True, capture_output=True, timeout=300)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    result = subprocess.run(
        [sys.executable, "-m", "taskdata", "cache", "--task", "user_pkg_task", "--module", "my_tasks.tasks",
         "--output", str(tmp_path / "cache"), "--num-shards", "2", "--quiet", "--",
         "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert list((tmp_path / "cache" / "user_pkg_task").glob("v*/COMPLETED"))


@pytest.mark.slow
def test_the_wheel_ships_every_package_with_its_py_typed_marker(tmp_path):
    # Built from what the Dockerfile copies, so that the image's 'pip install .' gets the same wheel.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(tmp_path / "dist"),
                    str(source)], check=True, capture_output=True, timeout=300)
    [wheel] = (tmp_path / "dist").glob("taskdata-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for package in PACKAGES:
        assert f"{package}/py.typed" in names, f"{package}/py.typed is not in the wheel: PEP 561 checkers ignore it"
        assert f"{package}/__init__.py" in names
    assert not any(name.startswith("tests/") for name in names)
