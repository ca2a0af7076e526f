"""The MaxText pipeline's rows, eval passes, resume records and refusals, without MaxText (numpy and orbax only).

``tests/test_maxtext_train.py`` runs the same pipeline inside MaxText's own train loop.
"""

from __future__ import annotations

import math
import shutil
import types

import numpy as np
import pytest

from taskdata.index import BatchSchedule, Stage
from taskdata.runs import RunStore
from tests import maxtext_helpers as data
from trainer_client.iterator import ResumeError
from trainer_client.maxtext import resume
from trainer_client.maxtext.batch_log import read_batch_hashes
from trainer_client.maxtext.layout import BatchLayout
from trainer_client.maxtext.pipeline import (
    MaxTextConfigError,
    RunRows,
    TaskdataInput,
    _check_config,
    _eval_steps,
    eval_iterator,
)

pytestmark = pytest.mark.slow

STEPS = 18  # the ramp (steps 0-5), full batches, the skipped steps 14 and 15, and two after them
CONFIG = types.SimpleNamespace(max_target_length=data.ROW_LENGTH, vocab_size=data.VOCAB_SIZE)


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory) -> str:
    return data.data_root(tmp_path_factory)


def elements(rows: RunRows) -> list[dict[str, np.ndarray]]:
    try:
        return list(rows)
    finally:
        rows.close()


def read(cache_root: str, positions: list[int], layout: BatchLayout, log: str | None = None, *, run: str = data.TRAIN_RUN,
         kind: str = "train", start: int = 0, stop: int | None = STEPS, config=CONFIG) -> RunRows:
    settings = TaskdataInput(run=data.TRAIN_RUN, cache_root=cache_root, eval_run=data.EVAL_RUN, batch_log=log)
    return RunRows(settings, run, layout, positions, config, start=start, stop=stop, kind=kind,
                   what="global_batch_size_to_train_on")


def test_processes_read_disjoint_rows_that_make_the_plans_batches_at_maxtexts_fixed_shape(cache_root, tmp_path):
    layout = BatchLayout(rows=8, trained_rows=8, devices=4)
    one = elements(read(cache_root, [0, 1, 2, 3], layout, str(tmp_path / "one")))
    halves = [elements(read(cache_root, positions, layout, str(tmp_path / "two" / str(i))))
              for i, positions in enumerate([[0, 1], [2, 3]])]
    expected = data.plan_batches(cache_root, data.TRAIN_RUN, range(STEPS))
    assert len(one) == STEPS
    for step, element in enumerate(one):
        # Two processes' elements, one after the other, are the one process's: devices 0-1, then 2-3.
        for name, array in element.items():
            assert array.shape == (8, data.ROW_LENGTH) and array.dtype == np.int32
            assert np.array_equal(np.concatenate([halves[0][step][name], halves[1][step][name]]), array)
        # Every step weighs exactly its plan rows; zero rows (a ramp's, a skipped step's) weigh nothing.
        assert np.count_nonzero(element["targets_segmentation"]) == expected[step][1]
    assert [np.count_nonzero(e["inputs_segmentation"].any(axis=1)) for e in one] == (
        [4] * 6 + [8] * 8 + [0, 0] + [8, 8])
    # The rows logged by the two processes hash to the plan's batches, as one process's do.
    logged = {step: h for (kind, _, step), h in read_batch_hashes(str(tmp_path / "one")).items() if kind == "train"}
    assert logged == {step: expected[step][0] for step in range(STEPS)}
    merged = tmp_path / "merged"
    merged.mkdir()
    for i in range(2):
        shutil.copy(tmp_path / "two" / str(i) / "process_0.jsonl", merged / f"process_{i}.jsonl")
    assert {k: v for k, v in read_batch_hashes(str(merged)).items()} == read_batch_hashes(str(tmp_path / "one"))


def test_the_cache_is_every_documents_tokens_but_each_shards_counted_last_partial_row(cache_root):
    from taskdata.cache.format import current_version, load_manifest, task_dir
    from taskdata.define.registry import Registry

    version = current_version(task_dir(cache_root, data.TASK))
    manifest = load_manifest(version)
    registry = Registry()
    registry.load_module(data.MODULE)
    task = registry.get_task(data.TASK)
    vocabulary = task.output_features["targets"].vocabulary
    source = task.source
    for split in ("train", "validation"):
        shards = source.list_shards(split)
        tokens = sum(len(ids) + 1 for shard in shards for ids in
                     vocabulary.encode_batch([r["text"] for r in source.read_shard(split, shard)]) if len(ids))
        counters = manifest.splits[split].counters
        dropped = counters["concatenate_and_chunk/final_partial_row_tokens_dropped"]
        assert manifest.splits[split].num_records * data.ROW_LENGTH + dropped == tokens
        assert 0 < dropped < len(shards) * data.ROW_LENGTH
        assert counters["concatenate_and_chunk/final_partial_rows_dropped"] == len(shards)


def test_read_worker_processes_give_the_same_elements(cache_root):
    layout = BatchLayout(rows=8, trained_rows=8, devices=4)
    plain = elements(read(cache_root, [0, 1], layout, stop=10))
    settings = TaskdataInput(run=data.TRAIN_RUN, cache_root=cache_root, workers=1)
    pooled = elements(RunRows(settings, data.TRAIN_RUN, layout, [0, 1], CONFIG, start=0, stop=10, kind="train",
                              what="global_batch_size_to_train_on"))
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(plain, pooled, strict=True) for k in a)


def test_per_device_batch_below_one_puts_the_plans_rows_on_maxtexts_first_devices(cache_root):
    # per_device_batch_size=0.5 on 16 devices: MaxText loads 16 rows, one a device, and trains on the first 8.
    layout = BatchLayout(rows=16, trained_rows=8, devices=16)
    first = elements(read(cache_root, list(range(8)), layout, start=6, stop=10))
    reference = elements(read(cache_root, [0, 1, 2, 3], BatchLayout(rows=8, trained_rows=8, devices=4), start=6,
                              stop=10))
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(first, reference, strict=True) for k in a)
    with pytest.raises(MaxTextConfigError, match=r"holds none of MaxText's 8 trained rows"):
        read(cache_root, list(range(8, 16)), layout)
    # The ramp's 4 rows cannot go one a device on 8 devices: refused, with the plan's fix.
    with pytest.raises(ValueError, match=r"Step 0 of the plan has a global batch of 4 rows.*multiple-of=8"):
        next(iter(read(cache_root, list(range(8)), layout)))


def test_the_eval_iterator_reads_one_pass_again_every_time_with_the_rows_past_it_zeroed(cache_root, tmp_path):
    layout = BatchLayout(rows=8, trained_rows=8, devices=4)
    rows = read(cache_root, [0, 1, 2, 3], layout, str(tmp_path), run=data.EVAL_RUN, kind="eval", stop=None)
    plan = rows.plan
    records = plan.caches[data.TASK].num_records
    rows.stop = _eval_steps(plan, eval_steps=-1)
    assert rows.stop == math.ceil(records / data.BATCH)
    passes = [list(rows), list(rows)]
    rows.close()
    assert len(passes[0]) == rows.stop
    for a, b in zip(*passes, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    left = records - (rows.stop - 1) * data.BATCH  # rows of the last step inside the pass
    assert 0 < left < data.BATCH
    # Devices hold rows 2p, 2p + 1 of the step: those past the pass are zero rows.
    last_rows = passes[0][-1]["inputs_segmentation"].any(axis=1)
    assert np.count_nonzero(last_rows) == left
    hashes = read_batch_hashes(str(tmp_path))
    assert hashes[("eval", 0, 0)] == hashes[("eval", 1, 0)] and len(hashes) == 2 * rows.stop
    assert _eval_steps(plan, eval_steps=3) == 3


def test_resume_records_accept_a_later_stage_and_refuse_other_batches(cache_root, tmp_path):
    store = RunStore(cache_root)
    plan = store.get(data.TRAIN_RUN).plan
    checkpoints = str(tmp_path / "checkpoints")
    resume.check_and_record(checkpoints, plan, 0, write=True)
    resume.check_and_record(checkpoints, plan, 9, write=False)  # the same run resumes
    later = plan.with_stage(Stage(start=20, schedule=BatchSchedule.constant(4)), current_step=10)
    resume.check_and_record(checkpoints, later, 9, write=True)  # a stage after the step changes nothing before it
    resume.check_and_record(checkpoints, later, 15, write=False)  # steps 9.. were trained on `later`'s record
    other = store.get(data.EVAL_RUN).plan
    with pytest.raises(ResumeError, match=r"steps 0\.\.8 were trained on run 'lm' \(recorded in .*start-000000000"
                                          r"\.json\).*Resume with the run the checkpoint was made with"):
        resume.check_and_record(checkpoints, other, 9, write=False)
    with pytest.raises(ResumeError, match=r"no taskdata run record there says which run trained the steps before it"):
        resume.check_and_record(str(tmp_path / "elsewhere"), plan, 5, write=False)


def test_the_start_step_is_the_one_after_maxtexts_latest_checkpoint(tmp_path):
    import orbax.checkpoint as ocp

    config = types.SimpleNamespace(enable_checkpointing=True, checkpoint_dir=str(tmp_path / "ckpt"),
                                   load_full_state_path="")
    assert resume.start_step(config) == 0
    with ocp.CheckpointManager(config.checkpoint_dir) as manager:
        for step in (0, 8):
            manager.save(step, args=ocp.args.Composite(items=ocp.args.StandardSave({"w": np.arange(3)})))
        manager.wait_until_finished()
    (tmp_path / "ckpt" / "taskdata").mkdir()  # the run records' folder is not a step
    assert resume.latest_checkpoint(config.checkpoint_dir) == 8
    assert resume.start_step(config) == 9
    assert resume.start_step(types.SimpleNamespace(**{**vars(config), "enable_checkpointing": False})) == 0
    fresh = types.SimpleNamespace(enable_checkpointing=True, checkpoint_dir=str(tmp_path / "none"),
                                  load_full_state_path="gs://b/state")
    with pytest.raises(ResumeError, match=r"load_full_state_path='gs://b/state' restores a train state at that state's "
                                          r"step.*load_parameters_path"):
        resume.start_step(fresh)
    with pytest.raises(ResumeError, match=r"enable_emergency_checkpoint=true restores through other checkpoint"):
        resume.start_step(types.SimpleNamespace(enable_emergency_checkpoint=True))


def test_what_the_pipeline_cannot_honour_is_refused_by_name(cache_root):
    layout = BatchLayout(rows=16, trained_rows=16, devices=4)
    with pytest.raises(MaxTextConfigError, match=r"Run 'lm' has global batches of up to 8 rows, but MaxText's "
                                                 r"global_batch_size_to_train_on is 16.*per_device_batch_size to 2"):
        read(cache_root, [0, 1, 2, 3], layout)
    small_vocab = types.SimpleNamespace(max_target_length=data.ROW_LENGTH, vocab_size=100)
    rows = read(cache_root, [0, 1, 2, 3], BatchLayout(8, 8, 4), config=small_vocab)
    with pytest.raises(MaxTextConfigError, match=r"Step 0 of run 'lm' holds token id \d+, but MaxText's vocab_size is "
                                                 r"100: set vocab_size to at least the tokenizer's size"):
        next(iter(rows))
    assert isinstance(rows.failure, MaxTextConfigError)  # kept for the launcher (MaxText stops "gracefully")
    rows.close()
    settings = TaskdataInput(run=data.TRAIN_RUN, cache_root=cache_root, feature="inputs")
    rows = RunRows(settings, data.TRAIN_RUN, BatchLayout(8, 8, 4), [0, 1, 2, 3], CONFIG, start=0, stop=2,
                   kind="train", what="global_batch_size_to_train_on")
    with pytest.raises(Exception, match=r"inputs"):
        next(iter(rows))
    rows.close()
    base = dict(expansion_factor_real_data=-1, enable_rampup_batch_size=False)
    with pytest.raises(MaxTextConfigError, match=r"expansion_factor_real_data=2 .*Set expansion_factor_real_data=-1"):
        _check_config(types.SimpleNamespace(**{**base, "expansion_factor_real_data": 2}))
    with pytest.raises(MaxTextConfigError, match=r"enable_rampup_batch_size=true .*taskdata plan --batch-size START "
                                                 r"--ramp-to END"):
        _check_config(types.SimpleNamespace(**{**base, "enable_rampup_batch_size": True}))
    with pytest.raises(ValueError, match=r"give exactly one of cache_root and server"):
        TaskdataInput(run="lm")
    evals = types.SimpleNamespace(**base, generate_padding_batch_eval=True, eval_steps=-1, eval_interval=10)
    with pytest.raises(MaxTextConfigError, match=r"generate_padding_batch_eval=true with eval_steps=-1 never ends an "
                                                 r"eval.*Set generate_padding_batch_eval=false"):
        eval_iterator(TaskdataInput(run=data.TRAIN_RUN, cache_root=cache_root, eval_run=data.EVAL_RUN), evals, None, [0])
    with pytest.raises(MaxTextConfigError, match=r"eval_interval=10 makes MaxText evaluate, but no eval run was "
                                                 r"given.*--eval-run NAME, or set eval_interval=-1"):
        eval_iterator(TaskdataInput(run=data.TRAIN_RUN, cache_root=cache_root), evals, None, [0])
