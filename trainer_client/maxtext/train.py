"""MaxText's own pre-training loop on a taskdata run, with no edit to MaxText's files.

    python -m trainer_client.maxtext.train --cache-root ROOT --run lm [--eval-run lm_validation] -- \\
        MAXTEXT_CONFIG.yml run_name=my_run max_target_length=512 vocab_size=8000 per_device_batch_size=2 ...

Everything after ``--`` is MaxText's own command line (``python -m maxtext.trainers.pre_train.train ...``), to
which the launcher adds ``dataset_type=olmo_grain``; it then runs MaxText's ``train.main`` as that module does
(``absl.app.run``). Several processes: start one per host with ``--coordinator HOST:PORT --num-processes P
--process-id I`` (the launcher initializes ``jax.distributed`` before MaxText, which then leaves it as is; on
TPU VMs leave them out and MaxText initializes it itself).

**What it hooks, and why.** MaxText picks its input pipeline in ``input_pipeline_interface.create_data_iterator``
from a closed list of ``dataset_type`` values (another one trains on synthetic data with a warning), and its
config refuses unknown types and keys, so a pipeline MaxText does not ship can only come in by replacing a
name MaxText looks up. The launcher replaces two: ``make_olmo_grain_train_iterator`` and
``make_olmo_grain_eval_iterator`` in that module, which ``create_data_iterator`` reads when it runs, with
taskdata's factories (``pipeline.train_iterator`` and ``eval_iterator``, same signature ``(config, mesh,
process_indices)``). So MaxText's own code still decides which processes load data, builds the placeholder
iterators of the others and wires the eval iterator. ``olmo_grain`` because it is the one dataset type whose
checkpoints hold no iterator state and whose config nothing else checks: the pipeline resumes stateless from
the step MaxText restores (``resume``), as MaxText's own ``olmo_grain`` pipeline does.

Exit codes as for every taskdata command: 2 for a setting or run the pipeline cannot honour (one line on
stderr naming it and the fix), 3 when reading fails (a cache or the assignment server), else MaxText's own.
MaxText's data loader turns an error of the data iterator into a graceful stop (exit 0, "Training stopped");
the launcher keeps the pipeline's error and ends with it instead.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

from taskdata.cache.format import CacheFormatError
from taskdata.exits import run_command
from taskdata.index import PlanError
from trainer_client.assignments import AssignmentError
from trainer_client.iterator import ResumeError
from trainer_client.maxtext.errors import MaxTextConfigError
from trainer_client.maxtext.pipeline import RunRows, TaskdataInput, eval_iterator, train_iterator

__all__ = ["DATASET_TYPE", "install", "main"]

PROG = "python -m trainer_client.maxtext.train"
DATASET_TYPE = "olmo_grain"
_HOOKED = ("make_olmo_grain_train_iterator", "make_olmo_grain_eval_iterator")
Factory = Callable[[TaskdataInput, Any, Any, Sequence[int]], Any]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0],
        usage=f"{PROG} (--cache-root DIR | --server URL) --run NAME [options] -- MAXTEXT_CONFIG.yml [key=value ...]")
    source = p.add_argument_group("data (one of --cache-root or --server)")
    source.add_argument("--cache-root", help="read the runs and their caches from this cache root, without a server")
    source.add_argument("--server", help="assignment server URL, e.g. http://127.0.0.1:8000")
    source.add_argument("--token-file", help="file holding the server's bearer token")
    source.add_argument("--run", required=True, help="the training run ('taskdata plan --name NAME ...')")
    source.add_argument("--eval-run", help="the run MaxText's evals read (a plan with --split validation); needed "
                                           "when eval_interval > 0")
    source.add_argument("--feature", default="targets",
                        help="the caches' token feature, stored with its _segment_ids and _positions (default targets)")
    source.add_argument("--batch-log", metavar="DIR",
                        help="append each step's row digests to DIR/process_I.jsonl (trainer_client.maxtext.batch_log)")
    source.add_argument("--lookahead", type=int, default=16, help="steps of read instructions per request")
    source.add_argument("--prefetch", type=int, default=4, help="batches read ahead of the train step")
    source.add_argument("--workers", type=int, default=0,
                        help="processes that read batches (0: threads of MaxText's process read them)")
    hosts = p.add_argument_group("hosts (leave out where MaxText initializes jax.distributed itself)")
    hosts.add_argument("--coordinator", help="HOST:PORT of process 0, to run several processes")
    hosts.add_argument("--num-processes", type=int, default=1)
    hosts.add_argument("--process-id", type=int, default=0)
    hosts.add_argument("--init-timeout", type=int, default=120, help="seconds to wait for every process to join")
    p.add_argument("--debug", action="store_true", help="print the traceback of an error")
    p.add_argument("maxtext", nargs=argparse.REMAINDER,
                   help="after '--': MaxText's config file and key=value overrides")
    return p


def install(settings: TaskdataInput) -> list[RunRows]:
    """Makes MaxText's ``olmo_grain`` dataset type read ``settings`` (see the module docstring). Returns the list
    that every ``RunRows`` MaxText then builds is added to."""
    from maxtext.input_pipeline import input_pipeline_interface as interface

    missing = [name for name in _HOOKED if not hasattr(interface, name)]
    if missing:
        raise MaxTextConfigError(
            f"This MaxText's input_pipeline_interface has no {missing}, the names taskdata's pipeline takes the place "
            "of: it supports maxtext 0.2.5 (deploy/maxtext_env.sh)."
        )
    built: list[RunRows] = []

    def kept(factory: Factory, config: Any, mesh: Any, process_indices: Sequence[int]) -> Any:
        iterator = factory(settings, config, mesh, process_indices)
        built.append(iterator.dataloader)
        return iterator

    interface.make_olmo_grain_train_iterator = functools.partial(kept, train_iterator)
    interface.make_olmo_grain_eval_iterator = functools.partial(kept, eval_iterator)
    return built


def maxtext_argv(args: Sequence[str]) -> list[str]:
    """MaxText's command line (config file, then overrides) with ``dataset_type=olmo_grain``."""
    args = list(args[1:] if args and args[0] == "--" else args)
    if not args or "=" in args[0]:
        raise MaxTextConfigError(
            "Give MaxText's config file after '--', e.g. '-- $(python -c \"import maxtext, os; print(os.path.dirname("
            f"maxtext.__file__))\")/configs/base.yml run_name=my_run ...' (got {args})."
        )
    for arg in args[1:]:
        key, _, value = arg.partition("=")
        if key == "dataset_type" and value != DATASET_TYPE:
            raise MaxTextConfigError(
                f"dataset_type={value}: the launcher feeds MaxText through dataset_type={DATASET_TYPE} (its slot is "
                "taskdata's pipeline); leave dataset_type out."
            )
    return [*args, f"dataset_type={DATASET_TYPE}"]


def _initialize_distributed(args: argparse.Namespace) -> None:
    import jax

    if args.coordinator is None:
        if args.num_processes != 1:
            raise MaxTextConfigError("--num-processes > 1 needs --coordinator HOST:PORT (process 0's address).")
        return
    # CPU hosts need a collectives backend for cross-process programs; TPU and GPU ignore this.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                               process_id=args.process_id, initialization_timeout=args.init_timeout)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        from absl import app
        from maxtext.trainers.pre_train import train

        token = None
        if args.token_file:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        settings = TaskdataInput(
            run=args.run, cache_root=args.cache_root, server=args.server, token=token, eval_run=args.eval_run,
            feature=args.feature, batch_log=args.batch_log, lookahead=args.lookahead, prefetch=args.prefetch,
            workers=args.workers)
        command = [PROG, *maxtext_argv(args.maxtext)]
        _initialize_distributed(args)
        built = install(settings)
        code = 0
        try:
            app.run(train.main, argv=command)
        except SystemExit as end:  # absl ends the process with main's outcome: hand it back as the exit code
            code = int(end.code or 0) if not isinstance(end.code, str) else 1
        failures = [rows.failure for rows in built if rows.failure is not None]
        if failures:  # MaxText stopped "gracefully" on the pipeline's error: end with that error instead
            raise failures[0]
        return code

    return run_command(
        PROG, body, debug=args.debug,
        usage_errors=(MaxTextConfigError, ResumeError, PlanError, CacheFormatError, FileNotFoundError),
        data_errors=(AssignmentError,))


if __name__ == "__main__":
    sys.exit(main())
