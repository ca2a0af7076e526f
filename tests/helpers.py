"""Small task definitions shared by tests (module-level so that they fingerprint by name)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from taskdata.define.features import Feature
from taskdata.define.task import Task
from taskdata.define.vocabularies import ByteVocabulary
from taskdata.preprocessors.base import Example, ShardContext
from taskdata.sources import FunctionSource

VOCAB = ByteVocabulary()


def numbered_texts(split: str, shard: str) -> Iterator[dict]:
    for i in range(5):
        yield {"text": f"{split} shard {shard} document {i}"}


@dataclasses.dataclass(frozen=True)
class BytesToTargets:
    """Encodes 'text' as 'targets' with the byte vocabulary and adds a fixed 'inputs' prompt."""

    prompt: str = "copy:"

    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        for example in examples:
            yield {
                "inputs": VOCAB.encode(self.prompt + example["text"]),
                "targets": VOCAB.encode(example["text"]),
                "_source_index": example["_source_index"],
            }


def make_task(name: str = "toy", prompt: str = "copy:", shards=("a", "b"), vocab=VOCAB, add_eos=True) -> Task:
    return Task(
        name=name,
        source=FunctionSource(numbered_texts, {"train": list(shards), "validation": ["v"]}),
        preprocessors=[BytesToTargets(prompt)],
        output_features={"inputs": Feature(vocab, add_eos=add_eos), "targets": Feature(vocab, add_eos=add_eos)},
    )


def ids(example: Example) -> tuple:
    return tuple(np.asarray(example["targets"]).tolist())


def metric_samples(text: str, parser=None) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> (sorted labels -> value) of a /metrics body, parsed by ``prometheus_client``'s own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in (parser or text_string_to_metric_families)(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out
