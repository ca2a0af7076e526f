"""Read instructions: the local source vs the index math vs the server, for every slicing of a batch."""

from __future__ import annotations

import json

import pytest

from taskdata.cache.format import CacheFormatError
from taskdata.index import assign, to_json
from taskdata.index.columns import base64_int64
from taskdata.runs import RunStore
from tests.client_helpers import serve, shared_root
from tests.index_references import step_examples
from trainer_client.assignments import AssignmentError, HostSlice
from trainer_client.local_source import LocalAssignments
from trainer_client.server_source import ServerAssignments

pytestmark = pytest.mark.slow  # cache jobs (Beam)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


def local(root, run="mix4"):
    return LocalAssignments.from_cache_root(RunStore(root).get(run), root)


def test_host_slice_rows_and_validation():
    assert HostSlice(1, 4).rows(16) == range(4, 8)
    with pytest.raises(AssignmentError, match=r"index must be in \[0, 4\) but got 4"):
        HostSlice(4, 4)
    with pytest.raises(AssignmentError, match="count must be an integer >= 1 but got 0"):
        HostSlice(0, 0)
    with pytest.raises(AssignmentError, match="12 examples cannot be split into 8 equal host slices"):
        HostSlice(0, 8).rows(12)


def test_local_instructions_follow_the_index_math_example_by_example(root):
    source = local(root)
    plan = source.run_info().plan
    for step in (0, 7, 40, 1000):
        for d in range(4):
            (reads,) = source.fetch(step, 1, HostSlice(d, 4))
            expected = assign(plan, step, d)
            assert step_examples(reads) == [(e.task, e.shard, e.record) for e in expected.examples], (step, d)
            assert reads.positions == expected.positions


def test_a_coarser_slice_reads_the_union_of_its_data_shards_as_one(root):
    source = local(root)
    for step in (0, 3, 55):
        quarters = [source.fetch(step, 1, HostSlice(d, 4))[0] for d in range(4)]
        halves = [source.fetch(step, 1, HostSlice(h, 2))[0] for h in range(2)]
        (whole,) = source.fetch(step, 1, HostSlice(0, 1))
        for h, half in enumerate(halves):
            assert step_examples(half) == step_examples(quarters[2 * h]) + step_examples(quarters[2 * h + 1])
            assert half.positions == range(
                quarters[2 * h].positions.start, quarters[2 * h + 1].positions.stop
            )
        assert step_examples(whole) == [e for q in quarters for e in step_examples(q)]


@pytest.mark.parametrize("encoding", ["compact", "base64"])
def test_server_instructions_equal_the_local_ones_for_every_slicing(root, encoding):
    with serve(root) as url:
        server = ServerAssignments(url, "mix4", encoding=encoding)
        assert server.encoding == encoding
        assert server.run_info() == local(root).run_info()
        for host_slice in (HostSlice(3, 4), HostSlice(1, 2), HostSlice(0, 1)):
            assert server.fetch(5, 20, host_slice) == local(root).fetch(5, 20, host_slice), host_slice
        # More than one request's worth of steps (the server answers at most 64 per request).
        assert server.fetch(0, 70, HostSlice(2, 4)) == local(root).fetch(0, 70, HostSlice(2, 4))
        server.close()


def test_a_server_answer_that_does_not_hold_together_is_refused(root):
    import httpx

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/runs/"):
            body = {"plan": info.plan.to_dict(), "split": info.split, "fingerprint": info.fingerprint}
            return httpx.Response(200, json=body)
        step = json.loads(to_json(good, "base64"))
        step["order"] = base64_int64(good.order[:-1])  # the order misses the slice's last example
        envelope = {
            "run": "mix4",
            "fingerprint": info.fingerprint,
            "split": info.split,
            "host": 0,
            "num_hosts": 4,
            "data_shard": 0,
            "num_data_shards": 4,
            "steps": [step],
        }
        return httpx.Response(200, json=envelope)

    info = local(root).run_info()
    (good,) = local(root).fetch(0, 1, HostSlice(0, 4))
    server = ServerAssignments("http://test", "mix4")
    server._http = httpx.Client(base_url="http://test", transport=httpx.MockTransport(answer))
    with pytest.raises(
        AssignmentError,
        match=r"with read instructions this client refuses: Step 0: 3 examples in the order but the host covers 4 "
        r"positions\. .* do not train on them",
    ):
        server.fetch(0, 1, HostSlice(0, 4))
    server.close()


# What a server from before encoding=compact answers it (FastAPI's validation error, taken from one at dbc6485).
OLD_SERVER_422 = {"detail": [{"type": "literal_error", "loc": ["query", "encoding"], "msg": "Input should be 'ints' or "
                              "'base64'", "input": "compact", "ctx": {"expected": "'ints' or 'base64'"}}]}  # fmt: skip


@pytest.mark.parametrize("refused", ["encoding", "host"])
def test_a_server_older_than_compact_is_asked_again_in_base64(root, refused):
    import httpx

    asked = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/runs/"):
            body = {"plan": info.plan.to_dict(), "split": info.split, "fingerprint": info.fingerprint}
            return httpx.Response(200, json=body)
        asked.append(request.url.params["encoding"])
        if request.url.params["encoding"] == "compact":
            detail = [{**OLD_SERVER_422["detail"][0], "loc": ["query", refused]}]
            return httpx.Response(422, json={"detail": detail})
        envelope = {"run": "mix4", "fingerprint": info.plan.fingerprint_before(2), "split": info.split, "host": 0,
                    "num_hosts": 4, "data_shard": 0, "num_data_shards": 4,
                    "steps": [json.loads(to_json(good, "base64"))]}  # fmt: skip
        return httpx.Response(200, json=envelope)

    info = local(root).run_info()
    (good,) = local(root).fetch(1, 1, HostSlice(0, 4))
    server = ServerAssignments("http://test", "mix4", retry_seconds=1)
    server._http = httpx.Client(base_url="http://test", transport=httpx.MockTransport(answer))
    if refused == "host":  # a 422 about anything else is the server's answer: raised, never retried
        with pytest.raises(AssignmentError, match="HTTP 422"):
            server.fetch(1, 1, HostSlice(0, 4))
        assert asked == ["compact"] and server.encoding == "compact"
    else:
        assert server.fetch(1, 1, HostSlice(0, 4)) == [good]
        assert server.fetch(1, 1, HostSlice(0, 4)) == [good]
        assert asked == ["compact", "base64", "base64"] and server.encoding == "base64"
    server.close()


def test_an_unknown_encoding_is_refused_naming_the_ones_there_are():
    with pytest.raises(AssignmentError, match="encoding must be 'compact' .the default., 'base64' or 'ints' but got 'hex'"):
        ServerAssignments("http://test", "mix4", encoding="hex")  # type: ignore[arg-type]


def test_server_refuses_more_host_slices_than_data_shards(root):
    with serve(root) as url:
        server = ServerAssignments(url, "mix2")
        with pytest.raises(
            AssignmentError, match="2 data shards, which cannot be grouped into 4 host slices"
        ):
            server.fetch(0, 1, HostSlice(0, 4))
        server.close()


def test_unknown_run_fails_at_once_with_the_servers_message(root):
    with serve(root) as url:
        server = ServerAssignments(url, "no_such_run", retry_seconds=30)
        with pytest.raises(AssignmentError, match=r"HTTP 404: Unknown run 'no_such_run'; known runs: \["):
            server.run_info()
        server.close()


def test_different_seed_gives_different_instructions(root):
    same = local(root, "mix4").fetch(200, 1, HostSlice(0, 4))
    other = local(root, "other_seed").fetch(200, 1, HostSlice(0, 4))
    assert local(root, "mix4").fetch(200, 1, HostSlice(0, 4)) == same
    assert other[0].tasks != same[0].tasks


def test_a_cache_root_without_the_pinned_version_is_an_error_naming_it(root, tmp_path):
    stored = RunStore(root).get("mix4")
    fingerprint = stored.plan.caches["toy_det"].fingerprint
    with pytest.raises(
        CacheFormatError, match=f"No complete version of task 'toy_det' under .* sha256 {fingerprint}"
    ):
        LocalAssignments.from_cache_root(stored, str(tmp_path))
