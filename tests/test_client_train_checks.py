"""What the example trainer checks before it trains, and what it prints while it does.

A batch that cannot fit is refused before anything is allocated, saying which batch would; the model's
vocabulary comes from the run's tasks and a different one is refused; errors are one line with an exit
code; progress lines give step, loss, examples/s and data wait.
"""

from __future__ import annotations

import argparse
import io

import jax
import numpy as np
import pytest

from tests.client_helpers import MODEL_ARGS, shared_root
from trainer_client.example.memory import BatchTooLargeError, StepMemory, check_fits, step_memory
from trainer_client.example.progress import StepReporter
from trainer_client.example.train import _model_vocab_size, main

GIB = 2**30


def test_a_step_that_fits_passes_and_one_that_does_not_names_the_batch_that_would():
    memory = StepMemory(total_bytes=40 * GIB, fixed_bytes=GIB // 2, per_device_batch=2048)
    check_fits(memory, 100 * GIB, global_batch=2048, data_devices=1, num_data_shards=8)
    with pytest.raises(BatchTooLargeError) as raised:
        check_fits(memory, 20 * GIB, global_batch=2048, data_devices=1, num_data_shards=8)
    assert str(raised.value) == (
        "The train step for a global batch of 2048 (2048 examples per device) needs 40.0 GiB per device, but 17.0 "
        "GiB is usable here (85% of 20.0 GiB available). Plan the run with --batch-size 848 or less ('taskdata "
        "plan ... --batch-size 848'), or give shorter --inputs-length/--targets-length or a smaller model; or pass "
        "--skip-memory-check to try anyway."
    )
    # 848: (17 GiB usable - 0.5 GiB fixed) / (39.5 GiB / 2048 per example) = 855.5, down to a multiple of 8.
    assert (17 * GIB - GIB // 2) / memory.bytes_per_example // 8 * 8 == 848
    check_fits(memory, None, global_batch=2048, data_devices=1, num_data_shards=8)  # unknown memory: no check


def test_compiled_step_memory_grows_with_the_batch():
    def step(w, x):
        return w - 0.1 * jax.grad(lambda w: ((x @ w) ** 2).mean())(w)

    w = jax.ShapeDtypeStruct((64, 512), np.float32)
    small, large = (
        step_memory(jax.jit(step, donate_argnums=0).lower(w, jax.ShapeDtypeStruct((b, 64), np.float32)).compile(), b)
        for b in (8, 4096)
    )
    assert small.fixed_bytes == large.fixed_bytes == 64 * 512 * 4  # the donated weights
    assert large.total_bytes > 100 * small.total_bytes // 8 > 0


@pytest.mark.slow
def test_the_trainer_refuses_a_batch_it_cannot_hold_before_training(tmp_path_factory, tmp_path, capsys):
    root = shared_root(tmp_path_factory)
    args = ["--cache-root", root, "--run", "mix4", "--steps", "2", "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--inputs-length", "8", "--targets-length", "176", *MODEL_ARGS, "--d-ff", "1000000000"]  # fmt: skip
    assert main(args) == 2
    first = capsys.readouterr().err.splitlines()[-1]
    per_device = 16 // len(jax.devices())  # the mesh's data axis spans every device (1 model replica each)
    assert first.startswith(
        "python -m trainer_client.example.train: error: The train step for a global batch of 16 "
        f"({per_device} examples per device) needs "
    ), first
    assert "Even one example per device does not fit" in first
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir()), "nothing was trained"


def _vocab_args(**given) -> argparse.Namespace:
    return argparse.Namespace(
        **{"module": ["tests.cache_tasks"], "vocab_size": None, "allow_vocab_size_mismatch": False, **given}
    )


def test_the_model_vocabulary_comes_from_the_tasks_and_another_is_refused():
    tasks = ["toy_det", "toy_random"]
    assert _model_vocab_size(_vocab_args(), tasks) == 384  # the byte vocabulary: 259 + 125 extra ids
    with pytest.raises(ValueError) as raised:
        _model_vocab_size(_vocab_args(vocab_size=32128), tasks)
    assert str(raised.value) == (
        "--vocab-size 32128 differs from the vocabulary of the run's tasks (toy_det/inputs: 384, toy_det/targets: "
        "384, toy_random/inputs: 384, toy_random/targets: 384): leave --vocab-size out to use 384, or pass "
        "--allow-vocab-size-mismatch."
    )
    assert _model_vocab_size(_vocab_args(vocab_size=512, allow_vocab_size_mismatch=True), tasks) == 512


def test_an_unregistered_task_needs_its_module_or_a_vocab_size(capsys):
    with pytest.raises(ValueError) as raised:
        _model_vocab_size(_vocab_args(module=[]), ["toy_not_registered"])
    assert str(raised.value).endswith(
        "The trainer sizes its model from the run's tasks: pass the --module that registers them, or --vocab-size N."
    )
    assert _model_vocab_size(_vocab_args(module=[], vocab_size=384), ["toy_not_registered"]) == 384
    assert "is not checked against the tasks" in capsys.readouterr().err


def test_progress_lines_give_step_loss_rate_and_data_wait():
    now = [0.0]
    out = io.StringIO()
    reporter = StepReporter(total_steps=5, every_s=10.0, out=out, clock=lambda: now[0])
    for step, (loss, wait) in enumerate([(4.0, 1.0), (2.0, 0.5), (None, 0.0), (1.0, 0.0), (3.0, 0.5)]):
        now[0] += 4.0
        reporter.record(step, loss, 0 if loss is None else 16, wait)
    assert out.getvalue().splitlines() == [
        "step 3/5  loss 3.0000  2.7 examples/s  data wait 12%",  # 12 s, 32 examples, 1.5 s waiting
        "step 5/5  loss 2.0000  4.0 examples/s  data wait 6%",  # the last step always prints
    ]


def test_an_unreadable_token_file_is_one_line_and_exit_code_2(tmp_path, capsys):
    args = ["--server", "http://127.0.0.1:9", "--token-file", str(tmp_path / "missing"), "--run", "r",
            "--steps", "1", "--checkpoint-dir", str(tmp_path / "ckpt")]  # fmt: skip
    assert main(args) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"python -m trainer_client.example.train: error: Cannot read --token-file {tmp_path / 'missing'}: No such "
        "file or directory."
    ]


def test_a_server_that_does_not_answer_is_one_line_and_exit_code_3(tmp_path, capsys):
    args = ["--server", "http://127.0.0.1:9", "--run", "r", "--retry-seconds", "1", "--steps", "1",
            "--checkpoint-dir", str(tmp_path / "ckpt")]  # fmt: skip
    assert main(args) == 3
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "python -m trainer_client.example.train: error: Server http://127.0.0.1:9 did not answer GET /runs/r {} after "
    ), line
    assert line.endswith("Check that the server is running and reachable from this host (or raise retry_seconds).")
