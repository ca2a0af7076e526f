"""A registered seqio Task as a taskdata task: what ``seqio_cache_tasks`` writes, built by taskdata's job.

For one source shard, a ``SeqioTask`` runs exactly what seqio's cache job runs (``beam_utils.PreprocessTask``):
the seqio source's dataset of that shard (``ShardInfo(i, number of source shards)``, unshuffled), then every
preprocessor before the ``CacheDatasetPlaceholder`` under seqio's seed manager, seeded with the shard's seqio
seed (``seeds.seqio_shard_seed``, taskdata's seed as seqio's ``--base_seed``). Everything after that is the
common cache job: stable ids (task, split, source shard, position in the shard's output), the keyed global
shuffle, sorted shards with offsets, the manifest and ``COMPLETED``.

What seqio runs after the placeholder runs when seqio reads its cache, with a new seed every epoch; taskdata
serves cached examples as they are, so a task with such preprocessors is refused, saying how to move them.

The examples a source shard yields are the seqio source's records after those preprocessors: for the
provenance (``taskdata.cache.provenance``), a bridged task's "source documents" are these examples (seqio
does not track which input record an output came from), so an example's first source document is its position.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from taskdata.define.features import Feature
from taskdata.define.task import Task, _Counted, _Where
from taskdata.fingerprint import fingerprint
from taskdata.names import InvalidNameError, validate_name
from taskdata.preprocessors.base import Example, ShardContext
from taskdata.seqio_bridge.describe import describe_preprocessor, describe_source, qualified_name
from taskdata.seqio_bridge.errors import SeqioBridgeError
from taskdata.seqio_bridge.metrics import bridge_metrics
from taskdata.seqio_bridge.runtime import import_seqio
from taskdata.seqio_bridge.seeds import SEEDING, seqio_shard_seed
from taskdata.seqio_bridge.vocabulary import SeqioVocabulary
from taskdata.sources.base import Source, estimated_file_bytes

__all__ = ["SeqioSource", "SeqioTask", "bridge_task"]

_FEATURE_DTYPES = ("int32", "int64", "float32", "string")

# seqio hands out the seeds of random preprocessors from a module-wide counter while a dataset is built
# (utils.map_seed_manager): building one shard's dataset at a time keeps threads from taking each other's.
_BUILD_LOCK = threading.Lock()


class SeqioSource(Source):
    """The source shards of a seqio task. ``read_shard`` gives the seqio source's raw records; the bridged
    task reads each shard through its pre-cache preprocessors instead (``SeqioTask.process_shard``)."""

    def __init__(self, seqio_task: Any):
        self.seqio_task = seqio_task
        self._checked_splits: set[str] = set()

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.seqio_task.source.splits)

    def list_shards(self, split: str) -> list[str]:
        self.check_split(split)
        shards = [str(s) for s in self.seqio_task.source.list_shards(split)]
        if not shards:
            raise SeqioBridgeError(
                f"seqio task {self.seqio_task.name!r}: its source {type(self.seqio_task.source).__qualname__} lists no "
                f"shards for split {split!r}. Check its file pattern."
            )
        if split not in self._checked_splits:
            self._check_splittable(split, len(shards))
            self._checked_splits.add(split)
        return shards

    def _check_splittable(self, split: str, num_shards: int) -> None:
        seqio = import_seqio()
        try:
            self.seqio_task.source.get_dataset(split=split, shuffle=False, shard_info=seqio.ShardInfo(0, num_shards))
        except Exception as e:
            raise SeqioBridgeError(
                f"seqio task {self.seqio_task.name!r}: its source {type(self.seqio_task.source).__qualname__} lists "
                f"{num_shards} shards for split {split!r} but cannot read one of them alone "
                f"(get_dataset(shard_info=ShardInfo(0, {num_shards})) failed: {e}). taskdata, like seqio_cache_tasks, "
                "reads each source shard on its own. Use a source that reads one shard by ShardInfo (seqio's "
                "TextLineDataSource, TFExampleDataSource or another FileDataSource over one file per shard), or one "
                "that lists a single shard (a FunctionDataSource)."
            ) from e

    def estimated_bytes(self, split: str) -> int | None:
        seqio = import_seqio()
        if isinstance(self.seqio_task.source, seqio.FileDataSource):
            return estimated_file_bytes(self.list_shards(split))
        return None

    def read_shard(self, split: str, shard: str) -> Iterator[dict[str, Any]]:
        """The seqio source's own records of ``shard`` (before any preprocessor), as Python values.

        A record that is not a dict (a ``TextLineDataSource`` line) becomes ``{"text": line}``, as in
        taskdata's ``TextLineSource``; single strings become ``str``.
        """
        seqio = import_seqio()
        shards = self.list_shards(split)
        dataset = self.seqio_task.source.get_dataset(
            split=split, shuffle=False, shard_info=seqio.ShardInfo(_shard_index(self, split, shard, shards), len(shards)))
        for record in dataset.as_numpy_iterator():
            yield {k: _text(v) for k, v in record.items()} if isinstance(record, dict) else {"text": _text(record)}

    def fingerprint_description(self) -> Any:
        return describe_source(self.seqio_task.source, self.seqio_task.name)


class SeqioTask(Task):
    """A bridged seqio Task (``source`` is a ``SeqioSource``); ``preprocessors`` are its seqio
    preprocessors before the placeholder, which ``process_shard`` runs as seqio's cache job does."""

    source: SeqioSource  # for type checkers only: bridge_task always builds it with one

    def precache_dataset(self, split: str, shard_index: int, seed: int) -> Any:
        """The ``tf.data.Dataset`` seqio's cache job makes of one source shard with ``--base_seed seed``."""
        seqio = import_seqio()
        seqio_task = self.source.seqio_task
        shards = self.source.list_shards(split)
        shard_seed = seqio_shard_seed(self.name, shard_index, seed)
        with _BUILD_LOCK:
            dataset = seqio_task.source.get_dataset(
                split=split, shuffle=False, seed=shard_seed, shard_info=seqio.ShardInfo(shard_index, len(shards)))
            return seqio_task.preprocess_precache(dataset, seed=shard_seed)

    def process_shard(self, ctx: ShardContext, shard: str, *, allow_empty: bool = False) -> Iterator[Example]:
        """seqio's source and preprocessors up to the placeholder, on one shard, with seqio's shard seed.

        Errors say where they happened, as for native tasks. ``allow_empty`` is accepted for the common
        job but has no effect: seqio runs its source and preprocessors as one tf.data pipeline, so the
        source's own record count is not seen here (a shard may legitimately preprocess to nothing).
        """
        del allow_empty
        if _shard_index(self.source, ctx.split, shard) != ctx.shard_index:
            raise SeqioBridgeError(
                f"seqio task {self.name!r}: source shard {shard!r} is not shard {ctx.shard_index} of split "
                f"{ctx.split!r}: the source lists its shards in another order now. Rebuild the cache.")
        import tensorflow as tf

        dataset = self.precache_dataset(ctx.split, ctx.shard_index, ctx.seed)
        _check_element_spec(self.name, dataset.element_spec)
        # As seqio's cache job does: TensorFlow runs ahead while this thread encodes and spills.
        produced = _Counted(dataset.prefetch(tf.data.AUTOTUNE).as_numpy_iterator())
        where = _Where(self.name, ctx.split, ctx.shard_index, shard)
        for example in where.guard(produced, "seqio's source and preprocessors", produced, produced):
            self.check_example(example)
            yield example

    def fingerprint_description(self) -> dict[str, Any]:
        return {
            "task": self.name,
            "seqio_version": import_seqio().__version__,
            "seeding": SEEDING,
            "source": self.source.fingerprint_description(),
            "preprocessors": self._preprocessors_description(),
            "output_features": {k: v.fingerprint_description() for k, v in sorted(self.output_features.items())},
        }

    def component_fingerprints(self) -> dict[str, str]:
        features = sorted(self.output_features.items())
        return {
            "task": self.fingerprint(),
            "source": fingerprint(self.source.fingerprint_description()),
            "preprocessors": fingerprint(self._preprocessors_description()),
            "vocabularies": fingerprint({k: f.vocabulary.fingerprint_description() for k, f in features}),
            "output_features": fingerprint({k: f.fingerprint_description() for k, f in features}),
        }

    def _preprocessors_description(self) -> list[Any]:
        return [describe_preprocessor(p, self.name) for p in self.preprocessors]


def bridge_task(seqio_task: Any) -> SeqioTask:
    """The taskdata task of a registered ``seqio.Task``; an error names what stands in the way and the fix."""
    seqio = import_seqio()
    name = seqio_task.name
    try:
        validate_name(name, kind="task")
    except InvalidNameError as e:
        raise SeqioBridgeError(
            f"seqio task {name!r} cannot be bridged under its own name: {e} Register it in seqio under such a name "
            "(e.g. with '_' for other characters)."
        ) from None
    try:
        preprocessors = list(seqio_task.preprocessors)
    except ValueError as e:  # seqio's own check: no sequence_length before the placeholder
        raise SeqioBridgeError(
            f"seqio task {name!r}: {e} To run such a preprocessor before the placeholder, bind fixed lengths in a "
            "module-level function, e.g. def my_step_512(dataset, output_features): return my_step(dataset, "
            "sequence_length={'inputs': 512, 'targets': 114}, output_features=output_features)."
        ) from None
    steps = [qualified_name(p) for p in preprocessors]
    placeholders = [i for i, p in enumerate(preprocessors) if isinstance(p, seqio.CacheDatasetPlaceholder)]
    if not placeholders:
        raise SeqioBridgeError(
            f"seqio task {name!r} has no seqio.CacheDatasetPlaceholder, so seqio would not cache it and taskdata, "
            "which caches exactly what seqio_cache_tasks would, does not know which part to cache. Add "
            "seqio.CacheDatasetPlaceholder() after the last deterministic step; at the end of its preprocessors it "
            f"caches the output of {type(seqio_task.source).__qualname__} -> {' -> '.join(steps) or '(no preprocessors)'}."
        )
    cut = placeholders[0]
    after = steps[cut + 1 :]
    if after:
        raise SeqioBridgeError(
            f"seqio task {name!r} has preprocessors after its CacheDatasetPlaceholder: {after}. seqio runs those when "
            "it reads the cache, with a new random seed every epoch; taskdata serves the cached examples as they are, "
            "in a fixed order, so it cannot serve them deterministically. Move them before "
            "seqio.CacheDatasetPlaceholder(): they then run once per source shard, seeded, when the cache is built. "
            "One that takes sequence_length needs the lengths bound in a module-level function (seqio refuses a "
            "sequence_length argument before the placeholder), e.g. def my_step_512(dataset, output_features): "
            "return my_step(dataset, sequence_length={'inputs': 512, 'targets': 114}, output_features=output_features)."
        )
    metric_fns, score_metric_fns = bridge_metrics(seqio_task)
    return SeqioTask(
        name=name,
        source=SeqioSource(seqio_task),
        preprocessors=tuple(preprocessors[:cut]),
        output_features=_output_features(seqio_task),
        metric_fns=metric_fns,
        score_metric_fns=score_metric_fns,
        postprocess_fn=seqio_task.postprocessor,
    )


def _output_features(seqio_task: Any) -> dict[str, Feature]:
    vocabularies: dict[int, SeqioVocabulary] = {}  # one wrapper per seqio vocabulary object
    features = {}
    for key, feature in seqio_task.output_features.items():
        dtype = feature.dtype.name
        if dtype not in _FEATURE_DTYPES:
            raise SeqioBridgeError(
                f"seqio task {seqio_task.name!r}: output feature {key!r} has dtype {dtype}; taskdata caches "
                f"{', '.join(_FEATURE_DTYPES)}. Cast it in a preprocessor before the placeholder."
            )
        vocabulary = vocabularies.setdefault(id(feature.vocabulary), SeqioVocabulary(feature.vocabulary))
        features[key] = Feature(vocabulary=vocabulary, add_eos=bool(feature.add_eos), dtype=dtype,
                                rank=int(feature.rank), required=bool(feature.required))
    return features


def _shard_index(source: SeqioSource, split: str, shard: str, shards: list[str] | None = None) -> int:
    shards = shards if shards is not None else source.list_shards(split)
    try:
        return shards.index(shard)
    except ValueError:
        raise SeqioBridgeError(
            f"seqio task {source.seqio_task.name!r}: source shard {shard!r} of split {split!r} is not among its shards "
            f"now ({len(shards)}: {shards[:3]}...): the source's files changed while the cache was built. Rebuild."
        ) from None


def _check_element_spec(task: str, spec: Any) -> None:
    import tensorflow as tf

    if not isinstance(spec, Mapping):
        raise SeqioBridgeError(
            f"seqio task {task!r}: its preprocessors before the placeholder yield {type(spec).__name__} elements, not "
            "dicts of features. Map them to a dict (e.g. with seqio.preprocessors.rekey) before the placeholder."
        )
    for key, value in spec.items():
        if key.startswith("_"):
            raise SeqioBridgeError(
                f"seqio task {task!r}: feature {key!r} starts with '_', which taskdata keeps for metadata it does not "
                "store. Rename it before the placeholder."
            )
        if not isinstance(value, tf.TensorSpec):
            raise SeqioBridgeError(
                f"seqio task {task!r}: feature {key!r} is a {type(value).__name__}; taskdata caches dense tensors. "
                "Make it dense (e.g. .to_tensor()) before the placeholder."
            )


def _text(value: Any) -> Any:
    # Single strings come back as text, which is what Python consumers of source records expect.
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value
