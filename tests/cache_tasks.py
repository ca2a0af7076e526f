"""Tasks for cache-job tests, importable by Beam worker processes (``--module tests.cache_tasks``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import numpy as np

from taskdata.define.features import Feature
from taskdata.define.packing import Packing
from taskdata.define.task import Task
from taskdata.define.vocabularies import ByteVocabulary
from taskdata.metrics import sequence_accuracy
from taskdata.preprocessors import AppendEosAfterTrim, Rekey, SpanCorruption, Tokenize
from taskdata.preprocessors.base import Example, ShardContext
from taskdata.sources import C4Source, FunctionSource, TextLineSource

VOCAB = ByteVocabulary()
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma"]


def synthetic_documents(split: str, shard: str) -> Iterator[dict]:
    """Deterministic documents: shard s of split has 40 + 7*s documents of varying length."""
    s = int(shard)
    rng = np.random.default_rng([s, len(split)])
    for i in range(40 + 7 * s):
        n = int(rng.integers(1, 30))
        words = [WORDS[int(j)] for j in rng.integers(0, len(WORDS), n)]
        yield {"text": f"{split} {s}.{i}: " + " ".join(words)}


@dataclasses.dataclass(frozen=True)
class EncodeText:
    """text -> targets (bytes); inputs = a prefix of it. Deterministic: no randomness."""

    prefix_chars: int = 8

    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        for example in examples:
            text = example["text"]
            yield {"inputs": VOCAB.encode(text[: self.prefix_chars]), "targets": VOCAB.encode(text),
                   "_source_index": example["_source_index"]}


@dataclasses.dataclass(frozen=True)
class RandomCrop:
    """Drops a random number of leading target tokens (uses the seeded per-example RNG)."""

    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        for ordinal, example in enumerate(examples):
            rng = ctx.rng("random_crop", ordinal)
            cut = int(rng.integers(0, max(1, len(example["targets"]) // 2)))
            yield {**example, "targets": example["targets"][cut:]}


@dataclasses.dataclass(frozen=True)
class TargetsOnly:
    """Drops every feature but ``targets`` (a decoder-only task)."""

    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        for example in examples:
            yield {k: v for k, v in example.items() if k == "targets" or k.startswith("_")}


FEATURES = {"inputs": Feature(VOCAB), "targets": Feature(VOCAB)}
SPLITS = {"train": [str(i) for i in range(6)], "validation": ["0", "1"]}


def documents_with_a_gap(split: str, shard: str) -> Iterator[dict]:
    """``synthetic_documents``, except that document 5 of shard 2 has no 'text' (a 'body' instead)."""
    for i, document in enumerate(synthetic_documents(split, shard)):
        yield {"body": document["text"]} if (shard, i) == ("2", 5) else document


def c4_dir() -> str:
    return os.environ["TASKDATA_TEST_C4_DIR"]


def register_tasks(registry) -> None:
    registry.add(Task("toy_det", FunctionSource(synthetic_documents, SPLITS), [EncodeText()], FEATURES))
    registry.add(Task("toy_random", FunctionSource(synthetic_documents, SPLITS), [EncodeText(), RandomCrop()],
                      FEATURES, metric_fns=[sequence_accuracy]))
    registry.add(Task("toy_text", EnvTextSource(), [EncodeText()], FEATURES))
    registry.add(Task("toy_gap", FunctionSource(documents_with_a_gap, SPLITS), [EncodeText()], FEATURES))
    registry.add(Task("toy_c4", C4Source(c4_dir, splits=("train",)), [EncodeText()], FEATURES))
    # toy_det's examples packed into rows of 64 + 128 tokens: some targets (up to ~190) are trimmed.
    registry.add(registry.get_task("toy_det").with_packing(Packing(PACKED_LENGTHS), name="toy_packed"))
    # toy_random with sequence lengths that every example fits: 'taskdata cache --pack' packs it at them.
    # Decoder-only: targets alone, packed into rows of 128 (the LM layout).
    registry.add(Task("toy_lm", FunctionSource(synthetic_documents, SPLITS), [EncodeText(), TargetsOnly()],
                      {"targets": FEATURES["targets"]}, packing=Packing({"targets": 128})))
    # T5's span corruption over bytes in chunks of 52 tokens (3 noise spans each): the cache job makes
    # these records in columns (ExampleBatch).
    registry.add(Task("toy_span", FunctionSource(synthetic_documents, SPLITS),
                      [Rekey({"inputs": None, "targets": "text"}), Tokenize(), SpanCorruption(concat_batch_size=8),
                       AppendEosAfterTrim()], FEATURES, sequence_length={"inputs": 48, "targets": 12}))
    registry.add(Task("toy_lengths", FunctionSource(synthetic_documents, SPLITS), [EncodeText(), RandomCrop()],
                      FEATURES, sequence_length=SEQUENCE_LENGTHS))


PACKED_LENGTHS = {"inputs": 64, "targets": 128}
SEQUENCE_LENGTHS = {"inputs": 64, "targets": 256}


class EnvTextSource(TextLineSource):
    """Text files in ``$TASKDATA_TEST_TEXT_DIR``, resolved when used (tests point it at a temp folder)."""

    def __init__(self) -> None:
        super().__init__({"train": "unused"})

    def list_shards(self, split: str) -> list[str]:
        self.check_split(split)
        folder = os.environ["TASKDATA_TEST_TEXT_DIR"]
        files = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".txt"))
        if not files:
            raise FileNotFoundError(f"No .txt files in {folder}")
        return files
