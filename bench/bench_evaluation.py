"""Throughput of evaluation: reading + joining prediction files, and each built-in metric.

Run: cd /work/main && PYTHONPATH=. python bench/bench_evaluation.py [--examples N]
Appends its figures to the "Evaluation" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import tempfile
import time

from taskdata import metrics
from taskdata.define.features import Feature
from taskdata.define.task import Task
from taskdata.define.vocabularies import ByteVocabulary
from taskdata.evaluation import evaluate
from taskdata.seeding import format_example_id
from taskdata.sources import FunctionSource

WORDS = tuple(
    [
        "the",
        "of",
        "and",
        "to",
        "in",
        "a",
        "is",
        "that",
        "for",
        "it",
        "as",
        "was",
        "with",
        "be",
        "by",
        "on",
        "not",
        "he",
        "this",
        "are",
        "or",
        "his",
        "from",
        "at",
        "which",
    ]
)


def sentence(i: int, n: int = 20) -> str:
    return " ".join(WORDS[(i * 7 + k * k) % len(WORDS)] for k in range(n))


def unused_records(split: str, shard: str):
    yield from ()


@dataclasses.dataclass(frozen=True)
class SyntheticTargets:
    """Targets without preprocessing, so that the figure is the join and scoring alone."""

    examples: int
    shards: int

    def __call__(self, task, split):
        for i in range(self.examples):
            yield format_example_id(task.name, split, i % self.shards, i // self.shards), sentence(i), {}

    def describe(self):
        return {"type": "synthetic", "examples": self.examples}


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--metric-examples", type=int, default=5_000)
    args = parser.parse_args()
    shards = 16
    task = Task(
        name="bench",
        source=FunctionSource(unused_records, {"validation": ["0"]}),
        preprocessors=[],
        output_features={"targets": Feature(ByteVocabulary())},
        metric_fns=[metrics.sequence_accuracy],
    )
    targets = SyntheticTargets(args.examples, shards)
    lines = []
    for i, (example_id, text, _) in enumerate(targets(task, "validation")):
        lines.append(json.dumps({"id": example_id, "prediction": text if i % 3 else sentence(i + 1)}))
    # Predictions arrive in host order, not id order.
    lines = lines[::-1]
    figures = []
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        per_file = -(-len(lines) // args.files)
        for f in range(args.files):
            path = os.path.join(folder, f"preds-{f:05d}.jsonl")
            with open(path, "w") as out:
                out.writelines(line + "\n" for line in lines[f * per_file : (f + 1) * per_file])
            paths.append(path)
        report, seconds = timed(lambda: evaluate(task, "validation", paths, targets))
        assert report.num_scored == args.examples
        figures.append(
            f"evaluate (read {args.files} files + join + sequence_accuracy), {args.examples} "
            f"examples: {seconds:.2f} s ({args.examples / seconds:,.0f} examples/s)"
        )
    n = args.metric_examples
    refs = [sentence(i) for i in range(n)]
    hyps = [sentence(i + (i % 3 == 0)) for i in range(n)]
    for name, fn in [
        ("bleu", metrics.bleu),
        ("rouge (4 keys)", metrics.rouge),
        ("squad", metrics.squad),
        ("sequence_accuracy", metrics.sequence_accuracy),
    ]:
        _, seconds = timed(lambda fn=fn: fn(refs, hyps))
        figures.append(f"{name}, {n} examples of 20 words: {seconds:.3f} s ({n / seconds:,.0f} examples/s)")
    for figure in figures:
        print(figure)
    _append(figures, args)


def _append(figures: list[str], args: argparse.Namespace) -> None:
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "BENCHMARKS.md")
    command = (
        f"PYTHONPATH=. python bench/bench_evaluation.py --examples {args.examples} --files {args.files} "
        f"--metric-examples {args.metric_examples}"
    )
    entry = [f"- {datetime.date.today().isoformat()}, 2 cores (shared), `{command}`:"]
    entry += [f"  - {figure}" for figure in figures]
    text = pathlib.Path(path).read_text() if os.path.exists(path) else "# Benchmarks\n"
    header = "## Evaluation"
    if header not in text:
        text = text.rstrip("\n") + f"\n\n{header}\n\n"
    start = text.index(header)
    following = text.find("\n## ", start + len(header))
    end = len(text) if following == -1 else following + 1
    section = text[start:end].rstrip("\n") + "\n" + "\n".join(entry) + "\n"
    text = text[:start] + section + ("\n" + text[end:] if end < len(text) else "")
    pathlib.Path(path).write_text(text)


if __name__ == "__main__":
    main()
