"""The tf.data adapter: the iterator's batches for the same steps, exact resume by step, another run refused."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from taskdata.index import SkipRange
from taskdata.runs import CacheResolver, RunStore
from tests.client_helpers import LENGTHS, REPO, client_env, features_equal, serve, shared_root
from trainer_client.assignments import HostSlice
from trainer_client.iterator import DataIterator, DataState, ResumeError
from trainer_client.local_source import LocalAssignments
from trainer_client.server_source import ServerAssignments
from trainer_client.tfdata import tf_dataset

pytestmark = pytest.mark.slow  # cache jobs (Beam), subprocesses


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


def local(root, run="mix4"):
    return LocalAssignments.from_cache_root(RunStore(root).get(run), root)


def iterator_batches(root, host_slice, start=0, stop=12, run="mix4"):
    with DataIterator(local(root, run), LENGTHS, start=start, host_slice=host_slice, stop_step=stop) as it:
        return [(b.step, dict(b.features)) for b in it]


def elements(dataset, count=None):
    out = []
    for element in dataset.as_numpy_iterator():
        out.append((int(element.pop("step")), element))
        if count is not None and len(out) == count:
            break
    return out


def same(a, b) -> bool:
    return [s for s, _ in a] == [s for s, _ in b] and all(
        features_equal(x, y) for (_, x), (_, y) in zip(a, b, strict=True)
    )


def test_elements_are_the_iterators_batches_from_either_source(root):
    expected = iterator_batches(root, HostSlice(1, 4))
    got = elements(tf_dataset(local(root), LENGTHS, host_slice=HostSlice(1, 4), stop_step=12))
    assert same(got, expected)
    with serve(root) as url:
        served = tf_dataset(ServerAssignments(url, "mix4"), LENGTHS, host_slice=HostSlice(1, 4), stop_step=12)
        assert same(elements(served), expected)
    first = got[0][1]
    assert {k: (v.dtype, v.shape) for k, v in first.items()} == {
        "inputs": (np.int32, (4, 8)),
        "targets": (np.int32, (4, 176)),
    }


def test_a_dataset_built_at_step_k_starts_with_the_batches_of_step_k(root):
    uninterrupted = iterator_batches(root, HostSlice(0, 2), stop=40)
    fingerprint = local(root).run_info().fingerprint
    for k in (5, 31):
        resumed = elements(tf_dataset(local(root), LENGTHS, start=DataState(k, fingerprint), host_slice=HostSlice(0, 2)), 3)
        assert same(resumed, uninterrupted[k : k + 3])
    # Negative control: another seed gives other batches (once the first epoch is over).
    other = elements(tf_dataset(local(root, "other_seed"), LENGTHS, start=31, host_slice=HostSlice(0, 2)), 3)
    assert [s for s, _ in other] == [31, 32, 33]
    assert not any(features_equal(a, b) for (_, a), (_, b) in zip(other, uninterrupted[31:34], strict=True))


def test_a_state_of_another_run_is_refused_when_the_dataset_is_built(root):
    fingerprint = local(root).run_info().fingerprint
    with pytest.raises(ResumeError, match=r"but run 'other_seed' has fingerprint"):
        tf_dataset(local(root, "other_seed"), LENGTHS, start=DataState(3, fingerprint), host_slice=HostSlice(0, 2))


def test_skipped_steps_yield_no_element_and_shift_nothing(root):
    plan = RunStore(root).get("mix4").plan
    skipping = type(plan)(**{**{f: getattr(plan, f) for f in plan.__dataclass_fields__}, "skip": (SkipRange(3, 5),)})
    dirs = {c.task: c.version_dir for c in CacheResolver(root).resolve_run(RunStore(root).get("mix4"))}
    got = elements(tf_dataset(LocalAssignments(skipping, dirs), LENGTHS, host_slice=HostSlice(0, 4), stop_step=8))
    expected = [b for b in iterator_batches(root, HostSlice(0, 4), stop=8) if b[0] not in (3, 4)]
    assert same(got, expected)


def test_each_iterator_of_a_dataset_starts_at_its_start_and_a_feature_cannot_be_called_step(root):
    dataset = tf_dataset(local(root), LENGTHS, host_slice=HostSlice(0, 4), start=3, stop_step=6)
    first = elements(dataset)
    assert [s for s, _ in first] == [3, 4, 5]
    assert same(elements(dataset, 2), first[:2])
    with pytest.raises(ValueError, match="cannot be named 'step'"):
        tf_dataset(local(root), {"step": 4}, host_slice=HostSlice(0, 4))


def test_tf_checkpoints_of_its_iterators_resume_at_the_saved_step(root, tmp_path):
    expected = iterator_batches(root, HostSlice(0, 2), stop=9)
    iterator = iter(tf_dataset(local(root), LENGTHS, host_slice=HostSlice(0, 2)))
    taken = [next(iterator) for _ in range(3)]
    checkpoint = tf.train.Checkpoint(ds=iterator)
    saved = checkpoint.write(str(tmp_path / "data"))
    ahead = [next(iterator) for _ in range(3)]
    checkpoint.read(saved).assert_consumed()
    again = [next(iterator) for _ in range(3)]
    got = [(int(e.pop("step")), {k: v.numpy() for k, v in e.items()}) for e in taken + ahead]
    assert same(got, expected[:6])
    assert same([(int(e.pop("step")), {k: v.numpy() for k, v in e.items()}) for e in again], expected[3:6])
    # Another process: a dataset built afresh from step 0, its iterator restored from the checkpoint.
    fresh = iter(tf_dataset(local(root), LENGTHS, host_slice=HostSlice(0, 2)))
    tf.train.Checkpoint(ds=fresh).read(saved).assert_consumed()
    assert same(elements_of(fresh, 2), expected[3:5])
    # Negative control: the same checkpoint restored into a dataset of a run with another seed is refused.
    other = iter(tf_dataset(local(root, "other_seed"), LENGTHS, host_slice=HostSlice(0, 2)))
    tf.train.Checkpoint(ds=other).read(saved).assert_consumed()
    with pytest.raises(tf.errors.OpError, match=r"ResumeError.*but run 'other_seed' has fingerprint"):
        next(other)


def test_clu_s_tf_dataset_iterator_checkpoints_it_as_t5x_does(root, tmp_path):
    from clu.data.dataset_iterator import TfDatasetIterator

    expected = iterator_batches(root, HostSlice(1, 2), start=4, stop=12)
    fingerprint = local(root).run_info().fingerprint
    wrapped = TfDatasetIterator(tf_dataset(local(root), LENGTHS, start=DataState(4, fingerprint),
                                           host_slice=HostSlice(1, 2)), checkpoint=True)
    first = [next(wrapped) for _ in range(2)]
    wrapped.save(tmp_path / "train_ds-001-of-002")
    later = [next(wrapped) for _ in range(2)]
    wrapped.restore(tmp_path / "train_ds-001-of-002")
    again = [next(wrapped) for _ in range(2)]
    as_pairs = lambda elements: [(int(e.pop("step")), e) for e in elements]  # noqa: E731
    assert same(as_pairs(first + later), expected[:4])
    assert same(as_pairs(again), expected[2:4])


def elements_of(iterator, count):
    return [(int(e.pop("step")), {k: v.numpy() for k, v in e.items()}) for e in (next(iterator) for _ in range(count))]


def test_the_client_library_imports_without_tensorflow():
    code = (
        "import sys\n"
        "class NoTensorFlow:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'tensorflow': raise ImportError('tensorflow is not installed')\n"
        "sys.meta_path.insert(0, NoTensorFlow())\n"
        "import trainer_client, trainer_client.tfdata, trainer_client.iterator, trainer_client.arrays\n"
        "assert 'tensorflow' not in sys.modules\n"
        "try:\n"
        "    trainer_client.tfdata.tf_dataset(None, {})\n"
        "except ImportError as error:\n"
        "    print('tf_dataset needs it:', error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=client_env(1), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tf_dataset needs it: tensorflow is not installed" in result.stdout
