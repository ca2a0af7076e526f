"""The ``taskdata`` command line.

Only the standard library is imported at module level so that ``taskdata --help`` and ``taskdata list``
answer quickly; each command imports what it uses. Options are parsed once here and passed down.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["main"]


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--module", action="append", default=[], metavar="MODULE",
        help="import this Python module before looking up names, so the tasks it registers are known "
             "(repeatable; e.g. --module my_project.tasks)",
    )
    common.add_argument(
        "--c4-dir", metavar="DIR",
        help="folder (local or gs://) with C4 JSON-lines files (c4-train.*-of-*.json.gz) for the built-in "
             "tasks; default: $TASKDATA_C4_DIR, else the built-in corpus",
    )
    common.add_argument(
        "--vocab", metavar="MODEL",
        help="SentencePiece model (local or gs://) for the built-in tasks; default: $TASKDATA_VOCAB, else "
             "the one trained on the built-in corpus",
    )
    common.add_argument(
        "--seqio-task", action="append", default=[], metavar="NAME",
        help="register the seqio Task NAME (from a --module) as a taskdata task of the same name: its source and "
             "preprocessors up to its CacheDatasetPlaceholder, with seqio's seeds (repeatable; needs taskdata[seqio])",
    )
    common.add_argument(
        "--seqio-mixture", action="append", default=[], metavar="NAME",
        help="register the seqio Mixture NAME and each of its tasks, with seqio's rates (repeatable; needs "
             "taskdata[seqio])",
    )
    common.add_argument(
        "--home", metavar="DIR",
        help="folder of the built-in corpus and vocabulary and of the default cache root; default: "
             "$TASKDATA_HOME, else ~/.cache/taskdata",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common_options()
    parser = argparse.ArgumentParser(
        prog="taskdata",
        description="Deterministic, seqio-style data pipelines: define tasks, cache them with Beam, serve "
                    "shard assignments to trainer hosts.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("list", parents=[common], help="list registered tasks and mixtures")
    p.set_defaults(run=_cmd_list)

    p = sub.add_parser("show", parents=[common], help="show a task's or mixture's definition and fingerprint")
    p.add_argument("name")
    p.set_defaults(run=_cmd_show)

    p = sub.add_parser("inspect", parents=[common],
                       help="print decoded examples straight from the source through the preprocessors (no Beam)")
    p.add_argument("name", help="a task name")
    p.add_argument("--split", default="train")
    p.add_argument("-n", "--num-examples", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="preprocessing seed (default 0)")
    p.set_defaults(run=_cmd_inspect)

    vocab = sub.add_parser("vocab", help="vocabulary tools")
    vocab_sub = vocab.add_subparsers(dest="vocab_command", metavar="SUBCOMMAND", required=True)
    p = vocab_sub.add_parser("train", parents=[common],
                             help="train a SentencePiece model (T5 conventions) on a task's source text, deterministically")
    p.add_argument("--task", required=True)
    p.add_argument("--size", type=int, required=True, help="number of pieces (without extra ids)")
    p.add_argument("--out", required=True, help="output .model file")
    p.add_argument("--split", default="train")
    p.add_argument("--max-docs", type=int, default=None, help="use at most this many documents")
    p.set_defaults(run=_cmd_vocab_train)

    p = sub.add_parser(
        "cache", parents=[common],
        help="build a deterministic, globally shuffled TFRecord cache of a task with Apache Beam",
        description="Build a cache version of a task: preprocess every source shard with Beam, shuffle globally "
                    "by a keyed hash of (seed, example id), write sorted shards with offsets, verify, then commit. "
                    "Beam pipeline options go after '--', e.g. 'taskdata cache --task X -- --runner=DataflowRunner "
                    "--project=P --region=R --temp_location=gs://B/tmp --setup_file=./setup.py'. Without --runner, "
                    "Beam's local Python runner is used ('-- --direct_running_mode=multi_processing "
                    "--direct_num_workers=2' for several processes).",
    )
    p.add_argument("--task", help="task (or mixture: each of its tasks) to cache; or give --seqio-task / "
                                  "--seqio-mixture to cache seqio's")
    p.add_argument("--output", default=None,
                   help="cache root, local or gs:// (default: {--home}/caches)")
    p.add_argument("--seed", type=int, default=0, help="shuffle and preprocessing seed (default 0), recorded in the manifest")
    p.add_argument("--num-shards", type=int, default=None,
                   help="output shards per split (default: ~256 MB per shard, at least 4)")
    p.add_argument("--split", action="append", default=None, dest="splits",
                   help="split to cache (repeatable; default: every split of the source)")
    p.add_argument("--force", action="store_true", help="build a new version even if a matching complete one exists")
    p.add_argument("--no-verify", action="store_true", help="skip re-reading every record before committing")
    p.add_argument("--stale-after", type=float, default=900.0, metavar="SECONDS",
                   help="remove incomplete versions of the task in which nothing was written for this long (their "
                        "jobs died; a running job rewrites its lease every 30 s); default 900")
    p.add_argument("--allow-empty-source-files", action="store_true",
                   help="accept source files with no records (by default an empty or zero-byte file is an error)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(run=_cmd_cache)

    p = sub.add_parser("eval", parents=[common],
                       help="score prediction files against a task's or mixture's targets")
    _add_eval_arguments(p)
    p.set_defaults(run=_cmd_eval)

    p = sub.add_parser("verify", help="re-read every record of a cache and check it against its manifest")
    p.add_argument("cache", help="a version folder, a task folder (its CURRENT version is verified), or a cache "
                                 "root (every task's CURRENT version is verified, one line per task)")
    p.add_argument("--level", choices=("full", "listing"), default="full",
                   help="'full' (default): every byte, every record's CRCs, every shard's sha256; 'listing': "
                        "COMPLETED, every file's size and every offsets sidecar, reading no record")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="N",
                   help="shards verified at once, each by its own thread (default: the number of CPUs)")
    p.set_defaults(run=_cmd_verify)

    p = sub.add_parser(
        "plan",
        parents=[common],
        help="create a training run over the current caches of a task or mixture (stored in the cache root)",
        description="Pin the CURRENT complete cache version of every task of a task or mixture in a run plan and "
        "store it as {cache root}/_runs/{name}.json, where every server replica finds it. Creating the "
        "same run again does nothing; a different plan under an existing name is refused.",
    )
    p.add_argument("--name", required=True, help="run name (letters, digits, '_', '.', ':')")
    p.add_argument("--mixture", required=True, help="task or mixture to train on")
    p.add_argument("--cache-root", default=None, help="cache root (default: {--home}/caches)")
    p.add_argument("--seed", type=int, required=True, help="orders every epoch after the first")
    p.add_argument(
        "--batch-size", type=int, required=True, help="global batch size (the ramp's start with --ramp-to)"
    )
    p.add_argument(
        "--ramp-to", type=int, default=None, help="ramp the global batch size linearly to this size"
    )
    p.add_argument("--ramp-steps", type=int, default=0, help="steps of the ramp")
    p.add_argument("--multiple-of", type=int, default=1, help="every ramp batch size is a multiple of this")
    p.add_argument(
        "--num-data-shards",
        type=int,
        required=True,
        help="slices each global batch is split into (hosts holding one model replica share one)",
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="START:STOP",
        help="skip the data of steps [START, STOP) (repeatable)",
    )
    p.add_argument("--split", default="train", help="cache split to read (default train)")
    p.set_defaults(run=_cmd_plan)

    p = sub.add_parser(
        "serve",
        parents=[common],
        help="serve read instructions to trainer hosts (GET /shards?host=H&step=S) over HTTP",
        description="Run the assignment service under uvicorn. The bearer token, if any, comes from "
        "$TASKDATA_SERVER_TOKEN or --token-file (never from the command line); every other setting "
        "can also come from $TASKDATA_SERVER_<NAME>.",
    )
    p.add_argument(
        "--cache-root",
        default=None,
        help="cache root (default: $TASKDATA_SERVER_CACHE_ROOT, then {--home}/caches)",
    )
    p.add_argument(
        "--runs-file", default=None, help="JSON list of run plans to serve besides the stored runs"
    )
    p.add_argument("--default-run", default=None, help="run answered when /shards has no run parameter")
    p.add_argument("--token-file", default=None, help="file holding the bearer token clients must send")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8000)")
    p.add_argument("--no-access-log", action="store_true", help="do not log every request")
    p.add_argument(
        "--first-use-check",
        choices=("full", "listing"),
        default=None,
        help="how a run's caches are verified on first use: 'full' (default) re-reads every byte; 'listing' "
        "checks COMPLETED, file sizes and offsets sidecars in seconds (for caches that passed 'taskdata verify'; "
        "trainers still verify every record they read)",
    )
    p.add_argument("--verify-workers", type=int, default=None, metavar="N",
                   help="threads verifying shards on first use (default 4)")
    limits = p.add_argument_group(
        "limits",
        "what a client may send before it is refused (also $TASKDATA_SERVER_MAX_BODY_BYTES, "
        "..._MAX_HEADER_BYTES, ..._HEADER_TIMEOUT_SECONDS, ..._KEEP_ALIVE_SECONDS)",
    )
    limits.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="largest request body (default 1048576); larger: 413",
    )
    limits.add_argument(
        "--max-header-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="largest request line plus headers (default 65536); larger: 431 and the connection is closed",
    )
    limits.add_argument(
        "--header-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="time to send a request line and headers, from connecting or from a request's first byte "
        "(default 10); slower: 408 and the connection is closed",
    )
    limits.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long an idle connection stays open between requests (default 15; behind a load balancer, "
        "more than the balancer's own idle timeout)",
    )
    p.set_defaults(run=_cmd_serve)
    return parser


def _config(args: argparse.Namespace) -> Any:
    """The one ``Config`` of this command: flags first, then ``$TASKDATA_*``, then the defaults."""
    from taskdata.config import Config

    return Config.from_environment(
        home=getattr(args, "home", None), c4_dir=getattr(args, "c4_dir", None), vocab=getattr(args, "vocab", None)
    )


def _registry(args: argparse.Namespace) -> Any:
    from taskdata.sources.digest import remember_digests_in
    from taskdata.tasks import default_registry

    config = _config(args)
    remember_digests_in(os.path.join(config.home, "source-digests"))  # hash local source files once
    registry = default_registry(config)
    seqio_names = args.seqio_task or args.seqio_mixture
    if seqio_names:
        from taskdata.seqio_bridge import add_seqio_mixture, add_seqio_task, import_seqio

        import_seqio()  # before the modules: they import seqio, which needs protobuf's check relaxed first
    for module in args.module:
        registry.load_module(module)
    if seqio_names:
        for name in args.seqio_task:
            add_seqio_task(name, registry)
        for name in args.seqio_mixture:
            add_seqio_mixture(name, registry)
    return registry


def _cmd_list(args: argparse.Namespace) -> int:
    from taskdata.define.mixture import Mixture

    registry = _registry(args)
    for name in registry.names():
        item = registry.get(name)
        if isinstance(item, Mixture):
            # The exact rate as written, then the share of examples it gives: 'a=1/10 (10%)'.
            parts = ", ".join(
                f"{t}={r} ({float(share) * 100:.3g}%)"
                for t, r, share in zip(item.task_names, item.rates, item.shares, strict=True)
            )
            print(f"mixture  {name}  [{parts}]")
        else:
            steps = " -> ".join(_short_name(p) for p in item.preprocessors)
            print(f"task     {name}  {type(item.source).__name__} -> {steps}")
    return 0


def _short_name(obj: Any) -> str:
    return getattr(obj, "__qualname__", type(obj).__name__)


def _cmd_show(args: argparse.Namespace) -> int:
    import json

    from taskdata.define.mixture import Mixture
    from taskdata.fingerprint import describe

    registry = _registry(args)
    item = registry.get(args.name)
    print(f"name:        {item.name}")
    print(f"kind:        {'mixture' if isinstance(item, Mixture) else 'task'}")
    print(f"registered:  {registry.origin(item.name)}")
    print(f"fingerprint: {item.fingerprint()}")
    print("definition:")
    print(json.dumps(describe(item), indent=2, sort_keys=True))
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    import numpy as np

    from taskdata.seeding import format_example_id

    task = _registry(args).get_task(args.name)
    if args.num_examples <= 0:
        raise SystemExit(f"-n must be a positive number of examples but got {args.num_examples}.")
    shown = 0
    last_shard, ordinal = -1, 0
    for ctx, example in task.iter_examples(args.split, seed=args.seed):
        ordinal = ordinal + 1 if ctx.shard_index == last_shard else 0
        last_shard = ctx.shard_index
        print(f"--- example {format_example_id(task.name, args.split, ctx.shard_index, ordinal)}")
        for key, value in example.items():
            feature = task.output_features.get(key)
            if feature is not None and feature.dtype != "string":
                ids = np.asarray(value)
                print(f"{key} ({len(ids)} ids): {ids[:16].tolist()}{' ...' if len(ids) > 16 else ''}")
                print(f"{key} (decoded): {feature.vocabulary.decode(ids)!r}")
            else:
                text = repr(value)
                print(f"{key}: {text[:300]}{'...' if len(text) > 300 else ''}")
        shown += 1
        if shown == args.num_examples:
            break
    if shown < args.num_examples:
        print(f"(split {args.split!r} has only {shown} examples)")
    return 0


def _cmd_vocab_train(args: argparse.Namespace) -> int:
    from taskdata.define.vocab_training import train_from_task

    task = _registry(args).get_task(args.task)
    path = train_from_task(task, args.split, args.size, args.out, max_docs=args.max_docs)
    print(f"wrote {path}")
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from taskdata.beam.job import CacheOptions, run_cache_job
    from taskdata.define.mixture import Mixture

    if args.task is None and not (args.seqio_task or args.seqio_mixture):
        raise ValueError("Name what to cache: --task NAME, or --seqio-task NAME / --seqio-mixture NAME with the "
                         "--module that registers it in seqio.")
    registry = _registry(args)
    names = []
    for given in [args.task] if args.task is not None else [*args.seqio_task, *args.seqio_mixture]:
        item = registry.get(given)
        names.extend(item.task_names if isinstance(item, Mixture) else [item.name])
    bridged = set(args.seqio_task) | {t for m in args.seqio_mixture for t in registry.get_mixture(m).task_names}
    for name in dict.fromkeys(names):
        options = CacheOptions(
            task=name, output=args.output or _config(args).cache_root, seed=args.seed, num_shards=args.num_shards,
            splits=tuple(args.splits) if args.splits else None, force=args.force, verify=not args.no_verify,
            modules=tuple(args.module), beam_args=tuple(args.beam_args), progress=not args.quiet,
            config=_config(args), allow_empty_source_files=args.allow_empty_source_files,
            stale_after_s=args.stale_after, seqio_tasks=(name,) if name in bridged else (),
        )
        result = run_cache_job(options, registry)
        print(result.version_dir)
        _log_seqio_location(result.version_dir, quiet=args.quiet)
    return 0


def _log_seqio_location(version_dir: str, quiet: bool) -> None:
    from taskdata.seqio_bridge.reader import seqio_cache_location  # no seqio import: names and paths only

    if not quiet:
        cache_dir, name = seqio_cache_location(version_dir)
        print(f"[cache] seqio reads it as cached task {name!r} after seqio.add_global_cache_dirs([{cache_dir!r}])",
              file=sys.stderr)


def _cmd_eval(args: argparse.Namespace) -> int:
    return run_eval(args, _registry(args))


def _add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the task or mixture to evaluate")
    parser.add_argument(
        "--split", default="validation", help="the split the predictions are for (default: validation)"
    )
    parser.add_argument(
        "--predictions",
        nargs="+",
        action="extend",
        required=True,
        metavar="FILE",
        help="JSON-lines prediction files, local or gs:// (repeatable; glob patterns such as "
        "'preds-*.jsonl' are expanded)",
    )
    parser.add_argument(
        "--cache", metavar="DIR", help="read the targets from this cache instead of recomputing them"
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="score the examples that have a prediction and report how many do not",
    )
    parser.add_argument(
        "--output", metavar="FILE", help="also write the report as JSON to FILE (local or gs://)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="the seed the evaluated examples were built with (required without --cache)",
    )


def run_eval(
    args: argparse.Namespace,
    registry: Any,
    *,
    cache_targets: Callable[[str, int | None], Any] | None = None,
) -> int:
    """Runs ``taskdata eval``: prints the report table, writes the JSON report if asked.

    Returns 0 on success and 1 when the predictions cannot be evaluated (the reason goes to stderr).
    Usage errors (unknown name, no --seed) raise ``ValueError`` or ``UnknownNameError`` for the command
    line's usual handling. ``cache_targets`` builds the targets of ``--cache`` (default: ``CacheTargets``).
    """
    from taskdata.evaluation import (
        CacheTargets,
        EvaluationError,
        SourceTargets,
        evaluate,
        expand_prediction_paths,
        format_report,
        write_report,
    )

    item = registry.get(args.name)
    if args.cache is not None:
        targets = (cache_targets or CacheTargets)(args.cache, args.seed)
    elif args.seed is None:
        raise ValueError(
            "--seed is required when the targets are recomputed from the task's source (no --cache): give "
            "the seed the evaluated examples were built with, e.g. --seed 0."
        )
    else:
        targets = SourceTargets(seed=args.seed)
    try:
        report = evaluate(
            item,
            args.split,
            expand_prediction_paths(args.predictions),
            targets,
            allow_partial=args.allow_partial,
        )
    except EvaluationError as e:
        print(f"taskdata eval: error: {e}", file=sys.stderr)
        return 1
    print(format_report(report))
    if args.output:
        write_report(report, args.output)
        print(f"wrote {args.output}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from taskdata import fs
    from taskdata.cache.format import current_version
    from taskdata.cache.verify import verify_version

    if args.workers < 1:
        raise ValueError(f"--workers must be at least 1 but got {args.workers}.")
    version_dir = args.cache
    if not fs.exists(fs.join(version_dir, "manifest.json")) and not fs.exists(fs.join(version_dir, "COMPLETED")):
        if not fs.exists(fs.join(version_dir, "CURRENT")):
            return _verify_root(args.cache, args.level, args.workers)
        version_dir = current_version(version_dir)
    checked: list[str] = []
    problems = verify_version(version_dir, on_shard=checked.append, level=args.level, workers=args.workers)
    if problems:
        print(f"FAILED {version_dir}: {problems[0]}")
        return 1
    print(f"OK {version_dir}: {len(checked)} shards, {_VERIFIED[args.level]}")
    return 0


_VERIFIED = {"full": "every record verified", "listing": "listing verified (sizes and offsets sidecars)"}


def _verify_root(root: str, level: str, workers: int) -> int:
    """Every task's CURRENT version under a cache root: one line per task; 1 if any fails."""
    from taskdata.cache.verify import task_folders, verify_current

    tasks = task_folders(root)
    if not tasks:
        raise FileNotFoundError(f"{root} is neither a cache version (no manifest.json), a task folder with a CURRENT "
                                "version, nor a cache root holding task folders with CURRENT versions.")
    failed = 0
    for task in tasks:
        result = verify_current(root, task, level=level, workers=workers)
        if result.ok:
            print(f"OK {result.version_dir}: {result.shards} shards, {_VERIFIED[level]}")
        else:
            failed += 1
            print(f"FAILED {result.version_dir or task}: {result.problem}")
    print(f"{len(tasks) - failed} of {len(tasks)} tasks under {root} verified")
    return 1 if failed else 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from taskdata.index import BatchSchedule, SkipRange
    from taskdata.runs import RunStore, build_run

    skip = []
    for text in args.skip:
        start, sep, stop = text.partition(":")
        if not sep or not start.isdigit() or not stop.isdigit():
            raise ValueError(
                f"--skip must be START:STOP with integer steps (e.g. 1200:1300) but got {text!r}."
            )
        skip.append(SkipRange(int(start), int(stop)))
    end = args.batch_size if args.ramp_to is None else args.ramp_to
    schedule = BatchSchedule(
        start=args.batch_size, end=end, ramp_steps=args.ramp_steps, multiple_of=args.multiple_of
    )
    root = args.cache_root or _config(args).cache_root
    run = build_run(
        _registry(args),
        root,
        name=args.name,
        mixture=args.mixture,
        seed=args.seed,
        schedule=schedule,
        num_data_shards=args.num_data_shards,
        skip=skip,
        split=args.split,
        warn=lambda message: print(f"taskdata plan: warning: {message}", file=sys.stderr),
    )
    store = RunStore(root)
    created = store.create(run)
    print(
        f"{'created' if created else 'unchanged'} {store.path(run.name)}: fingerprint {run.plan.fingerprint()}"
    )
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from server.main import create_app
    from server.protocol import limited_protocol
    from server.settings import Settings
    from server.state import state_of

    given = {
        "cache_root": args.cache_root,
        "runs_file": args.runs_file,
        "default_run": args.default_run,
        "token_file": args.token_file,
        "host": args.host,
        "port": args.port,
        "modules": tuple(args.module) or None,
        "home": args.home,
        "c4_dir": args.c4_dir,
        "vocab": args.vocab,
        "max_body_bytes": args.max_body_bytes,
        "max_header_bytes": args.max_header_bytes,
        "header_timeout_seconds": args.header_timeout,
        "keep_alive_seconds": args.keep_alive_timeout,
        "first_use_check": args.first_use_check,
        "verify_workers": args.verify_workers,
    }
    settings = Settings(**{key: value for key, value in given.items() if value is not None})
    app = create_app(settings)
    state_of(app)  # a bad runs file or default run is a one-line error here, before uvicorn starts
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        access_log=not args.no_access_log,
        log_level="info",
        workers=1,
        # httptools (a declared dependency) with the header limits uvicorn lacks; uvloop is picked too
        # where it is installed. No WebSocket route exists, so no upgrade is accepted.
        http=limited_protocol(settings),
        ws="none",
        timeout_keep_alive=settings.keep_alive_seconds,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after a bare '--' belongs to Beam (pipeline options), not to us.
    beam_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, beam_args = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.beam_args = beam_args
    from taskdata.beam.job import CacheJobError  # light: Beam itself is imported only when a job runs
    from taskdata.define.registry import UnknownNameError
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, UnknownNameError, FileNotFoundError, ModuleNotFoundError, PermissionError,
            CacheJobError) as e:
        # Expected failures (bad names, bad input, missing files) get one clear line, not a traceback.
        if os.environ.get("TASKDATA_DEBUG"):
            raise
        print(f"taskdata {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
