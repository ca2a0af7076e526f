"""Golden bytes: a small cache's shards and a few ``/shards`` bodies, pinned so refactors cannot move them.

Recipe (everything below is deterministic; change a pinned value only with a format or index-math
version bump, and say why in the commit):

- caches: ``tests.cache_tasks`` tasks ``toy_det`` and ``toy_random``, split train, seed 0, 3 shards
  each, built with the in-process Beam runner (``tests.cache_helpers.build``);
- run ``golden``: both tasks at rates 1:3, seed 5, global batch 16, 4 data shards;
- run ``golden_block``: the same, with the block epoch order (blocks of 2 records) and a stage from step 50
  on (rates 1:1, global batch 32);
- ``/shards`` of host 1 of 4 at steps 0-1 (epoch 0), 100-101 (later epochs) and 10**15 (far out),
  in every encoding; version folder names and the cache root are replaced by placeholders, because
  they hold the build time and a temporary path.

History: cache format 2 (offsets sidecars list every record's data CRC) left the shard bytes as they
were but changed every manifest, so the plan fingerprints in the ``/shards`` bodies changed. Cache
format 4 (compact provenance: one ``provenance/origin`` feature per record, source files in the
manifest) changed the shard bytes, the manifests and the byte offsets in the bodies. Origins sidecars
(issue 19) changed the manifests only, so only the fingerprints in the bodies.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import shutil
import socket
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from server.main import create_app
from server.settings import Settings
from taskdata.cache.reader import CacheReader
from taskdata.index import BatchSchedule, BlockOrder, RunPlan, Stage, TaskCache
from taskdata.runs import RunStore, StoredRun
from tests.cache_helpers import build
from tests.server_helpers import Server, environment

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
    # Pinned by issue 36 before the index package's redesign, from the code as it was (4a51cea):
    "0/compact": "8531ee79a7c740e2508cb2036513daa76b0cf1ff98a6e4e8771f935e0cd37e78",
    "100/compact": "42135cc55f9939647f5692cb23e5b7494f203a181c9047fe2ec70fa2aeb23a0b",
    "1000000000000000/compact": "03a2eed78dc04608045e9a4a04edad0137edc03270a2b9396fa81e763721e850",
    "golden_block/0/ints": "bbee68dd5d02a90a18408e047f9ef4ca20abe308273db576a2e4fcab711c5af9",
    "golden_block/0/base64": "47f574614a5673bab890a1d62c093a318ce348d3f10c7e5d12a09ced4e5c111e",
    "golden_block/0/compact": "099889ee4b19e07d771e32914f402565f29f2c86f8e0e2bd3ab28ac89b2e5a1f",
    "golden_block/100/ints": "5455db652f8b43d3fe35333e11ff9d2cb10018aa0e7aa635f9d5ff2cb1418079",
    "golden_block/100/base64": "b0432658f625c35cec5dfacb390f31f963152876fda541f69ef8d4439169ad88",
    "golden_block/100/compact": "3fa89c327a855b26742f08d2efede6137343ce17be10a927d0d98ba7dd6837c7",
    "golden_block/1000000000000000/ints": "1cd1802767936f8b7a671a4691f21911d072134609a441e9680830ecf63cfeea",
    "golden_block/1000000000000000/base64": "bebe676321dfbbc233820fc5e4aa808aaedcf94fdd3e05c0d0b486937996d157",
    "golden_block/1000000000000000/compact": "438d32ce3023153dacb45787d4c48459a31c21ec22fd93a971c8f79b41671a54",
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
    store = RunStore(str(root))
    store.create(StoredRun(plan))
    stage = Stage(50, rates={"toy_det": 1, "toy_random": 1}, schedule=BatchSchedule.constant(32))
    store.create(StoredRun(dataclasses.replace(plan, name="golden_block", epoch_order=BlockOrder(2), stages=(stage,))))
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


@pytest.mark.parametrize("encoding", ["ints", "base64", "compact"])
@pytest.mark.parametrize("step", [0, 100, 10**15])
@pytest.mark.parametrize("run", ["golden", "golden_block"])
def test_shards_bodies_are_pinned(golden, run, step, encoding):
    root, dirs = golden
    app = create_app(Settings(cache_root=str(root)))
    with TestClient(app) as client:
        params = {"run": run, "host": 1, "num_hosts": 4, "step": step, "steps": 2, "encoding": encoding}
        response = client.get("/shards", params=params)
    assert response.status_code == 200, response.text
    body = _normalised(response.content, root, dirs)
    key = f"{step}/{encoding}" if run == "golden" else f"{run}/{step}/{encoding}"
    assert hashlib.sha256(body).hexdigest() == SHARDS_BODY_SHA256.get(key), (key, body[:400])


# --- every /shards answer, pinned before its shortcuts were removed (issue 36) ---------------------------
#
# Recipe: the ``golden`` run above, served with the bearer token TOKEN; ``shards_requests(seed=36, count=240)``
# (random queries, valid and not, with good, missing and wrong tokens). Each answer is recorded as its status,
# its headers but ``date`` and ``content-length`` (checked against the body's length instead) and its body,
# the cache root and version folders replaced as above. ``tests/data/golden_shards_answers.json`` holds the
# first 16 hex digits of each record's sha256, recorded at commit 4a51cea, when three implementations answered
# GET /shards (the route, an answer before routing, an answer at uvicorn's protocol). ``RAW_ANSWERS`` pins the
# bytes ``taskdata serve --no-access-log`` wrote on the socket for a few requests at that commit.

TOKEN = "golden-token-36"
ANSWERS_FILE = Path(__file__).parent / "data" / "golden_shards_answers.json"
READ_DEADLINE = 20.0  # seconds any one socket read may take


@pytest.fixture(scope="module")
def golden_only(golden, tmp_path_factory):
    """The golden caches with the ``golden`` run alone, as when the answers below were recorded (an unknown
    run's 404 names the runs there are; ``golden_block`` came later)."""
    root, dirs = golden
    copy = tmp_path_factory.mktemp("golden_only") / "caches"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("golden_block*"))
    return copy, {task: str(copy / Path(d).relative_to(root)) for task, d in dirs.items()}


def shards_requests(seed: int, count: int) -> list[tuple[str, dict[str, str]]]:
    """Random ``GET /shards`` requests of the golden run: about 3 in 4 valid, the rest wrong in one way."""
    rng = random.Random(seed)
    good = {"Authorization": f"Bearer {TOKEN}"}
    steps = ["0", "1", "2", "5", "9", "100", "101", "1000000", str(10**15), str(2**53 - 17)]
    wrong = [("host", "x"), ("host", "-1"), ("host", "01"), ("host", "4"), ("step", "-1"), ("step", str(2**53)),
             ("steps", "0"), ("steps", "65"), ("num_hosts", "0"), ("num_hosts", "3"), ("encoding", "hex"),
             ("run", "nope"), ("run", "_bad"), ("bogus", "1"), ("step", None), ("host", None)]  # fmt: skip
    requests = []
    for _ in range(count):
        num_hosts = rng.choice([None, 1, 2, 4, 8, 16])
        params: dict[str, str | None] = {
            "host": str(rng.randrange(4 if num_hosts is None else num_hosts)),
            "step": rng.choice(steps),
            "run": rng.choice(["golden", "golden", "gold%65n"]),
        }
        if num_hosts is not None:
            params["num_hosts"] = str(num_hosts)
        if rng.random() < 0.5:
            params["steps"] = rng.choice(["1", "2", "3", "16"])
        if rng.random() < 0.7:
            params["encoding"] = rng.choice(["ints", "base64", "compact", "compact"])
        if rng.random() < 0.2:
            name, value = rng.choice(wrong)
            params[name] = value  # None: left out
        pairs = [(name, value) for name, value in params.items() if value is not None]
        rng.shuffle(pairs)
        if rng.random() < 0.05:
            pairs.append(pairs[0])  # a parameter twice
        query = "&".join(f"{name}={value}" for name, value in pairs)
        headers = rng.choices([good, {}, {"Authorization": f"Bearer {TOKEN}x"}], weights=(0.92, 0.04, 0.04))[0]
        requests.append((f"/shards?{query}", headers))
    return requests


def answer_digest(status: int, headers: list[tuple[str, str]], body: bytes, root: Path, dirs: dict[str, str]) -> str:
    kept = []
    for name, value in headers:
        if name == "content-length":
            assert int(value) == len(body), (headers, len(body))
        elif name != "date":
            kept.append(f"{name}: {value}")
    record = f"{status}\n" + "\n".join(kept) + "\n\n"
    return hashlib.sha256(record.encode() + _normalised(body, root, dirs)).hexdigest()[:16]


def test_shards_answers_to_random_requests_are_pinned(golden_only):
    root, dirs = golden_only
    pinned = json.loads(ANSWERS_FILE.read_text())
    requests = shards_requests(seed=36, count=240)
    assert len(pinned) == len(requests)
    app = create_app(Settings(cache_root=str(root), token=SecretStr(TOKEN)))
    statuses = []
    with TestClient(app) as client:
        for i, (path, headers) in enumerate(requests):
            response = client.get(path, headers=headers)
            statuses.append(response.status_code)
            digest = answer_digest(response.status_code, response.headers.items(), response.content, root, dirs)
            assert digest == pinned[i], (i, path, headers, response.status_code, response.content[:300])
    assert {200, 400, 401, 404, 422} <= set(statuses) and statuses.count(200) > len(requests) / 3


# Request targets, sent in this order on one kept-alive connection with the token (the last also with
# ``Connection: close``), and then one without the token on a new connection.
RAW_REQUESTS = {
    "compact": "/shards?run=golden&host=1&num_hosts=4&step=0&steps=2&encoding=compact",
    "compact again": "/shards?run=golden&host=1&num_hosts=4&step=0&steps=2&encoding=compact",
    "base64": "/shards?host=3&step=100&run=golden&encoding=base64",
    "ints, a window": "/shards?host=0&step=200&steps=16&run=golden&num_hosts=2",
    "percent-encoded": "/shards?run=gold%65n&host=1&num_hosts=4&step=0&steps=2&encoding=compact",
    "host out of range": "/shards?run=golden&host=4&step=0",
    "invalid step": "/shards?run=golden&host=0&step=-1",
    "unknown run": "/shards?run=nope&host=0&step=0",
    "closing": "/shards?run=golden&host=2&step=101&encoding=compact",
    "no token": "/shards?run=golden&host=2&step=101&encoding=compact",
}
RAW_ANSWERS = {  # name: (head, with date and content-length as *; the body's digest)
    "compact": ("HTTP/1.1 200 OK\r\ndate: *\r\nserver: uvicorn\r\ncontent-length: *\r\ncontent-type: application/json", "8531ee79a7c740e2"),
    "compact again": ("HTTP/1.1 200 OK\r\ndate: *\r\nserver: uvicorn\r\ncontent-length: *\r\ncontent-type: application/json", "8531ee79a7c740e2"),
    "base64": ("HTTP/1.1 200 OK\r\ndate: *\r\nserver: uvicorn\r\ncontent-length: *\r\ncontent-type: application/json", "7dc961801f9186cc"),
    "ints, a window": ("HTTP/1.1 200 OK\r\ndate: *\r\nserver: uvicorn\r\ncontent-length: *\r\ncontent-type: application/json", "4e6ab6c566307227"),
    "percent-encoded": ("HTTP/1.1 200 OK\r\ndate: *\r\nserver: uvicorn\r\ncontent-length: *\r\ncontent-type: application/json", "8531ee79a7c740e2"),
    "host out of range": ("HTTP/1.1 400 Bad Request\r\ndate: *\r\nserver: uvicorn\r\ncontent-length: *\r\ncontent-type: application/json", "98581408a82dce7f"),
    "invalid step": ("HTTP/1.1 422 Unprocessable Entity\r\ndate: *\r\nserver: uvicorn\r\ncontent-length: *\r\ncontent-type: application/json", "2caf93b9d1b7f55e"),
    "unknown run": ("HTTP/1.1 404 Not Found\r\ndate: *\r\nserver: uvicorn\r\ncontent-length: *\r\ncontent-type: application/json", "d106bd27c7d26db4"),
    "closing": ("HTTP/1.1 200 OK\r\ndate: *\r\nserver: uvicorn\r\ncontent-length: *\r\ncontent-type: application/json\r\nconnection: close", "83ce787e8edd529f"),
    "no token": ("HTTP/1.1 401 Unauthorized\r\ndate: *\r\nserver: uvicorn\r\nwww-authenticate: Bearer\r\ncontent-length: *\r\ncontent-type: application/json", "9456fadd5631f19a"),
}


def _read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or pytest.fail(f"closed after {data!r}")
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"\r\ncontent-length: (\d+)", head).group(1))
    while len(body) < length:
        body += sock.recv(65536) or pytest.fail(f"closed after {head + body!r}")
    assert len(body) == length, "more bytes than the answer's content-length"
    return head, body


def test_the_bytes_taskdata_serve_writes_are_pinned(golden_only, tmp_path):
    root, dirs = golden_only
    token = tmp_path / "token"
    token.write_text(TOKEN)
    args = ["--cache-root", str(root), "--token-file", str(token), "--no-access-log"]
    server = Server(args, environment(tmp_path), tmp_path / "server.log")
    got = {}
    try:
        names = list(RAW_REQUESTS)
        with socket.create_connection(("127.0.0.1", server.port), timeout=READ_DEADLINE) as sock:
            for name in names[:-1]:
                close = b"Connection: close\r\n" if name == "closing" else b""
                sock.sendall(f"GET {RAW_REQUESTS[name]} HTTP/1.1\r\nHost: golden\r\nAuthorization: Bearer {TOKEN}\r\n"
                             .encode() + close + b"\r\n")  # fmt: skip
                got[name] = _read_answer(sock)
            assert sock.recv(65536) == b""  # closed after "closing"
        with socket.create_connection(("127.0.0.1", server.port), timeout=READ_DEADLINE) as sock:
            sock.sendall(f"GET {RAW_REQUESTS[names[-1]]} HTTP/1.1\r\nHost: golden\r\n\r\n".encode())
            got[names[-1]] = _read_answer(sock)
    finally:
        server.stop()
    for name, (head, body) in got.items():
        head = re.sub(rb"\r\ndate: [^\r]*", b"\r\ndate: *", head)
        head = re.sub(rb"\r\ncontent-length: \d+", b"\r\ncontent-length: *", head)
        digest = hashlib.sha256(_normalised(body, root, dirs)).hexdigest()[:16]
        assert (head.decode(), digest) == RAW_ANSWERS[name], (name, head, body[:300])


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
