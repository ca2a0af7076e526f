"""Golden bytes: a small cache's shards and a few ``/shards`` bodies, pinned so refactors cannot move them.

Recipe (everything below is deterministic; change a pinned value only with a format or index-math
version bump, and say why in the commit):

- caches: ``tests.cache_tasks`` tasks ``toy_det`` and ``toy_random``, split train, seed 0, 3 shards
  each, built with the in-process Beam runner (``tests.test_cache_job.build``);
- run ``golden``: both tasks at rates 1:3, seed 5, global batch 16, 4 data shards;
- ``/shards`` of host 1 of 4 at steps 0-1 (epoch 0), 100-101 (later epochs) and 10**15 (far out),
  in both encodings; version folder names and the cache root are replaced by placeholders, because
  they hold the build time and a temporary path.

History: cache format 2 (offsets sidecars list every record's data CRC) left the shard bytes as they
were but changed every manifest, so the plan fingerprints in the ``/shards`` bodies changed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.main import create_app
from server.settings import Settings
from taskdata.cache.reader import CacheReader
from taskdata.index import BatchSchedule, RunPlan, TaskCache
from taskdata.runs import RunStore, StoredRun
from tests.test_cache_job import build

SHARD_SHA256 = {
    "toy_det": [
        "0828bc7b98ea203b3bab64af91fbad98c6cd59f90a33fa741989eb3188e1916d",
        "a4a442db021b09709555a8a6e07e78e893fca64926b0d32d21c48e3de3dc466d",
        "8858dbe6df67cbd023a182ea526acb82f40a983cddef6aca8e472fbe3bf08463",
    ],
    "toy_random": [
        "f260bab576ee12cf62b504d3355ab53ff040a55972fc3a74597ff8e6fcbcb04e",
        "934cbc7dfbb18bea53875f0320d950bfd79938e12ad22ed5746642424de68f5c",
        "129f3dd8607fba7f928a4d1e303e41f97cbcca35ee8ec394f4d51522efd609d8",
    ],
}

# Changed twice by issue 15, each time for a stated reason: the plan fingerprint covers the run's split
# (run format taskdata.run/2), and every manifest (so every pinned cache fingerprint) changed with cache
# format taskdata.cache/2 (offsets sidecars hold each record's CRC). The shard bytes did not change.
SHARDS_BODY_SHA256 = {
    "0/ints": "f07fe536c78fcad742b0098493dde62231c9f95233ed651d194ff6adcb27412b",
    "0/base64": "fe67c9476085e9113d734866b99d1849dbfe229afebdd9a4079686b0e9cb6de5",
    "100/ints": "d0a9a5054e328e19ab1ef62ce0c8c85fadc489f15525e0bcbe9053a7c6d43013",
    "100/base64": "1e389edb79a479aedc427f2b779821e8c837a8fc1fcdb303b58e47d875d6b268",
    "1000000000000000/ints": "87fe656c4f75458ad321648f22dc89e3159c51b89ebd4ff9ba712af85e133cca",
    "1000000000000000/base64": "12d2178017dcc6bff3808101e77ec5c9f16b1e80605e5558fe521d001f543b1d",
}


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden") / "caches"
    dirs = {task: build(root, task=task, num_shards=3, splits=("train",)).version_dir for task in ("toy_det", "toy_random")}
    readers = {task: CacheReader(d) for task, d in dirs.items()}
    plan = RunPlan(
        name="golden",
        mixture="golden_mix",
        caches={t: TaskCache(r.manifest_sha256, r.record_counts("train")) for t, r in readers.items()},
        rates={"toy_det": 1, "toy_random": 3},
        seed=5,
        schedule=BatchSchedule(start=16, end=16),
        num_data_shards=4,
    )
    RunStore(str(root)).create(StoredRun(plan))
    return root, dirs


def _shard_hashes(version_dir: str) -> list[str]:
    return [
        hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(Path(version_dir).glob("train.tfrecord-*"))
    ]


def _normalised(body: bytes, root: Path, dirs: dict[str, str]) -> bytes:
    for version_dir in dirs.values():
        body = body.replace(Path(version_dir).name.encode(), b"{version}")
    return body.replace(str(root).encode(), b"{root}")


def test_shard_bytes_are_pinned(golden):
    _, dirs = golden
    got = {task: _shard_hashes(d) for task, d in dirs.items()}
    assert got == SHARD_SHA256


@pytest.mark.parametrize("encoding", ["ints", "base64"])
@pytest.mark.parametrize("step", [0, 100, 10**15])
def test_shards_bodies_are_pinned(golden, step, encoding):
    root, dirs = golden
    app = create_app(Settings(cache_root=str(root)))
    with TestClient(app) as client:
        params = {"run": "golden", "host": 1, "num_hosts": 4, "step": step, "steps": 2, "encoding": encoding}
        response = client.get("/shards", params=params)
    assert response.status_code == 200, response.text
    body = _normalised(response.content, root, dirs)
    assert hashlib.sha256(body).hexdigest() == SHARDS_BODY_SHA256.get(f"{step}/{encoding}"), body[:400]
