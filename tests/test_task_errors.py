"""Errors while a task makes a source shard's examples say where: task, split, shard, stage, example."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from taskdata.define.features import Feature
from taskdata.define.task import PreprocessingError, Task
from taskdata.sources import FunctionSource, TextLineSource
from tests.helpers import VOCAB, BytesToTargets, numbered_texts

FEATURES = {"inputs": Feature(VOCAB), "targets": Feature(VOCAB)}


@dataclasses.dataclass(frozen=True)
class FailAt:
    """Raises ``error`` on its input example ``at``; passes everything else through."""

    at: int

    def __call__(self, examples: Iterator[dict], ctx) -> Iterator[dict]:
        for i, example in enumerate(examples):
            if i == self.at:
                raise ZeroDivisionError(f"cannot divide example {i}\nsecond line")
            yield example


def drop_targets(examples, ctx):
    for example in examples:
        yield {k: v for k, v in example.items() if k != "targets"}


def _task(preprocessors, source=None) -> Task:
    return Task("t", source or FunctionSource(numbered_texts, {"train": ["a", "b"]}), preprocessors, FEATURES)


def _examples(task: Task, shard_index: int = 1, shard: str = "b", **kwargs) -> list[dict]:
    return list(task.process_shard(task.shard_context("train", shard_index, 0), shard, **kwargs))


def test_a_failing_preprocessor_is_named_with_its_input_example_and_the_exception():
    with pytest.raises(PreprocessingError) as info:
        _examples(_task([BytesToTargets(), FailAt(3)]))
    assert str(info.value) == (
        "Task 't', split 'train', source shard 1 ('b'): preprocessor 2 of 2 (tests.test_task_errors.FailAt(at=3)) "
        "failed at its input example 3 (4 source records read): ZeroDivisionError: cannot divide example 3 | "
        "second line"
    )
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_an_error_of_an_earlier_preprocessor_keeps_its_own_name_through_later_ones():
    with pytest.raises(PreprocessingError, match=r"preprocessor 1 of 2 \(tests.test_task_errors.FailAt\(at=0\)\) "
                                                 r"failed at its input example 0 \(1 source records read\)"):
        _examples(_task([FailAt(0), BytesToTargets()]))


def test_a_source_error_is_placed_at_its_record(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"fine\n\xff broken\n")
    task = _task([BytesToTargets()], TextLineSource({"train": str(path)}))
    with pytest.raises(PreprocessingError) as info:
        _examples(task, 0, str(path))
    assert str(info.value) == (
        f"Task 't', split 'train', source shard 0 ({str(path)!r}): reading the source failed at record 1 of the "
        f"shard: SourceError: {path}, line 2: not valid UTF-8 (invalid start byte at byte 0)"
    )


def test_an_example_without_a_required_feature_is_placed_at_its_output_ordinal():
    with pytest.raises(PreprocessingError, match=r"checking the output features failed at example 0 of the shard "
                                                 r"\(1 source records read\): OutputFeatureError: Task 't': an "
                                                 "example lacks required output feature 'targets'"):
        _examples(_task([BytesToTargets(), drop_targets]))


def empty_documents(split: str, shard: str) -> Iterator[dict]:
    yield from ()


def test_a_shard_without_records_is_an_error_unless_empty_shards_are_allowed():
    task = _task([BytesToTargets()], FunctionSource(empty_documents, {"train": ["a"]}))
    with pytest.raises(PreprocessingError) as info:
        _examples(task, 0, "a")
    assert str(info.value).startswith(
        "Task 't', split 'train', source shard 0 ('a'): the source shard holds no records (shard 'a'). Remove it "
        "if it is a broken export; if empty source files are expected")
    ctx = task.shard_context("train", 0, 0)
    assert list(task.process_shard(ctx, "a", allow_empty=True)) == []
    assert ctx.counters == {"empty_source_shards": 1}
    allowing = _task([BytesToTargets()], FunctionSource(empty_documents, {"train": ["a"]}, allow_empty_shards=True))
    assert _examples(allowing, 0, "a") == []
