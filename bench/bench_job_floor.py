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

Every round also runs both on a tiny corpus (``--fixed-size``, 100 train documents): what the job costs beyond
the floor there is its fixed cost (importing Beam, starting and stopping the runner's workers, building the
pipeline, the commit), which no per-document speed-up removes. At each size the job's wall is then at least
the floor's plus that difference, and the bench says whether 1.25x is within reach at all.

``--thread-clocks N`` measures instead where the job's own Python time goes, which the machine's load
disturbs far less than wall time: ``preprocess_source_shard`` (the task, the records, the spill files; no
Beam) over the first N source files of the 100k corpus, in a subprocess per run, for this tree and for
``--baseline`` in alternating rounds; reported per example: the CPU time of the thread that runs the
preprocessors (``time.thread_time``) and of the whole process (the tokenizer's and the reader's helper
threads too), with the run's wall time::

    PYTHONPATH=. python bench/bench_job_floor.py --thread-clocks 6 --rounds 3 --baseline DIR [--write]
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
import subprocess
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


def _imported_from(source: str, env: dict[str, str]) -> str:
    """The checkout whose ``taskdata`` a process started as the job is gets (as run_job starts it)."""
    done = subprocess.run([sys.executable, "-c", "import os, taskdata; print(os.path.dirname(os.path.dirname("
                           "os.path.realpath(taskdata.__file__))))"], env=env, cwd=source, capture_output=True,
                          text=True, check=True)
    return done.stdout.strip()


def run_job(corpus_dir: str, output: str, beam_args: list[str], vocab: str, source: str) -> dict:
    """The job of the taskdata source tree ``source`` (this one, or a --baseline checkout)."""
    shutil.rmtree(output, ignore_errors=True)
    env = dict(os.environ, TASKDATA_VOCAB=vocab, PYTHONPATH=source)
    command = [sys.executable, "-m", "taskdata", "cache", "--task", "c4_span_corruption", "--c4-dir", corpus_dir,
               "--output", output, "--force", "--quiet", "--", *beam_args]
    # Run from inside ``source``: ``python -m`` puts the current folder first on sys.path, before PYTHONPATH, and
    # Beam's worker processes start the same way (until 2026-11-26 this ran every "before" with this tree's code).
    run = run_measured(command, env, what="cache job", cwd=source)
    if _imported_from(source, env) != os.path.realpath(source):
        raise SystemExit(f"the job did not run the code of {source}")
    manifest = json.loads(Path(run["stdout"].strip().splitlines()[-1], "manifest.json").read_text())
    digests = tuple(shard["sha256"] for split in sorted(manifest["splits"])
                    for shard in manifest["splits"][split]["shards"])
    examples = sum(s["num_records"] for s in manifest["splits"].values())
    shutil.rmtree(output, ignore_errors=True)
    return {**run, "digests": digests, "examples": examples}


# One --thread-clocks run, as its own process with the code of the checkout it runs in (``-c`` puts the current
# folder first on sys.path): the first N train files through preprocess_source_shard. Arguments: corpus folder, N,
# vocabulary, scratch folder.
_CLOCKS_CHILD = """
import json, os, sys, time
from pathlib import Path
from taskdata.beam.pipeline import CacheJobSpec, preprocess_source_shard
from taskdata.config import Config
from taskdata.tasks import default_registry

corpus_dir, files, vocab, scratch = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
task = default_registry(Config(c4_dir=corpus_dir, vocab=vocab)).get_task("c4_span_corruption")
paths = sorted(str(p) for p in Path(corpus_dir).glob("c4-train.*.json.gz"))[:files]
spec = CacheJobSpec(task=task.name, task_fingerprint=task.fingerprint(), modules=(), config=("", None, None), seed=0,
                    version_dir=os.path.join(scratch, "v"), tmp_dir=os.path.join(scratch, "t"),
                    num_shards=(("train", 4), ("validation", 2)))
wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
for index, path in enumerate(paths):
    for _ in preprocess_source_shard(spec, "train", index, path, task):
        pass
wall, thread, process = time.perf_counter() - wall, time.thread_time() - thread, time.process_time() - process
examples = sum(json.loads(p.read_text())["examples"] for p in Path(spec.tmp_dir, "results", "sources").glob("*.json"))
import taskdata
print(json.dumps({"wall": wall, "thread": thread, "process": process, "examples": examples,
                  "tree": os.path.dirname(os.path.dirname(os.path.realpath(taskdata.__file__)))}))
"""


def thread_clocks(files: int, rounds: int, baseline: str | None, write: bool) -> None:
    vocab = corpus.ensure_builtin_vocabulary()
    corpus_dir = os.path.join(OUT, "corpus-100000")
    if not os.path.exists(os.path.join(corpus_dir, "CORPUS.json")):
        corpus.build_corpus(corpus_dir, **corpus_params(100000))
    sources = {"this tree": os.getcwd(), **({f"before ({baseline})": baseline} if baseline else {})}
    runs: dict[str, list[dict]] = {name: [] for name in sources}
    loads = [os.getloadavg()[0]]
    for round_ in range(rounds):
        for name in (list(sources) if round_ % 2 == 0 else list(sources)[::-1]):
            scratch = os.path.join(OUT, "thread-clocks")
            shutil.rmtree(scratch, ignore_errors=True)
            env = dict(os.environ, PYTHONPATH=sources[name])
            run = run_measured([sys.executable, "-c", _CLOCKS_CHILD, corpus_dir, str(files), vocab, scratch], env,
                               what="thread clocks", sample_rss=False, cwd=sources[name])
            shutil.rmtree(scratch, ignore_errors=True)
            result = json.loads(run["stdout"].strip().splitlines()[-1])
            if result["tree"] != os.path.realpath(sources[name]):
                raise SystemExit(f"the run meant for {sources[name]} imported taskdata from {result['tree']}")
            loads.append(os.getloadavg()[0])
            runs[name].append(result)
            print(f"round {round_ + 1} {name}: {result}", flush=True)
    examples = runs["this tree"][0]["examples"]
    if any(r["examples"] != examples for rs in runs.values() for r in rs):
        raise SystemExit("the runs made different numbers of examples")
    lines = [f"`preprocess_source_shard` over the first {files} train files of the 100k corpus ({examples:,} examples), "
             "a subprocess per run"]
    for name, rs in runs.items():
        med = {key: statistics.median(r[key] for r in rs) for key in ("wall", "thread", "process")}
        lines.append(f"{name}: the preprocessing thread {med['thread'] / examples * 1e6:.1f} CPU-us per example, the "
                     f"process {med['process'] / examples * 1e6:.1f} (tokenizer and reader threads included), wall "
                     f"{med['wall']:.2f} s (threads: " + ", ".join(f"{r['thread'] / examples * 1e6:.1f}" for r in rs) + ")")
    lines.append(f"medians of {rounds} alternating rounds; 1-minute load average before and after each run: "
                 f"{', '.join(f'{x:.1f}' for x in loads)}")
    print("\n".join(lines))
    if write:
        write_section("Cache job: the preprocessing thread's clock", lines)


def fixed_cost_bounds(runs: dict, fixed: int, sizes: list[int], modes: list[str]) -> list[str]:
    """Per mode and size: the least wall the job can take there, the floor's plus the job's fixed cost beyond the
    floor's (medians at the tiny corpus), and whether the target lies above it."""
    lines = []
    for mode in modes:
        job, floor = (statistics.median(r["seconds"] for r in runs[fixed, mode, kind]) for kind in ("job", "floor"))
        extra = job - floor
        bounds = []
        for size in sizes:
            floor_wall = statistics.median(r["seconds"] for r in runs[size, mode, "floor"])
            least = floor_wall + extra
            room = TARGET * floor_wall - least
            bounds.append(
                f"at {size:,} documents at least {floor_wall:.2f} + {extra:.2f} = {least:.2f} s = "
                f"{least / floor_wall:.2f}x the floor, "
                + (f"{room:.2f} s left under {TARGET}x for per-document work beyond the floor's" if room > 0
                   else f"{TARGET}x out of reach whatever the per-document work costs"))
        lines.append(f"{mode}, fixed costs ({fixed:,} train documents): job {job:.2f} s wall, floor {floor:.2f} s: the "
                     f"job's own {extra:.2f} s more, so its wall is {'; '.join(bounds)}")
    return lines


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--floor-child":
        floor_child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[20000, 100000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--fixed-size", type=int, default=100,
                        help="train documents of the tiny corpus that measures fixed costs (0: none)")
    parser.add_argument("--baseline", help="also run the job of this taskdata source tree (e.g. an earlier commit "
                        "from 'git archive COMMIT | tar -x -C DIR') in every round, as 'before'")
    parser.add_argument("--write", action="store_true", help="write the figures into BENCHMARKS.md")
    parser.add_argument("--thread-clocks", type=int, metavar="FILES",
                        help="measure the preprocessing thread's CPU per example over FILES source files instead")
    args = parser.parse_args()
    if args.thread_clocks:
        thread_clocks(args.thread_clocks, args.rounds, args.baseline, args.write)
        return
    if args.write and (args.modes != list(MODES) or sorted(args.sizes) != [20000, 100000]):
        raise SystemExit("--write records the full comparison: both modes at --sizes 20000 100000")
    vocab = corpus.ensure_builtin_vocabulary()
    fixed = args.fixed_size if args.fixed_size and args.fixed_size not in args.sizes else None
    sizes = ([fixed] if fixed else []) + args.sizes
    dirs = {}
    for size in sizes:
        dirs[size] = os.path.join(OUT, f"corpus-{size}")
        if not os.path.exists(os.path.join(dirs[size], "CORPUS.json")):
            corpus.build_corpus(dirs[size], **corpus_params(size))
    runs: dict[tuple[int, str, str], list[dict]] = {}
    loads = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        for size in sizes:
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
    if len(digests) != len(sizes):
        raise SystemExit(f"the caches of one corpus differ between modes or rounds: {len(digests)} distinct sets "
                         f"of shard digests for {len(sizes)} corpus sizes")
    lines = []
    for size in sizes:
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
    if fixed:
        lines += fixed_cost_bounds(runs, fixed, args.sizes, args.modes)
    own = [r["own_cpu"] / r["seconds"] for rs in runs.values() for r in rs]
    lines.append(f"the bench's own RSS sampling used at most {max(own):.0%} of a core during a run")
    lines.append(f"medians of {args.rounds} alternating rounds; 1-minute load average (2 cores shared with other "
                 f"work) before and after each run: {', '.join(f'{x:.1f}' for x in loads)}")
    print("\n".join(lines))
    if args.write:
        write_section("Cache job against the SentencePiece floor", lines)


if __name__ == "__main__":
    main()
