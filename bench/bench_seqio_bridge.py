"""The seqio bridge against seqio's own cache job, on the same seqio task, documents and cores, in one run.

For each corpus size: documents of the built-in corpus as text files (one document per line, 1,250 per
file), the span-corruption task of ``bench/seqio_bridge_tasks.py`` (seqio preprocessors and TensorFlow
ops), cached by

- ``seqio_cache_tasks`` (seqio 0.0.20's ``seqio.scripts.cache_tasks_main``, ``--min_shards=0``), and
- ``taskdata cache --seqio-task`` (the bridge: the same preprocessing, taskdata's keyed shuffle and writer),

each as a fresh subprocess on Beam's local runner with the same options, three times (medians reported) (by default each tool's local
default: the in-process runner, whose TensorFlow uses every core; ``--workers N`` adds
``--direct_running_mode=multi_processing --direct_num_workers=N`` to both), timed from start to exit (wall
and CPU), with the RSS of its whole process tree sampled every 0.1 s. The two caches are checked to hold
the same multiset of examples. A 50-document run of each measures its start-up (importing TensorFlow,
JAX and seqio, building the pipeline), so that the time per document beyond start-up can be compared too;
and the seqio preprocessing alone (every shard's tf.data pipeline built and iterated in one process, nothing
written) shows the floor both jobs share.

    PYTHONPATH=. python bench/bench_seqio_bridge.py --sizes 5000 20000
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._measure import run_measured
from bench._report import write_section
from taskdata.tasks import corpus

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "seqio_bridge")
DOCS_PER_FILE = 1250
TASK = "bench_span_corruption"


def write_documents(size: int, corpus_size: int) -> str:
    """The first ``size`` training documents of a ``corpus_size`` built-in-recipe corpus, one per line, in
    files of 1,250 (each size reads a prefix of the same documents)."""
    folder = os.path.join(OUT, f"docs-{size}-of-{corpus_size}")
    if os.path.exists(os.path.join(folder, "DONE")):
        return folder
    source = os.path.join(OUT, f"corpus-{corpus_size}")
    if not os.path.exists(os.path.join(source, "CORPUS.json")):
        corpus.build_corpus(source, num_train_docs=corpus_size, num_validation_docs=200, train_files=8,
                            validation_files=1)
    texts = []
    for name in sorted(os.listdir(source)):
        if name.startswith("c4-train.") and name.endswith(".json.gz"):
            with gzip.open(os.path.join(source, name), "rt", encoding="utf-8") as f:
                texts.extend(" ".join(json.loads(line)["text"].split()) for line in f)
    texts = texts[:size]
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    files = -(-len(texts) // DOCS_PER_FILE)
    for i in range(files):
        with open(os.path.join(folder, f"train-{i:05d}-of-{files:05d}.txt"), "w", encoding="utf-8") as f:
            f.write("".join(t + "\n" for t in texts[i * DOCS_PER_FILE : (i + 1) * DOCS_PER_FILE]))
    Path(folder, "DONE").write_text(f"{len(texts)}\n")
    return folder


def run(command: list[str], env: dict[str, str]) -> dict:
    return run_measured(command, env, what=" ".join(command[:4]))


def examples_of(files: list[str]) -> collections.Counter:
    from taskdata.cache.tfrecord import iter_records
    from taskdata.example import decode_example, encode_example

    out: collections.Counter = collections.Counter()
    for path in files:
        with open(path, "rb") as f:
            for record in iter_records(f, path):
                example = {k: v for k, v in decode_example(record).items() if not k.startswith("provenance/")}
                out[encode_example(example)] += 1
    return out


def preprocessing_alone(env: dict[str, str]) -> float:
    """Seconds to run the seqio part of the bridge alone in one process: each shard's tf.data pipeline built
    and iterated as the bridged task does it, nothing encoded, shuffled or written."""
    code = (
        "import time\n"
        "from taskdata.define.registry import Registry\n"
        "from taskdata.seqio_bridge import add_seqio_task, import_seqio\n"
        "import_seqio()\n"
        "import bench.seqio_bridge_tasks\n"
        f"task = add_seqio_task({TASK!r}, Registry())\n"
        "started = time.monotonic()\n"
        "for _ in task.iter_examples('train', 7): pass\n"
        "print(time.monotonic() - started)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def cache_both(size: int, corpus_size: int, vocab: str, beam: list[str]) -> dict:
    """Runs both jobs on the first ``size`` documents; their results, and whether their examples agree."""
    data = write_documents(size, corpus_size)
    files = len([n for n in os.listdir(data) if n.endswith(".txt")])
    env = dict(os.environ, BENCH_SEQIO_DATA=data, BENCH_SEQIO_VOCAB=vocab, PYTHONPATH=os.getcwd())
    seqio_out, bridge_out = (os.path.join(OUT, f"{kind}-{size}") for kind in ("seqio", "bridge"))
    for folder in (seqio_out, bridge_out):
        shutil.rmtree(folder, ignore_errors=True)
    runner = ["--runner=FnApiRunner", *beam]  # what seqio's default DirectRunner runs, without trying Prism first
    theirs = run([sys.executable, "-m", "seqio.scripts.cache_tasks_main", "--module_import=bench.seqio_bridge_tasks",
                  f"--tasks={TASK}", f"--output_cache_dir={seqio_out}", "--min_shards=0", "--base_seed=7",
                  "--pipeline_options=" + ",".join(runner)], dict(env, TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK="true"))
    ours = run([sys.executable, "-m", "taskdata", "cache", "--seqio-task", TASK, "--module", "bench.seqio_bridge_tasks",
                "--output", bridge_out, "--seed", "7", "--num-shards", str(files), "--quiet", "--", *beam], env)
    version_dir = ours["stdout"].strip().splitlines()[-1]
    ours_examples = examples_of(sorted(str(p) for p in Path(version_dir).glob("train.tfrecord-*")))
    theirs_examples = examples_of(sorted(str(p) for p in Path(seqio_out, TASK).glob("train.tfrecord-*")))
    return {"documents": int(Path(data, "DONE").read_text()), "files": files, "env": env, "seqio": theirs,
            "bridge": ours, "examples": sum(ours_examples.values()), "same": ours_examples == theirs_examples}


def _job_line(name: str, job: dict, startup: dict, documents: int) -> str:
    beyond = job["seconds"] - startup["seconds"]
    return (f"{name}: {job['seconds']:.1f} s wall ({job['cpu']:.1f} s CPU), {documents / job['seconds']:,.0f} documents/s; "
            f"beyond its start-up: {beyond:.1f} s, {1e3 * beyond / documents:.2f} ms per document; peak RSS "
            f"{job['peak_tree_rss'] / 2**20:,.0f} MB for the process tree, largest process "
            f"{job['peak_process_rss'] / 2**20:,.0f} MB")


def _median_job(jobs: list[dict]) -> dict:
    return {"seconds": statistics.median(j["seconds"] for j in jobs), "cpu": statistics.median(j["cpu"] for j in jobs),
            "peak_tree_rss": max(j["peak_tree_rss"] for j in jobs),
            "peak_process_rss": max(j["peak_process_rss"] for j in jobs)}


def measure(size: int, corpus_size: int, vocab: str, beam: list[str], rounds: int) -> dict:
    """Medians over ``rounds`` runs of both jobs (the peak RSS is the largest of any round)."""
    results = [cache_both(size, corpus_size, vocab, beam) for _ in range(rounds)]
    return {"documents": results[0]["documents"], "files": results[0]["files"], "env": results[0]["env"],
            "examples": results[0]["examples"], "same": all(r["same"] for r in results),
            "seqio": _median_job([r["seqio"] for r in results]), "bridge": _median_job([r["bridge"] for r in results])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 20000])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each measurement; medians are reported")
    args = parser.parse_args()
    vocab = corpus.ensure_builtin_vocabulary()
    beam = ["--direct_running_mode=multi_processing", f"--direct_num_workers={args.workers}"] if args.workers > 1 else []
    startup = measure(50, max(args.sizes), vocab, beam, args.rounds)
    lines = [f"start-up (a 50-document run): seqio_cache_tasks {startup['seqio']['seconds']:.1f} s wall "
             f"({startup['seqio']['cpu']:.1f} s CPU), taskdata cache --seqio-task {startup['bridge']['seconds']:.1f} s "
             f"wall ({startup['bridge']['cpu']:.1f} s CPU)"]
    for size in args.sizes:
        result = measure(size, max(args.sizes), vocab, beam, args.rounds)
        documents, theirs, ours = result["documents"], result["seqio"], result["bridge"]
        alone = statistics.median(preprocessing_alone(result["env"]) for _ in range(args.rounds))
        ratio = theirs["seconds"] / ours["seconds"]
        beyond = (theirs["seconds"] - startup["seqio"]["seconds"]) / (ours["seconds"] - startup["bridge"]["seconds"])
        lines += [
            f"{documents:,} documents in {result['files']} files -> {result['examples']:,} examples; the same multiset of "
            f"examples in both caches: {result['same']}",
            _job_line("seqio_cache_tasks", theirs, startup["seqio"], documents),
            _job_line("taskdata cache --seqio-task", ours, startup["bridge"], documents),
            f"bridge / seqio: {ratio:.2f}x the documents/s (target >= 3x), {beyond:.2f}x beyond start-up",
            f"the seqio preprocessing alone, as the bridge runs it (each shard's tf.data pipeline built and iterated, "
            f"one process, nothing written): {alone:.1f} s, {1e3 * alone / documents:.2f} ms per document",
            f"what each job adds to its start-up and that preprocessing: seqio_cache_tasks "
            f"{theirs['seconds'] - startup['seqio']['seconds'] - alone:+.1f} s, the bridge "
            f"{ours['seconds'] - startup['bridge']['seconds'] - alone:+.1f} s; so no job that runs seqio's own "
            f"preprocessing can beat seqio here by more than {theirs['seconds'] / (startup['bridge']['seconds'] + alone):.2f}x "
            "(seqio's time over start-up plus preprocessing)",
        ]
        print("\n".join(lines[-6:]), flush=True)
    lines.append(f"medians of {args.rounds} rounds (peak RSS: the largest); Beam's local runner for both"
                 + (f", {' '.join(beam)}" if beam else " (in-process, as each tool runs by default on one machine)")
                 + "; each job is a fresh process")
    write_section("seqio bridge", lines)


if __name__ == "__main__":
    main()
