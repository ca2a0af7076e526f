"""Both epoch orders read from a GCS emulator through a proxy that adds latency to every request.

Called by ``bench/bench_epoch_order.py --gcs``; also the proxy's entry point:
``python -m bench.gcs_reads proxy --port P --upstream-port Q --delay-ms 20``.

The path is the trainer client's own: a ``DataIterator`` over ``LocalAssignments`` reading a cache
version at ``gs://`` through gcsfs, which points at ``STORAGE_EMULATOR_HOST``. That address is the
proxy's: it delays every HTTP request by ``--delay-ms`` before passing it to the emulator (a GCS
round trip's latency; the emulator on loopback answers in about a millisecond), and counts the
requests by method, kind of object (shard data, offsets sidecar, other) and whether they carry a
``Range`` header, which is the ground truth of how many GETs the client makes. The cache is built
locally from a synthetic task (kept under ``$TASKDATA_HOME/bench``, reused when its fingerprint
matches) and copied into the emulator's bucket directly, not through the proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np

from taskdata.define.features import Feature
from taskdata.define.task import Task
from taskdata.define.vocabularies import ByteVocabulary
from taskdata.preprocessors.base import Example, ShardContext
from taskdata.sources import FunctionSource

__all__ = ["GcsSetup", "measure_gcs", "register_tasks"]

TASK = "gcs_bench"
SOURCE_SHARDS = 16
DOCS_PER_SHARD = 1024  # 16,384 records in 16 cache shards of about 1,024
BUCKET = "bench"
CONTROL_PATH = "/_proxy/counts"  # answered by the proxy itself, never forwarded or counted
MAX_CONNECTIONS = 64
MAX_HEAD_BYTES = 64 << 10
VOCAB = ByteVocabulary()
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]


# --- the task: documents of ~1,000-3,000 characters, one example each ------------------------------------


def documents(split: str, shard: str) -> Iterator[dict]:
    rng = np.random.default_rng([int(shard), len(split)])
    for i in range(DOCS_PER_SHARD):
        words = [WORDS[int(j)] for j in rng.integers(0, len(WORDS), int(rng.integers(150, 450)))]
        yield {"text": f"{shard}.{i}: " + " ".join(words)}


@dataclasses.dataclass(frozen=True)
class EncodeTargets:
    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        for example in examples:
            yield {"targets": VOCAB.encode(example["text"]), "_source_index": example["_source_index"]}


def register_tasks(registry) -> None:
    shards = {"train": [str(i) for i in range(SOURCE_SHARDS)]}
    registry.add(Task(TASK, FunctionSource(documents, shards), [EncodeTargets()], {"targets": Feature(VOCAB)}))


def ensure_cache(root: str) -> str:
    """The local cache version of the bench task under ``root`` (built once, then reused)."""
    from taskdata.beam.job import CacheOptions, run_cache_job
    from taskdata.define.registry import Registry

    registry = Registry()
    registry.load_module(__name__)
    options = CacheOptions(task=TASK, output=root, num_shards=SOURCE_SHARDS, modules=(__name__,), progress=False)
    return run_cache_job(options, registry, log=lambda m: None).version_dir


# --- the proxy ----------------------------------------------------------------------------------------------


def _kind(target: str) -> str:
    if ".offsets" in target:
        return "offsets"
    return "shard data" if ".tfrecord-" in target else "other"


class _Proxy:
    def __init__(self, upstream_port: int, delay_s: float):
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self.counts: Counter[str] = Counter()
        self.response_bytes = 0
        self.slots = asyncio.Semaphore(MAX_CONNECTIONS)

    async def serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        async with self.slots:
            upstream_w = None
            try:
                upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
                pipe = asyncio.ensure_future(self._responses(upstream_r, client_w))
                try:
                    while await self._request(client_r, client_w, upstream_w):
                        pass
                finally:
                    pipe.cancel()
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                pass
            finally:
                for writer in (client_w, upstream_w):
                    if writer is not None:
                        writer.close()

    async def _request(self, client_r, client_w, upstream_w) -> bool:
        """Forwards one request after the delay; False when the client is done."""
        try:
            head = await client_r.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        if len(head) > MAX_HEAD_BYTES:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, target = lines[0].split(" ")[:2]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        if target.startswith(CONTROL_PATH):
            body = json.dumps({"counts": dict(self.counts), "response_bytes": self.response_bytes}).encode()
            client_w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            await client_w.drain()
            return False
        if "chunked" in headers.get("transfer-encoding", ""):
            client_w.write(b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await client_w.drain()
            return False
        body = await client_r.readexactly(int(headers.get("content-length", "0")))
        media = "media" if "alt=media" in target else "metadata"  # the object's bytes, or its description
        self.counts[f"{method} {_kind(target)} {media} {'ranged' if 'range' in headers else 'whole'}"] += 1
        await asyncio.sleep(self.delay_s)
        upstream_w.write(head + body)
        await upstream_w.drain()
        return True

    async def _responses(self, upstream_r, client_w) -> None:
        while data := await upstream_r.read(1 << 16):
            self.response_bytes += len(data)
            client_w.write(data)
            await client_w.drain()
        client_w.close()


async def _run_proxy(port: int, upstream_port: int, delay_ms: float) -> None:
    proxy = _Proxy(upstream_port, delay_ms / 1000)
    server = await asyncio.start_server(proxy.serve, "127.0.0.1", port, limit=MAX_HEAD_BYTES)
    async with server:
        await server.serve_forever()


# --- processes --------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(url: str, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} (pid {process.pid}) did not answer {url} within 30 s") from None
            time.sleep(0.2)


@contextlib.contextmanager
def _process(args: list[str], url: str, what: str) -> Iterator[subprocess.Popen]:
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for(url, process, what)
        yield process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


@dataclasses.dataclass(frozen=True)
class GcsSetup:
    """The emulator's and the proxy's addresses and process ids, and the cache version's ``gs://`` path."""

    emulator_url: str
    proxy_url: str
    version: str
    pids: tuple[int, int]

    def counts(self) -> tuple[Counter[str], int]:
        """Requests the proxy has passed on so far, by kind, and the bytes of the responses."""
        with urllib.request.urlopen(self.proxy_url + CONTROL_PATH, timeout=10) as response:
            data = json.loads(response.read())
        return Counter(data["counts"]), int(data["response_bytes"])


@contextlib.contextmanager
def gcs_with_latency(local_version: str, delay_ms: float) -> Iterator[GcsSetup]:
    """An emulator holding ``local_version``, a proxy in front of it, and this process's gcsfs pointed
    at the proxy; both processes are stopped by pid on the way out."""
    if "gcsfs" in sys.modules and os.environ.get("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT") != "false":
        raise RuntimeError("gcsfs was imported before GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false was set: it would ask "
                           "Google's metadata server about the emulator's bucket. Set it before importing gcsfs.")
    # gcsfs reads it on import; without it, it asks Google's metadata server about every bucket.
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    from gcsfs import GCSFileSystem

    binary = shutil.which("gcp-storage-emulator", path=os.pathsep.join([os.path.dirname(sys.executable),
                                                                        os.environ.get("PATH", "")]))
    if binary is None:
        raise FileNotFoundError("gcp-storage-emulator is not installed: pip install gcp-storage-emulator")
    emulator_port, proxy_port = _free_port(), _free_port()
    emulator_url, proxy_url = f"http://127.0.0.1:{emulator_port}", f"http://127.0.0.1:{proxy_port}"
    emulator_args = [binary, "start", "--host", "127.0.0.1", "--port", str(emulator_port), "--default-bucket",
                     BUCKET, "--in-memory"]
    proxy_args = [sys.executable, "-m", "bench.gcs_reads", "proxy", "--port", str(proxy_port), "--upstream-port",
                  str(emulator_port), "--delay-ms", str(delay_ms)]
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    with _process(emulator_args, f"{emulator_url}/storage/v1/b/{BUCKET}", "the GCS emulator") as emulator, \
            _process(proxy_args, proxy_url + CONTROL_PATH, "the latency proxy") as proxy:
        direct = GCSFileSystem(token="anon", endpoint_url=emulator_url, skip_instance_cache=True)
        name = os.path.basename(local_version.rstrip("/"))
        target = f"{BUCKET}/{TASK}/{name}"
        direct.put(local_version, target, recursive=True)
        os.environ["STORAGE_EMULATOR_HOST"] = proxy_url
        try:
            yield GcsSetup(emulator_url, proxy_url, f"gs://{target}", (emulator.pid, proxy.pid))
        finally:
            if saved is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = saved


# --- the measurement --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Figures:
    warmup: int  # steps read before the timed ones by the timing client
    examples_per_s: float
    data_gets_per_step: float  # GETs of shard bytes (each with a Range header, in practice), at the proxy
    ranged: bool  # every one of them had a Range header
    other_requests: int  # metadata, sidecars, manifest over the whole window
    reads_per_step: float  # what the instructions (/shards) name
    max_reads: int
    kib_per_step: float  # the instructions' byte ranges
    wire_kib_per_step: float  # every response's bytes at the proxy, headers and setup included


def _timing_window(source, host, first: int, least: int, steps: int, cap: int = 16) -> tuple[int, int]:
    """(step the timed iterator starts at, first timed step) for ``steps`` timed steps of the epoch that
    starts at ``first``: after the fewest warm-up steps (``least`` to ``cap``) just before them that open
    every shard the timed ones read, since a shard's first read also fetches its offsets sidecar and
    metadata, once per shard and run, not per step. Epoch 0 has no steps before it: its timed steps
    follow ``least`` of its own (it opens a shard at nearly every step anyway)."""
    if first == 0:
        return 0, least
    low = max(0, first - cap)
    touched = [set().union(*(t.files.tolist() for t in s.tasks)) for s in source.fetch(low, first + steps - low, host)]
    timed = set().union(*touched[first - low :])
    for warmup in range(least, first - low + 1):
        if timed <= set().union(*touched[first - low - warmup : first - low]):
            return first - warmup, first
    return first - least, first


def _read(source, lengths, host, start: int, stop: int, timed_from: int) -> float:
    """Reads steps [start, stop) with a DataIterator; seconds taken by the steps from ``timed_from``."""
    from trainer_client.iterator import DataIterator

    iterator = DataIterator(source, lengths, start=start, host_slice=host, stop_step=stop)
    try:
        for _ in range(start, timed_from):
            next(iterator)
        started = time.perf_counter()
        for _ in range(timed_from, stop):
            next(iterator)
        return time.perf_counter() - started
    finally:
        iterator.close()


def measure_one(setup: GcsSetup, plan, host_batch: int, first: int, least_warmup: int, steps: int) -> Figures:
    """Host 0 in the epoch starting at step ``first``: the GETs of its steps ``[first, first + steps)``
    counted at the proxy (a fresh client: what it fetches for exactly those steps), and its examples/s
    over ``steps`` timed steps after a warm-up (a second client)."""
    from taskdata.cache.reader import CacheReader
    from trainer_client.assignments import HostSlice
    from trainer_client.local_source import LocalAssignments

    with CacheReader(setup.version) as reader:
        lengths = {"targets": reader.max_tokens("train", "targets")}
    host = HostSlice(0, plan.num_data_shards)
    source = LocalAssignments(plan, {TASK: setup.version})
    instructions = source.fetch(first, steps, host)  # the sidecars it needs, loaded before counting
    reads = [sum(len(task) for task in s.tasks) for s in instructions]
    kib = [sum(int(task.byte_length.sum()) for task in s.tasks) / 1024 for s in instructions]
    before, wire_before = setup.counts()
    _read(source, lengths, host, first, first + steps, first)
    after, wire_after = setup.counts()
    delta = after - before
    data = delta["GET shard data media ranged"] + delta["GET shard data media whole"]
    source = LocalAssignments(plan, {TASK: setup.version})
    start, timed_from = _timing_window(source, host, first, least_warmup, steps)
    elapsed = _read(source, lengths, host, start, timed_from + steps, timed_from)
    return Figures(timed_from - start, host_batch * steps / elapsed, data / steps,
                   delta["GET shard data media whole"] == 0, sum(delta.values()) - data, float(np.mean(reads)),
                   max(reads), float(np.mean(kib)), (wire_after - wire_before) / 1024 / steps)


def measure_gcs(delays_ms: Sequence[float], hosts: int, host_batch: int, block_size: int, warmup: int,
                steps: int) -> list[str]:
    from taskdata.cache.reader import CacheReader
    from taskdata.config import Config
    from taskdata.index import FEISTEL, BatchSchedule, BlockOrder, RunPlan, TaskCache, reads_bound

    local = ensure_cache(os.path.join(Config.from_environment().home, "bench", "gcs_reads"))
    lines = [
        f"on the GCS emulator (gcp-storage-emulator, in memory) behind a loopback proxy adding "
        f"{' or '.join(f'{d:g}' for d in delays_ms)} ms to every request; the cache of a synthetic task "
        f"(bench/gcs_reads.py) copied into its bucket; host 0 of {hosts} ({host_batch} examples per step) read "
        f"through DataIterator over LocalAssignments (gs:// through gcsfs); GETs of the first {steps} steps of each "
        f"epoch (a fresh client); examples/s over {steps} timed steps (from each epoch's first, epoch 0's after "
        f"{warmup}) read by a second client after at least {warmup} warm-up steps just before them, more until the "
        "warm-up has opened every shard the timed steps read (a shard's first read also fetches its offsets "
        "sidecar and metadata: once per shard and run, not per step; epoch 0 opens a shard at nearly every step); GETs counted at the proxy (every GET of shard bytes had a Range header "
        "unless marked); 1-minute load average at the start of each delay's runs",
        "| delay (load) | order (stated reads bound) | epoch | warm-up steps | examples/s per host | GETs of shard bytes per step "
        "(proxy) | reads per step named by the instructions (max) | KiB per step (instructions; all responses at "
        "the proxy) | other requests in those steps (object metadata, sidecars, manifest: opening shards) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    over = []
    rates: dict[tuple[float, str, int], float] = {}
    gets: dict[tuple[float, str, int], float] = {}
    for delay in delays_ms:
        load = os.getloadavg()[0]
        with gcs_with_latency(local, delay) as setup:
            with CacheReader(setup.version) as reader:
                cache = TaskCache(reader.manifest_sha256, reader.record_counts("train"))
            n = sum(cache.shard_record_counts)
            batch = hosts * host_batch
            for name, order in (("feistel", FEISTEL), (f"block K={block_size}", BlockOrder(block_size))):
                plan = RunPlan(name="gcs", mixture=TASK, caches={TASK: cache}, rates=None, seed=17,
                               schedule=BatchSchedule.constant(batch), num_data_shards=hosts, epoch_order=order)
                bound = reads_bound(plan, host_batch)
                for epoch in (0, 1, 100):
                    f = measure_one(setup, plan, host_batch, -(-epoch * n // batch), warmup, steps)
                    rates[delay, name, epoch] = f.examples_per_s
                    gets[delay, name, epoch] = f.data_gets_per_step
                    if f.data_gets_per_step > bound:
                        over.append(f"{name} epoch {epoch} at {delay:g} ms: {f.data_gets_per_step:.1f} > {bound}")
                    lines.append(
                        f"| {delay:g} ms ({load:.2f}) | {name} ({bound}) | {epoch} | {f.warmup} | "
                        f"{f.examples_per_s:,.0f} | "
                        f"{f.data_gets_per_step:.1f}{'' if f.ranged else ' (some without Range)'} | "
                        f"{f.reads_per_step:.1f} ({f.max_reads}) | {f.kib_per_step:,.0f}; "
                        f"{f.wire_kib_per_step:,.0f} | {f.other_requests} |"
                    )
    lines.append(
        f"{n:,} records of ~2 KB in {len(cache.shard_record_counts)} cache shards (global batch {batch:,}: "
        f"{n // batch} steps per epoch). "
        + ("The client's GETs of shard bytes stay within the stated bound in every row (it merges records "
           "consecutive in a shard after sorting, so it may make fewer GETs than the instructions name)"
           if not over else "The client made more GETs than the stated bound: " + "; ".join(over))
    )
    top, low = max(delays_ms), min(delays_ms)
    step_ms = {d: 1000 * host_batch / rates[d, "feistel", 1] for d in (low, top)}
    lines.append(
        f"feistel in epoch 1 takes {step_ms[low]:,.0f} ms per step at {low:g} ms (the emulator's and the client's own "
        f"cost of {gets[low, 'feistel', 1]:.0f} GETs) and {step_ms[top]:,.0f} ms at {top:g} ms: "
        f"{(step_ms[top] - step_ms[low]) / gets[top, 'feistel', 1]:.1f} ms more per GET, the proxy's delay, so the "
        "proxy and the emulator are not what limits the 20 ms rows. Epoch 0 rows open a shard at nearly every step "
        "(the other requests), which is what a run pays once per shard"
    )
    lines.append(
        f"at {top:g} ms per request, epoch 1: block K={block_size} delivers "
        f"{rates[top, f'block K={block_size}', 1] / rates[top, 'feistel', 1]:.0f}x feistel's examples/s "
        f"({rates[top, f'block K={block_size}', 1]:,.0f} against {rates[top, 'feistel', 1]:,.0f}); the client fetches "
        "a step's reads one after another, so each read costs a round trip"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description="The latency proxy (see bench/bench_epoch_order.py --gcs).")
    parser.add_argument("command", choices=["proxy"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    args = parser.parse_args()
    asyncio.run(_run_proxy(args.port, args.upstream_port, args.delay_ms))


if __name__ == "__main__":
    main()
