"""The Grain adapter: the iterator's batches through a Grain pipeline, checkpointed by Grain's own orbax handler
(as MaxText does) and by ours, resumed at the exact step; another run refused."""

from __future__ import annotations

import grain
import grain.python
import numpy as np
import orbax.checkpoint as ocp
import pytest

from taskdata.runs import RunStore
from tests.client_helpers import LENGTHS, features_equal, shared_root
from trainer_client.assignments import HostSlice
from trainer_client.grain_dataset import RunIterDataset
from trainer_client.iterator import DataIterator, DataState, ResumeError
from trainer_client.local_source import LocalAssignments
from trainer_client.orbax_state import DataCheckpointRestore, DataCheckpointSave

pytestmark = pytest.mark.slow  # cache jobs (Beam)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


def local(root, run="mix4"):
    return LocalAssignments.from_cache_root(RunStore(root).get(run), root)


def iterator_batches(root, host_slice, stop, run="mix4"):
    with DataIterator(local(root, run), LENGTHS, host_slice=host_slice, stop_step=stop) as it:
        return [(b.step, dict(b.features)) for b in it]


def decoder_inputs(element):
    """A MaxText-style transformation: the decoder's inputs are the targets shifted right."""
    shifted = np.pad(element["targets"][:, :-1], ((0, 0), (1, 0)))
    return {**element, "decoder_input_tokens": shifted}


def pipeline(root, run="mix4", **kwargs):
    dataset = RunIterDataset(local(root, run), LENGTHS, host_slice=HostSlice(1, 2), **kwargs).map(decoder_inputs)
    return grain.experimental.ThreadPrefetchIterDataset(dataset, prefetch_buffer_size=4)


def take(it, count):
    out = []
    for _ in range(count):
        element = next(it)
        out.append((int(element["step"]), {k: element[k] for k in LENGTHS}))
    return out


def same(a, b) -> bool:
    return [s for s, _ in a] == [s for s, _ in b] and all(
        features_equal(x, y) for (_, x), (_, y) in zip(a, b, strict=True)
    )


def test_a_grain_pipeline_yields_the_iterators_batches(root):
    expected = iterator_batches(root, HostSlice(1, 2), stop=10)
    it = iter(pipeline(root, stop_step=10))
    got = take(it, 10)
    assert same(got, expected)
    with pytest.raises(StopIteration):
        next(it)
    it.close()


def test_grains_own_orbax_checkpointing_resumes_at_the_saved_step(root, tmp_path):
    """MaxText's calls: Composite(items=StandardSave, iter=PyGrainCheckpointSave) into a CheckpointManager."""
    expected = iterator_batches(root, HostSlice(1, 2), stop=40)
    params = {"w": np.arange(4.0, dtype=np.float32)}
    manager = ocp.CheckpointManager(
        str(tmp_path), item_names=("items", "iter"), options=ocp.CheckpointManagerOptions(create=True)
    )
    it = iter(pipeline(root))
    assert same(take(it, 31), expected[:31])
    assert it.get_state()["step"] == 31, "the state is the consumer's, not what the prefetch thread read ahead"
    manager.save(
        31, args=ocp.args.Composite(items=ocp.args.StandardSave(params), iter=grain.python.PyGrainCheckpointSave(it))
    )
    manager.wait_until_finished()
    it.close()

    fresh = iter(pipeline(root))
    next(fresh)
    restored = manager.restore(
        31,
        args=ocp.args.Composite(
            items=ocp.args.StandardRestore(params), iter=grain.python.PyGrainCheckpointRestore(fresh)
        ),
    )
    manager.close()
    assert np.array_equal(restored["items"]["w"], params["w"])
    assert same(take(fresh, 3), expected[31:34])
    fresh.close()
    # Negative control: another seed's run gives other batches at those steps.
    other = iter(pipeline(root, "other_seed", start=31))
    assert not any(features_equal(a, b) for (_, a), (_, b) in zip(take(other, 3), expected[31:34], strict=True))
    other.close()


def test_our_orbax_item_takes_grain_iterators_and_refuses_another_run(root, tmp_path):
    expected = iterator_batches(root, HostSlice(1, 2), stop=12)
    with ocp.CheckpointManager(str(tmp_path)) as manager:
        it = iter(pipeline(root))
        take(it, 9)
        manager.save(9, args=ocp.args.Composite(data=DataCheckpointSave(it)))
        manager.wait_until_finished()
        it.close()
        fresh = iter(pipeline(root))
        manager.restore(9, args=ocp.args.Composite(data=DataCheckpointRestore(fresh)))
        assert same(take(fresh, 3), expected[9:12])
        fresh.close()
        other = iter(pipeline(root, "other_seed"))
        with pytest.raises(ResumeError, match=r"but run 'other_seed' has fingerprint"):
            manager.restore(9, args=ocp.args.Composite(data=DataCheckpointRestore(other)))
        other.close()


def test_a_dataset_is_iterated_once_and_refuses_another_runs_start(root):
    dataset = RunIterDataset(local(root), LENGTHS, host_slice=HostSlice(0, 2), stop_step=1)
    it = iter(dataset)
    with pytest.raises(RuntimeError, match="is iterated once"):
        iter(dataset)
    it.close()
    fingerprint = local(root).run_info().fingerprint
    with pytest.raises(ResumeError, match=r"but run 'other_seed' has fingerprint"):
        RunIterDataset(local(root, "other_seed"), LENGTHS, start=DataState(2, fingerprint), host_slice=HostSlice(0, 2))
