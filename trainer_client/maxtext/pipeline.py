"""MaxText's input pipeline over a taskdata run: factories ``(config, mesh, process_indices) -> iterator``.

``train_iterator`` and ``eval_iterator`` have the signature of MaxText's ``make_<dataset_type>_train_iterator``
and ``..._eval_iterator`` (``input_pipeline_interface.create_data_iterator`` calls them on the processes that
load data) and return MaxText's own ``MultiHostDataLoadIterator`` over this process's rows, so MaxText makes
its global arrays itself, one batch per train step:

- **Fields.** Each element is MaxText's six fields (``fields.maxtext_fields``: targets shifted left, no loss
  across a document end or on padding), int32 ``[rows, max_target_length]``; nothing else, no scalar leaf.
  The run's caches must hold rows with segment ids and positions (``ConcatenateAndChunk``, or ``--pack``).
- **Rows.** ``layout.BatchLayout``: the plan's rows of a step spread evenly over MaxText's trained devices,
  each device's share followed by zero rows up to its fixed ``c`` rows, so every batch has MaxText's fixed
  shape and a ramp's smaller batch or a skipped step's empty one is zero-weight rows: MaxText's step is always
  the plan's step. A process reads its devices' rows with one ``DataIterator`` per run of neighbouring devices;
  the rows never repeat across processes, and the processes that hold trained devices must be exactly the
  ``process_indices`` MaxText passes.
- **Checks.** The plan's largest global batch must be MaxText's ``global_batch_size_to_train_on`` (the eval
  run's: ``global_batch_size_to_eval_on``) and every step's a multiple of the trained devices; tokens must be
  below ``vocab_size``; ``expansion_factor_real_data > 1`` and ``enable_rampup_batch_size`` are refused by name
  (the plan decides which rows every step holds: ramp it with ``taskdata plan --ramp-to``).
  ``per_device_batch_size < 1`` works: MaxText trains on the rows of its first devices, which hold the plan's.
- **Resume.** Stateless from the step MaxText restores (``resume``), on any number of processes.
- **Eval.** Iterating the eval iterator again (MaxText ``reset()``s it before every eval) reads the eval run
  again from its step 0: ``eval_steps`` steps, or (``eval_steps <= 0``) one pass over a one-task eval run's
  split, the rows past its end zero-weight.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from taskdata.example.packing import positions_name, segment_ids_name
from taskdata.index import RunPlan
from taskdata.runs import RunStore
from trainer_client.assignments import AssignmentSource
from trainer_client.digest import row_digests
from trainer_client.iterator import DataIterator
from trainer_client.local_source import LocalAssignments
from trainer_client.maxtext import resume
from trainer_client.maxtext.batch_log import StepLog
from trainer_client.maxtext.errors import MaxTextConfigError
from trainer_client.maxtext.fields import maxtext_fields
from trainer_client.maxtext.layout import BatchLayout
from trainer_client.reading import ClientBatch
from trainer_client.server_source import ServerAssignments

if TYPE_CHECKING:
    from jax.sharding import Mesh

__all__ = ["MaxTextConfigError", "RunRows", "TaskdataInput", "eval_iterator", "train_iterator"]


@dataclasses.dataclass(frozen=True)
class TaskdataInput:
    """What MaxText reads: run ``run`` (and ``eval_run`` for its evals) from a cache root or a server.

    Attributes:
      run: the training run (``taskdata plan --name RUN``).
      cache_root: read the stored run and its caches from here (no server), or
      server: the assignment server's URL, with its bearer ``token``.
      eval_run: the run MaxText's evals read (a plan over the validation split: ``taskdata plan --split
        validation``); needed when ``eval_interval > 0``.
      feature: the caches' token feature (with its ``_segment_ids`` and ``_positions``).
      batch_log: a folder for ``batch_log.StepLog`` files (one per process), or None.
      lookahead, prefetch, workers: as for ``DataIterator`` (``workers``: processes that read the batches, so
        that reading takes neither MaxText's interpreter lock nor its process's time).
    """

    run: str
    cache_root: str | None = None
    server: str | None = None
    token: str | None = None
    eval_run: str | None = None
    feature: str = "targets"
    batch_log: str | None = None
    lookahead: int = 16
    prefetch: int = 4
    workers: int = 0

    def __post_init__(self) -> None:
        if (self.cache_root is None) == (self.server is None):
            raise ValueError("TaskdataInput reads from a cache root or from a server: give exactly one of cache_root "
                             f"and server (got cache_root={self.cache_root!r}, server={self.server!r}).")
        for name in ("run", "feature"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"TaskdataInput {name} must be a non-empty string but got {getattr(self, name)!r}.")

    def open(self, run: str) -> AssignmentSource:
        """A new source of ``run``'s read instructions (every ``DataIterator`` owns and closes its own)."""
        if self.server is not None:
            return ServerAssignments(self.server, run, token=self.token)
        assert self.cache_root is not None
        stored = RunStore(self.cache_root).get(run)
        if stored is None:
            raise ValueError(f"No run {run!r} under {self.cache_root}: create it with 'taskdata plan --name {run} ...'.")
        return LocalAssignments.from_cache_root(stored, self.cache_root)


def train_iterator(settings: TaskdataInput, config: Any, mesh: Mesh, process_indices: Sequence[int]) -> Any:
    """MaxText's train iterator over ``settings.run``, from the step MaxText restores."""
    import jax

    _check_config(config)
    layout = BatchLayout(config.global_batch_size_to_load, config.global_batch_size_to_train_on, mesh.devices.size)
    start = resume.start_step(config)
    rows = RunRows(settings, settings.run, layout, _positions(mesh, layout, process_indices), config,
                   start=start, stop=config.steps, kind="train", what="global_batch_size_to_train_on")
    if config.enable_checkpointing:
        resume.check_and_record(config.checkpoint_dir, rows.plan, start, write=jax.process_index() == min(process_indices))
    return _multihost(rows, mesh, config.generate_padding_batch_train)


def eval_iterator(settings: TaskdataInput, config: Any, mesh: Mesh, process_indices: Sequence[int]) -> Any:
    """MaxText's eval iterator over ``settings.eval_run``: every pass from its step 0."""
    _check_config(config)
    if settings.eval_run is None:
        raise MaxTextConfigError(
            f"eval_interval={config.eval_interval} makes MaxText evaluate, but no eval run was given: plan one over "
            "the validation split ('taskdata plan --name NAME --split validation ...') and pass --eval-run NAME, or "
            "set eval_interval=-1."
        )
    if config.generate_padding_batch_eval and config.eval_steps <= 0:
        raise MaxTextConfigError(
            f"generate_padding_batch_eval=true with eval_steps={config.eval_steps} never ends an eval: MaxText "
            "pads forever after the eval run's pass. Set generate_padding_batch_eval=false (the pass ends by "
            "itself, its last rows zero-weight) or eval_steps to a number of steps."
        )
    layout = BatchLayout(config.global_batch_size_to_load_eval, config.global_batch_size_to_eval_on, mesh.devices.size)
    rows = RunRows(settings, settings.eval_run, layout, _positions(mesh, layout, process_indices), config,
                   start=0, stop=None, kind="eval", what="global_batch_size_to_eval_on")
    rows.stop = _eval_steps(rows.plan, config.eval_steps)
    return _multihost(rows, mesh, config.generate_padding_batch_eval)


def _multihost(rows: RunRows, mesh: Mesh, generate_padding_batch: bool) -> Any:
    from maxtext.input_pipeline.multihost_dataloading import MultiHostDataLoadIterator

    return MultiHostDataLoadIterator(rows, mesh, generate_padding_batch)


def _check_config(config: Any) -> None:
    if config.expansion_factor_real_data > 1:
        raise MaxTextConfigError(
            f"expansion_factor_real_data={config.expansion_factor_real_data} makes some processes load more rows "
            "and the others none; taskdata's pipeline puts every step's rows on MaxText's trained devices itself. Set "
            "expansion_factor_real_data=-1."
        )
    if config.enable_rampup_batch_size:
        raise MaxTextConfigError(
            "enable_rampup_batch_size=true slices MaxText's batches by its own schedule; with taskdata the plan ramps "
            "('taskdata plan --batch-size START --ramp-to END --ramp-steps N'), every step at MaxText's fixed shape. "
            "Set enable_rampup_batch_size=false."
        )


def _positions(mesh: Mesh, layout: BatchLayout, process_indices: Sequence[int]) -> list[int]:
    """This process's devices' flat positions in ``mesh`` (in the order MaxText splits its rows over them),
    after checking that the processes holding trained devices are the ones MaxText has load data."""
    import jax

    flat = list(mesh.devices.flat)
    holders = sorted({d.process_index for d in flat[: layout.trained_devices]})
    if holders != sorted(process_indices):
        raise MaxTextConfigError(
            f"MaxText loads data on processes {sorted(process_indices)}, but the devices holding its "
            f"{layout.trained_rows} trained rows belong to processes {holders}. Use a data_sharding over every mesh "
            "axis (MaxText's default)."
        )
    where = {d.id: p for p, d in enumerate(flat)}
    positions = [where[d.id] for d in mesh.local_devices]
    if positions != sorted(positions) or any(d.process_index != jax.process_index() for d in mesh.local_devices):
        raise MaxTextConfigError(f"The mesh's local devices are not in its flat order: positions {positions}.")
    return positions


def _eval_steps(plan: RunPlan, eval_steps: int) -> int:
    if eval_steps > 0:
        return int(eval_steps)
    if len(plan.task_names) != 1:
        raise MaxTextConfigError(
            f"eval_steps={eval_steps} asks for one pass over the eval data, but eval run {plan.name!r} mixes "
            f"{list(plan.task_names)}, whose passes end at different steps. Set eval_steps, or plan the eval run "
            "over one task."
        )
    return plan.step_of(plan.caches[plan.task_names[0]].num_records - 1) + 1


class RunRows:
    """This process's rows of a run, one MaxText element per step, from ``start`` to ``stop`` (exclusive).

    Iterating it again reads the same steps again (MaxText's ``reset()``). The rows past one pass over a
    one-task eval run's records are zeroed (they repeat the pass's first ones).
    """

    def __init__(self, settings: TaskdataInput, run: str, layout: BatchLayout, positions: Sequence[int], config: Any,
                 *, start: int, stop: int | None, kind: str, what: str):
        import jax

        self._settings = settings
        self._run = run
        self._layout = layout
        self._pieces = layout.pieces(positions)
        if all(piece.host_slice is None for piece in self._pieces):
            raise MaxTextConfigError(f"This process holds none of MaxText's {layout.trained_rows} trained rows.")
        self._length = int(config.max_target_length)
        self._vocab_size = int(config.vocab_size)
        self._feature = settings.feature
        self._names = (settings.feature, segment_ids_name(settings.feature), positions_name(settings.feature))
        self._start = start
        self.stop = stop
        self._kind = kind
        self._passes = 0
        self._open: list[DataIterator] = []
        self.failure: Exception | None = None  # what ended a pass early, if anything did
        with contextlib.closing(settings.open(run)) as source:
            self.plan = source.run_info().plan
        self._records = (self.plan.caches[self.plan.task_names[0]].num_records if kind == "eval"
                         and len(self.plan.task_names) == 1 else None)
        largest = max(max(s.start, s.end) for s in self.plan.staged_schedule.schedules)
        if largest != layout.trained_rows:
            raise MaxTextConfigError(
                f"Run {run!r} has global batches of up to {largest} rows, but MaxText's {what} is "
                f"{layout.trained_rows} (per_device_batch_size x {layout.devices} devices x gradient accumulation "
                f"steps): set per_device_batch_size to {largest / layout.devices:g} on {layout.devices} devices, or "
                f"plan the run with --batch-size {layout.trained_rows}."
            )
        self._log = StepLog(settings.batch_log, jax.process_index()) if settings.batch_log else None

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        self._close_readers()
        lengths = dict.fromkeys(self._names, self._length)
        self._open = [
            DataIterator(self._settings.open(self._run), lengths, start=self._start, host_slice=piece.host_slice,
                         stop_step=self.stop, lookahead=self._settings.lookahead, prefetch=self._settings.prefetch,
                         workers=self._settings.workers)
            for piece in self._pieces if piece.host_slice is not None
        ]
        return self._steps(self._open)

    def _steps(self, readers: list[DataIterator]) -> Iterator[dict[str, np.ndarray]]:
        # Numbered when read from, not when made: MaxText makes one iterator it never reads, then reset()s.
        eval_pass = self._passes
        self._passes += 1
        step = self._start
        try:
            while self.stop is None or step < self.stop:
                batches = [next(reader) for reader in readers]
                yield self._element(step, batches, eval_pass)
                step += 1
        except Exception as error:
            # MaxText's data loader turns any error of next() into a graceful stop (StopTraining, exit 0): keep
            # it, so that the launcher can end with it instead.
            self.failure = error
            raise

    def _element(self, step: int, batches: list[ClientBatch], eval_pass: int) -> dict[str, np.ndarray]:
        share = 0 if batches[0].skipped else self._layout.rows_per_trained_device(step, batches[0].global_batch_size)
        real: list[np.ndarray | None] = []
        runs: list[tuple[int, np.ndarray]] = []
        read = iter(batches)
        for piece in self._pieces:
            if piece.host_slice is None:
                real.append(None)
                continue
            batch = next(read)
            arrays = self._rows(step, batch, piece.count * share)
            real.append(arrays)
            if self._log is not None and share:
                kept = self._kept(batch)
                runs.append((batch.positions.start, row_digests(dict(zip(self._names, arrays[:, :kept], strict=True)))))
        if self._log is not None:
            self._log.write(self._kind, step, eval_pass if self._kind == "eval" else 0, runs)
        tokens, segment_ids, positions = (
            self._layout.process_rows(self._pieces, [None if a is None else a[i] for a in real], share)
            for i in range(3)
        )
        return maxtext_fields(tokens, segment_ids, positions)

    def _rows(self, step: int, batch: ClientBatch, count: int) -> np.ndarray:
        """The piece's rows as one ``[3, count, L]`` array (tokens, segment ids, positions), past-the-pass rows zeroed."""
        if batch.skipped:
            return np.zeros((3, 0, self._length), dtype=np.int32)
        missing = [name for name in self._names if name not in batch.features]
        if missing:
            raise MaxTextConfigError(
                f"Step {step} of run {self._run!r}: its rows have no {missing}. MaxText needs each row's documents: "
                "cache a decoder-only task with ConcatenateAndChunk (or a packed task, 'taskdata cache --pack')."
            )
        arrays = np.stack([batch.features[name] for name in self._names])
        if arrays.shape[1] != count:
            raise ValueError(f"Step {step}: read {arrays.shape[1]} rows where the layout needs {count}.")
        largest = int(arrays[0].max(initial=0))
        if largest >= self._vocab_size:
            raise MaxTextConfigError(
                f"Step {step} of run {self._run!r} holds token id {largest}, but MaxText's vocab_size is "
                f"{self._vocab_size}: set vocab_size to at least the tokenizer's size."
            )
        kept = self._kept(batch)
        if kept < count:
            arrays[:, kept:] = 0
        return arrays

    def _kept(self, batch: ClientBatch) -> int:
        """How many of the batch's rows are inside one pass over a one-task eval run (all of them otherwise)."""
        if self._records is None:
            return len(batch.positions)
        return max(0, min(len(batch.positions), self._records - batch.positions.start))

    def _close_readers(self) -> None:
        for reader in self._open:
            reader.close()
        self._open = []

    def close(self) -> None:
        self._close_readers()
        if self._log is not None:
            self._log.close()
            self._log = None
