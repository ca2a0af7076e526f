"""Validation predictions of the example trainer: the forward pass, greedy decoding, ids, and ``taskdata eval``."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from taskdata.cache.format import CacheFormatError
from taskdata.cache.reader import CacheReader
from taskdata.cli import main as taskdata_main
from taskdata.define.features import Feature
from taskdata.define.registry import Registry
from taskdata.define.task import Task
from taskdata.define.vocabularies import ByteVocabulary
from taskdata.evaluation.targets import CacheTargets
from taskdata.index import BatchSchedule, SkipRange
from taskdata.runs import RunStore, build_run
from tests.cache_helpers import build
from tests.client_helpers import MODEL_ARGS, Trainer, shared_compilation_cache, trainers
from trainer_client.assignments import AssignmentError
from trainer_client.example.model import ModelConfig, init_params, loss_fn
from trainer_client.example.predict import (
    decoder_logits,
    encode,
    first_examples,
    greedy_decode,
    pinned_version_dirs,
    predict_run,
    targets_vocabulary,
)
from trainer_client.local_source import LocalAssignments

pytestmark = pytest.mark.slow  # cache jobs (Beam)

CONFIG = ModelConfig(vocab_size=512, d_model=16, num_heads=2, head_dim=8, d_ff=32)
VALIDATION_RECORDS = 87  # toy_random's validation split (tests.cache_tasks)


@pytest.fixture(scope="module")
def registry():
    registry = Registry()
    registry.load_module("tests.cache_tasks")
    return registry


@pytest.fixture(scope="module")
def root(tmp_path_factory, registry):
    """A toy_random cache (seed 3) and two single-task runs over it, one skipping its first 20 steps."""
    root = str(tmp_path_factory.mktemp("predict_root"))
    build(root, task="toy_random", seed=3, num_shards=2)
    store = RunStore(root)
    schedule = BatchSchedule(start=4, end=4)
    for name, skip in (("rand", ()), ("rand_skip", (SkipRange(0, 20),))):
        run = build_run(
            registry,
            root,
            name=name,
            mixture="toy_random",
            seed=1,
            schedule=schedule,
            num_data_shards=1,
            skip=skip,
        )
        store.create(run)
    return root


def source_of(root: str, run: str) -> LocalAssignments:
    stored = RunStore(root).get(run)
    assert stored is not None
    return LocalAssignments.from_cache_root(stored, root)


def random_batch(seed: int, rows: int = 3, inputs: int = 7, targets: int = 9) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    batch = {
        "inputs": rng.integers(3, CONFIG.vocab_size, (rows, inputs)).astype(np.int32),
        "targets": rng.integers(3, CONFIG.vocab_size, (rows, targets)).astype(np.int32),
    }
    batch["inputs"][0, 4:] = 0  # padding must be masked the same way in both passes
    batch["targets"][1, 5:] = 0
    return batch


@jax.jit
def teacher_forced_logits(params, inputs, targets):
    # Compiled once: op-by-op dispatch of the whole model would take seconds.
    decoder_inputs = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
    return decoder_logits(params, encode(params, inputs, CONFIG), inputs, decoder_inputs, CONFIG)


def test_teacher_forced_logits_give_the_training_loss():
    params = init_params(CONFIG, 0)
    batch = random_batch(1)
    logits = np.asarray(teacher_forced_logits(params, batch["inputs"], batch["targets"]), dtype=np.float64)
    targets = batch["targets"]
    target_logit = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    top = logits.max(axis=-1)
    losses = top + np.log(np.exp(logits - top[..., None]).sum(axis=-1)) - target_logit
    weights = targets != 0
    expected = jax.jit(loss_fn, static_argnums=2)(params, batch, CONFIG)
    assert (losses * weights).sum() / weights.sum() == pytest.approx(float(expected), rel=1e-5)


def test_greedy_tokens_are_the_argmax_after_their_own_prefix_and_depend_on_the_parameters():
    params = init_params(CONFIG, 0)
    inputs = random_batch(2, rows=35)["inputs"]  # more rows than one decode batch: two compiled calls
    tokens = greedy_decode(params, inputs, CONFIG, 12)
    assert tokens.shape == (35, 12) and tokens.dtype == np.int32
    logits = teacher_forced_logits(params, inputs, tokens)
    np.testing.assert_array_equal(np.asarray(logits).argmax(axis=-1), tokens)
    assert not np.array_equal(greedy_decode(init_params(CONFIG, 1), inputs, CONFIG, 12), tokens)


def test_first_examples_are_the_cache_order_and_ids_that_eval_reads(root, registry):
    task = registry.get_task("toy_random")
    expected = [example_id for example_id, _, _ in CacheTargets(root)(task, "validation")]
    version_dir = pinned_version_dirs(source_of(root, "rand"))["toy_random"]
    with CacheReader(version_dir) as reader:
        ids, inputs = first_examples(reader, "validation", 50, 8)
        assert ids == expected[:50] and inputs.shape == (50, 8) and inputs[:, 0].all()
        every_id, _ = first_examples(reader, "validation", 1000, 8)
        assert every_id == expected and len(every_id) == VALIDATION_RECORDS
        with pytest.raises(ValueError, match="Raise --inputs-length to at least 8"):
            first_examples(reader, "validation", 5, 4)


def test_pinned_versions_are_found_past_skipped_steps_and_refuse_other_bytes(root):
    for run in ("rand", "rand_skip"):
        dirs = pinned_version_dirs(source_of(root, run))
        assert list(dirs) == ["toy_random"]
        with CacheReader(dirs["toy_random"]) as reader:
            assert reader.manifest_sha256 == RunStore(root).get(run).plan.caches["toy_random"].fingerprint


def test_a_run_that_skips_every_scanned_step_says_why(root, registry, tmp_path):
    store = RunStore(str(tmp_path))
    run = build_run(
        registry,
        root,
        name="all_skipped",
        mixture="toy_random",
        seed=1,
        schedule=BatchSchedule(start=4, end=4),
        num_data_shards=1,
        skip=(SkipRange(0, 5000),),
    )
    store.create(run)
    source = LocalAssignments.from_cache_root(run, root)
    with pytest.raises(AssignmentError, match="reads no records in its first 1024 steps"):
        pinned_version_dirs(source)


def test_another_vocabulary_than_the_cache_was_built_with_is_refused(root, registry):
    original = registry.get_task("toy_random")
    other = ByteVocabulary(extra_ids=7)
    features = {"inputs": Feature(other), "targets": Feature(other)}
    changed = Task("toy_random", original.source, list(original.preprocessors), features)
    version_dir = pinned_version_dirs(source_of(root, "rand"))["toy_random"]
    with CacheReader(version_dir) as reader:
        assert targets_vocabulary(original, reader) is original.output_features["targets"].vocabulary
        with pytest.raises(CacheFormatError, match="was built with other vocabularies"):
            targets_vocabulary(changed, reader)


def test_predict_run_decodes_every_row_with_the_targets_vocabulary(root, registry):
    params = init_params(CONFIG, 0)
    rows = predict_run(
        params,
        CONFIG,
        source_of(root, "rand"),
        registry,
        split="validation",
        count=3,
        lengths={"inputs": 8, "targets": 10},
    )
    version_dir = pinned_version_dirs(source_of(root, "rand"))["toy_random"]
    with CacheReader(version_dir) as reader:
        ids, inputs = first_examples(reader, "validation", 3, 8)
    vocabulary = registry.get_task("toy_random").output_features["targets"].vocabulary
    expected = [vocabulary.decode(row) for row in greedy_decode(params, inputs, CONFIG, 10).tolist()]
    assert rows == [{"id": i, "prediction": p} for i, p in zip(ids, expected, strict=True)]


@pytest.mark.timeout(900)  # longer than the default: minutes on a loaded machine
@pytest.mark.slow
def test_trainer_writes_predictions_that_taskdata_eval_scores_as_partial(
    root, tmp_path, tmp_path_factory, capsys
):
    predictions = tmp_path / "preds.jsonl"
    args = [
        "--cache-root", root, "--run", "rand", "--steps", "3", "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--inputs-length", "8", "--targets-length", "176", *MODEL_ARGS,
        "--compilation-cache", shared_compilation_cache(tmp_path_factory),
        "--module", "tests.cache_tasks", "--predictions-out", str(predictions), "--predict-examples", "12",
    ]  # fmt: skip
    with trainers([Trainer(args, stderr_path=str(tmp_path / "err"))]) as (trainer,):
        trainer.check(180)
    assert "wrote 12 predictions of split 'validation'" in (tmp_path / "err").read_text()
    lines = [json.loads(line) for line in predictions.read_text().splitlines()]
    with CacheReader(pinned_version_dirs(source_of(root, "rand"))["toy_random"]) as reader:
        assert [line["id"] for line in lines] == first_examples(reader, "validation", 12, 8)[0]
    assert all(set(line) == {"id", "prediction"} and isinstance(line["prediction"], str) for line in lines)

    eval_args = [
        "eval",
        "toy_random",
        "--module",
        "tests.cache_tasks",
        "--cache",
        root,
        "--predictions",
        str(predictions),
    ]
    assert taskdata_main(eval_args) != 0, "without --allow-partial the unpredicted examples are an error"
    assert "75 of 87 examples" in capsys.readouterr().err
    report = tmp_path / "report.json"
    assert taskdata_main([*eval_args, "--allow-partial", "--output", str(report)]) == 0
    [task_report] = json.loads(report.read_text())["tasks"]
    assert (task_report["num_scored"], task_report["num_missing"]) == (12, VALIDATION_RECORDS - 12)
    assert "sequence_accuracy" in task_report["metrics"]
