"""``taskdata cache``: plan a cache build, run the Beam pipeline, verify, then commit.

The commit protocol: every file goes into a fresh version folder; the manifest is written after all
shards verify, ``COMPLETED`` (holding the manifest's hash) after the manifest, and the task's
``CURRENT`` pointer after that. A crash at any moment leaves either the previous complete version or
a folder without ``COMPLETED``, which nothing reads. A complete version is never modified or deleted.
While a job writes its version it holds a lease on it (``taskdata.cache.lease``), confirmed right before
the manifest is written; every job first removes the incomplete versions whose lease went stale (their
jobs died).

``CURRENT`` moves by compare-and-swap (``taskdata.cas``) against the pointer as the job read it when it
started. If another job moved it since, to a version of the same cache (the same task fingerprint and seed,
with every split of this one: byte for byte the same records), it stays there; otherwise this job's
version replaces it, as a job started later would. Either way the job logs what ``CURRENT`` named and
names now, and two jobs of one task at once leave one ``CURRENT`` naming a complete version.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from taskdata import cas, fs
from taskdata.cache.format import (
    CURRENT,
    FORMAT,
    CacheFormatError,
    Manifest,
    ShardEntry,
    SidecarEntry,
    SplitManifest,
    completed_bytes,
    completed_path,
    is_version_name,
    list_versions,
    load_manifest,
    manifest_bytes,
    task_dir,
)
from taskdata.cache.lease import (
    DEFAULT_STALE_AFTER_S,
    LeaseLostError,
    VersionLease,
    remove_abandoned_versions,
)
from taskdata.cache.stats import FeatureStats
from taskdata.config import Config

if TYPE_CHECKING:  # imported when the job runs: Beam only then, and the pipeline module imports Beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from taskdata.beam.pipeline import CacheJobSpec
    from taskdata.define.registry import Registry
    from taskdata.define.task import Task

__all__ = ["SEQIO_CACHE_VERSION", "CacheJobError", "CacheOptions", "CacheResult", "run_cache_job", "version_name"]

# On real C4 a shard of span-corruption records is ~1.1x the size of the uncompressed source text it
# came from, so sizing by source bytes keeps shards near the target (100-500 MB).
TARGET_SHARD_BYTES = 256 << 20
MIN_SHARDS = 4
# The seqio cache format that info.{split}.json follows: seqio parses "seqio_version" as a version, and
# below 0.0.0 (or without it) it would read int64 features as int32. taskdata's version has its own key.
SEQIO_CACHE_VERSION = "0.0.20"


class CacheJobError(RuntimeError):
    """A cache build that failed; the message names the task, the stage and the cause."""


@dataclasses.dataclass(frozen=True)
class CacheOptions:
    task: str
    output: str
    seed: int = 0
    num_shards: int | None = None
    splits: tuple[str, ...] | None = None
    force: bool = False
    verify: bool = True
    modules: tuple[str, ...] = ()
    beam_args: tuple[str, ...] = ()
    spill_buffer_bytes: int = 64 << 20
    progress: bool = True
    # Incomplete versions in which nothing was written for this long are removed as abandoned.
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    # Source shards with no records are an error (a broken export, usually) unless this says they are expected.
    allow_empty_source_files: bool = False
    # seqio tasks the workers bridge after importing ``modules`` (taskdata cache --seqio-task).
    seqio_tasks: tuple[str, ...] = ()
    # Pack the task's examples into rows at its sequence lengths (taskdata cache --pack), as if it had
    # been defined with Task.with_packing(); a task defined with packing is packed either way.
    pack: bool = False
    # What the built-in tasks read (and where they build it): the workers register them from this.
    config: Config = dataclasses.field(default_factory=Config)

    def __post_init__(self) -> None:
        from taskdata.seeding import check_seed

        check_seed(self.seed)
        if self.num_shards is not None and (not isinstance(self.num_shards, int) or self.num_shards <= 0):
            raise ValueError(f"Number of shards must be a positive integer but got {self.num_shards!r}.")
        if isinstance(self.stale_after_s, bool) or not isinstance(self.stale_after_s, int | float) \
                or not self.stale_after_s > 0:
            raise ValueError(f"stale_after_s must be a positive number of seconds but got {self.stale_after_s!r}.")


@dataclasses.dataclass(frozen=True)
class CacheResult:
    task: str
    version_dir: str
    reused: bool
    manifest: Manifest
    seconds: float


def run_cache_job(options: CacheOptions, registry: Registry, log: Callable[[str], None] | None = None) -> CacheResult:
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    started = time.monotonic()
    task = registry.get_task(options.task)
    if options.pack and task.packing is None:
        task = task.with_packing()
    splits = options.splits or task.splits
    for split in splits:
        task.source.check_split(split)
    task_fingerprint = task.fingerprint()
    _check_output_is_a_folder(options.output)
    # Absolute: workers (a Dask cluster's, a remote runner's) do not run in the launcher's current folder.
    root = task_dir(_absolute(options.output), task.name)
    # What this job replaces: CURRENT moves from this only (the module docstring says when it moves at all).
    started_on = cas.read(fs.join(root, CURRENT))
    remove_abandoned_versions(root, options.stale_after_s, log)

    reusable = None if options.force else _find_reusable(root, task_fingerprint, options, splits, log)
    if reusable is not None:
        manifest = load_manifest(reusable)
        _point_current_at(root, reusable, log)
        log(f"[cache] reusing complete cache {reusable} (same task fingerprint {task_fingerprint[:12]}, "
            f"seed {options.seed}); pass --force to rebuild")
        if manifest.format != FORMAT:
            log(f"[cache] that version is cache format {manifest.format}: its records carry seqio-style provenance, "
                f"~300 bytes per example more than format {FORMAT}'s; --force rebuilds it in {FORMAT}")
        return CacheResult(task.name, reusable, True, manifest, time.monotonic() - started)

    work: list[tuple[str, int, str]] = []
    num_shards: dict[str, int] = {}
    for split in splits:
        shards = task.source.list_shards(split)
        work.extend((split, i, path) for i, path in enumerate(shards))
        num_shards[split] = options.num_shards or _default_num_shards(task.source.estimated_bytes(split))

    from taskdata.beam import runners

    pipeline_options = runners.pipeline_options(options.beam_args, len(work))
    version = version_name(datetime.datetime.now(datetime.UTC), uuid.uuid4().hex[:8])
    version_dir = fs.join(root, version)
    tmp_dir = fs.join(version_dir, "_tmp")
    fs.makedirs(tmp_dir)
    probe = _check_writable(tmp_dir)
    from taskdata.beam.pipeline import CacheJobSpec
    from taskdata.sources.digest import digests_remembered_in

    spec = CacheJobSpec(
        task=task.name, task_fingerprint=task_fingerprint, modules=tuple(options.modules),
        config=options.config.to_tuple(), seed=options.seed, version_dir=version_dir, tmp_dir=tmp_dir,
        num_shards=tuple(sorted(num_shards.items())), spill_buffer_bytes=options.spill_buffer_bytes,
        allow_empty_source_files=options.allow_empty_source_files, digest_memo_dir=digests_remembered_in(),
        seqio_tasks=tuple(options.seqio_tasks), pack=options.pack,
        packing_lengths=None if task.packing_lengths is None else tuple(task.packing_lengths.items()),
        packing_open_rows=1 if task.packing is None else task.packing.open_rows,
    )
    log(f"[cache] task {task.name} (fingerprint {task_fingerprint[:12]}), seed {options.seed}, "
        + (f"packed into rows of {task.packing_lengths}, " if task.packing is not None else "")
        + ", ".join(f"{s}: {sum(1 for w in work if w[0] == s)} source shards -> {num_shards[s]} shards"
                    for s in splits))
    if runners.is_dask(pipeline_options):
        try:
            workers = runners.check_dask_cluster(pipeline_options, spec, probe)
        except runners.ClusterError as e:
            _remove_tree(version_dir)  # nothing but the probe was written
            raise CacheJobError(f"Cache build of task {task.name!r} cannot start: {e}") from e
        log(f"[cache] Dask cluster ready: {len(workers)} workers ({', '.join(workers)})")
    log(f"[cache] writing {version_dir}")
    # The lease tells later jobs that this version is being written; without it, they remove it once stale.
    with VersionLease(version_dir, refresh_s=min(30.0, options.stale_after_s / 10)) as lease:
        _run_pipeline(spec, work, pipeline_options, options, log)
        manifest = _finalize(task, spec, splits, num_shards, options, log)
        try:
            lease.confirm()
        except LeaseLostError as error:
            raise CacheJobError(f"Cache build of task {task.name!r}: {error}") from None
        data = manifest_bytes(manifest)
        fs.write_atomic(fs.join(spec.version_dir, "manifest.json"), data)
        fs.write_atomic(completed_path(spec.version_dir), completed_bytes(data))
        _commit_current(root, version_dir, manifest, started_on, log)
    _remove_tree(tmp_dir)
    seconds = time.monotonic() - started
    total_bytes = sum(s.bytes for split in manifest.splits.values() for s in split.shards)
    log(f"[cache] done in {seconds:.1f} s: " + ", ".join(
        f"{name}: {split.num_records} examples in {len(split.shards)} shards" for name, split in manifest.splits.items())
        + f"; {total_bytes / 1e6:.1f} MB at {version_dir}")
    return CacheResult(task.name, version_dir, False, manifest, seconds)


def version_name(built: datetime.datetime, suffix: str) -> str:
    """``v20261123T114254Z_e0bf6160``: sorts by build time, and is a valid seqio task-name part, so that
    seqio reads the version as its cached task ``{task}:{version}`` (versions named before used '-')."""
    return f"v{built:%Y%m%dT%H%M%S}Z_{suffix}"


def _default_num_shards(estimated_bytes: int | None) -> int:
    return max(MIN_SHARDS, math.ceil((estimated_bytes or 0) / TARGET_SHARD_BYTES))


def _absolute(output: str) -> str:
    return output if fs.is_remote(output) else os.path.abspath(output.removeprefix("file://"))


def _check_output_is_a_folder(output: str) -> None:
    """A local cache root, or the nearest of its parents that exists, must be a folder."""
    if fs.is_remote(output):
        return  # object stores have no files in the way of folders
    path = os.path.abspath(output)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise NotADirectoryError(
            f"--output {output} cannot be a cache root: {path} is a file, not a folder. Choose a folder (it is "
            "created if missing)."
        )


def _check_writable(folder: str) -> str:
    """Writes a small file in ``folder``; returns its path (remote workers look for it: they see the output)."""
    probe = fs.join(folder, ".write-probe")
    try:
        fs.write_atomic(probe, b"ok")
    except OSError as e:
        raise CacheJobError(f"Cannot write to the output folder {folder}: {e}. Choose a writable --output.") from e
    return probe


def _find_reusable(root: str, task_fingerprint: str, options: CacheOptions, splits: Sequence[str],
                   log: Callable[[str], None]) -> str | None:
    found = None
    for version in list_versions(root):
        version_dir = fs.join(root, version)
        if not fs.exists(completed_path(version_dir)):
            continue
        try:
            manifest = load_manifest(version_dir)
        except CacheFormatError as e:
            log(f"[cache] ignoring {version_dir}: {e}")
            continue
        if manifest.task_fingerprint != task_fingerprint:
            log(f"[cache] stale: {version_dir} was built from a different definition of {options.task} "
                f"(fingerprint {manifest.task_fingerprint[:12]}, now {task_fingerprint[:12]})")
            continue
        same_shards = options.num_shards is None or all(
            len(manifest.splits[s].shards) == options.num_shards for s in splits if s in manifest.splits)
        if manifest.seed == options.seed and set(splits) <= set(manifest.splits) and same_shards:
            found = version_dir
    return found


def _point_current_at(task_root: str, version_dir: str, log: Callable[[str], None]) -> None:
    """Moves the task's CURRENT pointer to ``version_dir`` (a complete version) unless it is already there.

    A job that died after a version's COMPLETED and before CURRENT moved leaves CURRENT on an older
    version; the rerun that reuses the new one must finish that step, or 'taskdata plan' pins the old.
    """
    name = _version_of(version_dir)
    named: list[bytes | None] = []

    def change(data: bytes | None) -> bytes | None:
        named.append(data)
        return None if _named(data) == name else name.encode() + b"\n"

    _, moved = cas.update(fs.join(task_root, CURRENT), change)
    if moved:
        log(f"[cache] CURRENT pointed at {_described(named[-1], task_root)}; moved it to {name}")


def _commit_current(task_root: str, version_dir: str, manifest: Manifest, started_on: cas.Version,
                    log: Callable[[str], None]) -> None:
    """Moves CURRENT from ``started_on`` (as the job read it when it started) to its new complete version,
    unless another job has since pointed it at a version of the same cache (module docstring)."""
    name = _version_of(version_dir)
    named: list[bytes | None] = []

    def change(data: bytes | None) -> bytes | None:
        named.append(data)
        if data != started_on.data and _same_cache(task_root, _named(data), manifest):
            return None
        return name.encode() + b"\n"

    _, moved = cas.update(fs.join(task_root, CURRENT), change)
    if not moved:
        log(f"[cache] another job committed the same cache while this one ran: CURRENT stays on "
            f"{_named(named[-1])} (this job's {name} is complete too)")
    elif named[-1] != started_on.data:
        log(f"[cache] another job moved CURRENT to {_described(named[-1], task_root)} while this one ran, from "
            f"another definition or seed; moved it to {name}")
    else:
        log(f"[cache] CURRENT moved from {_described(named[-1], task_root)} to {name}")


def _version_of(version_dir: str) -> str:
    return version_dir.rstrip("/").rsplit("/", 1)[-1]


def _named(pointer: bytes | None) -> str | None:
    """The version name a CURRENT pointer's bytes hold (None: no pointer; what cannot be a name is kept as
    text, which no version is called)."""
    return None if pointer is None else pointer.decode("utf-8", "replace").strip()


def _described(pointer: bytes | None, task_root: str) -> str:
    name = _named(pointer)
    if name is None:
        return "no version"
    if not is_version_name(name):
        return f"{name!r}, which is not a version folder name (a damaged pointer)"
    return fs.join(task_root, name)


def _same_cache(task_root: str, name: str | None, manifest: Manifest) -> bool:
    """Whether version ``name`` of ``task_root`` is complete and holds the same records as ``manifest``'s."""
    if name is None:
        return False
    try:
        other = load_manifest(fs.join(task_root, name))
    except (CacheFormatError, OSError):
        return False
    return (other.task_fingerprint == manifest.task_fingerprint and other.seed == manifest.seed
            and all(other.splits.get(split) == entry for split, entry in manifest.splits.items()))


def _run_pipeline(spec: CacheJobSpec, work: list[tuple[str, int, str]], pipeline_options: PipelineOptions,
                  options: CacheOptions, log: Callable[[str], None]) -> None:
    from taskdata.beam import runners
    from taskdata.beam.pipeline import build_cache_pipeline

    pipeline = runners.new_pipeline(pipeline_options)
    build_cache_pipeline(pipeline, spec, work)
    stop = threading.Event()
    shards_total = sum(count for _, count in spec.num_shards)
    reporter = threading.Thread(target=_report_progress, args=(spec.tmp_dir, len(work), shards_total, stop, log),
                                daemon=True)
    if options.progress:
        reporter.start()
    interrupts = _StickyInterrupts()
    try:
        with interrupts:
            runners.run_to_end(pipeline, pipeline_options)
            if interrupts.requested.is_set():
                raise KeyboardInterrupt  # Ctrl-C came and something swallowed every KeyboardInterrupt it made
    except (Exception, KeyboardInterrupt) as e:
        # Ctrl-C, which Beam re-raises from its worker thread as another exception type; or any error after a
        # Ctrl-C (what the interrupt broke): either way the user asked the job to stop.
        if interrupts.requested.is_set() or _interrupted(e):
            log(f"[cache] interrupted; the partial version {spec.version_dir} is not marked complete and will "
                "never be read")
            raise KeyboardInterrupt from e
        raise CacheJobError(f"Cache build of task {spec.task!r} failed in the Beam pipeline: "
                            f"{_root_cause(e)}\nThe partial version {spec.version_dir} is not marked "
                            "complete and will never be read; a later 'taskdata cache' of this task removes it "
                            "once nothing has been written to it for --stale-after seconds.") from e
    finally:
        stop.set()
        if reporter.is_alive():
            reporter.join()


class _StickyInterrupts:
    """Ctrl-C while the pipeline runs, made to stick: a KeyboardInterrupt can be swallowed where it lands (in
    user code that catches it, or in a callback whose exceptions are only printed), and the job would then
    run on, and might even mark its version complete. While this is entered (in the main thread, where Python
    runs signal handlers), SIGINT is recorded in ``requested`` as well as raised, and is raised again every
    ``every_s`` seconds (a real SIGINT to the main thread, which also ends a blocking wait) until the pipeline
    returns; the caller treats the run as interrupted whenever ``requested`` is set. A process that handles
    SIGINT itself (not Python's default handler) keeps its own handler."""

    def __init__(self, every_s: float = 2.0):
        self.every_s = every_s
        self.requested = threading.Event()
        self._done = threading.Event()
        self._repeater: threading.Thread | None = None

    def __enter__(self) -> _StickyInterrupts:
        if threading.current_thread() is threading.main_thread() and (
            signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            signal.signal(signal.SIGINT, self._on_sigint)
            self._repeater = threading.Thread(target=self._repeat, name="cache-interrupts", daemon=True)
            self._repeater.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        if self._repeater is None:
            return
        try:
            self._repeater.join()  # no SIGINT of ours arrives after this (one already sent raises here)
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self._repeater = None

    def _on_sigint(self, signum: int, frame: object) -> None:
        self.requested.set()
        raise KeyboardInterrupt

    def _repeat(self) -> None:
        main = threading.main_thread().ident
        while not self._done.wait(self.every_s):
            if self.requested.is_set() and main is not None:
                signal.pthread_kill(main, signal.SIGINT)


def _interrupted(error: BaseException) -> bool:
    return any(isinstance(cause, KeyboardInterrupt) or str(cause).startswith("KeyboardInterrupt")
               for cause in _chain(error))


def _root_cause(error: BaseException) -> str:
    """The line that says what broke, out of what Beam made of a worker's exception.

    In-process runners re-raise the worker's exception (its message suffixed with the step that ran
    it); remote ones raise a RuntimeError holding the worker's traceback as text. A PreprocessingError
    (the task, split, shard, stage and example) is searched for first, then any "...Error: message" line.
    """
    from taskdata.define.task import PreprocessingError

    text = str(error)
    for cause in _chain(error):
        if isinstance(cause, PreprocessingError):
            return _STEP_SUFFIX.sub("", str(cause)).strip()
    found = [m.group(1) for m in _PREPROCESSING_LINE.finditer(text)]
    if found:
        return _STEP_SUFFIX.sub("", found[-1]).strip()
    lines = [line.strip() for line in text.splitlines() if "Error:" in line or "Exception:" in line]
    return lines[-1] if lines else text.strip().splitlines()[-1] if text.strip() else repr(error)


_PREPROCESSING_LINE = re.compile(r"PreprocessingError: (.*)")
_STEP_SUFFIX = re.compile(r" \[while running '[^']*'\]")


def _chain(error: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in out:
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def _report_progress(tmp_dir: str, total: int, shards_total: int, stop: threading.Event,
                     log: Callable[[str], None]) -> None:
    """Logs a line when a stage makes progress, and at least every 15 s (see ``taskdata.beam.progress``)."""
    from taskdata.beam.pipeline import read_json
    from taskdata.beam.progress import JobProgress, progress_line

    sources = fs.join(tmp_dir, "results", "sources")
    shards = fs.join(tmp_dir, "results", "shards")
    started = stage_started = last_time = time.monotonic()
    read: dict[str, int] = {}
    written: dict[str, int] = {}
    last = None
    finished = False
    while not finished:
        finished = stop.wait(2.0)  # after the pipeline ends, one last look shows where it ended
        try:
            for folder, seen, key in ((sources, read, "examples"), (shards, written, "records")):
                for name in fs.listdir(folder) if fs.exists(folder) else []:
                    if name.endswith(".json") and name not in seen:
                        seen[name] = int(read_json(fs.join(folder, name))[key])
        except (OSError, ValueError, KeyError):
            continue
        progress = JobProgress(len(read), total, sum(read.values()), len(written), shards_total, sum(written.values()))
        now = time.monotonic()
        if last is not None and progress.stage != last.stage:
            stage_started = now
        if progress != last or now - last_time >= 15:
            log(progress_line(progress, now - stage_started, now - started))
            last, last_time = progress, now


def _finalize(task: Task, spec: CacheJobSpec, splits: Sequence[str], num_shards: dict[str, int], options: CacheOptions,
              log: Callable[[str], None]) -> Manifest:
    from taskdata.beam.pipeline import packing_result_path, read_json, shard_result_path, source_result_path

    split_manifests: dict[str, SplitManifest] = {}
    features: dict[str, Any] = {}
    for split in splits:
        sources = task.source.list_shards(split)
        stats = FeatureStats()
        counters: dict[str, int] = {}
        source_files = []  # the table that records' provenance/origin indexes (taskdata.cache.provenance)
        for index, path in enumerate(sources):
            result_path = source_result_path(spec.tmp_dir, split, index)
            if not fs.exists(result_path):
                raise CacheJobError(f"Source shard {index} ({path}) of split {split!r} has no result: the "
                                    "pipeline did not process it. Nothing was committed; rerun the job.")
            result = read_json(result_path)
            source_files.append(result["source_shard"])
            stats.merge(FeatureStats.from_json(result["stats"]))
            for key, value in result["counters"].items():
                counters[key] = counters.get(key, 0) + int(value)
            features = features or (result["features"] or {})
        shards, origins = [], []
        for dest in range(num_shards[split]):
            result_path = shard_result_path(spec.tmp_dir, split, dest)
            if not fs.exists(result_path):
                # No example fell into this key range: an empty shard keeps the file set complete.
                _write_empty_shard(spec, split, dest, num_shards[split])
            result = read_json(result_path)
            if "origins" in result:  # every shard of a cache of examples has its origins sidecar
                origins.append(SidecarEntry(**result.pop("origins")))
            shards.append(ShardEntry(**result))
        if spec.packing_lengths is not None:
            # The records are rows: seqio's files describe them; the counters say what they hold.
            rows = [read_json(packing_result_path(spec.tmp_dir, split, d)) for d in range(num_shards[split])]
            stats = _packed_split(split, rows, stats, counters)
        split_manifest = SplitManifest(shards=tuple(shards), source_shards=len(sources), counters=counters,
                                       source_files=tuple(source_files), origins=tuple(origins) or None)
        if split_manifest.num_records != stats.examples:
            raise CacheJobError(
                f"Split {split!r}: the shards hold {split_manifest.num_records} records but the source shards "
                f"produced {stats.examples} {'rows' if spec.packing_lengths else 'examples'}. Nothing was committed; "
                "rerun the job.")
        split_manifests[split] = split_manifest
        _write_seqio_files(spec.version_dir, split, _stored_features(features, spec), num_shards[split], stats)

    packing = None if spec.packing_lengths is None else {
        "lengths": dict(spec.packing_lengths), "open_rows": spec.packing_open_rows}
    manifest = Manifest(
        task=task.name, task_fingerprint=spec.task_fingerprint,
        fingerprints=task.component_fingerprints(), seed=spec.seed, taskdata_version=_version(),
        sequence_length=dict(task.sequence_length or {}), features=_stored_features(features, spec),
        splits=split_manifests, packing=packing,
    )
    if options.verify:
        from taskdata.cache.verify import verify_shards

        started = time.monotonic()
        problems = verify_shards(spec.version_dir, manifest)
        if problems:
            raise CacheJobError(f"Verification of the new cache failed, nothing was committed: {problems[0]}")
        log(f"[cache] 3/3 verified every record of {sum(s.num_records for s in split_manifests.values()):,} "
            f"in {time.monotonic() - started:.1f} s")
    return manifest


def _stored_features(features: dict[str, Any], spec: CacheJobSpec) -> dict[str, Any]:
    """The features of the records: the examples' own, or those of the rows they are packed into."""
    if spec.packing_lengths is None or not features:
        return features
    from taskdata.beam.rows import packed_feature_info

    return packed_feature_info(features, dict(spec.packing_lengths))


def _packed_split(split: str, rows: list[dict[str, Any]], examples: FeatureStats,
                  counters: dict[str, int]) -> FeatureStats:
    """The row statistics of a packed split; adds its packing counters (examples, rows, tokens) to ``counters``.

    Every example must be in exactly one row: the rows' example count must be the source shards' count.
    """
    packed = sum(int(r["examples"]) for r in rows)
    if packed != examples.examples:
        raise CacheJobError(f"Split {split!r}: the packed rows hold {packed} examples but the source shards produced "
                            f"{examples.examples}. Nothing was committed; rerun the job.")
    stats = FeatureStats()
    for r in rows:
        stats.merge(FeatureStats.from_json(r["stats"]))
        for key, value in r["tokens"].items():
            counters[f"packing/{key}_tokens"] = counters.get(f"packing/{key}_tokens", 0) + int(value)
    counters["packing/examples"] = packed
    counters["packing/rows"] = stats.examples
    return stats


def _write_empty_shard(spec: CacheJobSpec, split: str, dest: int, num_shards: int) -> None:
    from taskdata.beam.pipeline import write_output_shard

    write_output_shard(spec, split, dest, [])


def _write_seqio_files(version_dir: str, split: str, features: dict[str, Any], num_shards: int,
                       stats: FeatureStats) -> None:
    info = {"features": features, "num_shards": num_shards, "seqio_version": SEQIO_CACHE_VERSION,
            "taskdata_version": _version()}
    fs.write_atomic(fs.join(version_dir, f"info.{split}.json"), (json.dumps(info, indent=2, sort_keys=True) + "\n").encode())
    fs.write_atomic(fs.join(version_dir, f"stats.{split}.json"),
                    (json.dumps(stats.to_json(), indent=2, sort_keys=True) + "\n").encode())


def _version() -> str:
    import taskdata

    return taskdata.__version__


def _remove_tree(path: str) -> None:
    fs_, inner = fs.filesystem(path)
    if fs_.exists(inner):
        fs_.rm(inner, recursive=True)

