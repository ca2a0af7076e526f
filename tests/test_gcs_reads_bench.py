"""The GCS latency bench's own instruments (bench/gcs_reads.py): its proxy passes the bytes through
unchanged, delays every request, counts exactly the GETs the client makes (one per run of records
consecutive in a shard), and everything it starts is stopped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from taskdata.cache.reader import CacheReader
from tests.cache_helpers import build

pytestmark = pytest.mark.slow  # cache jobs (Beam)

REPO = Path(__file__).resolve().parent.parent

# In a child process: gcsfs reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT on import, and the bench points
# this process's gcsfs at the proxy.
SCRIPT = """
import json, sys, time
from bench.gcs_reads import gcs_with_latency
from taskdata.cache.reader import CacheReader
version, delay_ms = sys.argv[1], float(sys.argv[2])
with gcs_with_latency(version, delay_ms) as setup:
    reader = CacheReader(setup.version)
    reader.read_records("train", [0, 1], [0, 0])  # opens both shards: sidecars and object metadata
    before, _ = setup.counts()
    started = time.perf_counter()
    # Shard 0: records 3, 4 and 5 are one run, 9 another; shard 1: record 2.
    records = reader.read_records("train", [0, 0, 1, 0, 0], [5, 3, 2, 9, 4])
    elapsed = time.perf_counter() - started
    after, _ = setup.counts()
    reader.close()
print(json.dumps({"delta": dict(after - before), "elapsed": elapsed, "pids": setup.pids,
                  "records": [r.hex() for r in records]}))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(shutil.which("gcp-storage-emulator", path=os.path.dirname(sys.executable)) is None
                    and shutil.which("gcp-storage-emulator") is None,
                    reason="gcp-storage-emulator is not installed")
def test_proxy_counts_each_ranged_get_delays_it_and_stops(tmp_path):
    version = build(tmp_path / "cache", num_shards=3).version_dir
    delay_ms = 60
    env = {k: v for k, v in os.environ.items() if k not in ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, version, str(delay_ms)], env=dict(env, PYTHONPATH=str(REPO)),
                         cwd=REPO, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # Three runs, three ranged GETs of shard bytes, and nothing else once the shards are open.
    assert result["delta"] == {"GET shard data media ranged": 3}
    assert result["elapsed"] >= 3 * delay_ms / 1000
    with CacheReader(version) as local:
        expected = local.read_records("train", [0, 0, 1, 0, 0], [5, 3, 2, 9, 4])
    assert [bytes.fromhex(r) for r in result["records"]] == expected
    assert not any(_alive(pid) for pid in result["pids"])
