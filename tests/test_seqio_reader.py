"""seqio reads what taskdata writes: real seqio 0.0.20 reads cache versions that ``taskdata cache`` built,
in place, through its cached-task reader, its ``ShardInfo`` sharding and t5x's feature converters."""

from __future__ import annotations

import collections
import gzip
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from taskdata.cache.format import current_version, list_versions, load_manifest
from taskdata.cache.reader import CacheReader
from taskdata.seqio_bridge import SeqioBridgeError, add_cached_task, import_seqio, seqio_cache_location
from tests.cache_helpers import build, records_of

seqio = import_seqio()
import tensorflow as tf  # noqa: E402  (after seqio, which import_seqio prepares)

pytestmark = pytest.mark.slow  # cache jobs (Beam)

ROOT = Path(__file__).resolve().parent.parent
BYTES = {"inputs": seqio.Feature(seqio.ByteVocabulary(extra_ids=125)),
         "targets": seqio.Feature(seqio.ByteVocabulary(extra_ids=125))}


@pytest.fixture(autouse=True)
def _worker_import_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """toy_random (ByteVocabulary) cached by taskdata with seed 3 into 3 shards: (version folder, seqio task)."""
    result = build(tmp_path_factory.mktemp("seqio_read") / "caches", task="toy_random", seed=3, num_shards=3)
    return result.version_dir, seqio.get_mixture_or_task(add_cached_task(result.version_dir, BYTES))


def _key(example) -> tuple:
    return tuple(sorted((k, np.asarray(v).tobytes() + str(np.asarray(v).dtype).encode()) for k, v in example.items()))


def _stored(version_dir: str, split: str = "train") -> collections.Counter:
    """Every record of the shards, parsed with the info file's features as seqio declares them."""
    info = json.loads(Path(version_dir, f"info.{split}.json").read_text())
    spec = {k: (tf.io.FixedLenSequenceFeature(v["shape"][1:], tf.int64, allow_missing=True) if v["shape"][:1] == [None]
                else tf.io.FixedLenFeature(v["shape"], tf.string if v["dtype"] == "string" else tf.int64))
            for k, v in info["features"].items()}
    out = collections.Counter()
    for record in records_of(version_dir, split):
        parsed = tf.io.parse_single_example(record, spec)
        out[_key({k: v.numpy().astype(info["features"][k]["dtype"]) if v.dtype != tf.string else v.numpy()
                  for k, v in parsed.items()})] += 1
    return out


def _read(task, split="train", shard_info=None) -> collections.Counter:
    dataset = task.get_dataset(split=split, use_cached=True, shuffle=False, sequence_length=None,
                               shard_info=shard_info)
    return collections.Counter(_key(example) for example in dataset.as_numpy_iterator())


def test_info_declares_the_seqio_cache_format_and_taskdata_s_own_version(toy):
    import packaging.version

    import taskdata

    version_dir, _ = toy
    info = json.loads(Path(version_dir, "info.train.json").read_text())
    assert info["seqio_version"] == "0.0.20" == seqio.__version__
    assert packaging.version.Version(info["seqio_version"]) >= packaging.version.Version("0.0.0")
    assert info["taskdata_version"] == taskdata.__version__


def test_a_version_is_a_seqio_cached_task_named_task_colon_version(toy):
    version_dir, task = toy
    root, version = str(Path(version_dir).parent.parent), Path(version_dir).name
    assert seqio_cache_location(version_dir) == (root, f"toy_random:{version}")
    assert seqio_cache_location(str(Path(version_dir).parent)) == (root, f"toy_random:{version}")  # CURRENT
    assert task.name == f"toy_random:{version}" and task.cache_dir == version_dir


def test_seqio_reads_every_record_with_every_feature_and_its_stats_count(toy):
    version_dir, task = toy
    spec = task.get_dataset(split="train", use_cached=True, shuffle=False, sequence_length=None).element_spec
    # A valid seqio_version keeps int64 provenance int64 (an old or missing one makes seqio cast it to int32).
    assert spec["provenance/origin"].dtype == tf.int64 and spec["provenance/origin"].shape == [4]
    assert spec["targets"].dtype == tf.int32 and not {k for k in spec if k.startswith("provenance/")} - {
        "provenance/origin"}
    read = _read(task, shard_info=seqio.ShardInfo(0, 1))
    assert read == _stored(version_dir)
    assert sum(read.values()) == task.get_cached_stats("train")["examples"] == load_manifest(version_dir).split(
        "train").num_records
    assert _read(task, "validation") == _stored(version_dir, "validation")
    # Every example's stable id and source, as seqio reads them: the ids of exactly the cache's examples.
    origins = [e["provenance/origin"].tolist() for e in task.get_dataset(
        split="train", use_cached=True, shuffle=False).as_numpy_iterator()]
    reader = CacheReader(version_dir)
    from_cache = reader.decode([r for s, n in enumerate(reader.record_counts("train")) for r in reader.read("train", s, 0, n)],
                               {"provenance/origin": "int64"})["provenance/origin"].values.reshape(-1, 4).tolist()
    assert sorted(origins) == sorted(from_cache) and len({tuple(o[:2]) for o in origins}) == len(origins)


@pytest.mark.parametrize("num_shards", [2, 3, 4])  # files round robin (2, 3) and example-level (4)
def test_shard_info_partitions_the_records(toy, num_shards):
    version_dir, task = toy
    parts = [_read(task, shard_info=seqio.ShardInfo(i, num_shards)) for i in range(num_shards)]
    assert all(parts)
    assert sum(parts, collections.Counter()) == _stored(version_dir)
    assert sum(sum(p.values()) for p in parts) == load_manifest(version_dir).split("train").num_records


def test_enc_dec_feature_converter_batches(toy):
    _, task = toy
    lengths = {"inputs": 16, "targets": 256}  # long enough that nothing is trimmed
    stored = list(task.get_dataset(split="train", use_cached=True, shuffle=False).as_numpy_iterator())
    batches = list(seqio.get_dataset(task.name, task_feature_lengths=lengths, dataset_split="train", shuffle=False,
                                     use_cached=True, num_epochs=1, batch_size=4,
                                     feature_converter=seqio.EncDecFeatureConverter(pack=False)).as_numpy_iterator())
    assert {k: v.shape for k, v in batches[0].items()} == {
        "encoder_input_tokens": (4, 16), "decoder_target_tokens": (4, 256), "decoder_input_tokens": (4, 256),
        "decoder_loss_weights": (4, 256)}
    first = batches[0]
    for row, example in enumerate(stored[:4]):  # the same order: the converter keeps seqio's reading order
        n = len(example["targets"])
        np.testing.assert_array_equal(first["encoder_input_tokens"][row, : len(example["inputs"])], example["inputs"])
        np.testing.assert_array_equal(first["decoder_target_tokens"][row, :n], example["targets"])
        np.testing.assert_array_equal(first["decoder_input_tokens"][row, 1:n], example["targets"][:-1])
        assert first["decoder_loss_weights"][row].sum() == n
    packed = seqio.EncDecFeatureConverter(pack=True)(
        task.get_dataset(split="train", use_cached=True, shuffle=False), lengths)
    assert {k: v.shape.as_list() for k, v in packed.element_spec.items()} == {
        "encoder_input_tokens": [16], "encoder_segment_ids": [16], "encoder_positions": [16],
        "decoder_target_tokens": [256], "decoder_input_tokens": [256], "decoder_loss_weights": [256],
        "decoder_segment_ids": [256], "decoder_positions": [256]}
    rows = list(packed.as_numpy_iterator())
    assert len(rows) < len(stored)  # several examples per row
    assert sum(int((r["decoder_segment_ids"] > 0).sum()) for r in rows) == sum(len(e["targets"]) for e in stored)
    assert sum(int((r["encoder_segment_ids"] > 0).sum()) for r in rows) == sum(len(e["inputs"]) for e in stored)


# A c4_span_corruption-like cache: the built-in span corruption and prefix LM tasks on a small C4-format
# folder with the tiny SentencePiece model (T5's 100 sentinels), built by the command line.


@pytest.fixture(scope="module")
def c4_caches(tmp_path_factory, tiny_sp_model):
    from taskdata.cli import main
    from tests.pydoc_corpus import pydoc_lines

    folder = tmp_path_factory.mktemp("c4")
    lines = pydoc_lines(120_000)
    for split, files in (("train", 2), ("validation", 1)):
        for f in range(files):
            docs = [" ".join(lines[i : i + 12]) for i in range(f * 12 + (0 if split == "train" else 7), len(lines), 24 * files)]
            with gzip.open(folder / f"c4-{split}.{f:05d}-of-{files:05d}.json.gz", "wt") as out:
                for doc in docs[:40]:
                    out.write(json.dumps({"text": doc, "timestamp": "2019-04-25T00:00:00Z", "url": "https://x.org"}) + "\n")
    root = folder / "caches"
    for task in ("c4_span_corruption", "c4_prefix_lm"):
        assert main(["cache", "--task", task, "--c4-dir", str(folder), "--vocab", tiny_sp_model, "--output", str(root),
                     "--home", str(folder / "home"), "--num-shards", "2", "--quiet"]) == 0
    vocab = seqio.SentencePieceVocabulary(tiny_sp_model, extra_ids=100)
    features = {"inputs": seqio.Feature(vocab), "targets": seqio.Feature(vocab)}
    return {task: current_version(str(root / task)) for task in ("c4_span_corruption", "c4_prefix_lm")}, features


def test_seqio_reads_a_span_corruption_cache_into_t5x_batches(c4_caches):
    versions, features = c4_caches
    task = seqio.get_mixture_or_task(add_cached_task(versions["c4_span_corruption"], features))
    assert _read(task) == _stored(versions["c4_span_corruption"])
    example = next(task.get_dataset(split="train", use_cached=True, shuffle=False).as_numpy_iterator())
    # taskdata's sentinels are seqio's: <extra_id_0> is the top id, first in every span corruption target.
    assert features["targets"].vocabulary.decode(example["targets"]).startswith("<extra_id_0>")
    lengths = {"inputs": 512, "targets": 114}
    for pack in (False, True):
        batch = next(seqio.get_dataset(task.name, task_feature_lengths=lengths, dataset_split="train", shuffle=False,
                                       use_cached=True, num_epochs=1, batch_size=2,
                                       feature_converter=seqio.EncDecFeatureConverter(pack=pack)).as_numpy_iterator())
        assert batch["encoder_input_tokens"].shape == (2, 512) and batch["decoder_target_tokens"].shape == (2, 114)
        assert ("encoder_segment_ids" in batch) == pack


def test_seqio_reads_a_prefix_lm_cache_through_the_prefix_lm_converter(c4_caches):
    versions, features = c4_caches
    task = seqio.get_mixture_or_task(add_cached_task(versions["c4_prefix_lm"], features))
    lengths = {"inputs": 512, "targets": 512}
    stored = list(task.get_dataset(split="train", use_cached=True, shuffle=False).as_numpy_iterator())
    assert sum(1 for _ in stored) == task.get_cached_stats("train")["examples"]
    batch = next(seqio.get_dataset(task.name, task_feature_lengths=lengths, dataset_split="train", shuffle=False,
                                   use_cached=True, num_epochs=1, batch_size=2,
                                   feature_converter=seqio.PrefixLMFeatureConverter(pack=False)).as_numpy_iterator())
    assert {k: v.shape for k, v in batch.items()} == {k: (2, 1024) for k in (
        "decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights", "decoder_causal_attention")}
    first, inputs, targets = batch, stored[0]["inputs"], stored[0]["targets"]
    # The prefix (inputs) is attended to fully and not scored; the targets follow it and are scored.
    np.testing.assert_array_equal(first["decoder_target_tokens"][0, : len(inputs) + len(targets)],
                                  np.concatenate([inputs, targets]))
    assert first["decoder_causal_attention"][0, : len(inputs)].all()
    assert first["decoder_loss_weights"][0].sum() == len(targets)


# Version names: old ones (with '-') stay readable by taskdata; seqio needs the new ones.


def test_versions_named_before_stay_readable_and_seqio_says_how_to_rename_them(toy, tmp_path):
    version_dir, _ = toy
    new = Path(version_dir).name
    assert "-" not in new and new.startswith("v")
    old = new.replace("_", "-", 1)
    task_root = tmp_path / "toy_random"
    shutil.copytree(version_dir, task_root / old)
    (task_root / "CURRENT").write_text(old + "\n")
    assert list_versions(str(task_root)) == [old]
    assert current_version(str(task_root)) == str(task_root / old)
    assert CacheReader(str(task_root / old)).manifest.task == "toy_random"
    with pytest.raises(SeqioBridgeError, match=f"Rename the folder to '{new}'"):
        seqio_cache_location(str(task_root))


def test_a_task_name_with_a_colon_is_read_under_its_task_folder(toy, tmp_path):
    version_dir, _ = toy
    copy = tmp_path / "glue:toy" / Path(version_dir).name
    shutil.copytree(version_dir, copy)
    assert seqio_cache_location(str(copy)) == (str(tmp_path / "glue:toy"), copy.name)
    task = seqio.get_mixture_or_task(add_cached_task(str(copy), BYTES))
    assert _read(task) == _stored(version_dir)
