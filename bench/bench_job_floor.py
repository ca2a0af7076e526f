"""The cache job against its floor: bare SentencePiece over the same files, on the same cores, in one run.

For each corpus size (the built-in C4-format corpus, the recipe and folders of ``bench_scale.py``) and
each way of running the job, in alternating rounds:

- **floor**: a subprocess that reads, decompresses and JSON-parses every source file of both splits and
  encodes every document with SentencePiece, as the job does it (the job's line reader, which decompresses
  a block ahead in a helper thread; batches of ``Tokenize``'s size, the processor's default threads, each
  batch encoded in a helper thread while the next is read); with 2 workers, 2 processes that take files
  from a shared queue.
- **job**: ``taskdata cache --task c4_span_corruption`` (both splits, start-up, commit and verification
  included), in-process (Beam's default local runner, one worker) or with 2 Beam workers
  (``--direct_num_workers=2 --direct_running_mode=multi_processing``).

Both are measured alike (``run_measured``): wall time, CPU-seconds and sampled peak RSS of the whole
process tree. Figures are medians over the rounds; the ratio is job / floor. The 1-minute load average
is recorded around every run (the machine is shared). The caches of every mode and round must be
byte-identical (their manifests' shard digests are compared), or the bench fails.

    PYTHONPATH=. python bench/bench_job_floor.py --sizes 20000 100000 --rounds 3 [--baseline DIR] [--write]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._measure import run_measured
from bench._report import write_section
from bench.bench_scale import corpus_params
from taskdata.sources.base import iter_text_lines
from taskdata.tasks import corpus

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
MODES = {"in-process": [], "2 workers": ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]}
TARGET = 1.25

_processor = None


def _load(model: str) -> None:
    global _processor
    import sentencepiece as spm

    _processor = spm.SentencePieceProcessor(model_file=model)


def _encode_file(path: str, batch_size: int = 256) -> tuple[int, int]:
    """(documents, tokens) of one C4 file, as the job does it: lines are read with the job's reader (the file
    decompressed a block ahead in a helper thread), parsed in batches, and each batch is encoded in a helper
    thread while the next one is read."""
    documents = tokens = 0
    with concurrent.futures.ThreadPoolExecutor(1) as ahead:
        texts = (json.loads(line)["text"] for _, line in iter_text_lines(path))
        pending = None
        while batch := list(itertools.islice(texts, batch_size)):
            documents += len(batch)
            encoding = ahead.submit(_processor.encode, batch, return_type="numpy")
            if pending is not None:
                tokens += sum(len(ids) for ids in pending.result())
            pending = encoding
        if pending is not None:
            tokens += sum(len(ids) for ids in pending.result())
    return documents, tokens


def floor_child(corpus_dir: str, workers: int, model: str) -> None:
    files = sorted(str(p) for p in Path(corpus_dir).glob("c4-*.json.gz"))
    if workers == 1:
        _load(model)
        counts = [_encode_file(f) for f in files]
    else:
        with multiprocessing.get_context("fork").Pool(workers, initializer=_load, initargs=(model,)) as pool:
            counts = pool.map(_encode_file, files, chunksize=1)
    print(json.dumps({"documents": sum(c[0] for c in counts), "tokens": sum(c[1] for c in counts)}))


def run_floor(corpus_dir: str, workers: int, vocab: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    run = run_measured([sys.executable, __file__, "--floor-child", corpus_dir, str(workers), vocab], env,
                       what="SentencePiece floor")
    return {**run, **json.loads(run["stdout"].strip().splitlines()[-1])}


def run_job(corpus_dir: str, output: str, beam_args: list[str], vocab: str, source: str) -> dict:
    """The job of the taskdata source tree ``source`` (this one, or a --baseline checkout)."""
    shutil.rmtree(output, ignore_errors=True)
    env = dict(os.environ, TASKDATA_VOCAB=vocab, PYTHONPATH=source)
    command = [sys.executable, "-m", "taskdata", "cache", "--task", "c4_span_corruption", "--c4-dir", corpus_dir,
               "--output", output, "--force", "--quiet", "--", *beam_args]
    run = run_measured(command, env, what="cache job")
    manifest = json.loads(Path(run["stdout"].strip().splitlines()[-1], "manifest.json").read_text())
    digests = tuple(shard["sha256"] for split in sorted(manifest["splits"])
                    for shard in manifest["splits"][split]["shards"])
    examples = sum(s["num_records"] for s in manifest["splits"].values())
    shutil.rmtree(output, ignore_errors=True)
    return {**run, "digests": digests, "examples": examples}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--floor-child":
        floor_child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[20000, 100000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--baseline", help="also run the job of this taskdata source tree (e.g. an earlier commit "
                        "from 'git archive COMMIT | tar -x -C DIR') in every round, as 'before'")
    parser.add_argument("--write", action="store_true", help="write the figures into BENCHMARKS.md")
    args = parser.parse_args()
    if args.write and (args.modes != list(MODES) or sorted(args.sizes) != [20000, 100000]):
        raise SystemExit("--write records the full comparison: both modes at --sizes 20000 100000")
    vocab = corpus.ensure_builtin_vocabulary()
    dirs = {}
    for size in args.sizes:
        dirs[size] = os.path.join(OUT, f"corpus-{size}")
        if not os.path.exists(os.path.join(dirs[size], "CORPUS.json")):
            corpus.build_corpus(dirs[size], **corpus_params(size))
    runs: dict[tuple[int, str, str], list[dict]] = {}
    loads = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        for size in args.sizes:
            for mode in args.modes:
                beam_args = MODES[mode]
                workers = 2 if beam_args else 1
                # Alternate which of the pair runs first, so that neither always gets the quieter moment.
                order = ["floor", "job"] + (["before"] if args.baseline else [])
                order = order if round_ % 2 == 0 else order[::-1]
                for kind in order:
                    usage = resource.getrusage(resource.RUSAGE_SELF)
                    if kind == "floor":
                        result = run_floor(dirs[size], workers, vocab)
                    else:
                        source = os.getcwd() if kind == "job" else args.baseline
                        result = run_job(dirs[size], os.path.join(OUT, f"floor-cache-{size}"), beam_args, vocab, source)
                    after = resource.getrusage(resource.RUSAGE_SELF)
                    # The RSS sampler runs in this process, beside the measured one: its CPU is reported.
                    result["own_cpu"] = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
                    result["load"] = os.getloadavg()[0]
                    loads.append(result["load"])
                    runs.setdefault((size, mode, kind), []).append(result)
                    print(f"round {round_ + 1} {size} {mode} {kind}: wall {result['seconds']:.2f} s, CPU "
                          f"{result['cpu']:.2f} s, peak RSS {result['peak_tree_rss'] / 2**20:,.0f} MB, "
                          f"load {result['load']:.2f}", flush=True)
    digests = {r["digests"] for (size, _, kind), rs in runs.items() if kind != "floor" for r in rs}
    if len(digests) != len(args.sizes):
        raise SystemExit(f"the caches of one corpus differ between modes or rounds: {len(digests)} distinct sets "
                         f"of shard digests for {len(args.sizes)} corpus sizes")
    lines = []
    for size in args.sizes:
        floor_docs = runs[size, args.modes[0], "floor"][0]
        lines.append(f"{floor_docs['documents']:,} documents ({size:,} train), {floor_docs['tokens']:,} source "
                     f"tokens, {runs[size, args.modes[0], 'job'][0]['examples']:,} examples; caches of "
                     f"{' and '.join(args.modes)}{' and before' if args.baseline else ''} in every round "
                     "byte-identical")
        for mode in args.modes:
            kinds = ("floor", "job", "before") if args.baseline else ("floor", "job")
            med = {kind: {key: statistics.median(r[key] for r in runs[size, mode, kind])
                          for key in ("seconds", "cpu", "peak_tree_rss")} for kind in kinds}
            ratio = med["job"]["seconds"] / med["floor"]["seconds"]
            # A wall-time verdict means something only on cores the runs had to themselves.
            load = max(r["load"] for kind in kinds for r in runs[size, mode, kind])
            verdict = (("met" if ratio <= TARGET else "NOT met") if load <= (os.cpu_count() or 1)
                       else f"not judged: load up to {load:.1f} on {os.cpu_count()} cores")
            walls = {kind: ", ".join(f"{r['seconds']:.1f}" for r in runs[size, mode, kind]) for kind in kinds}
            lines.append(
                f"{mode}: job {med['job']['seconds']:.2f} s wall, {med['job']['cpu']:.2f} CPU-s, peak RSS "
                f"{med['job']['peak_tree_rss'] / 2**20:,.0f} MB; floor {med['floor']['seconds']:.2f} s wall, "
                f"{med['floor']['cpu']:.2f} CPU-s, {med['floor']['peak_tree_rss'] / 2**20:,.0f} MB; job/floor "
                f"{ratio:.2f}x wall, {med['job']['cpu'] / med['floor']['cpu']:.2f}x CPU (target <= {TARGET}x: "
                f"{verdict}); walls: job {walls['job']}, floor {walls['floor']}"
                + (f"; before ({args.baseline}): {med['before']['seconds']:.2f} s wall, {med['before']['cpu']:.2f} "
                   f"CPU-s = {med['before']['seconds'] / med['floor']['seconds']:.2f}x wall, "
                   f"{med['before']['cpu'] / med['floor']['cpu']:.2f}x CPU, walls {walls['before']}"
                   if args.baseline else ""))
    own = [r["own_cpu"] / r["seconds"] for rs in runs.values() for r in rs]
    lines.append(f"the bench's own RSS sampling used at most {max(own):.0%} of a core during a run")
    lines.append(f"medians of {args.rounds} alternating rounds; 1-minute load average (2 cores shared with other "
                 f"work) before and after each run: {', '.join(f'{x:.1f}' for x in loads)}")
    print("\n".join(lines))
    if args.write:
        write_section("Cache job against the SentencePiece floor", lines)


if __name__ == "__main__":
    main()
