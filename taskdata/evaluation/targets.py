"""Where the targets of a task's split come from: recomputed from its source, or read from a cache version.

A ``TargetsSource`` is a callable ``(task, split) -> iterable of (example_id, target_text, example)``
that can ``describe()`` itself for the report. ``SourceTargets`` recomputes them from the task's
source through its preprocessors; ``CacheTargets`` reads them from a cache version (``--cache`` may name
a cache root, where ``{root}/{task}/CURRENT`` is used for each task, a task folder, or one version
folder). Cache ids come from the records' provenance, so they are the ids a multi-host inference job
wrote its predictions under.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from taskdata import fs
from taskdata.cache.format import CacheFormatError, current_version, task_dir
from taskdata.cache.provenance import provenance_spec, read_provenance
from taskdata.define.features import Feature
from taskdata.define.packing import Packing
from taskdata.define.task import Task
from taskdata.evaluation.predictions import EvaluationError
from taskdata.example.packing import unpack_row
from taskdata.seeding import check_seed, format_example_id

__all__ = ["CacheTargets", "SourceTargets", "TargetRecord", "TargetsSource", "resolve_version_dir"]

TargetRecord = tuple[str, str, Mapping[str, Any]]



class TargetsSource(Protocol):
    """Where the targets of a task's split come from."""

    def __call__(self, task: Task, split: str) -> Iterable[TargetRecord]:
        """``(example_id, target_text, example)`` for every example of ``split``, each id once."""
        ...

    def describe(self) -> dict[str, Any]:
        """A JSON description for the report (e.g. the seed, or the cache version read)."""
        ...


@dataclasses.dataclass(frozen=True)
class SourceTargets:
    """Targets recomputed from the task's source through its preprocessors (no cache needed).

    ``seed`` must be the seed the evaluated examples were built with: random preprocessors (span
    corruption, for one) make different targets under different seeds. The target text is the
    example's ``targets_pretokenized`` when the preprocessors keep it (seqio's convention: the raw
    text, before any truncation), else its ``targets`` ids decoded with the feature's vocabulary.
    """

    seed: int

    def __post_init__(self) -> None:
        check_seed(self.seed)

    def describe(self) -> dict[str, Any]:
        return {"type": "source", "seed": self.seed}

    def __call__(self, task: Task, split: str) -> Iterable[TargetRecord]:
        feature = task.output_features.get("targets")
        if feature is None:
            raise EvaluationError(
                f"Task {task.name!r} has no 'targets' output feature (it has {sorted(task.output_features)}), "
                "so there is nothing to compare predictions with."
            )
        # The id's ordinal counts the examples each source shard's preprocessed stream yields, exactly as
        # the cache numbers them; iter_examples runs shard after shard.
        ordinals: dict[int, int] = {}
        for ctx, example in task.iter_examples(split, self.seed):
            ordinal = ordinals.get(ctx.shard_index, 0)
            ordinals[ctx.shard_index] = ordinal + 1
            yield (
                format_example_id(task.name, split, ctx.shard_index, ordinal),
                _target_text(feature, example),
                example,
            )


def _target_text(feature: Feature, example: Mapping[str, Any]) -> str:
    raw = example.get("targets_pretokenized")
    if raw is None and feature.dtype == "string":
        raw = example["targets"]
    if isinstance(raw, bytes):
        return raw.decode("utf-8")
    if isinstance(raw, str):
        return raw
    return feature.vocabulary.decode(example["targets"])



_BATCH = 1024


def resolve_version_dir(cache: str, task: str) -> str:
    """The version folder of ``task`` that ``cache`` designates (root, task folder or version folder)."""
    if fs.exists(fs.join(cache, "COMPLETED")):
        return cache
    for candidate in (task_dir(cache, task), cache):
        version = current_version(candidate)
        if version is not None:
            return version
    raise CacheFormatError(
        f"{cache} holds no complete cache of task {task!r}: expected a cache root with {task}/CURRENT, a task "
        "folder with CURRENT, or a version folder with COMPLETED. Build one with 'taskdata cache'.")


@dataclasses.dataclass(frozen=True)
class CacheTargets:
    """The targets of every example of a split, as stored in a cache version."""

    cache: str
    seed: int | None = None

    def describe(self) -> dict[str, Any]:
        return {"type": "cache", "cache": self.cache, "seed": self.seed}

    def __call__(self, task: Task, split: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
        from taskdata.cache.reader import CacheReader

        reader = CacheReader(resolve_version_dir(self.cache, task.name))
        manifest = reader.manifest
        if manifest.task != task.name:
            raise CacheFormatError(f"{reader.version_dir} is a cache of task {manifest.task!r}, not {task.name!r}.")
        if self.seed is not None and manifest.seed != self.seed:
            raise CacheFormatError(
                f"{reader.version_dir} was built with seed {manifest.seed}, not {self.seed}: its targets are not the "
                "ones the predictions were made for. Leave out --seed to use the cache's own seed.")
        if manifest.packing is not None and task.packing is None:
            # Built with 'taskdata cache --pack': the task as packed, so that its fingerprint can match.
            task = task.with_packing(Packing(dict(manifest.packing["lengths"]), int(manifest.packing["open_rows"])))
        if manifest.task_fingerprint != task.fingerprint():
            ours = task.component_fingerprints()
            differ = [part for part, value in sorted(manifest.fingerprints.items()) if ours.get(part) != value and part != "task"]
            hint = (" The source files differ: pass the --c4-dir (or source) the cache was built from."
                    if differ == ["source"] else "")
            raise CacheFormatError(
                f"{reader.version_dir} was built from another definition of task {task.name!r} (differing: "
                f"{', '.join(differ) or 'the whole definition'}; fingerprint {manifest.task_fingerprint[:12]}, now "
                f"{task.fingerprint()[:12]}).{hint} Otherwise rebuild the cache or evaluate from source.")
        vocabulary = task.output_features["targets"].vocabulary
        for example_id, ids in _cached_targets(reader, task.name, split):
            yield example_id, vocabulary.decode(ids), {"targets": ids}


def _cached_targets(reader: Any, task: str, split: str) -> Iterator[tuple[str, np.ndarray]]:
    """(example id, targets) of every example of a cache split, in cache order; a packed row's in segment order."""
    manifest = reader.manifest
    packed = "targets" in manifest.packed_features
    spec = {"targets": "int32", **provenance_spec(manifest)}
    if packed:
        spec["targets_segment_ids"] = "int32"
    for shard, count in enumerate(reader.record_counts(split)):
        for first in range(0, count, _BATCH):
            n = min(_BATCH, count - first)
            decoded = reader.decode(reader.read(split, shard, first, n), spec)
            found = read_provenance(manifest, split, decoded)
            ids = iter(found.ids(task, split))
            for i, segments in enumerate(found.examples_per_record.tolist()):
                row = {name: np.asarray(decoded[name].row(i)) for name in ("targets", "targets_segment_ids")
                       if name in decoded}
                targets = ([segment["targets"] for segment in unpack_row(row, ["targets"], segments)]
                           if packed else [row["targets"]])
                for values in targets:
                    yield next(ids), values
