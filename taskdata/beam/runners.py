"""Which Beam runner runs the cache job, and whether it can run there.

- No ``--runner`` (or ``DirectRunner``, ``direct``): Beam's Python runner (``FnApiRunner``), in this process
  or, with ``--direct_running_mode=multi_processing``, in local worker processes. Not ``DirectRunner`` itself,
  which first tries to download the Prism runner.
- ``--runner=dask`` (or ``DaskRunner``, or the class path ``DASK_RUNNER``): Beam's Dask runner, on the
  ``distributed`` scheduler at ``--dask_client_address`` (or ``--dask_scheduler_file``). Every source shard is
  its own Dask task unless ``--dask_npartitions`` or ``--dask_partition_size`` says otherwise (Beam's default
  puts up to 128 in one task, so a job of fewer source shards would run on one worker). Before the job writes
  anything, ``check_dask_cluster`` connects, waits for a worker and has every worker load the task and find
  the job's folder, so that a scheduler that is not there, has no workers, or whose workers run other code or
  cannot reach the output fails the job with one line instead of hanging, or of starting a throwaway cluster
  in this process (what Beam does without an address).
- Any other runner is Beam's to resolve (``DataflowRunner``, ``FlinkRunner``, ``SparkRunner``, a class path).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from taskdata import fs

if TYPE_CHECKING:  # imported when a job runs (Beam's options module imports Beam)
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from taskdata.beam.pipeline import CacheJobSpec

__all__ = ["DASK_RUNNER", "ClusterError", "check_dask_cluster", "is_dask", "new_pipeline", "pipeline_options",
           "run_to_end"]

DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
_DASK_NAMES = ("dask", "DaskRunner", DASK_RUNNER)
_LOCAL_NAMES = (None, "DirectRunner", "direct")


class ClusterError(RuntimeError):
    """The Dask cluster cannot run the job: unreachable, without workers, or with workers that cannot."""


def pipeline_options(beam_args: Sequence[str], source_shards: int) -> PipelineOptions:
    """Beam's options for the job from the arguments after ``--``, with ``dask`` resolved to ``DASK_RUNNER``."""
    _import_beam_quietly()
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    options = PipelineOptions(list(beam_args))
    if options.view_as(StandardOptions).runner not in _DASK_NAMES:
        return options
    dask = options.view_as(_dask_options_class())
    if not dask.address and not dask.scheduler_file:
        raise ValueError(
            "--runner=dask needs the Dask scheduler's address: add --dask_client_address=tcp://HOST:8786 (or "
            "--dask_scheduler_file=FILE) after '--'. Start a scheduler with 'python -m distributed.cli.dask_scheduler' "
            "and workers with 'python -m distributed.cli.dask_worker tcp://HOST:8786'.")
    overrides: dict[str, Any] = {"runner": DASK_RUNNER}
    if dask.npartitions is None and dask.partition_size is None:
        overrides["npartitions"] = max(1, source_shards)
    return PipelineOptions(list(beam_args), **overrides)


def is_dask(options: PipelineOptions) -> bool:
    from apache_beam.options.pipeline_options import StandardOptions

    return bool(options.view_as(StandardOptions).runner == DASK_RUNNER)


def new_pipeline(options: PipelineOptions) -> beam.Pipeline:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import StandardOptions

    if options.view_as(StandardOptions).runner in _LOCAL_NAMES:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return beam.Pipeline(runner=FnApiRunner(), options=options)
    return beam.Pipeline(options=options)


def run_to_end(pipeline: beam.Pipeline, options: PipelineOptions) -> None:
    """Runs ``pipeline`` and waits for it. On Dask, a failed or interrupted job's tasks are cancelled on the
    cluster, and the client Beam opened for it is closed either way (Beam leaves it open)."""
    result = pipeline.run()
    if not is_dask(options):
        result.wait_until_finish()
        return
    from apache_beam.runners.dask.dask_runner import DaskRunnerResult
    from distributed import KilledWorker

    assert isinstance(result, DaskRunnerResult)
    finished = False
    try:
        result.wait_until_finish()
        # A client that lost its scheduler cancels the job's futures, and the wait above then returns as if done.
        lost = [future.status for future in result.futures if future.status != "finished"]
        if lost:
            settings = options.view_as(_dask_options_class())
            raise ClusterError(
                f"The Dask cluster lost the job: its result is {lost[0]}, not finished. Did the scheduler at "
                f"{settings.address or settings.scheduler_file} stop?")
        finished = True
    except KilledWorker as e:
        raise ClusterError(f"{e} (Dask gives up on a task after its worker died while running it "
                           f"{e.allowed_failures + 1} times: out of memory, or killed by the machine? The workers' logs "
                           "say.)") from e
    finally:
        try:
            if not finished:
                result.cancel()
        finally:
            result.client.close()


def check_dask_cluster(options: PipelineOptions, spec: CacheJobSpec, probe: str) -> list[str]:
    """Connects to the scheduler of ``options``, waits for a worker, and has every worker load the task (its
    fingerprint checked) and find ``probe`` (a file the job wrote in its temporary folder). Returns
    ``ADDRESS on HOST`` of every worker; raises ``ClusterError`` saying what is wrong and what to do."""
    import dask
    from dask.utils import parse_timedelta
    from distributed import Client

    settings = options.view_as(_dask_options_class())
    where = settings.address or f"the scheduler file {settings.scheduler_file}"
    timeout = settings.timeout if isinstance(settings.timeout, int) else parse_timedelta(
        dask.config.get("distributed.comm.timeouts.connect"))
    try:
        client = Client(address=settings.address, scheduler_file=settings.scheduler_file, timeout=timeout,
                        set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        raise ClusterError(f"Cannot reach the Dask scheduler at {where} within {timeout} s ({e}). Check the address "
                           "and that the scheduler runs, or give it longer with --dask_connection_timeout=SECONDS.") from e
    with client:
        try:
            client.wait_for_workers(1, timeout=timeout)
        except TimeoutError as e:
            raise ClusterError(f"The Dask scheduler at {where} has no workers (waited {timeout} s). Start some: "
                               f"python -m distributed.cli.dask_worker {settings.address or 'ADDRESS'}") from e
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        futures = {w: client.submit(_check_worker, spec, probe, workers=[w], allow_other_workers=False, pure=False)
                   for w in workers}
        seen, problems = [], []
        for worker, future in futures.items():
            error = future.exception()  # waits for it
            if error is None:
                seen.append(f"{worker} on {future.result()}")
            else:
                problems.append(f"worker {worker}: {type(error).__name__}: {error}")
        if problems:
            raise ClusterError(
                f"{len(problems)} of the {len(workers)} Dask workers cannot run this job: {problems[0]}"
                + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
                + ". Every worker needs taskdata and the --module packages installed, the same task definition, "
                "source files and vocabulary, and the output: a bucket (--output gs://...) or a folder every worker "
                "mounts at the same path.")
        return seen


def _check_worker(spec: CacheJobSpec, probe: str) -> str:
    """On one worker: the job's folder is there and the task loads with the launcher's fingerprint."""
    from taskdata.beam.pipeline import load_task

    if not fs.exists(probe):
        raise FileNotFoundError(f"{socket.gethostname()} cannot see {probe}, which the job wrote where it writes the "
                                "cache")
    load_task(spec)
    return socket.gethostname()


def _import_beam_quietly() -> None:
    """The job's first import of Beam, made by the pipeline module, which silences the warning Beam logs then."""
    from taskdata.beam import pipeline  # noqa: F401


def _dask_options_class() -> Any:
    from taskdata.extras import require

    # Beam's Dask runner module imports without Dask and fails only when it runs: say so before.
    require("distributed", "dask", "--runner=dask")
    from apache_beam.runners.dask.dask_runner import DaskOptions

    return DaskOptions
