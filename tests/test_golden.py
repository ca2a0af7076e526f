"""Golden bytes: a small cache's shards and a few ``/shards`` bodies, pinned so refactors cannot move them.

Recipe (everything below is deterministic; change a pinned value only with a format or index-math
version bump, and say why in the commit):

- caches: ``tests.cache_tasks`` tasks ``toy_det`` and ``toy_random``, split train, seed 0, 3 shards
  each, built with the in-process Beam runner (``tests.cache_helpers.build``);
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
from tests.cache_helpers import build

pytestmark = pytest.mark.slow  # cache jobs (Beam)

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
# Changed again when each origins sidecar's entry gained its byte size ("bytes", so that the listing check
# sizes sidecars from the listing of index/ without reading them): new manifests, new fingerprints only.
SHARDS_BODY_SHA256 = {
    "0/ints": "bec941352528079f2db9c5d270c91a6b03b70f0e5a526dc00eb2802456d5b667",
    "0/base64": "b1c3e6abb8ed15fc64de9738211f9a7898e3e412edb2bab35268839089f89d8e",
    "100/ints": "9394bbb3769284c940fd2cde826e6cedf8e66a1ba9910fb13a5c09851b31ecb4",
    "100/base64": "71eb5ee4d197045a0e4042c7e83e9f54f8c08906ab529d7057b385ddf03b39af",
    "1000000000000000/ints": "664923d3122d97ad228c0e0068ba492e7227b856aaf86b256b1c07c38eaf2523",
    "1000000000000000/base64": "43b8b764779f6b45dc23440504c8c3eed8922f629d8b65e843661fd9cf87bd58",
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


# Span corruption's records, made in columns (ExampleBatch, issue 21): pinned from the per-example code
# before the column path existed (commit 330c874), so the column path is shown to write the same bytes.
SPAN_SHARD_SHA256 = [
    "46a58cceef9a5d8af2c31c314e0b0fcfad315f23e66f107a80747fb64003698e",
    "38daadc865abaffd087f1d6d0fea2e4056f68286217dc607a395d4714ae33358",
    "37cf0f6a1a40ba64b99114b38b32b724c659d013ced113fa6112b12cf5991a80",
]


def test_span_corruption_shards_are_pinned_in_columns_and_example_by_example(tmp_path, monkeypatch):
    from taskdata.beam import pipeline

    columns = build(tmp_path / "columns", task="toy_span", num_shards=3, splits=("train",)).version_dir
    assert _shard_hashes(columns) == SPAN_SHARD_SHA256
    other_seed = build(tmp_path / "seed1", task="toy_span", num_shards=3, splits=("train",), seed=1).version_dir
    assert set(_shard_hashes(other_seed)).isdisjoint(SPAN_SHARD_SHA256)  # the pin is not of something seedless
    monkeypatch.setattr(pipeline, "_runs_in_columns", lambda task: False)

    def no_columns(*args):
        raise AssertionError("the column path ran")

    monkeypatch.setattr(pipeline, "encode_cache_records", no_columns)
    rows = build(tmp_path / "rows", task="toy_span", num_shards=3, splits=("train",)).version_dir
    assert _shard_hashes(rows) == SPAN_SHARD_SHA256
