"""Epoch orders side by side: randomness, and reads per host per step (figures go to BENCHMARKS.md).

Run: PYTHONPATH=. python bench/bench_epoch_order.py [--gcs] [--write]

``--gcs`` also measures the orders on the trainer client's real read path against the test object store
(``bench/object_store.py``), which adds ``--delay-ms`` to every request (``bench/gcs_reads.py``):
examples/s and client CPU per example per host beside the local-disk path's, ranged GETs per step
counted at the store, and their cost per epoch, in epochs 0, 1 and 100. The section's figures come from
one run with ``--gcs``.

One task of 262,144 records in 64 cache shards of 4,096, a global batch of 2,048 over 8 hosts (256
examples per host and step). The records come from 64 source files of 4,096 examples, 4 consecutive
examples per source document (long documents split into examples); the cache stores them in a keyed
uniform shuffle, as the Beam job writes every cache. Compared, each over the same records:

- taskdata ``feistel``: the per-record keyed permutation (every plan before the option);
- taskdata ``block``: keyed shuffled blocks of K contiguous cache records (K = 16, 64, 256);
- taskdata ``windowed``: the same blocks, each dealt out over K steps at one place of the batch (width =
  the global batch; K = 16, 64);
- MosaicML Streaming's ``py1br`` and ``py1e`` (re-implemented below from Streaming's documentation and
  its shuffle module's description: shards shuffled, then samples shuffled within variable blocks of
  ``shuffle_block_size`` samples, or spread over a window of that size and sorted), with one canonical
  node and its shards = our 64 cache shards, ``shuffle_block_size`` = 65,536 (16 shards), over our
  shuffled cache and over a source-order store (Streaming's MDS shards written in source order).

Measured on epochs 1 and 2 (epoch 0 is stored order under every taskdata order): the distance in the
cache between examples adjacent in a host's slice, how many distinct source documents and files a global
batch draws from (against a uniform sample of 2,048), how many pairs adjacent in a step of epoch 1 meet
again in one global batch of epoch 2, how many pairs of records next to each other in the cache (read
together) share a global batch in epoch 1, and reads per host per step in epochs 0, 1 and 100 (a read is a
run of consecutive records of one shard, as ``/shards`` gives them; the bytes are the examples' own, with
record sizes drawn from a log-normal of mean ~2 KB).
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

from taskdata.index import (
    FEISTEL,
    BatchSchedule,
    BlockOrder,
    EpochOrder,
    RunPlan,
    TaskCache,
    WindowedOrder,
    example_arrays,
    reads_bound,
    requests_bound,
)

N = 1 << 18
SHARDS = 64
PER_SHARD = N // SHARDS
BATCH = 2048
HOSTS = 8
PER_HOST = BATCH // HOSTS
EXAMPLES_PER_DOC = 4
SOURCE_FILES = 64
STREAMING_BLOCK = 1 << 16
STEPS_MEASURED = 32  # global batches per epoch measured
SEED = 17
PLOT = pathlib.Path(__file__).resolve().parent / "epoch_order.png"
TASKDATA_ORDERS = (
    [("feistel", FEISTEL)]
    + [(f"block K={k}", BlockOrder(k)) for k in (16, 64, 256)]
    + [(f"windowed K={k}", WindowedOrder(k, BATCH)) for k in (16, 64)]
)


def plan_of(order: EpochOrder) -> RunPlan:
    return RunPlan(
        name="bench",
        mixture="t",
        caches={"t": TaskCache("fp", (PER_SHARD,) * SHARDS)},
        rates=None,
        seed=SEED,
        schedule=BatchSchedule.constant(BATCH),
        num_data_shards=HOSTS,
        epoch_order=order,
    )


def taskdata_epoch(order: EpochOrder, epoch: int, length: int = STEPS_MEASURED * BATCH) -> np.ndarray:
    """Cache index of each of the first ``length`` positions of ``epoch``."""
    start = epoch * N
    return example_arrays(plan_of(order), range(start, start + length)).indices.copy()


# --- Streaming's shuffles, from its documentation ---------------------------------------------------------
# Both start from the shards in a run-wide shuffled order (fixed for the run), reshuffled per epoch; py1br
# then shuffles the samples inside consecutive blocks of 0.75-1.25 x shuffle_block_size samples (the block
# grid staggered per epoch); py1e gives every shard's samples random positions spread over a window of
# about shuffle_block_size around the shard's place, and reads them in sorted order.


def _shard_spans(epoch: int, rng_run: np.random.Generator, rng_epoch: np.random.Generator) -> list[np.ndarray]:
    order = rng_run.permutation(SHARDS)
    order = order[rng_epoch.permutation(SHARDS)]
    return [np.arange(s * PER_SHARD, (s + 1) * PER_SHARD) for s in order]


def py1br(epoch: int, block: int = STREAMING_BLOCK) -> np.ndarray:
    rng_run, rng_epoch = np.random.default_rng(SEED), np.random.default_rng(SEED + epoch)
    ids = np.concatenate(_shard_spans(epoch, rng_run, rng_epoch))
    stagger = int(rng_epoch.integers(0, int(0.75 * block)))
    blocks_end = 0
    while blocks_end < N:
        size = int(rng_epoch.integers(int(0.75 * block), int(1.25 * block)))
        # As Streaming cuts them: each block starts `stagger` before where the previous ones end.
        start, stop = max(blocks_end - stagger, 0), min(blocks_end + size - stagger, N)
        rng_epoch.shuffle(ids[start:stop])
        blocks_end += stop - start
    return ids


def py1e(epoch: int, block: int = STREAMING_BLOCK) -> np.ndarray:
    rng_run, rng_epoch = np.random.default_rng(SEED), np.random.default_rng(SEED + epoch)
    spans = _shard_spans(epoch, rng_run, rng_epoch)
    ids = np.concatenate([rng_epoch.permutation(span) for span in spans])
    places = np.arange(N, dtype=np.float64)
    offset = 0
    for span in spans:
        size = int(rng_epoch.integers(int(0.75 * block), int(1.25 * block)))
        cutoff = max(0.0, (size - len(span)) / 2)
        low, high = max(-cutoff, -offset), min(cutoff, N - offset - len(span))
        places[offset : offset + len(span)] += rng_epoch.uniform(low, high, len(span))
        offset += len(span)
    return ids[np.argsort(places, kind="stable")]


# --- the measurements -------------------------------------------------------------------------------------


def layouts() -> tuple[np.ndarray, np.ndarray]:
    """Source example id of each cache index: the shuffled cache, and a store in source order."""
    shuffled = np.random.default_rng(1234).permutation(N)  # stands for the Beam job's keyed shuffle
    return shuffled, np.arange(N)


def adjacent_distances(order: np.ndarray) -> np.ndarray:
    """|cache index difference| between examples adjacent in one host's slice of a step."""
    slices = order.reshape(-1, PER_HOST)
    return np.abs(np.diff(slices, axis=1)).ravel()


def batch_mixing(order: np.ndarray, source: np.ndarray) -> tuple[float, float]:
    """Mean distinct source documents and source files per global batch."""
    docs, files = [], []
    for batch in order.reshape(-1, BATCH):
        u = source[batch]
        docs.append(len(np.unique(u // EXAMPLES_PER_DOC)))
        files.append(len(np.unique(u // (N // SOURCE_FILES))))
    return float(np.mean(docs)), float(np.mean(files))


def meet_again(first: np.ndarray, second: np.ndarray) -> float:
    """Of the pairs adjacent in a host slice in one epoch, the share in one global batch in the next."""
    slices = first.reshape(-1, PER_HOST)
    a, b = slices[:, :-1].ravel(), slices[:, 1:].ravel()
    batch_of = np.full(N, -1, np.int64)
    batch_of[second] = np.arange(len(second)) // BATCH
    both = (batch_of[a] >= 0) & (batch_of[b] >= 0)
    return float(np.mean(batch_of[a][both] == batch_of[b][both]))


def neighbours_together(order: np.ndarray) -> float:
    """Of the pairs of records next to each other in the cache (what one read brings in together), the share
    that one global batch of the epoch ``order`` lists holds both of."""
    batch_of = np.empty(N, np.int64)
    batch_of[order] = np.arange(N) // BATCH
    return float(np.mean(batch_of[:-1] == batch_of[1:]))


def host_reads(order: np.ndarray) -> np.ndarray:
    """Reads per host per step when every host reads its records, merged where they are consecutive
    records of one shard (what the trainer client requests)."""
    counts = []
    for part in order.reshape(-1, PER_HOST):
        records = np.sort(part)
        new = np.ones(len(records), bool)
        new[1:] = (records[1:] != records[:-1] + 1) | (records[1:] // PER_SHARD != records[:-1] // PER_SHARD)
        counts.append(int(new.sum()))
    return np.array(counts)


def taskdata_reads(order: EpochOrder, epoch: int, record_bytes: np.ndarray) -> tuple[float, int, float]:
    """Mean and max reads per host per step as ``/shards`` gives them, and mean KiB per host per step."""
    plan = plan_of(order)
    reads, kib = [], []
    for step in range(epoch * N // BATCH, epoch * N // BATCH + STEPS_MEASURED):
        for host in range(HOSTS):
            first = step * BATCH + host * PER_HOST
            arrays = example_arrays(plan, range(first, first + PER_HOST))
            _, _, _, counts = arrays.extents()
            reads.append(len(counts))
            kib.append(record_bytes[arrays.indices].sum() / 1024)
    return float(np.mean(reads)), int(np.max(reads)), float(np.mean(kib))


def uniform_mixing(source: np.ndarray) -> tuple[float, float]:
    rng = np.random.default_rng(5)
    order = np.concatenate([rng.choice(N, BATCH, replace=False) for _ in range(STEPS_MEASURED)])
    return batch_mixing(order, source)


def measure() -> tuple[list[str], dict[str, np.ndarray]]:
    shuffled, source_order = layouts()
    record_bytes = np.random.default_rng(9).lognormal(np.log(1800), 0.5, N).astype(np.int64) + 16
    orders: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    together: dict[str, float] = {}
    for name, order in TASKDATA_ORDERS:
        orders[f"taskdata {name}"] = (taskdata_epoch(order, 1), taskdata_epoch(order, 2, N), shuffled)
        together[f"taskdata {name}"] = neighbours_together(taskdata_epoch(order, 1, N))
    m = STEPS_MEASURED * BATCH
    for name, fn in (("py1br", py1br), ("py1e", py1e)):
        first, second = fn(1), fn(2)
        orders[f"Streaming {name}, shuffled cache"] = (first[:m], second, shuffled)
        orders[f"Streaming {name}, source-order store"] = (first[:m], second, source_order)
        together[f"Streaming {name}, shuffled cache"] = together[f"Streaming {name}, source-order store"] = (
            neighbours_together(first))
    docs_u, files_u = uniform_mixing(shuffled)
    lines = [
        f"{N:,} records in {SHARDS} cache shards of {PER_SHARD:,}; global batch {BATCH:,} over {HOSTS} hosts "
        f"({PER_HOST} per host); {EXAMPLES_PER_DOC} examples per source document, {SOURCE_FILES} source files; "
        f"first {STEPS_MEASURED} global batches of epochs 1 and 2; Streaming with 1 canonical node, shuffle_block_size "
        f"{STREAMING_BLOCK:,}. A uniform sample of {BATCH:,} draws {docs_u:,.0f} distinct documents and "
        f"{files_u:.0f} source files per batch",
        "| order | adjacent in a host slice: median distance in the cache (share at distance 1) | distinct "
        "documents / files per global batch | adjacent pairs of epoch 1 in one batch of epoch 2 | records next to "
        "each other in the cache in one batch of epoch 1 | reads per host per step, epoch 1 (client-merged); "
        "distinct cache shards touched |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    distances = {}
    again = {}
    for name, (first, second, source) in orders.items():
        d = adjacent_distances(first)
        distances[name] = d
        docs, files = batch_mixing(first, source)
        reads = host_reads(first)
        again[name] = meet_again(first, second)
        lines.append(
            f"| {name} | {np.median(d):,.0f} ({np.mean(d == 1):.1%}) | {docs:,.0f} / {files:.0f} | "
            f"{again[name]:.2%} | {together[name]:.2%} | {reads.mean():.1f} (max {reads.max()}); "
            f"{np.mean([len(np.unique(p // PER_SHARD)) for p in first.reshape(-1, PER_HOST)]):.1f} shards |"
        )
    lines.append(
        "reads and bytes per host per step as `/shards` gives them (mean, max; the plan's stated bound; for the "
        "windowed order also its bound on requests per step of a client reading K steps ahead), epochs 0 / 1 / 100:"
    )
    for name, order in TASKDATA_ORDERS:
        cells = []
        for epoch in (0, 1, 100):
            mean, top, kib = taskdata_reads(order, epoch, record_bytes)
            cells.append(f"{mean:.1f} reads (max {top}), {kib:,.0f} KiB")
        bound = f"bound {reads_bound(plan_of(order), PER_HOST)}"
        if order.read_horizon:
            bound += f"; requests {requests_bound(plan_of(order), PER_HOST)}"
        lines.append(f"taskdata {name} ({bound}): " + " / ".join(cells))
    lines.append(
        f"randomness: the windowed order at K=64 puts {again['taskdata windowed K=64']:.2%} of epoch 1's adjacent "
        f"pairs in one batch of epoch 2 (target: at most 3x feistel's {again['taskdata feistel']:.2%}) and "
        f"{together['taskdata windowed K=64']:.2%} of the records next to each other in the cache in one batch "
        f"(feistel {together['taskdata feistel']:.2%}, block K=64 {together['taskdata block K=64']:.0%}); a batch "
        "draws as many documents and files as a uniform sample under every taskdata order"
    )
    return lines, distances


def plot(distances: dict[str, np.ndarray]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, d in distances.items():
        values = np.sort(np.maximum(d, 1))
        ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=name)
    ax.set_xscale("log")
    ax.set_xlabel("distance in the cache between examples adjacent in a host's slice (records)")
    ax.set_ylabel("share of adjacent pairs at most this far")
    ax.set_title(f"Epoch 1, {N:,} records, {PER_HOST} examples per host and step")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="write the figures into BENCHMARKS.md")
    parser.add_argument("--gcs", action="store_true", help="also read the orders from the test object store")
    parser.add_argument("--delay-ms", type=float, nargs="+", default=[0.0, 20.0],
                        help="latencies the store adds to every request (one table row set each)")
    parser.add_argument("--gcs-hosts", type=int, default=4)
    parser.add_argument("--gcs-host-batch", type=int, default=256)
    parser.add_argument("--gcs-block-size", type=int, default=64)
    parser.add_argument("--gcs-warmup", type=int, default=8, help="steps read before the timed ones")
    parser.add_argument("--gcs-steps", type=int, default=48, help="timed steps per order and epoch")
    parser.add_argument("--gcs-repeats", type=int, default=5,
                        help="reads per order, epoch and place (store, local disk); each row gives their median")
    args = parser.parse_args()
    lines, distances = measure()
    plot(distances)
    lines.append(f"plot: {PLOT.relative_to(PLOT.parent.parent)}")
    if args.gcs:
        from bench.gcs_reads import measure_gcs

        k, width = args.gcs_block_size, args.gcs_hosts * args.gcs_host_batch
        orders = [("feistel", FEISTEL), (f"block K={k}", BlockOrder(k)),
                  (f"windowed K={k}", WindowedOrder(k, width))]
        lines += measure_gcs(args.delay_ms, args.gcs_hosts, args.gcs_host_batch, orders, args.gcs_warmup,
                             args.gcs_steps, args.gcs_repeats)
    for line in lines:
        print(line)
    if args.write:
        from bench._report import write_section

        write_section("Epoch orders: randomness and reads per step", lines,
                      "PYTHONPATH=. python bench/bench_epoch_order.py" + (" --gcs" if args.gcs else "") + " --write")


if __name__ == "__main__":
    main()
