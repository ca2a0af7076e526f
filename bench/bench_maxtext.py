"""MaxText's own train loop fed by taskdata's pipeline against MaxText's own Grain pipeline, on the same tokens,
the same tiny decoder and the same cores, in one run.

The data: the built-in corpus's recipe at ``--docs`` train documents, a 1,024-token BPE tokenizer trained on
them, ``tests.maxtext_tasks``' decoder-only task (documents joined with EOS, rows of 128 tokens) cached with
taskdata, and a run of ``--per-device-batch x --devices`` rows a step. The rows of the run's first ``--steps``
steps, in the run's order, are also written as Parquet files (one ``text`` column of token ids), the
pre-tokenized input MaxText's Grain pipeline reads (``dataset_type=grain grain_file_type=parquet
tokenize_train_data=false packing=false``, Grain's other settings MaxText's defaults: one worker process,
16 threads, a window shuffle of 100 rows).

Each round runs MaxText once per pipeline (``bench/maxtext_timed.py`` in the MaxText environment, fresh
processes, one JAX compilation cache for both), ``--steps`` steps. Reported per pipeline, over the steps after
the first ``--warmup``: the time MaxText's loop waited for each batch (``DataLoader.load_next_batch_pre_sharding``:
``next()`` on the data iterator and its global arrays; median, 90th percentile, mean) and its steps per second
(from MaxText's own step times in its metrics file). Medians over rounds.

    PYTHONPATH=. python bench/bench_maxtext.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._report import write_section
from taskdata.cli import main as taskdata_main
from taskdata.runs import RunStore
from trainer_client.assignments import HostSlice
from trainer_client.iterator import DataIterator
from trainer_client.local_source import LocalAssignments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE, TASK, RUN = "tests.maxtext_tasks", "maxtext_lm", "bench"
ROW_LENGTH, VOCAB = 128, 1024
MODEL = ["base_emb_dim=64", "base_num_query_heads=2", "base_num_kv_heads=2", "base_mlp_dim=128",
         "base_num_decoder_layers=2", "head_dim=32", f"max_target_length={ROW_LENGTH}", f"vocab_size={VOCAB}"]


def build(out: str, docs: int, batch: int, steps: int) -> tuple[str, str]:
    """(cache root, folder of Parquet files and the HF tokenizer), built once per ``out`` and parameters."""
    from taskdata.tasks.corpus import build_corpus

    marker = os.path.join(out, f"built-{docs}-{batch}-{steps}")
    corpus, caches, parquet = (os.path.join(out, name) for name in ("corpus", "caches", "parquet"))
    os.environ["TASKDATA_TEST_C4_DIR"] = corpus
    os.environ["TASKDATA_TEST_TOKENIZER"] = os.path.join(parquet, "hf", "tokenizer.json")
    if os.path.exists(marker):
        return caches, parquet
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(parquet, "hf"))
    build_corpus(corpus, num_train_docs=docs, num_validation_docs=60, train_files=4, validation_files=1)
    common = ["--module", MODULE, "--home", os.path.join(out, "home")]
    for command in (
        ["vocab", "train", "--kind", "bpe", "--task", TASK, "--size", str(VOCAB), "--out",
         os.environ["TASKDATA_TEST_TOKENIZER"]],
        ["cache", "--task", TASK, "--output", caches, "--seed", "0", "--quiet"],
        ["plan", "--name", RUN, "--mixture", TASK, "--cache-root", caches, "--seed", "0", "--batch-size", str(batch),
         "--num-data-shards", "1"],
    ):
        assert taskdata_main([*command, *common]) == 0, command
    # What transformers.AutoTokenizer (MaxText's tokenizer_type=huggingface) needs beside tokenizer.json.
    with open(os.path.join(parquet, "hf", "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "</s>",
                   "unk_token": "<unk>"}, f)
    write_parquet(caches, parquet, steps)
    open(marker, "w").close()
    return caches, parquet


def write_parquet(caches: str, parquet: str, steps: int, files: int = 8) -> None:
    """The run's rows of steps [0, steps), in order, as ``files`` Parquet files with a ``text`` column of ids."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    stored = RunStore(caches).get(RUN)
    assert stored is not None
    rows = []
    with DataIterator(LocalAssignments.from_cache_root(stored, caches), {"targets": ROW_LENGTH},
                      host_slice=HostSlice(0, 1), stop_step=steps) as data:
        for batch in data:
            rows += list(batch.features["targets"])
    per_file = -(-len(rows) // files)
    for i in range(files):
        part = rows[i * per_file : (i + 1) * per_file]
        table = pa.table({"text": pa.array([r.tolist() for r in part], type=pa.list_(pa.int32()))})
        pq.write_table(table, os.path.join(parquet, f"rows-{i:02d}.parquet"))


def run(python: str, pipeline: str, folder: str, caches: str, parquet: str, config: str, args: argparse.Namespace,
        ) -> dict[str, float]:
    os.makedirs(folder, exist_ok=True)
    waits_path, metrics_path = os.path.join(folder, "waits.json"), os.path.join(folder, "metrics.jsonl")
    overrides = [config, "hardware=cpu", "skip_jax_distributed_system=true", *MODEL, f"steps={args.steps}",
                 f"per_device_batch_size={args.per_device_batch}", "enable_checkpointing=false",
                 f"run_name={pipeline}", f"base_output_directory={folder}", f"metrics_file={metrics_path}",
                 f"jax_cache_dir={os.path.join(args.out, 'jax_cache')}"]
    if pipeline.startswith("taskdata"):
        workers = pipeline.partition("-workers")[2] or "0"
        command = ["taskdata", "--cache-root", caches, "--run", RUN, "--workers", workers, "--", *overrides]
    else:
        command = ["grain", "--", *overrides, "dataset_type=grain", "grain_file_type=parquet",
                   f"grain_train_files={parquet}/*.parquet", "tokenize_train_data=false", "tokenizer_type=huggingface",
                   f"tokenizer_path={os.path.join(parquet, 'hf')}", "packing=false"]
    env = {**os.environ, "PYTHONPATH": ROOT, "DECOUPLE_GCLOUD": "TRUE", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}", "TF_CPP_MIN_LOG_LEVEL": "2"}
    with open(os.path.join(folder, "maxtext.log"), "wb") as log:
        code = subprocess.run([python, os.path.join(ROOT, "bench", "maxtext_timed.py"), "--waits", waits_path,
                               *command], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=1800).returncode
    if code != 0:
        raise SystemExit(f"{pipeline}: MaxText exited with {code}; see {folder}/maxtext.log")
    with open(waits_path) as f:
        timers = json.load(f)
    loop, own = (timers[name][args.warmup :] for name in ("loop", "pipeline"))
    with open(metrics_path) as f:
        step_times = [json.loads(line)["perf/step_time_seconds"] for line in f][args.warmup :]
    assert len(loop) == len(own) == len(step_times) == args.steps - args.warmup, (len(loop), len(own), len(step_times))
    return {"wait_median_ms": 1e3 * statistics.median(loop), "wait_p90_ms": 1e3 * _p90(loop),
            "wait_mean_ms": 1e3 * statistics.fmean(loop), "own_median_ms": 1e3 * statistics.median(own),
            "own_p90_ms": 1e3 * _p90(own), "steps_per_s": len(step_times) / sum(step_times),
            "step_median_ms": 1e3 * statistics.median(step_times)}


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * len(values))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=2400, help="train documents of the corpus")
    p.add_argument("--devices", type=int, default=4, help="CPU devices of the one MaxText process")
    p.add_argument("--per-device-batch", type=int, default=32, help="MaxText's per_device_batch_size")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=5, help="first steps left out (compilation)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "maxtext"))
    p.add_argument("--maxtext-python", default=os.path.join(ROOT, ".venv-maxtext", "bin", "python"),
                   help="the MaxText environment's Python (bash deploy/maxtext_env.sh)")
    args = p.parse_args()
    batch = args.per_device_batch * args.devices
    caches, parquet = build(args.out, args.docs, batch, args.steps)
    config = subprocess.run([args.maxtext_python, "-c", "import maxtext, os; print(os.path.join(os.path.dirname("
                             "maxtext.__file__), 'configs', 'decoupled_base_test.yml'))"], check=True,
                            capture_output=True, text=True).stdout.strip()
    results: dict[str, list[dict[str, float]]] = {"taskdata": [], "taskdata-workers1": [], "grain": []}
    loads = []
    for round_number in range(args.rounds):
        for pipeline in results:
            loads.append(os.getloadavg()[0])
            folder = os.path.join(args.out, "runs", f"{pipeline}-{round_number}")
            shutil.rmtree(folder, ignore_errors=True)
            results[pipeline].append(run(args.maxtext_python, pipeline, folder, caches, parquet, config, args))
            print(pipeline, round_number, results[pipeline][-1], flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    lines = [f"at {commit}: MaxText 0.2.5's train loop, tiny decoder (2 layers, width 64, vocabulary {VOCAB}), rows of {ROW_LENGTH} "
             f"tokens, {batch} rows a step ({args.devices} CPU devices x {args.per_device_batch}), {args.steps} steps "
             f"(the first {args.warmup} left out), {args.rounds} rounds (medians); load average "
             f"{min(loads):.1f}-{max(loads):.1f}:"]
    for pipeline, runs in results.items():
        median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        lines.append(f"{pipeline}: data wait per step {median['wait_median_ms']:.2f} ms median, "
                     f"{median['wait_p90_ms']:.2f} ms p90, {median['wait_mean_ms']:.2f} ms mean, of which in the "
                     f"pipeline's own next() {median['own_median_ms']:.2f} ms median, {median['own_p90_ms']:.2f} ms "
                     f"p90; {median['steps_per_s']:.1f} steps/s ({median['step_median_ms']:.1f} ms a step, median)")
    lines.append('the timers (`bench/maxtext_timed.py`): "data wait" around MaxText\'s `DataLoader.load_next_batch_pre_sharding` '
                 "(the pipeline's next host rows and MaxText's `MultiHostDataLoadIterator` making global arrays of them), "
                 '"own next()" around `next()` of the iterator MaxText takes host rows from. Grain (MaxText\'s defaults: '
                 "one worker process, 16 threads, a window shuffle of 100) reads the run's first "
                 f"{args.steps * batch:,} rows, written in the run's order to 8 Parquet files; taskdata reads them from "
                 "its cache (`--workers 1`: one read worker process)")
    for line in lines:
        print(line)
    write_section("MaxText: taskdata's pipeline against MaxText's Grain pipeline", lines)


if __name__ == "__main__":
    main()
