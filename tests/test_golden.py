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
were but changed every manifest, so the plan fingerprints in the ``/shards`` bodies changed. Cache
format 4 (compact provenance: one ``provenance/origin`` feature per record, source files in the
manifest) changed the shard bytes, the manifests and the byte offsets in the bodies. Origins sidecars
(issue 19) changed the manifests only, so only the fingerprints in the bodies.
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

# Changed by issue 21 (cache format taskdata.cache/4): records carry one compact provenance/origin feature
# instead of seqio-style provenance features, and the manifest lists each split's source files.
SHARD_SHA256 = {
    "toy_det": [
        "daeba9b5ec55b6e9324db4478a5c268f4231da40ab631a27489e4463996a354c",
        "9a781315fc1becec730c0d7f0dfa68c8c5d42328898282886c84bb9f76ce848b",
        "37f03778c27f138862312bf799dfea36cc62d598892f3de6d094bc623cbaa9cc",
    ],
    "toy_random": [
        "3f0f647ac35c70f9a59ca3b00dae70a31c14ce529884ee5eedbfca926bc404fa",
        "1d035ef816aef10a8d8cdc1bb6337d3792b92fb6fa551ddc6b00e404cb43cd61",
        "e88d14b8d06e4a4d21ce1d589abc04b0e81b7e091fe2c053188b58c78bba29f7",
    ],
}

# Changed twice by issue 15, each time for a stated reason: the plan fingerprint covers the run's split
# (run format taskdata.run/2), and every manifest (so every pinned cache fingerprint) changed with cache
# format taskdata.cache/2 (offsets sidecars hold each record's CRC). The shard bytes did not change.
# Changed by issue 21 with cache format taskdata.cache/4: new manifests (so new cache fingerprints) and
# smaller records (so other byte offsets). The records each step reads are the same.
# Changed by issue 19's origins sidecars (index/<shard>.origins, listed in each split's manifest entry): new
# manifests, so new cache and plan fingerprints; with every 64-hex-digit fingerprint masked, each body is
# byte for byte what it was. No format bump: the shard bytes are pinned unchanged above, and a reader that
# predates the sidecars ignores the manifest's new key (taskdata.cache.format).
SHARDS_BODY_SHA256 = {
    "0/ints": "f69692e65b04af76be3cbf79fd156134b936666e4c22c1d8d2d090932238fbb5",
    "0/base64": "7668ccbdd53418c05b7d27d86159fe5d1f8fc9ece9b86e680a965a3b5395d1b4",
    "100/ints": "78a6351e04c28708fc9640f694513ff6098d3816d03c18b06cd583e34e87260a",
    "100/base64": "e37c8ba04b5162f90e1c38572955203b37b26a6ba96deeb7eb924c50a0c7440b",
    "1000000000000000/ints": "10b06074b9fca4fa0fe34963085aeecbeb5e4eae76153409d7424e88daa27dc8",
    "1000000000000000/base64": "b44ac8ce169b47185b13539b8ebae2d10c469ce15aa36df09a40996c0b00c93e",
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
