"""A taskdata run as t5x's training data: ``get_dataset``, a ``get_dataset_fn`` for ``t5x/train.py``.

    # gin, after t5x's own files (pretrain.gin and a model):
    from trainer_client import t5x_dataset
    train_script.train.get_dataset_fn = @t5x_dataset.get_dataset
    t5x_dataset.get_dataset:
      run = "tour"                              # a run made with 'taskdata plan'
      server = "http://10.0.0.2:8000"           # or cache_root = "gs://B/cache" (no server)
      token_file = "/secrets/taskdata-token"
      model_dir = %MODEL_DIR
    train/utils.DatasetConfig.mixture_or_task_name = "c4_span_corruption"   # the run's mixture or task
    train/utils.DatasetConfig.pack = False      # True for a run of packed caches ('taskdata cache --pack')

t5x calls ``get_dataset(cfg, shard_id, num_shards, feature_converter_cls)`` before it restores anything,
with its data shard of the mesh (``partitioner.get_data_layout``). The result is a clu
``DatasetIterator`` whose elements are what ``feature_converter_cls`` (seqio's EncDec, PrePackedEncDec,
Decoder, LM or PrefixLM converter, as t5x's model names it) gives the model, computed in numpy by
``trainer_client.features`` from this shard's slice of every global batch of the run: ``[batch_size /
num_shards, length]`` int32 arrays. The same function takes ``get_deterministic_dataset``'s
``model_dir`` and ``start_step``.

The plan decides the data: ``DatasetConfig.batch_size`` must be the run's (constant) global batch size,
``task_feature_lengths`` must name the converter's task features and hold every cached example (for a
packed cache, its rows), ``split`` must be the run's split, and ``pack`` must say whether the run's
caches are packed (``PrePackedEncDecFeatureConverter`` takes packed rows with ``pack=False``, as in
seqio). ``seed``, ``shuffle`` and ``use_cached`` are ignored, and logged by name: the run's seed and
global order are the plan's.

Where the data starts: the iterator's state is a ``DataState`` (step and run fingerprint), which its
``save``/``restore`` write and read as JSON, so t5x's checkpointers (``save_dataset=True``) keep it with
the model. t5x restores it only on the first host of each replica set (its Orbax checkpointer); every
host therefore starts where that restore will put it, from ``model_dir``: the data state saved in the
latest checkpoint there, or, in a checkpoint saved without one (``save_dataset=False``), the step after
as many batches as the checkpoint's train step (the run's step 0 trained at train step 0, as when
pretraining from scratch; fine-tuning from another run's checkpoint needs ``save_dataset=True``). With no
checkpoint in ``model_dir`` (or no ``model_dir``) it starts at ``start_step``. So no host of a replica set
reads other rows than its peers. A step the plan skips yields nothing (the next step's batch comes).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from clu.data import dataset_iterator as clu_iterator

from taskdata import fs
from taskdata.cache.reader import CacheReader
from taskdata.runs import RunStore
from taskdata.seqio_bridge import import_seqio
from trainer_client.assignments import AssignmentSource, HostSlice
from trainer_client.digest import batch_hash, row_digests
from trainer_client.features import DecoderFeatures, EncDecFeatures
from trainer_client.iterator import DataIterator, DataState, ResumeError
from trainer_client.local_source import LocalAssignments
from trainer_client.server_source import ServerAssignments

__all__ = ["DATASET_CHECKPOINT_PREFIX", "T5xDatasetIterator", "get_dataset", "resume_state"]

log = logging.getLogger(__name__)

# t5x names a dataset checkpoint file 'train_ds-{shard:03}-of-{shards:03}' inside the checkpoint folder
# (its legacy checkpointer), 'dataset/' (Orbax) or 'dataset/process_{i}-of-{n}/' (Orbax, several processes).
DATASET_CHECKPOINT_PREFIX = "train_ds-"
_CHECKPOINT_DEPTH = 3

Converter = EncDecFeatures | DecoderFeatures


class T5xDatasetIterator(clu_iterator.DatasetIterator):
    """This data shard's model features, step by step; ``save``/``restore`` keep the ``DataState``."""

    def __init__(
        self,
        iterator: DataIterator,
        converter: Converter,
        element_spec: Mapping[str, Any],
        batch_log: str | None = None,
    ):
        self._iterator = iterator
        self._converter = converter
        self._element_spec = dict(element_spec)
        self._start = iterator.state()
        self._batch_log = batch_log

    def __next__(self) -> dict[str, np.ndarray]:
        while True:
            batch = next(self._iterator)
            if not batch.skipped:
                features = self._converter(batch.features)
                if self._batch_log is not None:
                    self._log(batch.step, features)
                return features

    def _log(self, step: int, features: Mapping[str, np.ndarray]) -> None:
        line = {"step": step, "data_shard": self._iterator.host_slice.index,
                "data_shards": self._iterator.host_slice.count, "hash": batch_hash(row_digests(features))}
        assert self._batch_log is not None
        with open(self._batch_log, "a") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")

    def get_next(self) -> dict[str, np.ndarray]:
        return next(self)

    @property
    def element_spec(self) -> dict[str, Any]:
        return dict(self._element_spec)

    def state(self) -> DataState:
        """The data state after every element returned so far."""
        return self._iterator.state()

    def reset(self) -> None:
        """Back to the step the iterator was built at."""
        self._iterator.restore(self._start)

    def save(self, filename: Any) -> None:
        fs.write_atomic(str(filename), json.dumps(self.state().to_dict(), sort_keys=True).encode())

    def restore(self, filename: Any) -> None:
        state = _read_state(str(filename))
        if state != self._iterator.state():  # else the batches read ahead are already the right ones
            self._iterator.restore(state)
        log.info("taskdata: restored data state step %d (run fingerprint %s) from %s", state.step,
                 state.fingerprint, filename)

    def load(self, filename: Any) -> None:  # clu's older name, which t5x's legacy checkpointer calls
        self.restore(filename)

    def close(self) -> None:
        self._iterator.close()


def get_dataset(
    cfg: Any,
    shard_id: int,
    num_shards: int,
    feature_converter_cls: Callable[..., Any],
    num_epochs: int | None = None,
    continue_from_last_checkpoint: bool = False,
    *,
    run: str,
    server: str | None = None,
    token_file: str | None = None,
    cache_root: str | None = None,
    model_dir: str | None = None,
    start_step: int = 0,
    lookahead: int = 16,
    prefetch: int = 4,
    workers: int = 0,
    verify_crc: bool = True,
    batch_log: str | None = None,
) -> T5xDatasetIterator:
    """t5x's ``get_dataset_fn`` over a taskdata run (see the module docstring).

    Args:
      cfg: t5x's ``utils.DatasetConfig``.
      shard_id, num_shards: this host's data shard, as t5x's data layout gives them.
      feature_converter_cls: the model's ``FEATURE_CONVERTER_CLS`` (a seqio converter class), built here with
        ``pack=cfg.pack`` as t5x does, so gin bindings of it (``bos_id``, ``loss_on_targets_only``) count.
      num_epochs: must be None: a run goes on for as many steps as are trained.
      continue_from_last_checkpoint: accepted for t5x's signature; where the data starts is decided as the
        module docstring says, either way.
      run: the taskdata run's name.
      server, token_file: the assignment server and a file holding its bearer token; or
      cache_root: the cache root (local or gs://) holding the run and its caches, read without a server.
      model_dir: t5x's model folder, where the data state of its latest checkpoint is found.
      start_step: the step to start at when ``model_dir`` holds no checkpoint.
      lookahead, prefetch, workers, verify_crc: as for ``DataIterator``.
      batch_log: a local folder; each process appends a JSON line per element it returns to
        ``process_{index}.jsonl`` there: the data step, the data shard and the hash of the element's model
        features (``trainer_client.digest``), for comparing runs batch by batch.
    """
    if num_epochs is not None:
        raise ValueError(
            f"get_dataset(num_epochs={num_epochs!r}): a taskdata run has no epoch limit, it yields every step "
            "trained (its plan repeats each task's cache as often as needed). Pass num_epochs=None."
        )
    del continue_from_last_checkpoint
    host_slice = HostSlice(shard_id, num_shards)
    source = _source(run, server, token_file, cache_root)
    try:
        plan = source.run_info().plan
        _check_config(cfg, plan_batch_size=_constant_batch_size(plan, cfg), run=run, mixture=plan.mixture,
                      split=plan.split)
        lengths = {name: int(length) for name, length in dict(cfg.task_feature_lengths).items()}
        start = resume_state(source, model_dir, start_step)
        converter, packed = _converter(feature_converter_cls, cfg, lengths)
        _check_caches(source, start.step, host_slice, lengths, packed, run)
    except BaseException:
        source.close()
        raise
    iterator = DataIterator(source, lengths, start=start, host_slice=host_slice, lookahead=lookahead,
                            prefetch=prefetch, workers=workers, verify_crc=verify_crc)
    rows = cfg.batch_size // num_shards
    spec = {name: clu_iterator.ArraySpec(np.int32, (rows, length))
            for name, length in converter.model_lengths(lengths, packed=packed).items()}
    log.info("taskdata run %r: data shard %d of %d from step %d, %d examples per shard, features %s",
             run, shard_id, num_shards, start.step, rows, sorted(spec))
    log_file = None
    if batch_log is not None:
        import jax

        os.makedirs(batch_log, exist_ok=True)
        log_file = os.path.join(batch_log, f"process_{jax.process_index()}.jsonl")
    return T5xDatasetIterator(iterator, converter, spec, log_file)


def resume_state(source: AssignmentSource, model_dir: str | None, start_step: int) -> DataState:
    """Where every host of the run starts, before t5x restores any of them (see the module docstring)."""
    plan = source.run_info().plan
    if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
        raise ValueError(f"start_step must be an integer >= 0 but got {start_step!r}.")
    if model_dir is None:
        return DataState(start_step, plan.fingerprint_before(start_step))
    from t5x import checkpoints_utils  # the checkpoint t5x restores: its own 'latest' rule

    step = checkpoints_utils.latest_step(model_dir)
    if step is None:
        return DataState(start_step, plan.fingerprint_before(start_step))
    folder = str(checkpoints_utils.get_checkpoint_dir(model_dir, step))
    saved = _saved_states(folder)
    if not saved:
        data_step = plan.step_after_batches(step)
        log.info("%s holds no taskdata data state (t5x saved it with save_dataset=False): starting at step %d, "
                 "after %d batches", folder, data_step, step)
        return DataState(data_step, plan.fingerprint_before(data_step))
    states = set(saved.values())
    if len(states) != 1:
        raise ResumeError(
            f"The data states saved in {folder} disagree: {saved}. A run's data state is one global step; "
            "these files were not all written by one t5x checkpoint of it."
        )
    return states.pop()


def _saved_states(folder: str) -> dict[str, DataState]:
    found: dict[str, DataState] = {}
    for depth in range(_CHECKPOINT_DEPTH):
        for path in fs.glob(fs.join(folder, *(["*"] * depth), DATASET_CHECKPOINT_PREFIX + "*")):
            found[path] = _read_state(path)
    return found


def _read_state(path: str) -> DataState:
    try:
        return DataState.from_dict(json.loads(fs.read_bytes(path)))
    except (ValueError, UnicodeDecodeError) as error:
        raise ResumeError(
            f"{path} is not a taskdata data state ({error}): it was written by another dataset than a taskdata "
            "run. Restore the checkpoint with the dataset function that saved it."
        ) from None


def _source(run: str, server: str | None, token_file: str | None, cache_root: str | None) -> AssignmentSource:
    if (server is None) == (cache_root is None):
        raise ValueError(
            f"get_dataset takes the run's assignment server (server=URL) or its cache root (cache_root=PATH), "
            f"exactly one of them, but got server={server!r} and cache_root={cache_root!r}."
        )
    if server is not None:
        token = None
        if token_file is not None:
            token = fs.read_bytes(token_file).decode().strip()
            if not token:
                raise ValueError(f"token_file {token_file} is empty; put the server's bearer token in it.")
        return ServerAssignments(server, run, token=token)
    assert cache_root is not None
    stored = RunStore(cache_root).get(run)
    if stored is None:
        raise ValueError(f"No run {run!r} is stored under {cache_root}; create it with 'taskdata plan --name {run}'.")
    return LocalAssignments.from_cache_root(stored, cache_root)


def _constant_batch_size(plan: Any, cfg: Any) -> int:
    sizes = {s.start for s in plan.staged_schedule.schedules} | {s.end for s in plan.staged_schedule.schedules}
    if len(sizes) != 1:
        raise ValueError(
            f"Run {plan.name!r} changes its global batch size ({sorted(sizes)}), but t5x trains one batch shape "
            f"(DatasetConfig.batch_size = {cfg.batch_size}). Plan a run with a constant batch size for t5x."
        )
    return sizes.pop()


def _check_config(cfg: Any, *, plan_batch_size: int, run: str, mixture: str, split: str) -> None:
    name = cfg.mixture_or_task_name
    name = name if isinstance(name, str) else getattr(name, "name", repr(name))
    wrong = []
    if name != mixture:
        wrong.append(f"mixture_or_task_name = {name!r} (the run trains on {mixture!r})")
    if cfg.batch_size != plan_batch_size:
        wrong.append(f"batch_size = {cfg.batch_size!r} (the run's global batch size is {plan_batch_size})")
    if cfg.split != split:
        wrong.append(f"split = {cfg.split!r} (the run reads split {split!r})")
    if wrong:
        raise ValueError(
            f"t5x's DatasetConfig does not describe taskdata run {run!r}: {'; '.join(wrong)}. Set those "
            "values in the gin file, or plan a run with them."
        )
    for field, why in (("seed", "its order is the plan's, fixed by the run's seed"),
                       ("shuffle", "the plan's global order is already shuffled"),
                       ("use_cached", "a run always reads its caches")):
        log.info("taskdata run %r: DatasetConfig.%s = %r is ignored: %s.", run, field, getattr(cfg, field), why)


_CONVERTERS = {
    "EncDecFeatureConverter": ("inputs", "targets"),
    "PrePackedEncDecFeatureConverter": ("inputs", "targets"),
    "DecoderFeatureConverter": None,  # targets, or inputs and targets
    "LMFeatureConverter": ("targets",),
    "PrefixLMFeatureConverter": ("inputs", "targets"),
}


def _converter(feature_converter_cls: Callable[..., Any], cfg: Any, lengths: Mapping[str, int]) -> tuple[Converter, bool]:
    """Our converter for the model's seqio converter, and whether the run's rows are packed (per cfg.pack)."""
    seqio = import_seqio()
    made = feature_converter_cls(pack=cfg.pack, use_custom_packing_ops=cfg.use_custom_packing_ops)
    kind = type(made).__name__
    prepacked = type(made) is seqio.PrePackedEncDecFeatureConverter
    if kind not in _CONVERTERS or type(made) is not getattr(seqio, kind):
        raise ValueError(
            f"taskdata's t5x dataset converts features as seqio's {', '.join(_CONVERTERS)} do, but the model's "
            f"feature converter is {type(made).__module__}.{type(made).__qualname__}. Use a model with one of "
            "those, or convert this run's batches (trainer_client.DataIterator) with your own code."
        )
    converter: Converter
    features: tuple[str, ...]
    if kind in ("EncDecFeatureConverter", "PrePackedEncDecFeatureConverter"):
        converter = EncDecFeatures(bos_id=made.bos_id)
        features = converter.TASK_FEATURES
    else:
        prefix = made.prefixlm_feature_converter if kind == "DecoderFeatureConverter" else made
        converter = DecoderFeatures(
            loss_on_targets_only=bool(getattr(prefix, "loss_on_targets_only", True)), bos_id=made.bos_id)
        features = _CONVERTERS[kind] or converter.task_features(lengths)
    if set(lengths) != set(features):
        raise ValueError(
            f"seqio's {kind} takes task features {list(features)} but DatasetConfig.task_feature_lengths names "
            f"{sorted(lengths)}. Give lengths for exactly those features."
        )
    return converter, prepacked or bool(cfg.pack)


def _check_caches(
    source: AssignmentSource, step: int, host_slice: HostSlice, lengths: Mapping[str, int], packed: bool, run: str
) -> None:
    """The run's caches hold the features at these lengths, packed as ``packed`` says."""
    plan = source.run_info().plan
    if isinstance(source, LocalAssignments):
        dirs = dict(source.version_dirs)
    else:  # the version folders a host reads come with the instructions: those of the first steps
        dirs = {}
        for reads in source.fetch(step, 16, host_slice):
            for read in reads.tasks:
                if len(read.cache.uris):
                    dirs[read.task] = read.cache.uris[0].rsplit("/", 1)[0]
    for task, version_dir in sorted(dirs.items()):
        with CacheReader(version_dir, expected_manifest_sha256=plan.caches[task].fingerprint) as reader:
            manifest = reader.manifest
            missing = sorted(set(lengths) - set(manifest.features))
            if missing:
                raise ValueError(
                    f"Run {run!r} reads task {task!r}, whose cache has features {sorted(manifest.features)}, not "
                    f"{missing}: DatasetConfig.task_feature_lengths names features the task does not have."
                )
            cache_packed = bool(manifest.packed_features)
            if cache_packed != packed:
                fix = ("set DatasetConfig.pack = True (or use seqio's PrePackedEncDecFeatureConverter)"
                       if cache_packed else
                       "set DatasetConfig.pack = False, or plan a run of packed caches ('taskdata cache --pack'): "
                       "taskdata packs in the cache job, never while reading")
                raise ValueError(
                    f"Run {run!r} reads task {task!r} from a cache of {'packed rows' if cache_packed else 'examples'}, "
                    f"but t5x asks for {'packed' if packed else 'unpacked'} data: {fix}."
                )
            for name, length in lengths.items():
                longest = (int(manifest.packing["lengths"][name]) if cache_packed and manifest.packing
                           else reader.max_tokens(plan.split, name))
                if longest > length:
                    what = "rows of" if cache_packed else "longest example's"
                    raise ValueError(
                        f"DatasetConfig.task_feature_lengths[{name!r}] = {length}, but the cached {what} {name!r} "
                        f"of task {task!r} take {longest} tokens. Set it to at least {longest}: taskdata "
                        "trains every cached token (the cache job trimmed them to the task's lengths)."
                    )

