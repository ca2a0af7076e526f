"""``Task``: a source, a list of preprocessors and the output features they produce (seqio's Task)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from taskdata.define.features import Feature
from taskdata.define.packing import Packing
from taskdata.fingerprint import describe, fingerprint
from taskdata.names import validate_name
from taskdata.preprocessors.base import Example, ShardContext
from taskdata.preprocessors.batch import ExampleBatch
from taskdata.sources.base import Source

__all__ = ["OutputFeatureError", "PreprocessingError", "Task"]

MetricFn = Callable[..., Mapping[str, Any]]


class OutputFeatureError(ValueError):
    """An example that does not match the task's declared output features."""


class PreprocessingError(ValueError):
    """A source shard whose examples could not be made: names the task, split, source shard, the stage
    (source reader, preprocessor or output check), the example and the original exception (also its
    ``__cause__``). One line, so that it survives a remote worker's traceback text whole."""


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """A named dataset definition.

    Attributes:
      name: letters, digits, ``_``, ``.`` and ``:`` only.
      source: where raw examples come from.
      preprocessors: applied in order to each source shard's stream (see ``taskdata.preprocessors``).
      output_features: the features every final example has, with their vocabularies.
      sequence_length: the lengths the preprocessors produce (e.g. inputs 512, targets 114).
      metric_fns: prediction metrics ``(targets, predictions) -> {name: value}``.
      score_metric_fns: score metrics ``(targets, scores) -> {name: value}``.
      postprocess_fn: ``(text, example=..., is_target=...) -> value`` applied to decoded outputs and
        targets before the metrics compare them.
      packing: if given, the cache stores packed rows of examples (``Packing``) instead of examples.
    """

    name: str
    source: Source
    preprocessors: Sequence[Any]
    output_features: Mapping[str, Feature]
    sequence_length: Mapping[str, int] | None = None
    metric_fns: Sequence[MetricFn] = ()
    score_metric_fns: Sequence[MetricFn] = ()
    postprocess_fn: Callable[..., Any] | None = None
    packing: Packing | None = None

    def __post_init__(self) -> None:
        validate_name(self.name, kind="task")
        if not isinstance(self.source, Source):
            raise TypeError(f"Task {self.name!r}: source must be a taskdata Source but got {type(self.source).__name__}.")
        if not self.output_features:
            raise ValueError(f"Task {self.name!r} declares no output features.")
        for key, feature in self.output_features.items():
            if not isinstance(feature, Feature):
                raise TypeError(f"Task {self.name!r}: output feature {key!r} must be a Feature but got {type(feature).__name__}.")
        for key, length in (self.sequence_length or {}).items():
            if not isinstance(length, int) or length <= 0:
                raise ValueError(f"Task {self.name!r}: sequence_length[{key!r}] must be a positive integer but got {length!r}.")
        object.__setattr__(self, "preprocessors", tuple(self.preprocessors))
        object.__setattr__(self, "metric_fns", tuple(self.metric_fns))
        object.__setattr__(self, "score_metric_fns", tuple(self.score_metric_fns))
        object.__setattr__(self, "output_features", dict(self.output_features))
        if self.packing is not None:
            self._check_packing()

    def _check_packing(self) -> None:
        if not isinstance(self.packing, Packing):
            raise TypeError(f"Task {self.name!r}: packing must be a Packing but got {type(self.packing).__name__}.")
        lengths = self.packing_lengths
        if not lengths:
            raise ValueError(f"Task {self.name!r} asks for packing but has no sequence_length to pack to. Give "
                             "sequence_length, or Packing(lengths={...}).")
        unknown = sorted(set(lengths) - set(self.output_features))
        if unknown:
            raise ValueError(f"Task {self.name!r}: packing lengths name {unknown}, which are not output features "
                             f"({sorted(self.output_features)}).")
        unpacked = sorted(set(self.output_features) - set(lengths))
        if unpacked:
            raise ValueError(f"Task {self.name!r}: output features {unpacked} have no packing length, and a packed row "
                             "has no place for them. Give them a length, or drop them from the task's output features "
                             "(e.g. with Rekey) for the packed variant.")
        for key in lengths:
            feature = self.output_features[key]
            if feature.dtype == "string" or feature.rank != 1:
                raise ValueError(f"Task {self.name!r}: output feature {key!r} ({feature.dtype}, rank {feature.rank}) "
                                 "cannot be packed: only rank-1 token features can.")

    @property
    def packing_lengths(self) -> dict[str, int] | None:
        """The row length of every packed feature, or None for a task that is not packed."""
        if self.packing is None:
            return None
        return dict(sorted((self.packing.lengths or self.sequence_length or {}).items()))

    def with_packing(self, packing: Packing | None = None, name: str | None = None) -> Task:
        """This task with packed caches (``Packing()`` by default), under ``name`` or its own name."""
        return dataclasses.replace(self, name=name or self.name, packing=packing or Packing())

    @property
    def splits(self) -> tuple[str, ...]:
        return self.source.splits

    def fingerprint_description(self) -> dict[str, Any]:
        description = {
            "task": self.name,
            "source": self.source.fingerprint_description(),
            "preprocessors": [describe(p) for p in self.preprocessors],
            "output_features": {k: v.fingerprint_description() for k, v in sorted(self.output_features.items())},
            "sequence_length": dict(sorted((self.sequence_length or {}).items())),
        }
        if self.packing is not None:  # absent otherwise, so that unpacked tasks keep their fingerprints
            description["packing"] = {**self.packing.fingerprint_description(), "lengths": self.packing_lengths}
        return description

    def fingerprint(self) -> str:
        """A stable hash of everything that determines this task's examples (not its metrics)."""
        return fingerprint(self)

    def component_fingerprints(self) -> dict[str, str]:
        """The task's fingerprint and one per part of it, so that a mismatch can be named precisely."""
        features = sorted(self.output_features.items())
        parts = {
            "task": self.fingerprint(),
            "source": fingerprint(self.source.fingerprint_description()),
            "preprocessors": fingerprint([describe(p) for p in self.preprocessors]),
            "vocabularies": fingerprint({k: f.vocabulary.fingerprint_description() for k, f in features}),
            "output_features": fingerprint({k: f.fingerprint_description() for k, f in features}),
        }
        if self.packing is not None:
            parts["packing"] = fingerprint(self.fingerprint_description()["packing"])
        return parts

    def shard_context(self, split: str, shard_index: int, seed: int,
                      sequence_length: Mapping[str, int] | None = None) -> ShardContext:
        return ShardContext(
            task=self.name, split=split, shard_index=shard_index, seed=seed,
            sequence_length=dict(sequence_length or self.sequence_length or {}),
            output_features=self.output_features,
        )

    def process_shard(self, ctx: ShardContext, shard: str, *, allow_empty: bool = False) -> Iterator[Example]:
        """Source records of ``shard`` through every preprocessor; the final examples are checked.

        Any exception on the way is re-raised as a ``PreprocessingError`` saying where it happened. A
        shard with no source records at all is an error too (an empty or zero-byte file is more often
        a broken export than an intended one) unless ``allow_empty`` or the source allows empty shards.
        """
        where, source, stream = self._examples(ctx, shard, len(self.preprocessors))
        for produced, example in enumerate(stream):
            try:
                self.check_example(example)
            except OutputFeatureError as e:
                raise where.error("checking the output features",
                                  f"example {produced} of the shard ({source.count} source records read)", e) from e
            yield example
        self._check_read(where, source, ctx, shard, allow_empty)

    def batch_start(self) -> int | None:
        """The preprocessor from which ``process_shard_batches`` runs in columns, or None if it cannot.

        That is the last one with a ``to_batches`` form (``taskdata.preprocessors.batch``), if every one
        after it has a ``map_batches`` form.
        """
        for number in range(len(self.preprocessors) - 1, -1, -1):
            preprocessor = self.preprocessors[number]
            if hasattr(preprocessor, "to_batches"):
                return number
            if not hasattr(preprocessor, "map_batches"):
                return None
        return None

    def process_shard_batches(self, ctx: ShardContext, shard: str, *, allow_empty: bool = False,
                              ) -> Iterator[ExampleBatch]:
        """``process_shard``'s examples, in the same order, in columns (``ExampleBatch``): the preprocessors
        before ``batch_start()`` run per example, the rest on batches. The same checks, the same errors
        (a later stage's names the batch it failed on). Only for tasks whose ``batch_start()`` is not None.
        """
        start = self.batch_start()
        if start is None:
            raise ValueError(f"Task {self.name!r} has no batch form: its last preprocessors are not one with "
                             "to_batches followed only by ones with map_batches. Use process_shard.")
        where, source, examples = self._examples(ctx, shard, start)
        inputs = _Counted(examples)
        batches: Iterator[ExampleBatch] = where.guard(
            self.preprocessors[start].to_batches(inputs, ctx), self._stage(start), inputs, source)
        for number in range(start + 1, len(self.preprocessors)):
            batch_inputs = _Counted(batches)
            batches = where.guard(self.preprocessors[number].map_batches(batch_inputs, ctx), self._stage(number),
                                  batch_inputs, source, unit="batch")
        produced = 0
        for batch in batches:
            try:
                self.check_batch(batch)
            except _RowError as e:
                raise where.error("checking the output features",
                                  f"example {produced + e.row} of the shard ({source.count} source records read)",
                                  e.error) from e.error
            produced += len(batch)
            yield batch
        self._check_read(where, source, ctx, shard, allow_empty)

    def _examples(self, ctx: ShardContext, shard: str, stages: int) -> tuple[_Where, _Counted, Iterator[Example]]:
        """(where, the counted source records, the stream after the first ``stages`` preprocessors)."""
        where = _Where(self.name, ctx.split, ctx.shard_index, shard)
        source = _Counted(_with_source_index(self.source.read_shard(ctx.split, shard)))
        stream: Iterator[Example] = where.guard(source, "reading the source", source, source)
        for number in range(stages):
            inputs = _Counted(stream)
            stream = where.guard(self.preprocessors[number](inputs, ctx), self._stage(number), inputs, source)
        return where, source, stream

    def _stage(self, number: int) -> str:
        return f"preprocessor {number + 1} of {len(self.preprocessors)} ({_stage_name(self.preprocessors[number])})"

    def _check_read(self, where: _Where, source: _Counted, ctx: ShardContext, shard: str, allow_empty: bool) -> None:
        if source.count == 0 and not (allow_empty or self.source.allows_empty_shards):
            raise PreprocessingError(
                f"{where}: the source shard holds no records ({self.source.describe_shard(shard)}). Remove it if it "
                "is a broken export; if empty source files are expected, build the source with allow_empty_files="
                "True (allow_empty_shards=True for a FunctionSource) or pass 'taskdata cache "
                "--allow-empty-source-files'.")
        if source.count == 0:
            ctx.count("empty_source_shards")

    def iter_examples(self, split: str, seed: int, sequence_length: Mapping[str, int] | None = None,
                      ) -> Iterator[tuple[ShardContext, Example]]:
        """Every example of ``split`` in source order, shard after shard (no Beam)."""
        self.source.check_split(split)
        for shard_index, shard in enumerate(self.source.list_shards(split)):
            ctx = self.shard_context(split, shard_index, seed, sequence_length)
            for example in self.process_shard(ctx, shard):
                yield ctx, example

    def check_example(self, example: Example) -> None:
        for key, feature in self.output_features.items():
            if key not in example:
                if feature.required:
                    raise OutputFeatureError(
                        f"Task {self.name!r}: an example lacks required output feature {key!r} "
                        f"(it has {sorted(k for k in example if not k.startswith('_'))}). "
                        "Check that the preprocessors produce it."
                    )
                continue
            value = example[key]
            if feature.dtype == "string":
                continue
            array = value if type(value) is np.ndarray else np.asarray(value)
            # The kinds np.issubdtype(dtype, np.number) accepts (timedelta is one), without its cost per feature per example.
            if array.ndim != feature.rank or array.dtype.kind not in "iufcm":
                raise OutputFeatureError(
                    f"Task {self.name!r}: output feature {key!r} must be a rank-{feature.rank} numeric "
                    f"array but got dtype {array.dtype} with shape {array.shape}."
                )
            limit = (self.sequence_length or {}).get(key)
            if limit is not None and array.shape[0] > limit:
                raise OutputFeatureError(
                    f"Task {self.name!r}: output feature {key!r} has length {array.shape[0]} but "
                    f"sequence_length[{key!r}] is {limit}. Add a trim step to the preprocessors."
                )

    def check_batch(self, batch: ExampleBatch) -> None:
        """``check_example`` for every row of ``batch``, in columns: raises ``_RowError`` with the first failing
        row and the error ``check_example`` gives for it."""
        rows = len(batch)
        bad = rows
        for key, feature in self.output_features.items():
            column = batch.tokens.get(key)
            if column is None:
                if key in batch.meta or feature.required:  # the row check says what is wrong
                    bad = 0
                continue
            limit = (self.sequence_length or {}).get(key)
            if feature.rank != 1 or column.values.dtype.kind not in "iufcm":
                bad = 0
            elif limit is not None and rows:
                over = np.flatnonzero(column.lengths > limit)
                if over.size:
                    bad = min(bad, int(over[0]))
        if bad < rows:
            row = next(itertools.islice(batch.rows(), bad, None))
            try:
                self.check_example(row)
            except OutputFeatureError as e:
                raise _RowError(bad, e) from e
            raise AssertionError(f"check_batch found row {bad} of a batch wrong but check_example accepts it")


class _RowError(Exception):
    """A batch's row ``row`` that fails ``check_example`` with ``error``."""

    def __init__(self, row: int, error: OutputFeatureError):
        super().__init__(row, error)
        self.row = row
        self.error = error


class _Counted:
    """An iterator that counts what has been taken from it (the ordinal of the example a stage is on)."""

    def __init__(self, items: Iterator[Any]):
        self._items = iter(items)
        self.count = 0

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        item = next(self._items)
        self.count += 1
        return item


@dataclasses.dataclass(frozen=True)
class _Where:
    """The task, split and source shard being processed, for errors that say where they happened."""

    task: str
    split: str
    shard_index: int
    shard: str

    def guard(self, stream: Iterator[Any], stage: str, inputs: _Counted, source: _Counted, unit: str = "example",
              ) -> Iterator[Any]:
        """``stream``, with an exception raised by this stage (not one passed up from an earlier stage,
        which that stage's guard has already placed) re-raised as a PreprocessingError. ``unit``: what the
        stage takes in (an example, or a batch of them)."""
        try:
            yield from stream
        except PreprocessingError:
            raise
        except Exception as e:
            if inputs is source:
                position = f"record {source.count} of the shard"
            else:
                example = f"its input {unit} {inputs.count - 1}" if inputs.count else f"before its first input {unit}"
                position = f"{example} ({source.count} source records read)"
            raise self.error(stage, position, e) from e

    def error(self, stage: str, position: str, cause: Exception) -> PreprocessingError:
        return PreprocessingError(f"{self}: {stage} failed at {position}: {type(cause).__name__}: "
                                  f"{_one_line(str(cause))}")

    def __str__(self) -> str:
        return f"Task {self.task!r}, split {self.split!r}, source shard {self.shard_index} ({self.shard!r})"


def _stage_name(preprocessor: Any) -> str:
    """``module.function``, or ``module.repr`` of a preprocessor object (a dataclass shows its parameters)."""
    name = getattr(preprocessor, "__qualname__", None)
    text = f"{preprocessor.__module__}.{name}" if name else f"{type(preprocessor).__module__}.{preprocessor!r}"
    return text if len(text) <= 200 else text[:197] + "..."


def _one_line(text: str) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()) or "(no message)"


def _with_source_index(records: Iterator[dict[str, Any]]) -> Iterator[Example]:
    for index, record in enumerate(records):
        record["_source_index"] = index
        yield record
