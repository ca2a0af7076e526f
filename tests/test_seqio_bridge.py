"""The seqio bridge: a registered seqio Task or Mixture cached by taskdata's job, compared with what seqio's
own cache job (``seqio_cache_tasks``) writes for the same task, data and seed."""

from __future__ import annotations

import collections
import functools
import json
import os
from pathlib import Path

import pytest

from taskdata.beam.job import CacheOptions, run_cache_job
from taskdata.cache.format import load_manifest
from taskdata.define.registry import Registry, UnknownNameError
from taskdata.example import decode_example, encode_example
from taskdata.seqio_bridge import (
    SeqioBridgeError,
    SeqioTask,
    add_seqio_mixture,
    add_seqio_task,
    bridge_task,
    import_seqio,
    seqio_shard_seed,
)
from tests.cache_helpers import files_of, records_of

seqio = import_seqio()
import tensorflow as tf  # noqa: E402  (after seqio, which import_seqio prepares)

import tests.seqio_tasks as toy  # noqa: E402  (registers the seqio tasks)

ROOT = Path(__file__).resolve().parent.parent
MODULE = "tests.seqio_tasks"


@pytest.fixture(autouse=True)
def _worker_import_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def bridge_build(output, task="seqio_toy_lines", seed=7, beam_args=(), **kwargs):
    """taskdata cache --seqio-task TASK --module tests.seqio_tasks --seed SEED, through the job's API."""
    registry = Registry()
    add_seqio_task(task, registry)
    options = CacheOptions(task=task, output=str(output), seed=seed, modules=(MODULE,), seqio_tasks=(task,),
                           beam_args=tuple(beam_args), num_shards=3, progress=False, **kwargs)
    return run_cache_job(options, registry, log=lambda message: None)


def seqio_build(output, task="seqio_toy_lines", base_seed=7) -> Path:
    """seqio_cache_tasks --tasks=TASK --base_seed=SEED --min_shards=0 on Beam's in-process runner."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from seqio.scripts import cache_tasks_main

    # run_pipeline reads these absl flags; --min_shards=0: one output shard per source shard.
    cache_tasks_main.FLAGS(["seqio_cache_tasks", "--min_shards=0", f"--base_seed={base_seed}",
                            f"--output_cache_dir={output}"])
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        cache_tasks_main.run_pipeline(pipeline, [task], str(output), modules_to_import=[MODULE],
                                      output_format="tfrecord")
    return Path(output) / task


def examples(records) -> collections.Counter:
    """The multiset of examples, without taskdata's provenance features, in one canonical encoding."""
    return collections.Counter(
        encode_example({k: v for k, v in decode_example(r).items() if not k.startswith("provenance/")})
        for r in records)


def seqio_records(task_dir: Path, split: str) -> list[bytes]:
    from taskdata.cache.tfrecord import iter_records

    out = []
    for path in sorted(task_dir.glob(f"{split}.tfrecord-*")):
        with open(path, "rb") as f:
            out.extend(iter_records(f, str(path)))
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """seqio's own cache of seqio_toy_lines with base seed 7, and taskdata's bridged cache with seed 7."""
    return (seqio_build(tmp_path_factory.mktemp("seqio_own")),
            bridge_build(tmp_path_factory.mktemp("bridged")))


def test_shard_seeds_are_seqio_cache_tasks_own():
    # Logged by seqio 0.0.20's cache job (beam_utils.PreprocessTask) for a task named s4_lines.
    assert [seqio_shard_seed("s4_lines", i, 0) for i in range(3)] == [
        46586550515899811, 27168635040932652, 66415365987442507]
    assert [seqio_shard_seed("s4_lines", i, 7) for i in range(3)] == [
        5180741085723182086, 5161323170248214927, 5200569901194724782]


@pytest.mark.slow
def test_bridged_cache_holds_exactly_the_examples_seqio_cache_tasks_writes(reference):
    seqio_dir, bridged = reference
    for split in ("train", "validation"):
        ours = examples(records_of(bridged.version_dir, split))
        assert sum(ours.values()) == load_manifest(bridged.version_dir).split(split).num_records > 0
        assert ours == examples(seqio_records(seqio_dir, split)), split
    theirs = json.loads((seqio_dir / "info.train.json").read_text())["features"]
    info = json.loads(Path(bridged.version_dir, "info.train.json").read_text())["features"]
    assert {k: v for k, v in info.items() if not k.startswith("provenance/")} == theirs
    assert json.loads(Path(bridged.version_dir, "stats.train.json").read_text())["examples"] == json.loads(
        (seqio_dir / "stats.train.json").read_text())["examples"]


@pytest.mark.slow
def test_bridged_cache_records_each_example_s_origin_and_the_task_seed_and_sources_once(reference):
    _, bridged = reference
    source_shard, ordinal, first, more = decode_example(records_of(bridged.version_dir)[0])["provenance/origin"].tolist()
    assert first == ordinal and more == 0  # a bridged task's "source documents" are its examples
    manifest = load_manifest(bridged.version_dir)
    assert manifest.task == "seqio_toy_lines" and manifest.split("train").source_files[source_shard].startswith("train-0000")
    assert set(manifest.fingerprints) == {"task", "source", "preprocessors", "vocabularies", "output_features"}
    assert manifest.seed == 7 and manifest.split("train").source_shards == 3


@pytest.mark.slow
def test_rerun_is_byte_identical(reference, tmp_path):
    _, bridged = reference
    again = bridge_build(tmp_path)
    assert files_of(again.version_dir) == files_of(bridged.version_dir)


@pytest.mark.timeout(900)  # longer than the default: minutes on a loaded machine
@pytest.mark.slow
@pytest.mark.parametrize("mode, workers", [("multi_processing", 2), ("multi_threading", 3)])
def test_other_runner_modes_and_worker_counts_are_byte_identical(reference, tmp_path, mode, workers):
    # Threads build their shards' datasets one at a time: seqio draws seeds from a module-wide counter.
    _, bridged = reference
    again = bridge_build(tmp_path, beam_args=[f"--direct_running_mode={mode}", f"--direct_num_workers={workers}"])
    assert files_of(again.version_dir) == files_of(bridged.version_dir)


@pytest.mark.slow
def test_another_seed_gives_another_order_and_seqio_s_other_random_draws(reference, tmp_path):
    _, bridged = reference
    other = bridge_build(tmp_path / "a", seed=8)
    # random_drop draws from seqio's seeds: another base seed drops other tokens, as seqio's job would.
    assert examples(records_of(other.version_dir)) != examples(records_of(bridged.version_dir))
    assert examples(records_of(other.version_dir)) == examples(seqio_records(seqio_build(tmp_path / "s", base_seed=8),
                                                                             "train"))
    # A task without random steps: the same examples in another order.
    one, two = (bridge_build(tmp_path / f"b{s}", task="seqio_toy_lines_b", seed=s) for s in (7, 8))
    assert examples(records_of(one.version_dir)) == examples(records_of(two.version_dir))
    assert records_of(one.version_dir) != records_of(two.version_dir)


# The fingerprint: what decides the bytes.


def _task(name, source=None, preprocessors=None, features=None, **kwargs):
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    return seqio.TaskRegistry.add(
        name, source=source or seqio.TextLineDataSource(toy.SPLITS),
        preprocessors=toy.PREPROCESSORS if preprocessors is None else preprocessors,
        output_features=features or toy.FEATURES, **kwargs)


def _rekey_lines(key_map):
    return functools.partial(seqio.preprocessors.rekey, key_map=key_map)


def test_fingerprint_covers_source_files_preprocessor_arguments_features_and_vocabulary(tmp_path):
    lines = [toy.to_inputs_targets, seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder()]
    base = bridge_task(_task("fp_case", preprocessors=lines)).component_fingerprints()
    assert bridge_task(_task("fp_case", preprocessors=lines)).component_fingerprints() == base
    (tmp_path / "train-00000-of-00001.txt").write_text("alpha beta\n")
    other_files = bridge_task(_task("fp_case", source=seqio.TextLineDataSource({"train": str(tmp_path / "*.txt")}),
                                    preprocessors=lines)).component_fingerprints()
    assert other_files["source"] != base["source"] and other_files["task"] != base["task"]
    bound = [_rekey_lines({"targets": "text"}), *lines]
    other_args = bridge_task(_task("fp_case", preprocessors=[_rekey_lines({"targets": "line"}), *lines[1:]]))
    assert bridge_task(_task("fp_case", preprocessors=bound)).component_fingerprints()["preprocessors"] != \
        other_args.component_fingerprints()["preprocessors"]
    eos = {k: seqio.Feature(toy.VOCAB, add_eos=True) for k in toy.FEATURES}
    assert bridge_task(_task("fp_case", preprocessors=lines, features=eos)).component_fingerprints()[
        "output_features"] != base["output_features"]
    sentinels = {k: seqio.Feature(seqio.ByteVocabulary(extra_ids=10), add_eos=False) for k in toy.FEATURES}
    assert bridge_task(_task("fp_case", preprocessors=lines, features=sentinels)).component_fingerprints()[
        "vocabularies"] != base["vocabularies"]
    seqio.TaskRegistry.remove("fp_case")


# A bridged task is a task like any other: plan with seqio's mixture rates, serve, read, evaluate.


@pytest.mark.slow
def test_cli_caches_a_seqio_mixture_then_plans_serves_and_reads_it(tmp_path):
    from fastapi.testclient import TestClient

    from server.main import create_app
    from server.settings import Settings
    from taskdata.cli import main
    from taskdata.runs import RunStore

    root = tmp_path / "caches"
    common = ["--module", MODULE, "--seqio-mixture", "seqio_toy_mix"]
    assert main(["cache", *common, "--output", str(root), "--num-shards", "2", "--seed", "3", "--quiet"]) == 0
    assert sorted(p.name for p in root.iterdir()) == ["seqio_toy_lines", "seqio_toy_lines_b"]
    assert main(["plan", *common, "--name", "bridged", "--mixture", "seqio_toy_mix", "--cache-root", str(root),
                 "--seed", "1", "--batch-size", "8", "--num-data-shards", "2"]) == 0
    plan = RunStore(str(root)).get("bridged").plan
    assert {k: float(v) for k, v in plan.rates.items()} == {"seqio_toy_lines": 0.25, "seqio_toy_lines_b": 0.75}  # 1:3
    with TestClient(create_app(Settings(cache_root=str(root)))) as client:
        response = client.get("/shards", params={"run": "bridged", "host": 0, "num_hosts": 2, "step": 5})
    assert response.status_code == 200, response.text

    from trainer_client.assignments import HostSlice
    from trainer_client.local_source import LocalAssignments
    from trainer_client.reading import BatchReader

    source = LocalAssignments.from_cache_root(RunStore(str(root)).get("bridged"), str(root))
    [step] = source.fetch(5, 1, HostSlice(0, 2))
    batch = BatchReader(source.run_info(), {"targets": 512}).read(step)
    assert batch.features["targets"].shape[0] == 4 and len(step.order) == 4


@pytest.mark.slow  # seconds
def test_eval_uses_the_seqio_task_s_postprocessor_and_metric_functions(tmp_path, capsys):
    from taskdata.cli import main
    from taskdata.evaluation import SourceTargets

    registry = Registry()
    task = add_seqio_task("seqio_toy_lines", registry)
    targets = list(SourceTargets(seed=7)(task, "validation"))
    lines = []
    for i, (example_id, text, _) in enumerate(targets):
        # Upper case is undone by the seqio postprocessor; every fourth prediction is wrong.
        lines.append({"id": example_id, "prediction": text.upper() if i % 4 else "wrong", "score": -float(i)})
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    report = tmp_path / "report.json"
    assert main(["eval", "seqio_toy_lines", "--module", MODULE, "--seqio-task", "seqio_toy_lines", "--seed", "7",
                 "--predictions", str(predictions), "--output", str(report)]) == 0
    metrics = json.loads(report.read_text())["tasks"][0]["metrics"]
    wrong = sum(1 for i in range(len(targets)) if i % 4 == 0)
    assert metrics["exact_match"] == pytest.approx(100.0 * (len(targets) - wrong) / len(targets))
    assert metrics["mean_score"] == pytest.approx(-sum(range(len(targets))) / len(targets))  # Scalar unwrapped


def test_a_metric_taskdata_cannot_compute_fails_evaluation_by_name(tmp_path):
    from taskdata.evaluation import EvaluationError

    def with_aux(targets, predictions, aux_values):
        return {}

    task = bridge_task(_task("aux_case", metric_fns=[toy.exact_match, with_aux]))
    with pytest.raises(EvaluationError, match=r"'aux_case': seqio metric .*with_aux takes aux_values"):
        task.metric_fns[-1](["a"], ["a"])
    seqio.TaskRegistry.remove("aux_case")


# Bad input: each error names the task and the fix.


def test_unknown_seqio_name_lists_close_matches():
    with pytest.raises(UnknownNameError, match=r"Unknown seqio task 'seqio_toy_line'\. Did you mean: seqio_toy_lines"):
        add_seqio_task("seqio_toy_line", Registry())
    with pytest.raises(SeqioBridgeError, match="'seqio_toy_mix' is a seqio mixture, not a task: use --seqio-mixture"):
        add_seqio_task("seqio_toy_mix", Registry())


def test_a_task_without_a_placeholder_says_what_would_be_cached():
    with pytest.raises(SeqioBridgeError, match=r"'no_placeholder' has no seqio.CacheDatasetPlaceholder.*caches the "
                                               r"output of TextLineDataSource -> tests.seqio_tasks.to_inputs_targets "
                                               r"-> seqio.preprocessors.tokenize"):
        bridge_task(_task("no_placeholder", preprocessors=[toy.to_inputs_targets, seqio.preprocessors.tokenize]))
    seqio.TaskRegistry.remove("no_placeholder")


def test_preprocessors_after_the_placeholder_are_refused_with_how_to_move_them():
    steps = [toy.to_inputs_targets, seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(), toy.random_drop]
    with pytest.raises(SeqioBridgeError, match=r"'after_placeholder' has preprocessors after its "
                                               r"CacheDatasetPlaceholder: \['tests.seqio_tasks.random_drop'\]\. "
                                               r"seqio runs those when it reads the cache, with a new random seed "
                                               r"every epoch.*Move them before seqio.CacheDatasetPlaceholder"):
        bridge_task(_task("after_placeholder", preprocessors=steps))
    seqio.TaskRegistry.remove("after_placeholder")


def needs_lengths(dataset, sequence_length, output_features):
    return dataset


def test_sequence_length_before_the_placeholder_says_how_to_bind_it():
    steps = [toy.to_inputs_targets, needs_lengths, seqio.CacheDatasetPlaceholder()]
    with pytest.raises(SeqioBridgeError, match=r"'needs_lengths' has a `sequence_length` argument.*bind fixed lengths"):
        bridge_task(_task("lengths_case", preprocessors=steps))
    seqio.TaskRegistry.remove("lengths_case")


def _two_shards(split, shuffle_files, seed=None):
    return tf.data.Dataset.from_tensor_slices(["a", "b"])


class TwoShardFunctionSource(seqio.FunctionDataSource):
    """Lists two shards but, as every FunctionDataSource, cannot read one of them alone."""

    def list_shards(self, split):
        return [f"{split}-0", f"{split}-1"]


def test_a_source_that_cannot_be_split_by_shard_is_refused_before_the_job_runs(tmp_path):
    task = bridge_task(_task("unsplittable", source=TwoShardFunctionSource(_two_shards, splits=["train"])))
    with pytest.raises(SeqioBridgeError, match=r"'unsplittable': its source TwoShardFunctionSource lists 2 shards for "
                                               r"split 'train' but cannot read one of them alone.*reads each source "
                                               r"shard on its own"):
        task.source.list_shards("train")
    seqio.TaskRegistry.remove("unsplittable")


def test_a_lambda_preprocessor_cannot_be_fingerprinted():
    steps = [seqio.map_over_dataset(lambda line: {"targets": line}), seqio.CacheDatasetPlaceholder()]
    task = bridge_task(_task("lambda_case", preprocessors=steps))
    with pytest.raises(SeqioBridgeError, match=r"'lambda_case': .*<lambda>.*Define it at module level"):
        task.fingerprint()
    seqio.TaskRegistry.remove("lambda_case")


def test_a_bridged_mixture_keeps_seqio_s_rates_and_is_idempotent():
    registry = Registry()
    mixture = add_seqio_mixture("seqio_toy_mix", registry)
    assert mixture.task_names == ("seqio_toy_lines", "seqio_toy_lines_b") and [float(r) for r in mixture.rates] == [1, 3]
    assert add_seqio_mixture("seqio_toy_mix", registry) is mixture
    assert isinstance(registry.get_task("seqio_toy_lines"), SeqioTask)
    clash = Registry()
    clash.add_task("seqio_toy_lines", registry.get_task("seqio_toy_lines_b").source, output_features=
                   registry.get_task("seqio_toy_lines_b").output_features)
    with pytest.raises(SeqioBridgeError, match="taskdata already has a task of that name"):
        add_seqio_task("seqio_toy_lines", clash)


def test_the_source_reads_seqio_s_raw_records_and_the_vocabulary_seqio_s_ids():
    task = add_seqio_task("seqio_toy_lines", Registry())
    shard = task.source.list_shards("train")[1]
    records = list(task.source.read_shard("train", shard))
    assert records == [{"text": line} for line in Path(shard).read_text().splitlines()]  # as TextLineSource's
    vocabulary = task.output_features["targets"].vocabulary
    ids = vocabulary.encode_batch(["ab", "c"])
    assert [i.tolist() for i in ids] == [toy.VOCAB.encode("ab"), toy.VOCAB.encode("c")]
    assert vocabulary.tf_encode(tf.constant(["ab", "c"])).to_list() == [i.tolist() for i in ids]
    assert vocabulary.decode([*ids[0], 1, 50]) == toy.VOCAB.decode([*ids[0], 1, 50]) == "ab"  # up to EOS


def _tf_example_lines(split, shuffle_files, seed=None):
    return tf.data.Dataset.from_tensor_slices({"text": ["a", "b"]})


def test_function_and_tf_example_sources_are_described_by_their_parameters(tmp_path):
    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"")
    pattern = {"train": str(tmp_path / "*.tfrecord")}
    steps = [seqio.CacheDatasetPlaceholder()]
    described = {}
    for key, source in {
        "string": seqio.TFExampleDataSource(pattern, {"text": tf.io.FixedLenFeature([], tf.string)}),
        "int": seqio.TFExampleDataSource(pattern, {"text": tf.io.FixedLenFeature([], tf.int64)}),
        "function": seqio.FunctionDataSource(_tf_example_lines, splits=["train"]),
    }.items():
        described[key] = bridge_task(_task("source_case", source=source, preprocessors=steps)).fingerprint_description()
    assert described["string"]["source"]["feature_description"]["text"]["fields"]["dtype"] == {"tf_dtype": "string"}
    # Files by name, size and content digest (CRC32C, as GCS keeps it; this file is empty).
    assert described["string"]["source"]["files"] == {"train": [["train-00000-of-00001.tfrecord", 0, "crc32c:AAAAAA=="]]}
    assert described["int"]["source"] != described["string"]["source"]
    assert described["function"]["source"]["dataset_fn"] == {"function": "tests.test_seqio_bridge._tf_example_lines"}
    seqio.TaskRegistry.remove("source_case")


@pytest.mark.slow
def test_a_fresh_command_loads_a_module_that_imports_seqio_plainly():
    import subprocess
    import sys

    # As a user runs it: no protobuf variable set; the module does 'import seqio' at its top.
    env = {k: v for k, v in os.environ.items() if k != "TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK"}
    out = subprocess.run([sys.executable, "-m", "taskdata", "list", "--module", MODULE, "--seqio-mixture",
                          "seqio_toy_mix"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "task     seqio_toy_lines  SeqioSource -> to_inputs_targets -> tokenize -> random_drop" in out.stdout
    assert "mixture  seqio_toy_mix  [seqio_toy_lines=1 (25%), seqio_toy_lines_b=3 (75%)]" in out.stdout


@pytest.mark.slow
def test_a_fresh_beam_worker_loads_a_module_that_imports_seqio_plainly(tmp_path):
    import subprocess
    import sys

    # A remote worker inherits no environment from the launcher: load_task prepares the import itself.
    # The task's fingerprint is checked after it is loaded, so a wrong expected one proves it loaded.
    code = (
        "from taskdata.beam.pipeline import CacheJobSpec, load_task\n"
        f"spec = CacheJobSpec(task='seqio_toy_lines', task_fingerprint='0' * 64, modules=({MODULE!r},), "
        f"config=({str(tmp_path)!r}, None, None), seed=0, version_dir='unused', tmp_dir='unused', "
        "num_shards=(('train', 1),), seqio_tasks=('seqio_toy_lines',))\n"
        "try:\n    load_task(spec)\nexcept RuntimeError as e:\n    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Task 'seqio_toy_lines' has fingerprint" in out.stdout and "on this worker but 000000000000" in out.stdout
