"""An example trainer: a tiny encoder-decoder trained on a cached task with exact, elastic resume.

    python -m trainer_client.example.train --server http://127.0.0.1:8000 --run c4_sc --steps 1000 \\
        --checkpoint-dir ckpt --log batches.jsonl
    python -m trainer_client.example.train --cache-root ~/.taskdata/caches --run c4_sc ...   (no server)

Several hosts: start one process per host with ``--coordinator HOST:PORT --num-processes P
--process-id I`` (``jax.distributed``). Every host reads its slice of each global batch (from the
mesh: ``--model-axis`` devices per model replica) and the train step is one ``jax.jit`` with explicit
in/out shardings over the (data, model) mesh.

The optimizer is optax's Adam. Checkpoints are orbax steps holding parameters, optimizer state and
the data state (next step + run fingerprint; ``trainer_client.example.checkpoint``), written
asynchronously every ``--checkpoint-every`` steps and at the end. SIGTERM makes every host stop at
the same step boundary (the hosts agree on it at every step), checkpoint and exit 0; a restart with
the same arguments resumes at that exact step, on the same or another number of hosts; after a
SIGKILL it resumes at the last committed checkpoint. The log gets one JSON line per step with the
hash of the global batch as assembled across hosts.

No host is left hanging: when one of several processes stops (killed, crashed, host lost), every
other one exits with code 1 within about ``--peer-timeout`` seconds, saying which process stopped
and how to resume (``trainer_client.peers``); a process that fails with an error stops the others
the same way instead of leaving them blocked until JAX's shutdown barrier times out.

With ``--predictions-out FILE``, a run that reaches ``--steps`` (also a restart with nothing left to
train) then has process 0 greedily decode the ``targets`` of the first ``--predict-examples`` examples
of ``--predict-split`` of every task of the run and write them as JSON lines for ``taskdata eval``
(``trainer_client.example.predict``); the other processes wait for it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where they are used, so that --help answers without loading JAX
    import jax
    import numpy as np

    from taskdata.define.registry import Registry
    from trainer_client.assignments import AssignmentSource
    from trainer_client.example.model import ModelConfig

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer_client.example.train", description=__doc__.split("\n\n")[0])
    source = p.add_argument_group("data (one of --server or --cache-root)")
    source.add_argument("--server", help="assignment server URL, e.g. http://127.0.0.1:8000")
    source.add_argument("--cache-root", help="read the run from this cache root without a server")
    source.add_argument("--run", required=True, help="run name (created with 'taskdata plan' or POST /runs)")
    source.add_argument("--token-file", help="file holding the server's bearer token")
    source.add_argument(
        "--retry-seconds", type=float, default=300.0, help="how long to retry an unreachable server"
    )
    source.add_argument("--lookahead", type=int, default=None,
                        help="steps of read instructions known ahead (default: 16, or what the run's epoch order needs)")
    source.add_argument("--prefetch", type=int, default=4, help="batches read ahead of the train step")
    source.add_argument("--inputs-length", type=int, default=512, help="padded length of 'inputs'")
    source.add_argument("--targets-length", type=int, default=114, help="padded length of 'targets'")

    train = p.add_argument_group("training")
    train.add_argument("--steps", type=int, required=True, help="train until this step (exclusive)")
    train.add_argument(
        "--checkpoint-dir", required=True, help="where checkpoints are written and resumed from"
    )
    train.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    train.add_argument("--keep", type=int, default=2, help="checkpoints kept")
    train.add_argument("--log", help="batch log (JSON lines; written by process 0)")
    train.add_argument(
        "--compilation-cache", help="JAX persistent compilation cache folder (faster restarts)"
    )
    train.add_argument("--seed", type=int, default=0, help="parameter initialisation seed")
    train.add_argument("--learning-rate", type=float, default=1e-3)
    train.add_argument(
        "--vocab-size",
        type=_positive,
        default=None,
        help="model vocabulary (default: the run's tasks' vocabulary size; they are looked up with --module)",
    )
    train.add_argument(
        "--allow-vocab-size-mismatch",
        action="store_true",
        help="train a model whose --vocab-size differs from the tasks' vocabulary (its predictions may not decode)",
    )
    train.add_argument("--d-model", type=int, default=32)
    train.add_argument("--num-heads", type=int, default=2)
    train.add_argument("--head-dim", type=int, default=16)
    train.add_argument("--d-ff", type=int, default=64)
    train.add_argument(
        "--skip-memory-check",
        action="store_true",
        help="start even if the train step of the run's largest batch needs more memory than a device has",
    )
    train.add_argument(
        "--print-every",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="print step, loss, examples/s and data wait this often (default 10; 0: every step)",
    )
    train.add_argument("--debug", action="store_true", help="print the traceback of an error")

    predict = p.add_argument_group("predictions (after the last step)")
    predict.add_argument(
        "--predictions-out",
        help="write greedy predictions as JSON lines to this file (local or gs://) once --steps is reached",
    )
    predict.add_argument(
        "--predict-split", default="validation", help="cache split to predict (default validation)"
    )
    predict.add_argument(
        "--predict-examples",
        type=_positive,
        default=64,
        help="examples predicted per task: the split's first N",
    )
    predict.add_argument(
        "--module",
        action="append",
        default=[],
        help="import this module to register the run's tasks (their vocabularies size the model and decode the "
        "predictions)",
    )

    hosts = p.add_argument_group("hosts")
    hosts.add_argument(
        "--model-axis", type=int, default=1, help="devices per model replica (mesh 'model' axis)"
    )
    hosts.add_argument("--coordinator", help="HOST:PORT of process 0, to run several processes")
    hosts.add_argument("--num-processes", type=int, default=1)
    hosts.add_argument("--process-id", type=int, default=0)
    hosts.add_argument(
        "--init-timeout", type=int, default=60, help="seconds to wait for every process to join"
    )
    hosts.add_argument(
        "--peer-timeout",
        type=float,
        default=10.0,
        help="seconds without a peer's heartbeat before every other process exits (several processes)",
    )
    return p


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer but got {value}")
    return value


class _StopRequest:
    """Set by SIGTERM; read at step boundaries (a signal handler must not do the checkpoint itself)."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        self.requested = True


def _initialize_distributed(args: argparse.Namespace) -> None:
    import jax

    if args.coordinator is None:
        if args.num_processes != 1:
            raise ValueError("--num-processes > 1 needs --coordinator HOST:PORT (process 0's address).")
        return
    # CPU hosts need a collectives backend to run cross-process programs; TPU/GPU ignore this.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # JAX's preemption service would take SIGTERM for itself; this trainer agrees on the stop step
    # with its own per-step collective, the same way on one process and on many.
    jax.config.update("jax_enable_preemption_service", False)
    jax.distributed.initialize(
        coordinator_address=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
        initialization_timeout=args.init_timeout,
        # Backstops behind the peer watchdog: JAX aborts a process whose peer missed heartbeats this
        # long (default 100 s), and bounds the shutdown barrier (default 300 s).
        heartbeat_timeout_seconds=int(args.peer_timeout * 3) + 10,
        shutdown_timeout_seconds=30,
    )


def _any_process(flag: bool) -> bool:
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return flag
    return bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).max())


def _to_host(tree: Mapping[str, jax.Array]) -> dict[str, np.ndarray]:
    import numpy as np
    from jax.experimental import multihost_utils

    # A collective: every process calls it, and every process gets the whole arrays.
    return {
        name: np.asarray(value) for name, value in multihost_utils.process_allgather(tree, tiled=True).items()
    }


def _place(values: Mapping[str, np.ndarray], shardings: Mapping[str, jax.sharding.Sharding]) -> dict[str, jax.Array]:
    import jax

    return {
        name: jax.make_array_from_callback(value.shape, shardings[name], value.__getitem__)
        for name, value in values.items()
    }


def _source(args: argparse.Namespace) -> AssignmentSource:
    if (args.server is None) == (args.cache_root is None):
        raise ValueError("Give exactly one of --server URL or --cache-root DIR.")
    if args.server is not None:
        from trainer_client.server_source import ServerAssignments

        token = None
        if args.token_file:
            try:
                with open(args.token_file) as f:
                    token = f.read().strip()
            except OSError as e:
                raise ValueError(f"Cannot read --token-file {args.token_file}: {e.strerror or e}.") from e
            if not token:
                raise ValueError(f"--token-file {args.token_file} is empty; put the server's bearer token in it.")
        return ServerAssignments(args.server, args.run, token=token, retry_seconds=args.retry_seconds)
    from taskdata.runs import RunStore
    from trainer_client.local_source import LocalAssignments

    stored = RunStore(args.cache_root).get(args.run)
    if stored is None:
        raise ValueError(
            f"No run {args.run!r} under {args.cache_root}/_runs; create it with 'taskdata plan --name {args.run} ...'."
        )
    return LocalAssignments.from_cache_root(stored, args.cache_root)


def _registry(args: argparse.Namespace) -> Registry:
    from taskdata.config import Config
    from taskdata.tasks import default_registry

    # The trainer is an entry point: $TASKDATA_VOCAB / $TASKDATA_C4_DIR / $TASKDATA_HOME apply here.
    registry = default_registry(Config.from_environment())
    for module in args.module:
        registry.load_module(module)
    return registry


def _model_vocab_size(args: argparse.Namespace, task_names: Sequence[str]) -> int:
    """``--vocab-size``, or the run's tasks' vocabulary size; a model that differs from it is refused."""
    from taskdata.define.registry import UnknownNameError

    registry = _registry(args)
    sizes: dict[str, int] = {}
    try:
        for name in task_names:
            task = registry.get_task(name)
            for feature_name, feature in task.output_features.items():
                if feature.vocabulary is not None and feature.dtype != "string":
                    sizes[f"{name}/{feature_name}"] = feature.vocabulary.vocab_size
    except UnknownNameError as e:
        if args.vocab_size is not None:
            print(f"note: --vocab-size {args.vocab_size} is not checked against the tasks ({e.args[0]})", file=sys.stderr)
            return args.vocab_size
        raise ValueError(
            f"{e.args[0]} The trainer sizes its model from the run's tasks: pass the --module that registers them, "
            "or --vocab-size N."
        ) from e
    distinct = sorted(set(sizes.values()))
    if args.vocab_size is None:
        if len(distinct) > 1:
            raise ValueError(
                f"The run's features have vocabularies of different sizes ({_listing(sizes)}); one model cannot "
                "decode them all. Pass --vocab-size N (at least the largest) with --allow-vocab-size-mismatch."
            )
        return distinct[0]
    if distinct != [args.vocab_size] and not args.allow_vocab_size_mismatch:
        raise ValueError(
            f"--vocab-size {args.vocab_size} differs from the vocabulary of the run's tasks ({_listing(sizes)}): "
            f"leave --vocab-size out to use {distinct[-1]}, or pass --allow-vocab-size-mismatch."
        )
    return args.vocab_size


def _listing(sizes: dict[str, int]) -> str:
    return ", ".join(f"{name}: {size}" for name, size in sizes.items())


def _predict(
    args: argparse.Namespace, params: Mapping[str, jax.Array], config: ModelConfig, lengths: dict[str, int]
) -> None:
    import jax
    from jax.experimental import multihost_utils

    host_params = _to_host(params)  # a collective: every process takes part
    if jax.process_index() == 0:
        from trainer_client.example.predict import predict_run, write_predictions

        source = _source(args)
        try:
            rows = predict_run(
                host_params,
                config,
                source,
                _registry(args),
                split=args.predict_split,
                count=args.predict_examples,
                lengths=lengths,
            )
        finally:
            source.close()
        write_predictions(args.predictions_out, rows)
        print(
            f"wrote {len(rows)} predictions of split {args.predict_split!r} to {args.predictions_out}",
            file=sys.stderr,
        )
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("predictions")


PROG = "python -m trainer_client.example.train"


def main(argv: Sequence[str] | None = None) -> int:
    """Trains; the exit codes are ``taskdata.exits``' (2 a user error, 3 the server or data failed, 130 Ctrl-C)."""
    from taskdata.cache.ranges import RangeReadError
    from taskdata.define.registry import UnknownNameError
    from taskdata.exits import run_command
    from trainer_client.assignments import AssignmentError
    from trainer_client.example.checkpoint import CheckpointError
    from trainer_client.iterator import ResumeError

    args = build_parser().parse_args(argv)
    return run_command(
        PROG,
        lambda: _main(args),
        usage_errors=(ValueError, OSError, ImportError, UnknownNameError, ResumeError, CheckpointError),
        data_errors=(AssignmentError, RangeReadError),
        debug=args.debug,
    )


def _main(args: argparse.Namespace) -> int:
    stop = _StopRequest()
    _initialize_distributed(args)
    if args.coordinator is None:
        return _train(args, stop)
    from trainer_client.example.checkpoint import committed_steps
    from trainer_client.peers import PeerWatchdog

    def resume_hint() -> str:
        steps = committed_steps(args.checkpoint_dir)
        where = f"step {steps[-1]} in {args.checkpoint_dir}" if steps else f"step 0 (none in {args.checkpoint_dir})"
        return (
            "To resume, start every process again with the same arguments (any number of processes): "
            f"training goes on from the last committed checkpoint, {where}."
        )

    watchdog = PeerWatchdog(resume_hint, timeout=args.peer_timeout).start()
    try:
        code = _train(args, stop)
    except BaseException as error:
        # Leave at once (os._exit): a normal exit would wait in jax.distributed's shutdown barrier for
        # peers blocked in a collective with this process, so nobody would stop until its timeout.
        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            watchdog.fail(error)
    watchdog.stop()
    return code


def _check_memory(
    step_fn: Any, shapes: Any, tx: Any, mesh: Any, plan: Any, args: argparse.Namespace, lengths: dict[str, int]
) -> None:
    """Refuses a run whose largest global batch cannot fit, asking XLA before anything is allocated."""
    import jax
    import numpy as np

    from trainer_client.arrays import batch_sharding
    from trainer_client.example.memory import available_bytes, check_fits, step_memory

    # A batch schedule is constant or a linear ramp, so its largest batch is at one end of the run.
    largest = max(plan.schedule.batch_size(0), plan.schedule.batch_size(max(args.steps - 1, 0)))
    data_devices = mesh.shape["data"]
    rows = -(-largest // data_devices) * data_devices
    batch = {
        name: jax.ShapeDtypeStruct((rows, length), np.int32, sharding=batch_sharding(mesh))
        for name, length in lengths.items()
    }
    compiled = step_fn.lower(shapes, jax.eval_shape(tx.init, shapes), batch).compile()
    device = jax.local_devices()[0]
    sharing = len(jax.local_devices()) if device.platform == "cpu" else 1
    check_fits(
        step_memory(compiled, rows // data_devices),
        available_bytes(device),
        global_batch=largest,
        data_devices=data_devices,
        num_data_shards=plan.num_data_shards,
        devices_sharing_memory=sharing,
    )


def _train(args: argparse.Namespace, stop: _StopRequest) -> int:
    import jax
    import numpy as np
    import optax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding

    from trainer_client.arrays import (
        batch_sharding,
        gather_batch_hash,
        global_batch,
        host_slice,
        make_mesh,
        replicated,
    )
    from trainer_client.example import checkpoint
    from trainer_client.example.batch_log import BatchLog
    from trainer_client.example.model import ModelConfig, init_params, loss_fn, param_shapes, param_specs
    from trainer_client.example.optimizer import init_opt_state, make_optimizer, opt_state_shardings
    from trainer_client.example.progress import StepReporter
    from trainer_client.iterator import DataIterator, DataState

    if args.compilation_cache:
        jax.config.update("jax_compilation_cache_dir", args.compilation_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    first_process = jax.process_index() == 0
    mesh = make_mesh(args.model_axis)
    source = _source(args)
    plan = source.run_info().plan
    vocab_size = _model_vocab_size(args, plan.task_names)
    config = ModelConfig(vocab_size, args.d_model, args.num_heads, args.head_dim, args.d_ff)
    config.check_model_axis(mesh.shape["model"])
    tx = make_optimizer(args.learning_rate)
    p_shardings = {n: NamedSharding(mesh, s) for n, s in param_specs(config).items()}
    shapes = {n: jax.ShapeDtypeStruct(shape, np.float32) for n, shape in param_shapes(config).items()}
    o_shardings = opt_state_shardings(tx, p_shardings, shapes, replicated(mesh))
    lengths = {"inputs": args.inputs_length, "targets": args.targets_length}

    def train_step(params: Any, opt_state: Any, batch: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, config)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    data_sharding = {name: batch_sharding(mesh) for name in lengths}
    step_fn = jax.jit(
        train_step,
        in_shardings=(p_shardings, o_shardings, data_sharding),
        out_shardings=(p_shardings, o_shardings, replicated(mesh)),
        donate_argnums=(0, 1),
    )
    if not args.skip_memory_check:
        _check_memory(step_fn, shapes, tx, mesh, plan, args, lengths)
    manager = checkpoint.checkpoint_manager(args.checkpoint_dir, args.keep)

    # Process 0 picks the checkpoint and every process restores that one (they share the directory).
    latest = manager.latest_step() if first_process else None
    chosen = int(multihost_utils.broadcast_one_to_all(np.int64(-1 if latest is None else latest)))
    start: int | DataState = 0
    if chosen >= 0:
        saved = checkpoint.saved_param_shapes(manager, chosen)
        if saved != param_shapes(config):
            raise SystemExit(
                f"The checkpoint of step {chosen} in {args.checkpoint_dir} holds parameters of another model "
                f"({len(saved)} arrays, embed {saved.get('embed')}) than the flags describe (embed "
                f"{param_shapes(config)['embed']}). Pass the model flags it was trained with."
            )
        abstract = {
            "params": {n: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=p_shardings[n]) for n, s in shapes.items()},
            "opt_state": jax.tree.map(
                lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                jax.eval_shape(tx.init, shapes),
                o_shardings,
            ),
        }
        restored, start = checkpoint.restore(manager, chosen, abstract)
        params, opt_state = restored["params"], restored["opt_state"]
        print(f"resuming at step {chosen} from {args.checkpoint_dir}", file=sys.stderr)
    else:
        params = _place(init_params(config, args.seed), p_shardings)
        opt_state = init_opt_state(tx, params, o_shardings)

    if args.predictions_out:
        # An unknown task fails now, not after the whole run has trained.
        registry = _registry(args)
        for task in plan.task_names:
            registry.get_task(task)
    iterator = DataIterator(
        source,
        lengths,
        start=start,
        host_slice=host_slice(mesh),
        lookahead=args.lookahead,
        prefetch=args.prefetch,
        stop_step=args.steps,
    )

    log = BatchLog(args.log) if args.log and first_process else None
    reporter = StepReporter(args.steps, args.print_every) if first_process else None
    finished = False
    try:
        while True:
            waited_from = time.monotonic()
            batch = next(iterator, None)
            if batch is None:
                break
            data_wait_s = time.monotonic() - waited_from
            if batch.skipped:
                entry: dict[str, Any] = {"step": batch.step, "skipped": True}
            else:
                packed = sorted(name for name in batch.features if name not in lengths)
                if packed:
                    raise ValueError(
                        f"Step {batch.step}: the run's caches are packed (the batch has {packed}), but the example "
                        "model attends across a whole row and would mix the packed examples. Train it on unpacked "
                        "caches; a packing-aware model takes the segment ids and positions from the batch.")
                for name, array in batch.features.items():
                    if array.size and int(array.max()) >= config.vocab_size:
                        raise ValueError(
                            f"Step {batch.step}: feature {name!r} holds token id {int(array.max())}, outside the "
                            f"model's vocabulary of {config.vocab_size}. Pass --vocab-size of at least "
                            f"{int(array.max()) + 1} (the task's vocabulary size)."
                        )
                arrays = global_batch(batch, mesh)
                digest = gather_batch_hash(arrays)
                params, opt_state, loss = step_fn(params, opt_state, arrays)
                entry = {
                    "step": batch.step,
                    "hash": digest,
                    "loss": float(loss),
                    "examples": batch.global_batch_size,
                }
            if log is not None:
                log.write(entry)
            if reporter is not None:
                reporter.record(batch.step, entry.get("loss"), entry.get("examples", 0), data_wait_s)
            next_step = batch.step + 1
            stopping = _any_process(stop.requested)
            if stopping or next_step % args.checkpoint_every == 0 or next_step == args.steps:
                checkpoint.save(manager, {"params": params, "opt_state": opt_state}, iterator.state())
            if stopping:
                manager.wait_until_finished()
                print(f"stopped by SIGTERM; checkpointed step {next_step}", file=sys.stderr)
                finished = True
                return 0
        manager.wait_until_finished()
        if args.predictions_out:
            _predict(args, params, config, lengths)
        finished = True
        return 0
    finally:
        iterator.close()
        if log is not None:
            log.close()
        # After an error, one process commits what it saved; several leave through os._exit (see main),
        # since closing waits at barriers that peers blocked elsewhere would never reach.
        if finished or jax.process_count() == 1:
            manager.close()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
