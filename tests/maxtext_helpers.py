"""Shared pieces of the MaxText tests: a small LM cache and its runs, the plan's own batches, MaxText's environment.

The data: a 400-document C4-format corpus (the built-in recipe at a small size), a 1,024-token BPE tokenizer
trained on it, and ``tests.maxtext_tasks``' ``maxtext_lm`` (documents joined with EOS, rows of 128 tokens) cached
with seed 0: about 2,350 train and 400 validation rows, built in a few seconds. Two runs over it: ``lm`` (a
ramp of the global batch from 4 to 8 rows over the first 6 steps, the data of steps 14 and 15 skipped) and
``lm_eval`` (the validation split, 8 rows a step), and ``lm_uneven``, a ramp whose steps the tests' 4 devices
cannot all hold evenly.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

import numpy as np

from taskdata.cli import main as taskdata_main
from taskdata.runs import RunStore
from trainer_client.assignments import HostSlice
from trainer_client.digest import batch_hash, row_digests
from trainer_client.iterator import DataIterator
from trainer_client.local_source import LocalAssignments
from trainer_client.maxtext.fields import maxtext_fields

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = "tests.maxtext_tasks"
TASK = "maxtext_lm"
ROW_LENGTH = 128
VOCAB_SIZE = 1024
TRAIN_RUN, EVAL_RUN = "lm", "lm_eval"
# A ramp from 4 to 8 rows without --multiple-of: step 2 has 5 rows, which 4 devices cannot hold evenly.
UNEVEN_RUN = "lm_uneven"
BATCH = 8
SKIPPED = (14, 15)
NAMES = ("targets", "targets_segment_ids", "targets_positions")
# A tiny decoder MaxText trains in a second a step on CPU (the recipe of ../shared/recipes/maxtext-on-cpu.md).
MODEL = ["base_emb_dim=64", "base_num_query_heads=2", "base_num_kv_heads=2", "base_mlp_dim=128",
         "base_num_decoder_layers=2", "head_dim=32", f"max_target_length={ROW_LENGTH}", f"vocab_size={VOCAB_SIZE}"]

_SHARED: dict[str, str] = {}


def data_root(tmp_path_factory) -> str:
    """The corpus, tokenizer, cache and runs, built once per test session (never modify them)."""
    if "root" not in _SHARED:
        _SHARED["root"] = build(str(tmp_path_factory.mktemp("maxtext_data")))
    return _SHARED["root"]


def build(root: str) -> str:
    """Builds everything under ``root``; returns the cache root (``{root}/caches``)."""
    from taskdata.tasks.corpus import build_corpus

    build_corpus(os.path.join(root, "corpus"), num_train_docs=400, num_validation_docs=60, train_files=2,
                 validation_files=1)
    os.environ["TASKDATA_TEST_C4_DIR"] = os.path.join(root, "corpus")
    os.environ["TASKDATA_TEST_TOKENIZER"] = os.path.join(root, "tokenizer.json")
    caches = os.path.join(root, "caches")
    common = ["--module", MODULE, "--home", os.path.join(root, "home")]
    commands = [
        ["vocab", "train", "--kind", "bpe", "--task", TASK, "--size", str(VOCAB_SIZE), "--out",
         os.environ["TASKDATA_TEST_TOKENIZER"]],
        ["cache", "--task", TASK, "--output", caches, "--seed", "0", "--quiet"],
        ["plan", "--name", TRAIN_RUN, "--mixture", TASK, "--cache-root", caches, "--seed", "0", "--batch-size", "4",
         "--ramp-to", str(BATCH), "--ramp-steps", "6", "--multiple-of", "4", "--num-data-shards", "1",
         "--skip", f"{SKIPPED[0]}:{SKIPPED[-1] + 1}"],
        ["plan", "--name", UNEVEN_RUN, "--mixture", TASK, "--cache-root", caches, "--seed", "0", "--batch-size", "4",
         "--ramp-to", str(BATCH), "--ramp-steps", "6", "--num-data-shards", "1"],
        ["plan", "--name", EVAL_RUN, "--mixture", TASK, "--cache-root", caches, "--seed", "0", "--batch-size",
         str(BATCH), "--num-data-shards", "1", "--split", "validation"],
    ]
    for command in commands:
        assert taskdata_main([*command, *common]) == 0, command
    return caches


def task_env() -> dict[str, str]:
    """What a process needs to import ``tests.maxtext_tasks`` and find the test data."""
    return {"PYTHONPATH": REPO, **{k: os.environ[k] for k in ("TASKDATA_TEST_C4_DIR", "TASKDATA_TEST_TOKENIZER")}}


def plan_batches(cache_root: str, run: str, steps: Sequence[int], pass_records: int | None = None,
                 ) -> dict[int, tuple[str | None, int]]:
    """Step -> (hash of the plan's global batch, or None when skipped; the loss weights MaxText should count),
    read by one process straight from the plan (no MaxText, no layout). With ``pass_records``, the rows at
    stream positions from it on are left out (an eval pass's end)."""
    stored = RunStore(cache_root).get(run)
    assert stored is not None
    out: dict[int, tuple[str | None, int]] = {}
    lengths = dict.fromkeys(NAMES, ROW_LENGTH)
    with DataIterator(LocalAssignments.from_cache_root(stored, cache_root), lengths, start=min(steps),
                      host_slice=HostSlice(0, 1), stop_step=max(steps) + 1) as data:
        for batch in data:
            if batch.step not in steps:
                continue
            if batch.skipped:
                out[batch.step] = (None, 0)
                continue
            kept = len(batch.positions) if pass_records is None else pass_records - batch.positions.start
            features = {name: batch.features[name][:kept] for name in NAMES}
            fields = maxtext_fields(*(features[name] for name in NAMES))
            weight = int(np.count_nonzero(fields["targets_segmentation"]))
            out[batch.step] = (batch_hash(row_digests(features)), weight)
    return out


def maxtext_python() -> str | None:
    """The MaxText environment's Python (``deploy/maxtext_env.sh``), or None where it is not built."""
    venv = os.environ.get("TASKDATA_MAXTEXT_VENV", os.path.join(REPO, ".venv-maxtext"))
    python = os.path.join(venv, "bin", "python")
    return python if os.path.isfile(os.path.join(venv, ".taskdata-env")) else None


def maxtext_config(python: str) -> str:
    """MaxText's own CPU test config (``configs/decoupled_base_test.yml``) in its environment."""
    return subprocess.run(
        [python, "-c", "import maxtext, os; print(os.path.join(os.path.dirname(maxtext.__file__), 'configs', "
                       "'decoupled_base_test.yml'))"],
        check=True, capture_output=True, text=True, timeout=120).stdout.strip()
