"""Tasks the cache drills build (``--module deploy.fault_drills._tasks``).

``drill_docs``: synthetic documents, enough of them that a build takes a few seconds (so that a kill
at a random moment can land in any phase). ``drill_text``: the ``.txt`` files of
``$TASKDATA_DRILL_TEXT_DIR``, so that a drill can switch a task's definition between two folders (as
an operator switches ``--c4-dir``). ``drill_c4``: the C4-format files of ``$TASKDATA_DRILL_C4_DIR``, which a
worker holds open while it preprocesses them (the Dask drills kill a worker that holds one).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import numpy as np

from taskdata.define.features import Feature
from taskdata.define.task import Task
from taskdata.define.vocabularies import ByteVocabulary
from taskdata.preprocessors.base import Example, ShardContext
from taskdata.sources import C4Source, FunctionSource, TextLineSource

VOCAB = ByteVocabulary()
FEATURES = {"inputs": Feature(VOCAB), "targets": Feature(VOCAB)}
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
DOCS_PER_SHARD = 600
TEXT_DIR_ENV = "TASKDATA_DRILL_TEXT_DIR"
C4_DIR_ENV = "TASKDATA_DRILL_C4_DIR"


def drill_documents(split: str, shard: str) -> Iterator[dict]:
    rng = np.random.default_rng([int(shard), len(split)])
    for i in range(DOCS_PER_SHARD):
        words = [WORDS[int(j)] for j in rng.integers(0, len(WORDS), int(rng.integers(1, 60)))]
        yield {"text": f"{split} {shard}.{i}: " + " ".join(words)}


@dataclasses.dataclass(frozen=True)
class Encode:
    """text -> targets (bytes); inputs = its first words; one random crop per example (seeded)."""

    prefix_chars: int = 12

    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        for ordinal, example in enumerate(examples):
            targets = VOCAB.encode(example["text"])
            cut = int(ctx.rng("crop", ordinal).integers(0, max(1, len(targets) // 3)))
            yield {"inputs": VOCAB.encode(example["text"][: self.prefix_chars]), "targets": targets[cut:],
                   "_source_index": example["_source_index"]}


class EnvTextSource(TextLineSource):
    def __init__(self) -> None:
        super().__init__({"train": "unused"})

    def list_shards(self, split: str) -> list[str]:
        self.check_split(split)
        folder = os.environ[TEXT_DIR_ENV]
        return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".txt"))


def drill_c4_dir() -> str:
    return os.environ[C4_DIR_ENV]


def register_tasks(registry) -> None:
    splits = {"train": [str(i) for i in range(8)], "validation": ["0", "1"]}
    registry.add(Task("drill_docs", FunctionSource(drill_documents, splits), [Encode()], FEATURES))
    registry.add(Task("drill_text", EnvTextSource(), [Encode()], FEATURES))
    registry.add(Task("drill_c4", C4Source(drill_c4_dir), [Encode()], FEATURES))
