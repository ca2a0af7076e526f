"""Validation predictions of the example trainer: greedy decoding of ``targets`` for a cache split.

After training, process 0 reads the first ``count`` examples of a split (e.g. ``validation``) of every
task of the run, from the cache version the run pins (the folder its read instructions name, opened
only if its manifest sha256 is the plan's), decodes their ``targets`` greedily with the trained
parameters and writes JSON lines ``{"id": "task/split/shard/ordinal", "prediction": "..."}`` that
``taskdata eval NAME --cache ... --allow-partial`` scores. Ids come from the records' provenance,
as ``taskdata eval --cache`` reads them; texts are decoded with the task's ``targets`` vocabulary
from the registry, which must be the one the cache was built with (checked against its manifest).

"First" is in cache order (shard 0 from its first record, then shard 1, ...). A cache is globally
shuffled, so these examples are a uniform sample of the split, the same for every run of that cache.

The forward pass is ``trainer_client.example.model.loss_fn``'s, split in two so that the encoder runs once
and the decoder once per generated position; a test pins that its teacher-forced logits give
``loss_fn``'s loss, so predictions come from the model that was trained.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from taskdata import fs
from taskdata.cache.format import CacheFormatError
from taskdata.cache.provenance import provenance_spec, read_provenance
from taskdata.cache.reader import CacheReader
from taskdata.define.registry import Registry
from taskdata.define.task import Task
from taskdata.define.vocabularies import Vocabulary
from taskdata.example import pad_features
from trainer_client.assignments import AssignmentError, AssignmentSource, HostSlice
from trainer_client.example.model import ModelConfig, _decoder_hidden, _logits, decoder_logits, encode

__all__ = [
    "decoder_logits",
    "encode",
    "first_examples",
    "greedy_decode",
    "pinned_version_dirs",
    "predict_run",
    "targets_vocabulary",
    "write_predictions",
]

_DECODE_BATCH = 32  # rows per compiled decode call; the last batch is padded, so one shape compiles
_SCAN_WINDOW = 16
_SCAN_STEPS = 1024


@functools.partial(jax.jit, static_argnames=("config", "length"))
def _greedy(
    params: Mapping[str, jax.Array], inputs: jax.Array, config: ModelConfig, length: int
) -> jax.Array:
    encoded = encode(params, inputs, config)

    def body(t: jax.Array, tokens: jax.Array) -> jax.Array:
        # Position t sees decoder inputs [PAD, tokens[:t]] only (causal), so recomputing the whole
        # sequence with the not-yet-generated tail still zero gives the same logits at t.
        decoder_inputs = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))
        hidden = _decoder_hidden(params, encoded, inputs, decoder_inputs, config)
        step_logits = _logits(params, jax.lax.dynamic_index_in_dim(hidden, t, axis=1, keepdims=False), config)
        return tokens.at[:, t].set(jnp.argmax(step_logits, axis=-1).astype(tokens.dtype))

    tokens = jnp.zeros((inputs.shape[0], length), dtype=jnp.int32)
    return jax.lax.fori_loop(0, length, body, tokens)


def greedy_decode(
    params: Mapping[str, np.ndarray], inputs: np.ndarray, config: ModelConfig, length: int
) -> np.ndarray:
    """Greedy ``targets`` [rows, length] int32 for padded ``inputs`` [rows, inputs length], on this process.

    Runs on this process's first device, so one process can decode while others wait.
    """
    inputs = np.asarray(inputs, dtype=np.int32)
    if inputs.ndim != 2:
        raise ValueError(f"inputs must be [rows, length] but got shape {inputs.shape}.")
    out = np.zeros((len(inputs), length), dtype=np.int32)
    with jax.default_device(jax.local_devices()[0]):
        device_params = {name: jnp.asarray(value) for name, value in params.items()}
        for first in range(0, len(inputs), _DECODE_BATCH):
            chunk = inputs[first : first + _DECODE_BATCH]
            padded = np.zeros((_DECODE_BATCH, inputs.shape[1]), dtype=np.int32)
            padded[: len(chunk)] = chunk
            tokens = np.asarray(_greedy(device_params, jnp.asarray(padded), config, length))
            out[first : first + len(chunk)] = tokens[: len(chunk)]
    return out


def first_examples(
    reader: CacheReader, split: str, count: int, inputs_length: int
) -> tuple[list[str], np.ndarray]:
    """Ids and padded ``inputs`` [n, inputs_length] of the first ``count`` examples of ``split`` (fewer if
    the split is smaller), in cache order."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive integer but got {count!r}.")
    if reader.manifest.packing is not None:
        raise CacheFormatError(
            f"Cache {reader.version_dir} of task {reader.task!r} holds packed rows of several examples; predictions "
            "decode one example per record. Predict from an unpacked cache of the task (built without --pack, or "
            "the task's unpacked variant).")
    provenance = provenance_spec(reader.manifest)  # says what is missing if the cache has no provenance
    missing = [name for name in ("inputs", *provenance) if name not in reader.manifest.features]
    if missing:
        raise CacheFormatError(
            f"Cache {reader.version_dir} of task {reader.task!r} has no features {missing}; predictions need "
            "'inputs' and the provenance ids (caches written by 'taskdata cache' have both)."
        )
    records: list[bytes] = []
    for shard, size in enumerate(reader.record_counts(split)):
        take = min(size, count - len(records))
        if take <= 0:
            break
        records += reader.read(split, shard, 0, take)
    decoded = reader.decode(records, {"inputs": "int32", **provenance})
    ids = read_provenance(reader.manifest, split, decoded).ids(reader.task, split)
    try:
        inputs = pad_features(decoded, {"inputs": inputs_length})["inputs"]
    except ValueError as error:
        raise ValueError(
            f"Split {split!r} of task {reader.task!r}: {error} Raise --inputs-length to at least "
            f"{reader.max_tokens(split, 'inputs')} (the split's longest inputs)."
        ) from None
    return ids, inputs


def targets_vocabulary(task: Task, reader: CacheReader) -> Vocabulary:
    """``task``'s targets vocabulary, refused unless the cache was built with the same vocabularies."""
    stored = reader.manifest.fingerprints.get("vocabularies")
    ours = task.component_fingerprints()["vocabularies"]
    if stored != ours:
        raise CacheFormatError(
            f"Cache {reader.version_dir} of task {task.name!r} was built with other vocabularies (fingerprint "
            f"{str(stored)[:12]}) than the registered task has now ({ours[:12]}): its ids would decode to "
            "wrong text. Point $TASKDATA_VOCAB (or the task's definition, via --module) at the vocabulary the "
            "cache was built with."
        )
    return task.output_features["targets"].vocabulary


def pinned_version_dirs(source: AssignmentSource) -> dict[str, str]:
    """Task -> the cache version folder the run pins, where the source's read instructions point.

    Every task's caches share one cache root; it is read off the first read of the run's first steps
    that read anything (a plan may skip the data of its first steps).
    """
    info = source.run_info()
    for first in range(0, _SCAN_STEPS, _SCAN_WINDOW):
        for step in source.fetch(first, _SCAN_WINDOW, HostSlice(0, 1)):
            for task in step.tasks:
                if len(task):
                    # A shard URI is {root}/{task}/{version}/{file}.
                    root = task.file_uris[0].rsplit("/", 3)[0]
                    return {t.task: fs.join(root, t.task, t.version) for t in step.tasks}
    raise AssignmentError(
        f"Run {info.name!r} reads no records in its first {_SCAN_STEPS} steps, so the cache versions it pins "
        "cannot be located from its read instructions. Predict with a run that reads data."
    )


def predict_run(
    params: Mapping[str, np.ndarray],
    config: ModelConfig,
    source: AssignmentSource,
    registry: Registry,
    *,
    split: str,
    count: int,
    lengths: Mapping[str, int],
) -> list[dict[str, str]]:
    """``{"id", "prediction"}`` rows for the first ``count`` examples of ``split`` of every task of the run."""
    plan = source.run_info().plan
    tasks = {name: registry.get_task(name) for name in plan.task_names}  # unknown names fail before reading
    rows = []
    for name, version_dir in pinned_version_dirs(source).items():
        with CacheReader(version_dir, expected_manifest_sha256=plan.caches[name].fingerprint) as reader:
            vocabulary = targets_vocabulary(tasks[name], reader)
            ids, inputs = first_examples(reader, split, count, lengths["inputs"])
        tokens = greedy_decode(params, inputs, config, lengths["targets"])
        rows += [
            {"id": example_id, "prediction": vocabulary.decode(row)}
            for example_id, row in zip(ids, tokens.tolist(), strict=True)
        ]
    return rows


def write_predictions(path: str, rows: Sequence[Mapping[str, str]]) -> None:
    """JSON lines at ``path`` (local or ``gs://``), written whole: readers never see part of the file."""
    fs.write_atomic(path, "".join(json.dumps(dict(row), ensure_ascii=False) + "\n" for row in rows).encode())
