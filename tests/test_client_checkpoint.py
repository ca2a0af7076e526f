"""Checkpoints: exact round trip without pickle, atomic commit, loud failures on damage."""

from __future__ import annotations

import os

import numpy as np
import pytest

from trainer_client.example.batch_log import BatchLog, read_batch_log, read_batch_log_lines
from trainer_client.example.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    save_checkpoint,
)
from trainer_client.iterator import DataState

FINGERPRINT = "f" * 64


def arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "params/w": rng.standard_normal((3, 4)).astype(np.float32),
        "opt/count": np.asarray(seed, dtype=np.int32),
    }


def test_round_trip_is_exact(tmp_path):
    save_checkpoint(str(tmp_path), 7, "run", DataState(7, FINGERPRINT), arrays(7))
    loaded = latest_checkpoint(str(tmp_path))
    assert loaded.step == 7 and loaded.run == "run" and loaded.data == DataState(7, FINGERPRINT)
    for name, value in arrays(7).items():
        assert loaded.arrays[name].dtype == value.dtype and np.array_equal(loaded.arrays[name], value)


def test_newest_checkpoints_are_kept(tmp_path):
    for step in (5, 10, 15, 20):
        save_checkpoint(str(tmp_path), step, "run", DataState(step, FINGERPRINT), arrays(step), keep=2)
    assert list_checkpoints(str(tmp_path)) == [15, 20]
    assert sorted(os.listdir(tmp_path)) == [
        "step-000000015.json",
        "step-000000015.npz",
        "step-000000020.json",
        "step-000000020.npz",
    ]
    assert latest_checkpoint(str(tmp_path)).step == 20


def test_a_write_killed_before_its_marker_leaves_the_previous_checkpoint(tmp_path):
    save_checkpoint(str(tmp_path), 10, "run", DataState(10, FINGERPRINT), arrays(10))
    # What a kill leaves at each point of the next save: a temporary .npz, a complete .npz without its
    # marker, a temporary marker.
    (tmp_path / "step-000000020.npz.tmp-99999").write_bytes(b"PK\x03\x04 partial")
    assert latest_checkpoint(str(tmp_path)).step == 10
    np.savez(tmp_path / "step-000000020.npz", **arrays(20))
    (tmp_path / "step-000000020.json.tmp-99999").write_bytes(b'{"format": ')
    assert latest_checkpoint(str(tmp_path)).step == 10
    # The next save clears what the killed writer left.
    save_checkpoint(str(tmp_path), 20, "run", DataState(20, FINGERPRINT), arrays(20))
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    assert latest_checkpoint(str(tmp_path)).step == 20


def test_a_damaged_npz_is_an_error_naming_the_files(tmp_path):
    save_checkpoint(str(tmp_path), 10, "run", DataState(10, FINGERPRINT), arrays(10))
    path = tmp_path / "step-000000010.npz"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(
        CheckpointError, match=r"step-000000010\.npz does not match the sha256 its marker .* commits"
    ):
        latest_checkpoint(str(tmp_path))


def test_pickled_objects_cannot_be_stored(tmp_path):
    with pytest.raises(CheckpointError, match=r"\['params/x'\] have dtype object"):
        save_checkpoint(
            str(tmp_path), 1, "run", DataState(1, FINGERPRINT), {"params/x": np.array([{}], dtype=object)}
        )
    assert list_checkpoints(str(tmp_path)) == []


def test_step_and_data_state_must_agree(tmp_path):
    with pytest.raises(CheckpointError, match="step 3 holds a data state of step 4"):
        save_checkpoint(str(tmp_path), 3, "run", DataState(4, FINGERPRINT), arrays(3))


def test_no_checkpoint_is_none(tmp_path):
    assert latest_checkpoint(str(tmp_path / "missing")) is None


def test_batch_log_drops_a_torn_last_line_and_keeps_the_last_entry_per_step(tmp_path):
    path = str(tmp_path / "log.jsonl")
    log = BatchLog(path)
    for step in range(3):
        log.write({"step": step, "hash": f"h{step}"})
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"hash": "h3", "st')  # a kill mid-write
    assert [e["step"] for e in read_batch_log_lines(path)] == [0, 1, 2]
    log = BatchLog(path)  # a restart from the checkpoint of step 1 trains steps 1, 2, 3 again
    for step in (1, 2, 3):
        log.write({"step": step, "hash": f"h{step}'"})
    log.close()
    assert [e["step"] for e in read_batch_log_lines(path)] == [0, 1, 2, 1, 2, 3]
    assert {s: e["hash"] for s, e in read_batch_log(path).items()} == {0: "h0", 1: "h1'", 2: "h2'", 3: "h3'"}
