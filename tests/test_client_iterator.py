"""DataIterator: identical batches from the server and the local source, exact resume, loud failures."""

from __future__ import annotations

import shutil
import time

import httpx
import numpy as np
import pytest

from taskdata.cache.tfrecord import CorruptRecordError
from taskdata.index import SkipRange
from taskdata.runs import CacheResolver, RunStore
from tests.client_helpers import LENGTHS, features_equal, free_port, serve, shared_root
from tests.helpers import metric_samples
from trainer_client.assignments import AssignmentError, HostSlice
from trainer_client.digest import batch_hash, row_digests
from trainer_client.iterator import DataIterator, DataState, ResumeError
from trainer_client.local_source import LocalAssignments
from trainer_client.server_source import ServerAssignments

pytestmark = pytest.mark.slow  # cache jobs (Beam), servers


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


def local(root, run="mix4"):
    return LocalAssignments.from_cache_root(RunStore(root).get(run), root)


def collect(source, host_slice, start=0, stop=40, **kwargs):
    with DataIterator(source, LENGTHS, start=start, host_slice=host_slice, stop_step=stop, **kwargs) as it:
        return [(b.step, b.features) for b in it]


def test_server_and_local_sources_give_identical_batches(root):
    with serve(root) as url:
        for host_slice in (HostSlice(1, 4), HostSlice(0, 2)):
            served = collect(ServerAssignments(url, "mix4"), host_slice, lookahead=7)
            local_batches = collect(local(root), host_slice, lookahead=3, prefetch=1)
            assert [s for s, _ in served] == list(range(40))
            assert all(
                a[0] == b[0] and features_equal(a[1], b[1])
                for a, b in zip(served, local_batches, strict=True)
            )
    # Negative control: another seed gives other batches once the first epoch is over.
    other = collect(local(root, "other_seed"), HostSlice(0, 2), start=200, stop=203)
    same = collect(local(root), HostSlice(0, 2), start=200, stop=203)
    assert not any(features_equal(a[1], b[1]) for a, b in zip(other, same, strict=True))


def test_host_slices_make_up_the_global_batch(root):
    whole = collect(local(root), HostSlice(0, 1), stop=5)
    quarters = [collect(local(root), HostSlice(d, 4), stop=5) for d in range(4)]
    for step in range(5):
        for name in LENGTHS:
            joined = np.concatenate([quarters[d][step][1][name] for d in range(4)])
            assert np.array_equal(joined, whole[step][1][name])


def test_resuming_from_a_data_state_gives_the_tail_of_the_uninterrupted_run(root):
    uninterrupted = collect(local(root), HostSlice(2, 4), stop=30)
    fingerprint = local(root).run_info().fingerprint
    for k in (1, 13, 29):
        resumed = collect(local(root), HostSlice(2, 4), start=DataState(k, fingerprint), stop=30)
        assert [s for s, _ in resumed] == list(range(k, 30))
        assert all(features_equal(a[1], b[1]) for a, b in zip(resumed, uninterrupted[k:], strict=True))


def test_iterator_state_is_the_next_step_and_the_run_fingerprint(root):
    source = local(root)
    fingerprint = source.run_info().fingerprint
    with DataIterator(source, LENGTHS, start=DataState(5, fingerprint), host_slice=HostSlice(0, 4)) as it:
        assert it.state() == DataState(5, fingerprint)
        next(it), next(it)
        assert it.state() == DataState(7, fingerprint)
    assert DataState.from_dict(DataState(7, fingerprint).to_dict()) == DataState(7, fingerprint)


def test_a_checkpoint_of_another_run_is_refused_before_reading(root):
    other = local(root, "other_seed").run_info().fingerprint
    with pytest.raises(
        ResumeError,
        match=rf"fingerprint {other}, but run 'mix4' has fingerprint \w+: its batches "
        "would differ",
    ):
        DataIterator(local(root), LENGTHS, start=DataState(12, other), host_slice=HostSlice(0, 4))
    with pytest.raises(ResumeError, match="fingerprint must be a non-empty string"):
        DataState(12, "")
    with pytest.raises(ResumeError, match="must be"):
        DataState.from_dict({"step": 3})


def test_runs_with_other_data_shard_counts_share_the_fingerprint_and_the_batches(root):
    # Elastic resume: a checkpoint of the 4-shard run is accepted by the 2-shard one.
    fingerprint = local(root, "mix4").run_info().fingerprint
    assert local(root, "mix2").run_info().fingerprint == fingerprint
    a = collect(local(root, "mix2"), HostSlice(1, 2), start=DataState(3, fingerprint), stop=8)
    b = collect(local(root, "mix4"), HostSlice(1, 2), start=3, stop=8)
    assert all(features_equal(x[1], y[1]) for x, y in zip(a, b, strict=True))


def test_a_server_that_starts_late_is_waited_for(root):
    port = free_port()
    expected = collect(local(root), HostSlice(0, 4), stop=6)
    with serve(root, port=port, delay=1.0) as url:
        got = collect(ServerAssignments(url, "mix4", retry_seconds=60), HostSlice(0, 4), stop=6)
    assert all(a[0] == b[0] and features_equal(a[1], b[1]) for a, b in zip(got, expected, strict=True))


def test_a_server_still_verifying_the_caches_is_retried(root):
    # With no wait for the first verification, the server answers 503 + Retry-After until it is done.
    expected = collect(local(root), HostSlice(0, 4), stop=3)
    with serve(root, first_use_wait_seconds=0.0) as url:
        source = ServerAssignments(url, "mix4", retry_seconds=60, max_backoff=0.2)
        got = collect(source, HostSlice(0, 4), stop=3)
        metrics = httpx.get(f"{url}/metrics").text
    statuses = {dict(k)["status"] for k, v in metric_samples(metrics)["taskdata_http_requests_total"].items() if v}
    assert "503" in statuses, "the server never said 503"
    assert all(a[0] == b[0] and features_equal(a[1], b[1]) for a, b in zip(got, expected, strict=True))


def test_a_server_restart_mid_run_is_ridden_out(root):
    port = free_port()
    expected = collect(local(root), HostSlice(1, 4), stop=12)
    got = []
    with serve(root, port=port) as url:
        it = DataIterator(
            ServerAssignments(url, "mix4", retry_seconds=60),
            LENGTHS,
            host_slice=HostSlice(1, 4),
            lookahead=2,
            prefetch=1,
            stop_step=12,
        )
        got += [next(it) for _ in range(2)]
    time.sleep(0.3)  # nobody listens now; the fetcher keeps retrying
    with serve(root, port=port):
        got += list(it)
    it.close()
    assert [b.step for b in got] == list(range(12))
    assert all(features_equal(a.features, b[1]) for a, b in zip(got, expected, strict=True))


def test_an_unreachable_server_fails_loudly_after_the_retry_deadline():
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(
        AssignmentError,
        match=r"did not answer GET /runs/mix4 .* after \d+ attempts over 0\.5 s; "
        "last problem: ConnectError",
    ):
        DataIterator(ServerAssignments(url, "mix4", retry_seconds=0.5), LENGTHS, host_slice=HostSlice(0, 4))
    assert time.monotonic() - started < 30


def test_a_read_error_reaches_the_train_loop_and_stays(tmp_path, root):
    copy = str(tmp_path / "copy")
    shutil.copytree(root, copy)
    dirs = {task: d.replace(root, copy, 1) for task, d in _dirs(root).items()}
    with open(dirs["toy_random"] + "/train.tfrecord-00000-of-00003", "r+b") as f:
        f.seek(20)  # inside the first record's payload
        f.write(b"\xff")
    # Damaged after planning: only the reader's CRC checks can notice.
    it = DataIterator(
        LocalAssignments(RunStore(root).get("mix4").plan, dirs),
        LENGTHS,
        host_slice=HostSlice(0, 1),
        stop_step=5,
    )
    with pytest.raises(
        CorruptRecordError, match=r"train\.tfrecord-00000-of-00003: record 0 at byte offset 0"
    ):
        next(it)
    with pytest.raises(CorruptRecordError):
        next(it)
    it.close()


def test_instructions_for_another_slice_are_refused(root):
    class WrongSlice:
        def __init__(self, inner):
            self.inner = inner

        def run_info(self):
            return self.inner.run_info()

        def fetch(self, first, count, host_slice):
            return self.inner.fetch(
                first, count, HostSlice((host_slice.index + 1) % host_slice.count, host_slice.count)
            )

        def close(self):
            self.inner.close()

    with (
        DataIterator(WrongSlice(local(root)), LENGTHS, host_slice=HostSlice(0, 4)) as it,
        pytest.raises(AssignmentError, match=r"host slice 0 of 4 of run 'mix4' is positions range\(0, 4\)"),
    ):
        next(it)


def test_skipped_steps_deliver_no_data_and_shift_nothing(root):
    stored = RunStore(root).get("mix4")
    plan = stored.plan
    skipping = type(plan)(
        **{**{f: getattr(plan, f) for f in plan.__dataclass_fields__}, "skip": (SkipRange(3, 5),)}
    )
    dirs = _dirs(root)
    plain = collect(LocalAssignments(plan, dirs), HostSlice(0, 4), stop=8)
    skipped = DataIterator(LocalAssignments(skipping, dirs), LENGTHS, host_slice=HostSlice(0, 4), stop_step=8)
    batches = list(skipped)
    skipped.close()
    assert [b.skipped for b in batches] == [False, False, False, True, True, False, False, False]
    assert batches[3].features == {} and batches[3].positions == range(48, 52)
    for b, (step, features) in zip(batches, plain, strict=True):
        assert b.step == step
        if not b.skipped:
            assert features_equal(b.features, features)


def test_batch_hash_depends_on_content_and_order_only(root):
    batches = collect(local(root), HostSlice(0, 1), stop=2)
    a = row_digests(batches[0][1])
    assert batch_hash(a) == batch_hash(row_digests({k: v.copy() for k, v in batches[0][1].items()}))
    assert batch_hash(a) != batch_hash(row_digests(batches[1][1]))
    assert batch_hash(a) != batch_hash(a[::-1].copy())


def _dirs(root):
    return {c.task: c.version_dir for c in CacheResolver(root).resolve_run(RunStore(root).get("mix4"))}


def test_restore_moves_the_iterator_to_a_states_step_and_refuses_another_run(root):
    uninterrupted = collect(local(root), HostSlice(3, 4), stop=12)
    fingerprint = local(root).run_info().fingerprint
    with DataIterator(local(root), LENGTHS, host_slice=HostSlice(3, 4), stop_step=12) as it:
        next(it), next(it)  # and more read ahead, which the restore drops
        with pytest.raises(ResumeError, match="belongs to a run with fingerprint 000"):
            it.restore(DataState(2, "0" * 64))
        assert it.state() == DataState(2, fingerprint), "a refused state changes nothing"
        it.restore(DataState(9, fingerprint))
        assert it.state() == DataState(9, fingerprint)
        tail = [(b.step, b.features) for b in it]
        it.restore(DataState(1, fingerprint))  # backwards too
        assert next(it).step == 1
    assert [s for s, _ in tail] == [9, 10, 11]
    assert all(features_equal(a[1], b[1]) for a, b in zip(tail, uninterrupted[9:], strict=True))
