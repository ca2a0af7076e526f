"""An example trainer: a tiny encoder-decoder trained on a cached task with exact, elastic resume.

    python -m trainer_client.example.train --server http://127.0.0.1:8000 --run c4_sc --steps 1000 \\
        --checkpoint-dir ckpt --log batches.jsonl
    python -m trainer_client.example.train --cache-root ~/.taskdata/caches --run c4_sc ...   (no server)

Several hosts: start one process per host with ``--coordinator HOST:PORT --num-processes P
--process-id I`` (``jax.distributed``). Every host reads its slice of each global batch (from the
mesh: ``--model-axis`` devices per model replica) and the train step is one ``jax.jit`` with explicit
in/out shardings over the (data, model) mesh.

Checkpoints hold parameters, Adam state, the step and the run fingerprint (``trainer_client.
checkpoint``), every ``--checkpoint-every`` steps and at the end. SIGTERM makes every host stop at
the same step boundary (the hosts agree on it at every step), checkpoint and exit 0; a restart with
the same arguments resumes at that exact step, on the same or another number of hosts. The log gets
one JSON line per step with the hash of the global batch as assembled across hosts.

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
from collections.abc import Sequence
from typing import Any

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
    source.add_argument("--lookahead", type=int, default=16, help="steps of read instructions per request")
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
    train.add_argument("--vocab-size", type=int, default=32128)
    train.add_argument("--d-model", type=int, default=32)
    train.add_argument("--num-heads", type=int, default=2)
    train.add_argument("--head-dim", type=int, default=16)
    train.add_argument("--d-ff", type=int, default=64)

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
        help="import this module to register the run's tasks (their vocabularies decode the predictions)",
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

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True


def _initialize_distributed(args: argparse.Namespace) -> None:
    import jax

    if args.coordinator is None:
        if args.num_processes != 1:
            raise SystemExit("--num-processes > 1 needs --coordinator HOST:PORT (process 0's address).")
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
    )


def _any_process(flag: bool) -> bool:
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return flag
    return bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).max())


def _to_host(tree: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    from jax.experimental import multihost_utils

    # A collective: every process calls it, and every process gets the whole arrays.
    return {
        name: np.asarray(value) for name, value in multihost_utils.process_allgather(tree, tiled=True).items()
    }


def _place(values: dict[str, Any], specs: dict[str, Any], mesh: Any) -> dict[str, Any]:
    import jax
    from jax.sharding import NamedSharding

    return {
        name: jax.make_array_from_callback(
            value.shape, NamedSharding(mesh, specs[name]), lambda i, v=value: v[i]
        )
        for name, value in values.items()
    }


def _source(args: argparse.Namespace) -> Any:
    if (args.server is None) == (args.cache_root is None):
        raise SystemExit("Give exactly one of --server URL or --cache-root DIR.")
    if args.server is not None:
        from trainer_client.server_source import ServerAssignments

        token = None
        if args.token_file:
            with open(args.token_file) as f:
                token = f.read().strip()
        return ServerAssignments(args.server, args.run, token=token, retry_seconds=args.retry_seconds)
    from taskdata.runs import RunStore
    from trainer_client.local_source import LocalAssignments

    stored = RunStore(args.cache_root).get(args.run)
    if stored is None:
        raise SystemExit(
            f"No run {args.run!r} under {args.cache_root}/_runs; create it with 'taskdata plan --name {args.run} ...'."
        )
    return LocalAssignments.from_cache_root(stored, args.cache_root)


def _registry(args: argparse.Namespace) -> Any:
    from taskdata.config import Config
    from taskdata.tasks import default_registry

    # The trainer is an entry point: $TASKDATA_VOCAB / $TASKDATA_C4_DIR / $TASKDATA_HOME apply here.
    registry = default_registry(Config.from_environment())
    for module in args.module:
        registry.load_module(module)
    return registry


def _predict(args: argparse.Namespace, params: Any, config: Any, lengths: dict[str, int]) -> None:
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stop = _StopRequest()
    _initialize_distributed(args)

    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from trainer_client.arrays import (
        batch_sharding,
        gather_batch_hash,
        global_batch,
        host_slice,
        make_mesh,
        replicated,
    )
    from trainer_client.example.adam import AdamConfig, adam_specs, adam_update, init_adam
    from trainer_client.example.batch_log import BatchLog
    from trainer_client.example.checkpoint import latest_checkpoint, list_checkpoints, save_checkpoint
    from trainer_client.example.model import ModelConfig, init_params, loss_fn, param_shapes, param_specs
    from trainer_client.iterator import DataIterator, DataState

    if args.compilation_cache:
        jax.config.update("jax_compilation_cache_dir", args.compilation_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    first_process = jax.process_index() == 0
    mesh = make_mesh(args.model_axis)
    config = ModelConfig(args.vocab_size, args.d_model, args.num_heads, args.head_dim, args.d_ff)
    config.check_model_axis(mesh.shape["model"])
    adam = AdamConfig(args.learning_rate)
    p_specs = param_specs(config)
    o_specs = adam_specs(p_specs)

    # Process 0 picks the checkpoint and every process loads that one (they share the directory).
    steps = list_checkpoints(args.checkpoint_dir) if first_process else []
    chosen = int(multihost_utils.broadcast_one_to_all(np.int64(steps[-1] if steps else -1)))
    start: int | DataState = 0
    if chosen >= 0:
        checkpoint = latest_checkpoint(args.checkpoint_dir, chosen)
        assert checkpoint is not None
        host_params = {
            k[len("params/") :]: v for k, v in checkpoint.arrays.items() if k.startswith("params/")
        }
        host_opt = {k[len("opt/") :]: v for k, v in checkpoint.arrays.items() if k.startswith("opt/")}
        saved = {name: tuple(value.shape) for name, value in host_params.items()}
        if saved != param_shapes(config):
            raise SystemExit(
                f"The checkpoint of step {checkpoint.step} in {args.checkpoint_dir} holds parameters of another "
                f"model ({len(saved)} arrays, embed {saved.get('embed')}) than the flags describe "
                f"(embed {param_shapes(config)['embed']}). Pass the model flags it was trained with."
            )
        start = checkpoint.data
        print(f"resuming at step {checkpoint.step} from {args.checkpoint_dir}", file=sys.stderr)
    else:
        host_params = init_params(config, args.seed)
        host_opt = init_adam(host_params)
    params, opt = _place(host_params, p_specs, mesh), _place(host_opt, o_specs, mesh)

    source = _source(args)
    if args.predictions_out:
        # An unknown task fails now, not after the whole run has trained.
        registry = _registry(args)
        for task in source.run_info().plan.task_names:
            registry.get_task(task)
    lengths = {"inputs": args.inputs_length, "targets": args.targets_length}
    iterator = DataIterator(
        source,
        lengths,
        start=start,
        host_slice=host_slice(mesh),
        lookahead=args.lookahead,
        prefetch=args.prefetch,
        stop_step=args.steps,
    )

    def train_step(params: Any, opt: Any, batch: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, config)
        params, opt = adam_update(params, grads, opt, adam)
        return params, opt, loss

    p_shardings = {n: jax.sharding.NamedSharding(mesh, s) for n, s in p_specs.items()}
    o_shardings = {n: jax.sharding.NamedSharding(mesh, s) for n, s in o_specs.items()}
    data_sharding = {name: batch_sharding(mesh) for name in lengths}
    step_fn = jax.jit(
        train_step,
        in_shardings=(p_shardings, o_shardings, data_sharding),
        out_shardings=(p_shardings, o_shardings, replicated(mesh)),
        donate_argnums=(0, 1),
    )
    log = BatchLog(args.log) if args.log and first_process else None

    def checkpoint_now() -> None:
        arrays = {f"params/{k}": v for k, v in _to_host(params).items()}
        arrays.update({f"opt/{k}": v for k, v in _to_host(opt).items()})
        state = iterator.state()
        if first_process:
            save_checkpoint(
                args.checkpoint_dir, state.step, iterator.info.name, state, arrays, keep=args.keep
            )
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"checkpoint {state.step}")

    try:
        for batch in iterator:
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
                params, opt, loss = step_fn(params, opt, arrays)
                entry = {
                    "step": batch.step,
                    "hash": digest,
                    "loss": float(loss),
                    "examples": batch.global_batch_size,
                }
            if log is not None:
                log.write(entry)
            next_step = batch.step + 1
            stopping = _any_process(stop.requested)
            if stopping or next_step % args.checkpoint_every == 0 or next_step == args.steps:
                checkpoint_now()
            if stopping:
                print(f"stopped by SIGTERM; checkpointed step {next_step}", file=sys.stderr)
                return 0
        if args.predictions_out:
            _predict(args, params, config, lengths)
        return 0
    finally:
        iterator.close()
        if log is not None:
            log.close()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
