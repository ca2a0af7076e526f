"""The torch datasets over a run: the map-style dataset by position (driven by megatron-core's own sampler
from ``consumed_samples``), the Stateful iterable dataset (its state moved between 2, 1 and 4 ranks), and torchdata's
``StatefulDataLoader`` around it."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import warnings

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from taskdata.index import SkipRange
from taskdata.runs import RunStore
from tests.client_helpers import GLOBAL_BATCH, LENGTHS, REPO, reference_hashes, shared_root
from trainer_client.assignments import HostSlice
from trainer_client.digest import batch_hash, row_digests
from trainer_client.iterator import DataIterator, DataState, ResumeError
from trainer_client.local_source import LocalAssignments
from trainer_client.pytorch import CacheRun, RunIterableDataset, RunMapDataset
from trainer_client.pytorch.megatron import gpt_sample, iterations_to_skip

pytestmark = pytest.mark.slow  # cache jobs (Beam), DataLoader worker processes


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


def global_batches(root, run, stop):
    with DataIterator(CacheRun(root, run)(), LENGTHS, host_slice=HostSlice(0, 1), stop_step=stop) as it:
        return [{name: array.copy() for name, array in b.features.items()} for b in it]


def stacked(items):
    return {name: np.stack([np.asarray(item[name]) for item in items]) for name in LENGTHS}


def features_equal(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


MEGATRON_CORE = os.environ.get("TASKDATA_MEGATRON_CORE", os.path.join(REPO, ".megatron-core"))


@pytest.fixture(scope="module")
def megatron_sampler():
    """megatron-core's ``MegatronPretrainingSampler`` (installed by deploy/megatron_core.sh), as Megatron's
    ``build_pretraining_data_loader`` builds it: ``(total_samples, consumed_samples, micro_batch_size,
    data_parallel_rank, data_parallel_size)``."""
    if not os.path.isdir(os.path.join(MEGATRON_CORE, "megatron", "training")):
        message = f"no megatron-core at {MEGATRON_CORE}: install it with 'bash deploy/megatron_core.sh'"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    sys.path.insert(0, MEGATRON_CORE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed": not used here
        from megatron.training.datasets.data_samplers import MegatronPretrainingSampler
    return MegatronPretrainingSampler


def test_item_i_is_the_example_at_position_i_of_the_run(root):
    expected = global_batches(root, "mix1", 6)
    dataset = RunMapDataset(CacheRun(root, "mix1"), LENGTHS, num_samples=6 * GLOBAL_BATCH)
    assert len(dataset) == 6 * GLOBAL_BATCH
    for step, batch in enumerate(expected):
        positions = list(range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH))
        assert features_equal(stacked(dataset.__getitems__(positions)), batch)
        one = dataset[positions[5]]
        assert isinstance(one["targets"], torch.Tensor) and one["targets"].dtype == torch.int32
        assert np.array_equal(one["targets"].numpy(), batch["targets"][5])
    # Any order, across steps, unaligned: each item is still its position's example.
    scattered = [37, 3, 4, 5, 6, 7, 8, 9, 90, 15, 16, 17]
    every = {name: np.concatenate([b[name] for b in expected]) for name in LENGTHS}
    assert features_equal(stacked(dataset.__getitems__(scattered)), {k: v[scattered] for k, v in every.items()})
    as_numpy = RunMapDataset(CacheRun(root, "mix1"), LENGTHS, num_samples=16, tensors=False)[3]
    assert isinstance(as_numpy["targets"], np.ndarray) and np.array_equal(as_numpy["targets"], every["targets"][3])


@pytest.mark.parametrize(("consumed_step", "micro", "size"), [(0, 4, 2), (3, 2, 4)])
def test_megatrons_sampler_reads_the_runs_global_batches_from_consumed_samples(
    root, megatron_sampler, consumed_step, micro, size
):
    """Every rank's micro batches of a step together are the run's global batch of that step; resuming is
    a consumed-samples counter, on any number of ranks. Read through DataLoader with 2 worker processes."""
    stop = 8
    expected = global_batches(root, "mix1", stop)
    dataset = RunMapDataset(CacheRun(root, "mix1"), LENGTHS, num_samples=stop * GLOBAL_BATCH)
    by_position = {}
    for rank in range(size):
        sampler = megatron_sampler(len(dataset), consumed_step * GLOBAL_BATCH, micro, rank, size)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=2)
        for indices, batch in zip(sampler, loader, strict=True):
            for row, position in enumerate(indices):
                by_position[position] = {name: batch[name][row].numpy() for name in LENGTHS}
    for step in range(consumed_step, stop):
        rows = [by_position[p] for p in range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)]
        assert features_equal(stacked(rows), expected[step])


def test_items_in_megatrons_gpt_layout_through_a_dataloader(root, megatron_sampler):
    dataset = RunMapDataset(CacheRun(root, "mix1"), LENGTHS, num_samples=64, transform=gpt_sample)
    plain = RunMapDataset(CacheRun(root, "mix1"), LENGTHS, num_samples=64)
    sampler = list(megatron_sampler(len(dataset), 16, 4, 1, 2))
    batch = next(iter(torch.utils.data.DataLoader(dataset, batch_sampler=sampler)))
    assert sorted(batch) == ["labels", "loss_mask", "position_ids", "tokens"]
    assert batch["tokens"].dtype == batch["labels"].dtype == torch.int64 and batch["loss_mask"].dtype == torch.float32
    rows = stacked(plain.__getitems__(sampler[0]))["targets"]
    assert np.array_equal(batch["tokens"].numpy(), rows)
    trained = batch["loss_mask"].numpy() == 1
    assert np.array_equal(batch["labels"].numpy()[:, :-1][trained[:, :-1]], rows[:, 1:][trained[:, :-1]])
    assert (batch["labels"].numpy()[~trained] == 0).all() and (rows[:, 1:][trained[:, :-1]] != 0).all()


def test_a_skipped_step_keeps_its_examples_and_megatron_is_told_to_skip_its_iteration(root):
    stored = RunStore(root).get("mix1")
    source = CacheRun(root, "mix1")()
    plan, dirs = source.run_info().plan, source.version_dirs
    source.close()
    skipping = dataclasses.replace(plan, skip=(SkipRange(2, 4),))
    dataset = RunMapDataset(lambda: LocalAssignments(skipping, dirs), LENGTHS, num_samples=6 * GLOBAL_BATCH)
    plain = RunMapDataset(CacheRun(root, stored.name), LENGTHS, num_samples=6 * GLOBAL_BATCH)
    positions = list(range(2 * GLOBAL_BATCH, 4 * GLOBAL_BATCH))
    assert features_equal(stacked(dataset.__getitems__(positions)), stacked(plain.__getitems__(positions)))
    assert iterations_to_skip(dataset, GLOBAL_BATCH) == [3, 4]
    assert iterations_to_skip(plain, GLOBAL_BATCH) == []
    with pytest.raises(ValueError, match=r"Step 2 of run 'mix1' is skipped, but it covers positions range\(32, 48\)"):
        iterations_to_skip(dataset, 8)


def test_bad_indices_and_a_server_source_are_refused_by_name(root):
    dataset = RunMapDataset(CacheRun(root, "mix1"), LENGTHS, num_samples=32)
    with pytest.raises(IndexError, match=r"Index 32 is not a position of this dataset: it holds positions 0..31"):
        dataset[32]
    with pytest.raises(IndexError, match="Index -1"):
        dataset[-1]
    with pytest.raises(ValueError, match="num_samples must be a positive integer but got 0"):
        RunMapDataset(CacheRun(root, "mix1"), LENGTHS, num_samples=0)
    with pytest.raises(ValueError, match=r"No run named 'mix9' is stored under .* \(runs: \['mix1', 'mix2'"):
        CacheRun(root, "mix9")()


def iterate(dataset, count):
    iterator = iter(dataset)
    return [next(iterator) for _ in range(count)]


def hashes_of(per_rank):
    """Global batch hashes of elements read on several ranks (rank order is row order)."""
    out = {}
    for elements in zip(*per_rank, strict=True):
        steps = {int(e["step"]) for e in elements}
        assert len(steps) == 1
        digests = np.concatenate([row_digests({k: e[k].numpy() for k in LENGTHS}) for e in elements])
        out[steps.pop()] = batch_hash(digests)
    return out


def test_the_iterable_datasets_elements_are_the_host_batches_of_consecutive_steps(root):
    with DataIterator(CacheRun(root, "mix4")(), LENGTHS, host_slice=HostSlice(1, 4), stop_step=5) as it:
        expected = [(b.step, dict(b.features)) for b in it]
    dataset = RunIterableDataset(CacheRun(root, "mix4"), LENGTHS, host_slice=HostSlice(1, 4), stop_step=5)
    elements = list(dataset)
    assert [int(e["step"]) for e in elements] == [s for s, _ in expected]
    for element, (_, features) in zip(elements, expected, strict=True):
        assert features_equal({k: element[k].numpy() for k in LENGTHS}, features)
    assert dataset.state_dict()["step"] == 5


def test_a_state_saved_on_two_ranks_resumes_on_one_and_on_four_with_the_uninterrupted_global_batches(root):
    """From step 34 to 46: the toy tasks' second epochs begin there, whose order the seed decides."""
    reference = reference_hashes(root, "mix4", range(34, 46))
    assert reference != reference_hashes(root, "other_seed", range(34, 46))  # another seed: other batches
    run = CacheRun(root, "mix4")
    ranks = [RunIterableDataset(run, LENGTHS, host_slice=HostSlice(r, 2), start=34) for r in range(2)]
    before = hashes_of([iterate(d, 6) for d in ranks])
    states = [d.state_dict() for d in ranks]
    assert states[0] == states[1] and states[0]["step"] == 40  # one global state: any rank's copy will do
    for d in ranks:
        d.close()
    after = {}
    for count in (1, 4):
        resumed = [RunIterableDataset(run, LENGTHS, host_slice=HostSlice(r, count)) for r in range(count)]
        for d in resumed:
            d.load_state_dict(states[0])
        after[count] = hashes_of([iterate(d, 6) for d in resumed])
        for d in resumed:
            d.close()
    assert before == {s: reference[s] for s in range(34, 40)}
    assert after[1] == after[4] == {s: reference[s] for s in range(40, 46)}


def test_another_runs_state_is_refused_and_a_running_iterator_moves_to_a_loaded_state(root):
    other = RunIterableDataset(CacheRun(root, "other_seed"), LENGTHS, host_slice=HostSlice(0, 4))
    dataset = RunIterableDataset(CacheRun(root, "mix4"), LENGTHS, host_slice=HostSlice(0, 4))
    with pytest.raises(ResumeError, match="belongs to a run with fingerprint"):
        dataset.load_state_dict(other.state_dict())
    with pytest.raises(ResumeError, match="belongs to a run with fingerprint"):
        RunIterableDataset(CacheRun(root, "mix4"), LENGTHS, start=DataState.from_dict(other.state_dict()))
    iterator = iter(dataset)
    assert int(next(iterator)["step"]) == 0
    dataset.load_state_dict(DataState(9, dataset.info.plan.fingerprint_before(9)).to_dict())
    assert int(next(iterator)["step"]) == 9
    assert int(next(iter(dataset))["step"]) == 10  # a new iterator goes on from where the dataset stands
    dataset.close()


def test_statefuldataloader_saves_and_restores_the_data_state_without_fast_forwarding(root, caplog):
    reference = reference_hashes(root, "mix4", range(10))
    run = CacheRun(root, "mix4")
    loader = StatefulDataLoader(RunIterableDataset(run, LENGTHS, host_slice=HostSlice(0, 1)), batch_size=None)
    first = iterate(loader, 4)
    state = loader.state_dict()
    loader.dataset.close()
    resumed = StatefulDataLoader(RunIterableDataset(run, LENGTHS, host_slice=HostSlice(0, 1)), batch_size=None)
    with caplog.at_level(logging.WARNING):
        resumed.load_state_dict(state)
        rest = iterate(resumed, 6)
    assert "fast-forward" not in caplog.text
    assert hashes_of([first + rest]) == reference
    assert resumed.dataset.state_dict()["step"] == 10
    resumed.dataset.close()


def test_read_worker_processes_give_the_same_elements_and_state(root):
    """What the worker refusal points to: the dataset's own read processes (DataIterator's workers)."""
    run = CacheRun(root, "mix4")
    plain = RunIterableDataset(run, LENGTHS, host_slice=HostSlice(1, 2), stop_step=6)
    pooled = RunIterableDataset(run, LENGTHS, host_slice=HostSlice(1, 2), stop_step=6, workers=1)
    assert hashes_of([list(plain)]) == hashes_of([list(pooled)])
    assert pooled.state_dict() == plain.state_dict() and pooled.state_dict()["step"] == 6
    pooled.close()


def test_statefuldataloader_worker_processes_are_refused_by_name(root):
    dataset = RunIterableDataset(CacheRun(root, "mix4"), LENGTHS, host_slice=HostSlice(0, 1))
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=2)
    with pytest.raises(RuntimeError, match=r"DataLoader worker [01] of 2 \(num_workers=2\).*num_workers=0"):
        next(iter(loader))
