"""PeerWatchdog's rules that need no running job (the job itself: test_client_train's peer tests, the drill)."""

from __future__ import annotations

import jax
import pytest

from trainer_client.peers import PeerWatchdog, _is_runtime_failure


def test_a_collective_that_lost_its_peer_counts_as_a_runtime_failure_and_a_python_error_does_not():
    gloo = ValueError(
        "UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer"
    )
    assert _is_runtime_failure(gloo)
    assert _is_runtime_failure(jax.errors.JaxRuntimeError("INTERNAL: anything the runtime raises"))
    assert not _is_runtime_failure(ValueError("Step 3: feature 'inputs' holds token id 600, outside the vocabulary"))
    assert not _is_runtime_failure(FileNotFoundError(2, "No such file or directory"))


def test_the_watchdog_needs_a_distributed_job_and_a_period_below_its_timeout():
    with pytest.raises(ValueError, match="needs 0 < period < timeout but got period 5, timeout 5"):
        PeerWatchdog(lambda: "", timeout=5, period=5)
    with pytest.raises(RuntimeError, match="call jax.distributed.initialize first"):
        PeerWatchdog(lambda: "")
