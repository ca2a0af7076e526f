"""The ``taskdata`` command line.

Only the standard library is imported at module level so that ``taskdata --help`` and ``taskdata list``
answer quickly; each command imports what it uses. Options are parsed once here and passed down.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # each command imports these when it runs (see above)
    from server.settings import Settings
    from taskdata.cache.verify import Level
    from taskdata.config import Config
    from taskdata.define.registry import Registry
    from taskdata.evaluation import TargetsSource
    from taskdata.index import RunPlan
    from taskdata.runs import ExampleLedger, StepLedger

__all__ = ["main"]


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--module", action="append", default=[], metavar="MODULE",
        help="import this Python module before looking up names, so the tasks it registers are known "
             "(repeatable; e.g. --module my_project.tasks; the current folder is searched first, as by python -m)",
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
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error, and Beam's worker logs (also $TASKDATA_DEBUG=1)")
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
                             help="train a vocabulary (T5's special ids) on a task's source text, deterministically: a "
                                  "SentencePiece model, or a byte-level BPE tokenizer.json (Hugging Face tokenizers)")
    p.add_argument("--task", required=True)
    p.add_argument("--kind", choices=("sentencepiece", "bpe"), default="sentencepiece",
                   help="sentencepiece: a SentencePiece .model (unigram, as T5's); bpe: a Hugging Face tokenizers "
                        "tokenizer.json, byte-level BPE as GPT-2's (for HuggingFaceVocabulary). Default: sentencepiece")
    p.add_argument("--size", type=int, required=True,
                   help="number of pieces (without extra ids); for bpe, of tokens (3 special, 256 bytes, then merges)")
    p.add_argument("--out", required=True, help="output file (.model for sentencepiece, tokenizer.json for bpe)")
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
                    "--direct_num_workers=2' for several processes). On a Dask cluster: '-- --runner=dask "
                    "--dask_client_address=tcp://HOST:8786' (Beam's apache_beam.runners.dask.dask_runner.DaskRunner; "
                    "needs taskdata[dask]): the job first checks that the scheduler answers and that every worker "
                    "loads the task and sees --output, then runs each source shard as one Dask task.",
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
    p.add_argument("--pack", action="store_true",
                   help="pack examples into rows at the task's sequence lengths (t5x's *_segment_ids/*_positions "
                        "layout); a task defined with packing is packed either way")
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
        "same run again does nothing; a different plan under an existing name is refused. With --add-stage, "
        "append stages to an existing run instead (only --name, --cache-root and --current-step then).",
    )
    p.add_argument("--name", required=True, help="run name (letters, digits, '_', '.', ':')")
    p.add_argument("--mixture", help="task or mixture to train on (required to create a run)")
    p.add_argument("--cache-root", default=None, help="cache root (default: {--home}/caches)")
    p.add_argument("--seed", type=int, help="orders every epoch after the first (required to create a run)")
    p.add_argument(
        "--batch-size", type=int, help="global batch size (the ramp's start with --ramp-to; required to create a run)"
    )
    p.add_argument(
        "--ramp-to", type=int, default=None, help="ramp the global batch size linearly to this size"
    )
    p.add_argument("--ramp-steps", type=int, default=0, help="steps of the ramp")
    p.add_argument("--multiple-of", type=int, default=1, help="every ramp batch size is a multiple of this")
    p.add_argument(
        "--num-data-shards",
        type=int,
        help="slices each global batch is split into (hosts holding one model replica share one; required to "
        "create a run)",
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="START:STOP",
        help="skip the data of steps [START, STOP) (repeatable)",
    )
    p.add_argument("--split", default="train", help="cache split to read (default train)")
    stages = p.add_argument_group(
        "stages",
        "change the mixing rates and/or the global batch size from a step on. A stage is "
        "STEP:ITEM,ITEM,... where an ITEM is TASK=RATE (every task of the run; 0 leaves one out), "
        "batch=SIZE, or batch=START..END/STEPS (a ramp from STEP on) with multiple-of=M. E.g. "
        "--stage 200000:c4_span_corruption=0.5,c4_prefix_lm=0.5 --stage 300000:batch=4096",
    )
    stages.add_argument("--stage", action="append", default=[], metavar="STAGE",
                        help="a stage of the new run (repeatable, in step order)")
    stages.add_argument("--add-stage", action="append", default=[], metavar="STAGE",
                        help="append a stage to the existing run --name (repeatable)")
    stages.add_argument(
        "--current-step", type=int, metavar="STEP",
        help="with --add-stage: a step no trainer of the run has read yet, its lookahead included (the step it "
             "trains next plus what it fetched ahead); a new stage must start at or after it",
    )
    p.add_argument(
        "--epoch-order",
        default=None,
        metavar="KIND",
        help="order of epochs after the first (taskdata.index.orders): 'windowed' (the default of new runs, with "
        "--block-size 64 and --width the largest batch: shuffled blocks of contiguous records, each dealt out over "
        "--block-size steps at one place of the batch; one request per block for a client that knows that many "
        "steps ahead), 'block' (the same blocks read together: a block's records share a batch every epoch) or "
        "'feistel' (per record: every later-epoch example is its own ranged read)",
    )
    p.add_argument("--block-size", type=int, default=None,
                   help="records per block of --epoch-order block or windowed")
    p.add_argument("--width", type=int, default=None,
                   help="with --epoch-order windowed: a task's examples per global step (default: --batch-size)")
    p.set_defaults(run=_cmd_plan)

    p = sub.add_parser(
        "ledger",
        help="which examples a step of a run read, or at which steps one example is read",
        description="By step: every example of the step (or of one host's slice) with its stable id, cache "
        "shard and record, and the source file and documents it was made from. By example (a stable id "
        "'task/split/source_shard/ordinal'): every step and data shard at which the run reads it, found by "
        "inverting the index math.",
    )
    p.add_argument("run_name", metavar="RUN", help="a stored run (see 'taskdata plan')")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--step", type=int, help="the step whose examples to list")
    which.add_argument("--example", metavar="ID", help="the stable id of the example to find")
    p.add_argument("--host", type=int, help="with --step: only this host's slice (with --num-hosts)")
    p.add_argument("--num-hosts", type=int, help="with --host: the hosts reading the run")
    p.add_argument("--from-step", type=int, default=0, help="with --example: list reads from this step on")
    p.add_argument("--until-step", type=int, help="with --example: list (and count) reads before this step")
    p.add_argument("--limit", type=int, default=100, help="with --example: list at most this many reads")
    p.add_argument("--cache-root", default=None, help="cache root (default: {--home}/caches)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_cmd_ledger)

    p = sub.add_parser("summary", help="where a run stands before a step: per task, per host, the stage")
    p.add_argument("run_name", metavar="RUN", help="a stored run")
    p.add_argument("--step", type=int, required=True, help="the run as it stands before this step")
    p.add_argument("--cache-root", default=None, help="cache root (default: {--home}/caches)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_cmd_summary)

    p = sub.add_parser(
        "plot", help="draw a run's mixture proportions, epochs and batch size over steps, and its token lengths"
    )
    p.add_argument("run_name", metavar="RUN", help="a stored run")
    p.add_argument("--out", required=True, help="PNG file to write (local or gs://)")
    p.add_argument("--until-step", type=int, help="last step drawn (default: past the last stage)")
    p.add_argument("--cache-root", default=None, help="cache root (default: {--home}/caches)")
    p.set_defaults(run=_cmd_plot)

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
    p.add_argument("--insecure", action="store_true",
                   help="serve without a bearer token on an address other than loopback (anyone who can connect "
                        "reads every run and may create runs)")
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
        help="largest request line plus headers (default 65536); larger: 431 (none on a kept-alive connection's later "
        "request) and the connection is closed",
    )
    limits.add_argument(
        "--header-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="time to send a request line and headers, from connecting or from a request's first byte "
        "(default 10); slower: 408 (none on a kept-alive connection's later request) and the connection is closed",
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


def _version() -> str:
    import taskdata  # already imported: this module is inside it

    return taskdata.__version__


def _config(args: argparse.Namespace) -> Config:
    """The one ``Config`` of this command: flags first, then ``$TASKDATA_*``, then the defaults."""
    from taskdata.config import Config

    return Config.from_environment(
        home=getattr(args, "home", None), c4_dir=getattr(args, "c4_dir", None), vocab=getattr(args, "vocab", None)
    )


def _registry(args: argparse.Namespace) -> Registry:
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


def _short_name(obj: object) -> str:
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
    from taskdata.define.bpe_training import train_bpe_from_task
    from taskdata.define.vocab_training import train_from_task

    task = _registry(args).get_task(args.task)
    train = train_bpe_from_task if args.kind == "bpe" else train_from_task
    path = train(task, args.split, args.size, args.out, max_docs=args.max_docs)
    print(f"wrote {path}")
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from taskdata.extras import require

    require("apache_beam", "cache", "taskdata cache")
    from taskdata.beam.job import CacheOptions, run_cache_job
    from taskdata.define.mixture import Mixture

    _quiet_beam_logs(args.debug)
    if args.task is None and not (args.seqio_task or args.seqio_mixture):
        raise ValueError("Name what to cache: --task NAME, or --seqio-task NAME / --seqio-mixture NAME with the "
                         "--module that registers it in seqio.")
    registry = _registry(args)
    names: list[str] = []
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
            stale_after_s=args.stale_after, seqio_tasks=(name,) if name in bridged else (), pack=args.pack,
        )
        result = run_cache_job(options, registry)
        print(result.version_dir)
        _log_seqio_location(result.version_dir, quiet=args.quiet)
    return 0


def _quiet_beam_logs(debug: bool) -> None:
    """Beam logs a failing worker's traceback before the job's own one-line error, and Dask's client (with
    --runner=dask) its lost connections; show them only with --debug."""
    import logging

    logging.getLogger("apache_beam").setLevel(logging.INFO if debug else logging.CRITICAL)
    if debug:
        return
    # distributed sets its loggers' levels from Dask's config when it is imported (a later setLevel would lose).
    quiet = {"distributed": "critical", "distributed.client": "critical"}
    if "distributed" in sys.modules:
        for name in quiet:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        return
    try:
        import dask
    except ImportError:
        return  # no Dask (taskdata[dask]): nothing of it can log
    dask.config.set({"logging": quiet})


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
    registry: Registry,
    *,
    cache_targets: Callable[[str, int | None], TargetsSource] | None = None,
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


def _verify_root(root: str, level: Level, workers: int) -> int:
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
    from taskdata.index import (
        BatchSchedule,
        PlanError,
        SkipRange,
        epoch_order,
        parse_stage,
        reads_bound,
        requests_bound,
    )
    from taskdata.runs import RunStore, build_run, default_epoch_order

    if args.add_stage:
        return _add_stages(args)
    if args.current_step is not None:
        raise ValueError("--current-step goes with --add-stage (appending stages to an existing run).")
    missing = [f"--{flag.replace('_', '-')}" for flag in ("mixture", "seed", "batch_size", "num_data_shards")
               if getattr(args, flag) is None]
    if missing:
        raise ValueError(f"Creating run {args.name!r} needs {', '.join(missing)} (or --add-stage to extend it).")

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
    stages = [parse_stage(text) for text in args.stage]
    # The order's options, from the flags that name them (each order checks which it takes); no order named
    # is the default of new runs (build_run), whose options the flags may change.
    kind = args.epoch_order
    options = {name: value for name, value in (("block_size", args.block_size), ("width", args.width))
               if value is not None}
    order = None
    if kind == "windowed" or (kind is None and options):
        default = default_epoch_order(schedule, stages)
        kind, options = "windowed", {"block_size": default.block_size, "width": default.width, **options}
    if kind is not None:
        try:
            order = epoch_order(kind, **options)
        except PlanError as error:
            raise ValueError(f"--epoch-order {kind}: {error}") from None
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
        stages=stages,
        warn=lambda message: print(f"taskdata plan: warning: {message}", file=sys.stderr),
        epoch_order=order,
    )
    store = RunStore(root)
    created = store.create(run)
    print(
        f"{'created' if created else 'unchanged'} {store.path(run.name)}: fingerprint {run.plan.fingerprint()}"
    )
    plan = run.plan
    # The largest batch of any stage has the largest slices, and the bound grows with the slice.
    schedules = [plan.schedule] + [stage.schedule for stage in plan.stages if stage.schedule is not None]
    slice_size = max(max(s.start, s.end) for s in schedules) // plan.num_data_shards
    order = plan.epoch_order
    print(
        f"epoch order {order.describe()}: at most {reads_bound(plan, slice_size)} ranged reads per "
        f"data shard ({slice_size} examples) at any step"
    )
    if order.read_horizon:
        record_bytes = _largest_record(root, plan)
        held = order.records_held(slice_size)
        print(
            f"knowing {order.read_horizon} steps ahead (DataIterator's default lookahead covers it), a data shard "
            f"makes at most {requests_bound(plan, slice_size)} requests per step after its first (when a task's "
            f"examples per step are the width) and keeps at most {held:,} records for later steps "
            f"({held * record_bytes / 2**20:,.1f} MiB at the caches' largest record of {record_bytes:,} bytes)"
        )
    return 0


def _largest_record(root: str, plan: RunPlan) -> int:
    """The largest record of the split the plan reads, over its tasks' pinned cache versions."""
    from taskdata.cache.format import find_version, load_manifest, task_dir

    largest = 0
    for task in plan.task_names:
        version = find_version(task_dir(root, task), plan.caches[task].fingerprint)
        if version is not None:
            largest = max(largest, load_manifest(version).split(plan.split).max_record_bytes)
    return largest


def _add_stages(args: argparse.Namespace) -> int:
    """``taskdata plan --name R --add-stage STEP:... --current-step S``: stages appended to a stored run."""
    from taskdata.index import parse_stage
    from taskdata.runs import RunStore

    given = [f"--{flag.replace('_', '-')}" for flag in ("mixture", "seed", "batch_size", "ramp_to", "num_data_shards")
             if getattr(args, flag) is not None] + (["--stage"] if args.stage else []) + (["--skip"] if args.skip else [])
    if given:
        raise ValueError(f"--add-stage extends the stored run {args.name!r}; {', '.join(given)} only apply when "
                         "creating a run.")
    if args.current_step is None:
        raise ValueError(
            "--add-stage needs --current-step: a step no trainer of the run has read yet (the step it trains next "
            "plus its lookahead, e.g. 1016 for a trainer at step 1000 fetching 16 steps ahead)."
        )
    stages = [parse_stage(text) for text in args.add_stage]
    store = RunStore(args.cache_root or _config(args).cache_root)
    for stage in stages:
        run, added = store.add_stage(args.name, stage, current_step=args.current_step)
        print(f"{'added' if added else 'unchanged'} stage at step {stage.start} to {store.path(run.name)}: "
              f"fingerprint {run.plan.fingerprint()} (steps before {stage.start}: "
              f"{run.plan.fingerprint_before(stage.start)})")
    return 0


def _stored_plan(args: argparse.Namespace) -> tuple[Any, str]:
    """(plan, cache root) of the stored run ``args.run_name``."""
    from taskdata.runs import RunStore

    root = args.cache_root or _config(args).cache_root
    store = RunStore(root)
    run = store.get(args.run_name)
    if run is None:
        raise ValueError(f"There is no run {args.run_name!r} under {root}; runs: {store.names()}. Create it with "
                         "'taskdata plan'.")
    return run.plan, root


def _cmd_ledger(args: argparse.Namespace) -> int:
    import json

    from taskdata.runs import StepLedger, example_ledger, open_views, step_ledger

    if args.step is None and (args.host is not None or args.num_hosts is not None):
        raise ValueError("--host and --num-hosts go with --step (a host's slice of a step).")
    if args.example is None and (args.from_step, args.until_step, args.limit) != (0, None, 100):
        raise ValueError("--from-step, --until-step and --limit go with --example.")
    plan, root = _stored_plan(args)
    views = open_views(plan, root)
    ledger: StepLedger | ExampleLedger
    try:
        if args.step is not None:
            ledger = step_ledger(plan, views, args.step, host=args.host, num_hosts=args.num_hosts)
        else:
            ledger = example_ledger(plan, views, args.example, from_step=args.from_step,
                                    until_step=args.until_step, limit=args.limit)
    finally:
        for view in views.values():
            view.close()
    if args.json:
        print(json.dumps(ledger.to_dict(), indent=1))
    elif isinstance(ledger, StepLedger):
        print(_format_step_ledger(ledger))
    else:
        print(_format_example_ledger(ledger))
    return 0


def _format_step_ledger(ledger: StepLedger) -> str:
    where = "every data shard" if ledger.data_shard is None else f"data shard {ledger.data_shard}"
    lines = [
        f"run {ledger.run} step {ledger.step:,} ({where} of {ledger.num_data_shards}, stage {ledger.stage}, global "
        f"batch {ledger.global_batch_size:,}, positions {ledger.positions.start:,}..{ledger.positions.stop - 1:,}); "
        f"fingerprint {ledger.fingerprint}",
    ]
    if ledger.skipped:
        lines.append("SKIPPED: the plan skips this step; these examples are never delivered")
    lines.append(f"{'position':>14} {'shard':>5} {'task':<24} {'epoch':>6} {'cache shard:record':>18}  "
                 f"{'id':<40} source file [documents]")
    for e in ledger.entries:
        documents = "" if e.documents is None else f" [{e.documents[0]}..{e.documents[1]}]"
        lines.append(f"{e.position:>14,} {e.data_shard:>5} {e.task:<24} {e.epoch:>6} {f'{e.shard}:{e.record}':>18}  "
                     f"{e.id:<40} {e.source_file or '-'}{documents}")
    return "\n".join(lines)


def _format_example_ledger(ledger: ExampleLedger) -> str:
    span = f"steps {ledger.from_step:,}.." + ("(no end)" if ledger.until_step is None else f"{ledger.until_step - 1:,}")
    lines = [f"example {ledger.id}: task {ledger.task}, cache shard {ledger.shard} record {ledger.record} (record "
             f"{ledger.index} of the task's order); run {ledger.run}"]
    if ledger.total is not None:
        lines.append(f"read {ledger.total:,} times in {span} ({ledger.skipped:,} of them in skipped steps)")
    lines.append(f"{'epoch':>8} {'step':>14} {'position':>16} {'data shard':>10}")
    for read in ledger.reads:
        lines.append(f"{read.epoch:>8,} {read.step:>14,} {read.position:>16,} {read.data_shard:>10}"
                     + ("  (skipped: not delivered)" if read.skipped else ""))
    if ledger.truncated:
        lines.append(f"... more reads in {span}: raise --limit, or list them from a later --from-step")
    elif not ledger.reads:
        lines.append(f"not read in {span}")
    return "\n".join(lines)


def _cmd_summary(args: argparse.Namespace) -> int:
    import json

    from taskdata.runs import format_summary, open_views, summarize

    plan, root = _stored_plan(args)
    views = open_views(plan, root)
    try:
        summary = summarize(plan, views, args.step)
    finally:
        for view in views.values():
            view.close()
    print(json.dumps(summary, indent=1) if args.json else format_summary(summary))
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from taskdata.runs import open_views
    from taskdata.runs.plot import plot_run

    plan, root = _stored_plan(args)
    views = open_views(plan, root)
    try:
        drawn = plot_run(plan, views, args.out, until_step=args.until_step)
    finally:
        for view in views.values():
            view.close()
    print(f"wrote {args.out}: steps 0..{drawn['until_step']:,}, {drawn['stages']} stage starts marked")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from taskdata.extras import require

    require("fastapi", "server", "taskdata serve")

    from server.main import create_app
    from server.serving import serve
    from server.settings import Settings
    from server.state import state_of
    from taskdata.exits import EXIT_DATA

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
    settings = _serve_settings(Settings, {key: value for key, value in given.items() if value is not None})
    _check_token_or_warn(settings, insecure=args.insecure)
    app = create_app(settings)
    state = state_of(app)  # a bad runs file or default run is a one-line error here, before uvicorn starts
    runs = [name for name, _ in state.run_names()]
    print(f"taskdata serve: cache root {state.resolver.cache_root}; {len(runs)} run(s): "
          f"{', '.join(runs) or 'none yet (create one with taskdata plan)'}", file=sys.stderr, flush=True)
    if not serve(app, settings, access_log=not args.no_access_log):
        return EXIT_DATA  # uvicorn said why (e.g. the port is taken)
    return 0


def _serve_settings(settings_type: type[Settings], given: dict[str, Any]) -> Settings:
    """The server's settings, with pydantic's wording of a bad value reduced to our own message."""
    from pydantic import ValidationError

    try:
        return settings_type(**given)
    except ValidationError as e:
        problems = [
            error["msg"].removeprefix("Value error, ")
            if error["type"] == "value_error"
            else f"{'.'.join(str(part) for part in error['loc']) or 'settings'}: {error['msg']} (got {error.get('input')!r})"
            for error in e.errors()
        ]
        raise ValueError(" ".join(problems)) from None


_LOOPBACK = ("127.", "::1", "localhost")


def _check_token_or_warn(settings: Settings, *, insecure: bool) -> None:
    """No token: refused outside loopback unless --insecure, and a loud warning in any case."""
    if settings.token is not None:
        return
    where = f"{settings.host}:{settings.port}"
    if not settings.host.startswith(_LOOPBACK) and not insecure:
        raise ValueError(
            f"Refusing to serve {where} without a bearer token: anyone who can connect could read every run and "
            "create runs. Give --token-file FILE (or $TASKDATA_SERVER_TOKEN), or pass --insecure on a trusted "
            "network."
        )
    print(f"taskdata serve: WARNING: no bearer token: every route on {where} is open to anyone who can connect. "
          "Give --token-file FILE (or $TASKDATA_SERVER_TOKEN) to require one.", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; the exit codes are ``taskdata.exits``' (0 ok, 1 a check failed, 2 a user error...)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after a bare '--' belongs to Beam (pipeline options), not to us.
    beam_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, beam_args = argv[:cut], argv[cut + 1 :]
    debug = "--debug" in argv or bool(os.environ.get("TASKDATA_DEBUG"))  # accepted anywhere before '--'
    argv = [arg for arg in argv if arg != "--debug"]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.beam_args = beam_args
    args.debug = debug
    if getattr(args, "module", None) and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # --module finds the current folder's packages, as 'python -m' does
    from taskdata.beam.job import CacheJobError  # light: Beam itself is imported only when a job runs
    from taskdata.cache.ranges import RangeReadError
    from taskdata.cas import ContentionError
    from taskdata.define.registry import UnknownNameError
    from taskdata.exits import run_command
    from taskdata.fingerprint import FingerprintError

    # Expected failures (bad names, bad input, missing files) get one clear line, not a traceback.
    return run_command(
        f"taskdata {args.command}",
        lambda: args.run(args),
        usage_errors=(ValueError, UnknownNameError, OSError, ImportError, FingerprintError),
        data_errors=(CacheJobError, RangeReadError, ContentionError),
        debug=debug,
    )


if __name__ == "__main__":
    sys.exit(main())
