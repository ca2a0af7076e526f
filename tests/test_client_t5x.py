"""taskdata's t5x dataset function through t5x's own code (in this process): t5x's DatasetConfig and
prepare_train_iter, its legacy and Orbax checkpointers saving and restoring the iterator, clu's peeking
wrapper, where a host that t5x does not restore starts, and the checks against the run and its caches."""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

import jax
import numpy as np
import pytest
from clu.data.dataset_iterator import PeekableDatasetIterator

from taskdata.runs import RunStore
from tests.client_helpers import LENGTHS, features_equal, serve, shared_root
from tests.t5x_helpers import import_t5x
from trainer_client.assignments import HostSlice
from trainer_client.features import DecoderFeatures, EncDecFeatures
from trainer_client.iterator import DataIterator, DataState, ResumeError
from trainer_client.local_source import LocalAssignments
from trainer_client.t5x_dataset import get_dataset

pytestmark = pytest.mark.slow

t5x = import_t5x()
from t5x import adafactor, checkpoints, models, partitioning, utils  # noqa: E402
from t5x.examples.t5 import network  # noqa: E402

from taskdata.seqio_bridge import import_seqio  # noqa: E402

seqio = import_seqio()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


def config(**changes):
    values = dict(mixture_or_task_name="toy_mix", task_feature_lengths=dict(LENGTHS), split="train", batch_size=16,
                  shuffle=True, seed=42, pack=False)
    return utils.DatasetConfig(**{**values, **changes})


def expected(root, host_slice, start=0, count=6, run="mix4"):
    """The run's batches for ``host_slice`` as the client reads them, converted by our EncDec converter."""
    source = LocalAssignments.from_cache_root(RunStore(root).get(run), root)
    with DataIterator(source, LENGTHS, start=start, host_slice=host_slice, stop_step=start + count) as it:
        return [EncDecFeatures()(batch.features) for batch in it]


def take(iterator, count):
    return [{k: np.asarray(v) for k, v in next(iterator).items()} for _ in range(count)]


def all_equal(got, want):
    return len(got) == len(want) and all(features_equal(a, b) for a, b in zip(got, want, strict=True))


def test_elements_are_the_model_features_of_t5x_s_data_shard_locally_and_through_the_server(root):
    made = get_dataset(config(), 1, 4, seqio.EncDecFeatureConverter, run="mix4", cache_root=root)
    assert {k: (np.dtype(v.dtype), v.shape) for k, v in made.element_spec.items()} == {
        "encoder_input_tokens": (np.int32, (4, 8)), "decoder_target_tokens": (np.int32, (4, 176)),
        "decoder_input_tokens": (np.int32, (4, 176)), "decoder_loss_weights": (np.int32, (4, 176))}
    want = expected(root, HostSlice(1, 4))
    assert all_equal(take(made, 6), want)
    made.close()
    with serve(root) as url:
        served = get_dataset(config(), 1, 4, seqio.EncDecFeatureConverter, run="mix4", server=url)
        assert all_equal(take(served, 6), want)
        served.close()


def tiny_model():
    # t5x's CPU mesh puts every local device on its 'model' axis, and this process may hold 1, 4 or 8 of them
    # (whatever an earlier test module forced): every model-sharded size (heads, mlp, vocab) divides by 8.
    module = network.Transformer(config=network.T5Config(
        vocab_size=384, dtype="float32", emb_dim=8, num_heads=8, num_encoder_layers=1, num_decoder_layers=1,
        head_dim=2, mlp_dim=16, mlp_activations=("relu",), dropout_rate=0.0, logits_via_embedding=True))
    return models.EncoderDecoderModel(module, seqio.ByteVocabulary(), seqio.ByteVocabulary(), adafactor.Adafactor())


def test_t5x_prepares_it_and_both_of_its_checkpointers_save_and_restore_it(root, tmp_path):
    model = tiny_model()
    cfg = config()
    partitioner = partitioning.PjitPartitioner(num_partitions=1)
    layout = partitioner.get_data_layout(cfg.batch_size)
    get_dataset_fn = functools.partial(get_dataset, run="mix4", cache_root=root)  # as gin binds it
    save = utils.SaveCheckpointConfig(period=1, save_dataset=True)
    train_iter = utils.prepare_train_iter(
        get_dataset_fn(cfg, layout.shard_id, layout.num_shards, model.FEATURE_CONVERTER_CLS),
        checkpoint_cfg=utils.CheckpointConfig(save=save), partitioner=partitioner, data_layout=layout)
    initializer = utils.TrainStateInitializer(
        optimizer_def=model.optimizer_def, init_fn=model.get_initial_variables,
        input_shapes=jax.tree.map(lambda x: (cfg.batch_size, *x.shape[1:]), train_iter.element_spec),
        input_types=jax.tree.map(lambda x: x.dtype, train_iter.element_spec), partitioner=partitioner)
    state = initializer.from_scratch(jax.random.PRNGKey(0))
    want = expected(root, HostSlice(0, 1), count=12)
    assert all_equal(take(train_iter, 2), want[:2])  # jax.Arrays of the global batch, as t5x trains them

    legacy = checkpoints.Checkpointer(state, partitioner, str(tmp_path / "legacy"), dataset_iterator=train_iter)
    legacy.save(state)  # train step 0, data state: step 2
    assert all_equal(take(train_iter, 2), want[2:4])
    legacy.restore(path=str(tmp_path / "legacy" / "checkpoint_0"))
    assert all_equal(take(train_iter, 3), want[2:5])

    model_dir = str(tmp_path / "orbax")
    os.makedirs(model_dir)  # as train.py makes it (t5x takes a missing folder for a checkpoint's own)
    manager = utils.create_orbax_checkpoint_manager(
        save_cfg=save, restore_cfg=utils.RestoreCheckpointConfig(path=model_dir, restore_dataset=True),
        train_state=initializer.global_train_state_shape, partitioner=partitioner, ds_iter=train_iter,
        model_dir=model_dir)
    manager.save(state)  # data state: step 5
    manager.wait_until_finished()
    assert all_equal(take(train_iter, 2), want[5:7])
    manager.restore(step=0)
    assert all_equal(take(train_iter, 2), want[5:7])

    # A host that t5x does not restore (not the first of its replica set) starts where the restore puts
    # the others: the data state of model_dir's latest checkpoint.
    [saved] = [p for p in Path(model_dir).rglob("train_ds-*")]
    assert json.loads(saved.read_text())["step"] == 5
    unrestored = get_dataset_fn(cfg, 0, 1, model.FEATURE_CONVERTER_CLS, model_dir=model_dir)
    assert unrestored.state().step == 5
    assert all_equal(take(unrestored, 2), want[5:7])
    unrestored.close()

    # A checkpoint saved without the dataset (save_dataset=False): every host starts after as many batches
    # as the checkpoint's train step.
    no_data = str(tmp_path / "no_data")
    os.makedirs(no_data)
    at_step_3 = state.replace_step(jax.numpy.asarray(3, state.step.dtype))
    checkpoints.Checkpointer(at_step_3, partitioner, no_data).save(at_step_3)
    from_step = get_dataset_fn(cfg, 0, 1, model.FEATURE_CONVERTER_CLS, model_dir=no_data, start_step=9)
    assert from_step.state().step == 3
    assert all_equal(take(from_step, 1), want[3:4])
    from_step.close()
    empty = get_dataset_fn(cfg, 0, 1, model.FEATURE_CONVERTER_CLS, model_dir=str(tmp_path / "empty"), start_step=9)
    assert empty.state().step == 9  # no checkpoint yet: start_step
    empty.close()


def test_clu_s_peeking_wrapper_saves_and_restores_it_and_another_run_s_state_is_refused(root, tmp_path):
    wrapped = PeekableDatasetIterator(get_dataset(config(), 0, 2, seqio.EncDecFeatureConverter, run="mix4",
                                                  cache_root=root))
    want = expected(root, HostSlice(0, 2), count=8)
    first = wrapped.peek_async().result()
    assert features_equal({k: np.asarray(v) for k, v in first.items()}, want[0])
    assert all_equal(take(wrapped, 3), want[:3])
    wrapped.save(tmp_path / "train_ds-000-of-002")
    assert json.loads((tmp_path / "train_ds-000-of-002").read_text())["step"] == 3
    assert all_equal(take(wrapped, 2), want[3:5])
    wrapped.restore(tmp_path / "train_ds-000-of-002")
    assert all_equal(take(wrapped, 2), want[3:5])
    wrapped.reset()
    assert all_equal(take(wrapped, 1), want[:1])
    # Negative control: a run with another seed refuses that state, and its batches differ.
    other = get_dataset(config(), 0, 2, seqio.EncDecFeatureConverter, run="other_seed", cache_root=root)
    with pytest.raises(ResumeError, match="but run 'other_seed' has fingerprint"):
        other.restore(tmp_path / "train_ds-000-of-002")
    state = DataState(30, other.state().fingerprint)
    (tmp_path / "other").write_text(json.dumps(state.to_dict()))
    other.restore(tmp_path / "other")
    later = expected(root, HostSlice(0, 2), start=30, count=2)
    assert not any(features_equal(a, b) for a, b in zip(take(other, 2), later, strict=True))
    other.close()


def test_the_config_is_checked_against_the_run_and_its_caches(root, caplog):
    make = functools.partial(get_dataset, run="mix4", cache_root=root)
    enc_dec = seqio.EncDecFeatureConverter
    cases = [
        (dict(batch_size=32), enc_dec, "batch_size = 32 \\(the run's global batch size is 16\\)"),
        (dict(mixture_or_task_name="c4"), enc_dec, "mixture_or_task_name = 'c4' \\(the run trains on 'toy_mix'\\)"),
        (dict(split="validation"), enc_dec, "split = 'validation' \\(the run reads split 'train'\\)"),
        (dict(task_feature_lengths={"inputs": 8, "targets": 100}), enc_dec,
         "task_feature_lengths\\['targets'\\] = 100, but the cached longest example's 'targets' of task 'toy_det' "
         "take 176 tokens. Set it to at least 176"),
        (dict(pack=True), enc_dec, "from a cache of examples, but t5x asks for packed data: set DatasetConfig.pack"),
        (dict(), seqio.LMFeatureConverter, "LMFeatureConverter takes task features \\['targets'\\]"),
        (dict(), seqio.PassThroughFeatureConverter, "converts features as seqio's EncDecFeatureConverter"),
    ]
    for changes, converter, message in cases:
        with pytest.raises(ValueError, match=message):
            make(config(**changes), 0, 1, converter)
    with pytest.raises(ValueError, match="a taskdata run has no epoch limit"):
        make(config(), 0, 1, enc_dec, 2)
    with pytest.raises(ValueError, match="exactly one of them"):
        get_dataset(config(), 0, 1, enc_dec, run="mix4", cache_root=root, server="http://127.0.0.1:1")
    with caplog.at_level(logging.INFO, logger="trainer_client.t5x_dataset"):
        make(config(), 0, 1, enc_dec).close()
    assert "DatasetConfig.seed = 42 is ignored" in caplog.text
    assert "DatasetConfig.shuffle = True is ignored" in caplog.text


@pytest.fixture(scope="module")
def packed_root(tmp_path_factory):
    """A run of toy_lm: targets packed into rows of 128 (the LM layout), 8 rows a step."""
    from taskdata.cache.reader import CacheReader
    from taskdata.index import BatchSchedule, RunPlan, TaskCache
    from taskdata.runs import StoredRun
    from tests.cache_helpers import build

    root = str(tmp_path_factory.mktemp("packed_root"))
    reader = CacheReader(build(root, task="toy_lm", num_shards=2).version_dir)
    RunStore(root).create(StoredRun(RunPlan(
        name="lm", mixture="toy_lm", caches={"toy_lm": TaskCache(reader.manifest_sha256, reader.record_counts("train"))},
        rates=None, seed=3, schedule=BatchSchedule(start=8, end=8), num_data_shards=2)))
    return root


def test_a_decoder_only_model_reads_a_packed_run_as_seqio_s_packed_features(packed_root):
    cfg = config(mixture_or_task_name="toy_lm", task_feature_lengths={"targets": 128}, batch_size=8, pack=True)
    made = get_dataset(cfg, 1, 2, seqio.DecoderFeatureConverter, run="lm", cache_root=packed_root)
    assert {k: v.shape for k, v in made.element_spec.items()} == dict.fromkeys(
        ["decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights", "decoder_segment_ids",
         "decoder_positions"], (4, 128))
    source = LocalAssignments.from_cache_root(RunStore(packed_root).get("lm"), packed_root)
    with DataIterator(source, {"targets": 128}, host_slice=HostSlice(1, 2), stop_step=3) as it:
        want = [DecoderFeatures()(batch.features) for batch in it]
    got = take(made, 3)
    assert all_equal(got, want)
    assert max(g["decoder_segment_ids"].max() for g in got) > 1  # rows of several examples
    made.close()
    with pytest.raises(ValueError, match="from a cache of packed rows, but t5x asks for unpacked data: set "
                                         "DatasetConfig.pack = True"):
        get_dataset(config(mixture_or_task_name="toy_lm", task_feature_lengths={"targets": 128}, batch_size=8),
                    0, 1, seqio.DecoderFeatureConverter, run="lm", cache_root=packed_root)


def test_the_readme_s_gin_binds_what_get_dataset_and_dataset_config_take():
    import inspect
    import re

    from tests.client_helpers import REPO

    text = (Path(REPO) / "README.md").read_text()
    section = text[text.index("## Train with t5x\n"):]
    gin = section[section.index("```\n") + 4: section.index("```", section.index("```\n") + 4)]
    block = re.search(r"^t5x_dataset\.get_dataset:\n((?:  .*\n)+)", gin, re.M)
    assert block is not None
    bound = {line.split("=")[0].strip() for line in block.group(1).splitlines()}
    assert bound == {"run", "server", "token_file", "model_dir"}
    assert bound <= set(inspect.signature(get_dataset).parameters)
    assert "train_script.train.get_dataset_fn = @t5x_dataset.get_dataset" in gin
    fields = set(utils.DatasetConfig.__dataclass_fields__)
    assert {m.group(1) for m in re.finditer(r"^train/utils\.DatasetConfig\.(\w+)", gin, re.M)} <= fields
