"""Verification at scale: the CPU's hashing ceiling, full verification in parallel, first use of a
65,536-shard run at each level, on local disk and on a GCS emulator.

Run: PYTHONPATH=. python bench/bench_verify.py [--rounds 5] [--write]

- ceiling: sha256 and CRC32C (google_crc32c) over 64 MiB in memory, one thread, and sha256 in two
  threads at once (hashlib releases the GIL), the most a per-host verifier can reach on this CPU;
- full verification (``taskdata verify``'s code) of the cache ``bench_scale.py`` built from 100,000
  documents (real span-corruption records, ~1.3 KB each; files in the page cache) with 1, 2 and 4
  threads, in interleaved rounds, median;
- first use of bench_server.py's runs (3 tasks x 64 and x 65,536 shards): a fresh process per
  measurement builds the server's state and times the first use of the run exactly as a request
  starts it (``ServerState.resolving``: find the versions, verify at the level, load offsets, prepare
  the answers' file tables), at ``listing`` and at ``full`` (4 threads);
- the same on a GCS emulator (gcp-storage-emulator, in memory, a Python process on the same cores):
  full verification of the 100,000-document cache, and both levels on a 256-shard synthetic cache.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import write_section

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out"
SERVER_ROOT = OUT / "server"
JOB_CACHE = OUT / "scale-cache-100000" / "c4_span_corruption"


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def ceiling() -> list[str]:
    import google_crc32c

    data = os.urandom(64 << 20)

    def rate(function, threads: int = 1) -> float:
        best = float("inf")
        for _ in range(5):
            workers = [threading.Thread(target=function) for _ in range(threads)]
            started = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            best = min(best, time.perf_counter() - started)
        return threads * len(data) / best / 1e6

    sha = rate(lambda: hashlib.sha256(data).digest())
    sha2 = rate(lambda: hashlib.sha256(data).digest(), threads=2)
    crc = rate(lambda: google_crc32c.value(data))
    records = [data[i : i + 1300] for i in range(0, 16 << 20, 1300)]
    started = time.perf_counter()
    for record in records:
        google_crc32c.value(record)
    per_record = (time.perf_counter() - started) / len(records)
    return [
        f"ceiling on this CPU (best of 5, 64 MiB in memory): sha256 {sha:,.0f} MB/s in one thread, {sha2:,.0f} MB/s "
        f"in two at once; CRC32C ({google_crc32c.implementation} implementation) {crc:,.0f} MB/s; one CRC32C call "
        f"per 1,300-byte record {per_record * 1e6:.2f} us ({1300 / per_record / 1e6:,.0f} MB/s); load {load()}"
    ]


def full_local(rounds: int) -> list[str]:
    from taskdata.cache.format import current_version, load_manifest
    from taskdata.cache.verify import verify_version

    version = current_version(str(JOB_CACHE))
    if version is None:
        raise SystemExit(f"No cache under {JOB_CACHE}: run bench/bench_scale.py first.")
    manifest = load_manifest(version)
    size = sum(s.bytes for split in manifest.splits.values() for s in split.shards)
    shards = sum(len(split.shards) for split in manifest.splits.values())
    records = sum(split.num_records for split in manifest.splits.values())
    verify_version(version)  # page cache warm for every configuration
    times: dict[int, list[float]] = {1: [], 2: [], 4: []}
    loads = [load()]
    for _ in range(rounds):
        for workers in times:
            started = time.perf_counter()
            assert verify_version(version, workers=workers) == []
            times[workers].append(time.perf_counter() - started)
        loads.append(load())
    rates = {w: size / statistics.median(t) / 1e6 for w, t in times.items()}
    return [
        f"full verification, local disk (page cache), {size / 1e6:,.1f} MB in {shards} shards ({records:,} records "
        f"of {size / records:,.0f} bytes; the 100,000-document cache of bench_scale.py): "
        + ", ".join(f"{w} thread{'s' if w > 1 else ''} {r:,.0f} MB/s" for w, r in rates.items())
        + f" (median of {rounds} interleaved rounds); load {', '.join(loads)}"
    ]


def first_use(level: str, run: str, root: str) -> float:
    """Seconds of a run's first use, in a fresh process (``--first-use``)."""
    out = subprocess.run(
        [sys.executable, __file__, "--first-use", level, run, root],
        capture_output=True, text=True, timeout=1800, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return float(out.stdout.strip().splitlines()[-1])


def _first_use_child(level: str, run: str, root: str) -> None:
    from server.settings import Settings
    from server.state import build_state

    state = build_state(Settings(cache_root=root, runs_file=str(Path(root) / "runs.json"), first_use_check=level,
                                 verify_workers=4))
    stored, _ = state.find_run(run)
    started = time.perf_counter()
    state.resolving(stored).result()
    print(time.perf_counter() - started)


def first_use_local(rounds: int) -> list[str]:
    from bench.bench_server import make_runs

    started = time.monotonic()
    runs = make_runs(SERVER_ROOT)  # written once, reused
    (SERVER_ROOT / "runs.json").write_text(json.dumps(runs))
    lines = [f"bench_server.py's caches (3 tasks x 64 and x 65,536 shards, 328,704 records per layout) ready in "
             f"{time.monotonic() - started:.1f} s"]
    for run in ("r64", "r65536"):
        listing, loads = [], [load()]
        for _ in range(rounds):
            listing.append(first_use("listing", run, str(SERVER_ROOT)))
            loads.append(load())
        full = first_use("full", run, str(SERVER_ROOT))
        loads.append(load())
        lines.append(
            f"first use of run {run} (local disk, page cache; versions found, verified, offsets loaded, answers' "
            f"file tables built): listing {statistics.median(listing):.2f} s (median of {rounds}: "
            f"{', '.join(f'{x:.2f}' for x in listing)}), full with 4 threads {full:.1f} s; load {', '.join(loads)}"
        )
    return lines


# --- GCS emulator ------------------------------------------------------------------------------------


def start_emulator() -> tuple[subprocess.Popen, dict]:
    binary = shutil.which("gcp-storage-emulator", path=os.path.dirname(sys.executable))
    if binary is None:
        raise SystemExit("gcp-storage-emulator is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([binary, "start", "--host", "127.0.0.1", "--port", str(port), "--default-bucket",
                                "bench", "--in-memory"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/storage/v1/b/bench", timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    os.environ.update(STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{port}", GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")
    return process, os.environ


def emulator(rounds: int) -> list[str]:
    from gcsfs import GCSFileSystem

    from bench.bench_server import write_cache
    from taskdata.cache.format import current_version, load_manifest
    from taskdata.cache.verify import check_split, verify_version

    process, _ = start_emulator()
    try:
        gcs = GCSFileSystem()
        lines = []
        version = current_version(str(JOB_CACHE))
        started = time.monotonic()
        gcs.put(version, "bench/job/v", recursive=True)
        upload = time.monotonic() - started
        manifest = load_manifest(version)
        size = sum(s.bytes for split in manifest.splits.values() for s in split.shards)
        times: dict[int, list[float]] = {1: [], 4: []}
        loads = [load()]
        for _ in range(rounds):
            for workers in times:
                started = time.perf_counter()
                assert verify_version("gs://bench/job/v", workers=workers) == []
                times[workers].append(time.perf_counter() - started)
            loads.append(load())
        lines.append(
            f"GCS emulator, full verification of the same {size / 1e6:,.1f} MB ({upload:.0f} s to upload): "
            + ", ".join(f"{w} thread{'s' if w > 1 else ''} {size / statistics.median(t) / 1e6:,.0f} MB/s"
                        for w, t in times.items())
            + f" (median of {rounds} interleaved rounds); load {', '.join(loads)}"
        )
        synthetic = write_cache(OUT / "verify-synthetic", "cola_like", 256)
        started = time.monotonic()
        gcs.put(str(synthetic), "bench/synthetic/v", recursive=True)
        upload = time.monotonic() - started
        split = load_manifest(str(synthetic)).split("train")
        measured: dict[str, list[float]] = {"listing": [], "full": []}
        for _ in range(rounds):
            for level in measured:
                started = time.perf_counter()
                assert check_split("gs://bench/synthetic/v", "train", split, level=level, workers=4).ok
                measured[level].append(time.perf_counter() - started)
        median = {level: statistics.median(t) for level, t in measured.items()}
        started = time.perf_counter()
        assert check_split(str(synthetic), "train", split, level="listing").ok
        local = time.perf_counter() - started
        lines.append(
            f"GCS emulator, a {len(split.shards)}-shard cache (cola_like of bench_server.py, {upload:.0f} s to upload "
            f"{2 * len(split.shards)} files): listing {median['listing']:.2f} s "
            f"({median['listing'] / len(split.shards) * 1e3:.1f} ms per shard), full with 4 threads "
            f"{median['full']:.2f} s ({median['full'] / len(split.shards) * 1e3:.1f} ms per shard), median of "
            f"{rounds}; the same listing on local disk {local * 1e3:.0f} ms. The emulator (a Python process on these "
            f"cores) answers one request at a time: more threads make full verification slower on it, and these "
            f"figures measure it, not GCS; load {load()}"
        )
        return lines
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--first-use":
        _first_use_child(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-emulator", action="store_true")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    lines = ceiling()
    print(lines[-1], flush=True)
    lines += full_local(args.rounds)
    print(lines[-1], flush=True)
    lines += first_use_local(min(args.rounds, 3))
    print("\n".join(lines[-3:]), flush=True)
    if not args.skip_emulator:
        lines += emulator(min(args.rounds, 3))
        print("\n".join(lines[-2:]), flush=True)
    if args.write:
        write_section("Verification at scale", lines)


if __name__ == "__main__":
    main()
