"""A trainer host's install: ``pip install 'taskdata[client]'`` into a fresh virtualenv reads a run's caches
locally, on gs:// and through the server, with neither Apache Beam, TensorFlow nor tensorflow-text installed
or imported; the cache job and the server say, in one line, which extra they need."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.client_helpers import LENGTHS, REPO, reference_hashes, serve, shared_root
from tests.gcs_emulator import gcs_emulator

pytestmark = pytest.mark.slow

HEAVY = ("apache_beam", "tensorflow", "tensorflow_text", "seqio")
STEPS = range(0, 4)

READ = """
import importlib.util, json, sys
from taskdata.runs import RunStore
from trainer_client import DataIterator, HostSlice, LocalAssignments, ServerAssignments, batch_hash, row_digests

heavy, where, run, lengths = sys.argv[1].split(","), sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
if where.startswith("http"):
    source = ServerAssignments(where, run)
else:
    source = LocalAssignments.from_cache_root(RunStore(where).get(run), where)
with DataIterator(source, lengths, host_slice=HostSlice(0, 1), stop_step=4) as batches:
    hashes = {b.step: batch_hash(row_digests(b.features)) for b in batches}
import trainer_client.arrays  # the JAX side, which [client] installs
print(json.dumps({"hashes": hashes, "installed": [m for m in heavy if importlib.util.find_spec(m)],
                  "imported": sorted({m.split(".")[0] for m in sys.modules} & set(heavy)),
                  "taskdata": __import__("taskdata").__file__}))
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


@pytest.fixture(scope="module")
def light(tmp_path_factory):
    """A virtualenv with this tree installed as ``taskdata[client]`` (the versions of requirements.lock)."""
    venv = tmp_path_factory.mktemp("light") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"{REPO}[client]", "-c",
                           f"{REPO}/requirements.lock"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def read(light, where, run="mix1", env=None, cwd=None):
    done = subprocess.run([str(light), "-c", READ, ",".join(HEAVY), where, run, json.dumps(LENGTHS)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_client_install_reads_locally_on_gcs_and_through_the_server_without_beam_or_tensorflow(
        light, root, tmp_path):
    expected = {str(step): digest for step, digest in reference_hashes(root, "mix1", STEPS).items()}
    got = read(light, root, cwd=tmp_path)
    assert got["installed"] == [] and got["imported"] == []
    assert got["taskdata"].startswith(str(light.parent.parent))  # the installed package, not this tree
    assert got["hashes"] == expected
    with serve(root) as url:
        assert read(light, url, cwd=tmp_path) == got
    with gcs_emulator("caches") as env:
        upload = f"from gcsfs import GCSFileSystem\nGCSFileSystem().put({root!r}, 'caches/root', recursive=True)\n"
        done = subprocess.run([sys.executable, "-c", upload], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        assert read(light, "gs://caches/root", env=env, cwd=tmp_path) == got
    # Negative control: another seed's run reads other batches (past its first epoch).
    other = {str(step): digest for step, digest in reference_hashes(root, "other_seed", range(40, 42)).items()}
    assert other != {str(s): d for s, d in reference_hashes(root, "mix1", range(40, 42)).items()}


def test_the_cache_job_and_the_server_name_the_extra_they_need(light, tmp_path):
    taskdata = light.parent / "taskdata"
    for args, extra in ((["cache", "--task", "c4_span_corruption"], "cache"), (["serve"], "server")):
        done = subprocess.run([str(taskdata), *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pip install 'taskdata[{extra}]'" in lines[0], done.stderr
