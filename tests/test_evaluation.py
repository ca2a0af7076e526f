"""Joining predictions to targets by stable id, scoring, reports, bad input and the eval command."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import tempfile
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata import metrics
from taskdata.cli import _add_eval_arguments as add_eval_arguments
from taskdata.cli import run_eval as main_eval
from taskdata.define import postprocessors
from taskdata.define.features import Feature
from taskdata.define.registry import UnknownNameError
from taskdata.define.vocabularies import ByteVocabulary
from taskdata.evaluation import (
    EvaluationError,
    MissingPredictionsError,
    PredictionFileError,
    SourceTargets,
    evaluate,
    format_report,
    write_report,
)
from taskdata.preprocessors.base import Example, ShardContext
from taskdata.sources import FunctionSource

VOCAB = ByteVocabulary()
SPLIT = "validation"

# Shard "0" has a record without an answer, which the preprocessor drops: ids count the preprocessed
# stream, so "color of sky" (source record 3) is example 2 of shard 0.
RECORDS = {
    "0": [("2+2", "Four"), ("capital of France", "Paris"), ("unanswerable", ""), ("color of sky", "Blue")],
    "1": [("opposite of up", "Down"), ("first letter", "A"), ("planet we live on", "Earth")],
}
TARGETS = {
    "0/0": "four",
    "0/1": "paris",
    "0/2": "blue",
    "1/0": "down",
    "1/1": "a",
    "1/2": "earth",
}


def qa_records(split: str, shard: str) -> Iterator[dict]:
    for question, answer in RECORDS[shard]:
        yield {"question": question, "answer": answer}


def no_records(split: str, shard: str) -> Iterator[dict]:
    yield from ()


@dataclasses.dataclass(frozen=True)
class EncodeQA:
    """Drops unanswered records; encodes the question and the lower-cased answer with the byte vocabulary."""

    keep_text: bool = False

    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        for example in examples:
            if not example["answer"]:
                ctx.count("unanswered")
                continue
            out = {
                "inputs": VOCAB.encode(example["question"]),
                "targets": VOCAB.encode(example["answer"].lower()),
                "answers": [example["answer"], example["answer"].lower()],
            }
            if self.keep_text:
                out["targets_pretokenized"] = example["answer"]
            yield out


def random_digit_suffix(examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
    for ordinal, example in enumerate(examples):
        digit = int(ctx.rng("random_digit_suffix", ordinal).integers(10))
        yield {**example, "targets": np.concatenate([example["targets"], VOCAB.encode(str(digit))])}


def reports_pi(targets, predictions):
    return {"pi": math.pi, "nan": math.nan, "inf": math.inf}


def reports_an_array(targets, predictions):
    return {"confusion": [[1, 0], [0, 1]]}


def broken_metric(targets, predictions):
    raise ZeroDivisionError("boom")


def add_qa_task(registry, name="qa_a", preprocessors=(EncodeQA(),), fn=qa_records, **kwargs):
    kwargs.setdefault("metric_fns", (metrics.sequence_accuracy,))
    kwargs.setdefault("postprocess_fn", postprocessors.lower_text)
    return registry.add_task(
        name,
        # Empty shards are expected only of the task that tests empty splits.
        FunctionSource(fn, {SPLIT: ["0", "1"], "train": ["0"]}, allow_empty_shards=fn is no_records),
        preprocessors,
        output_features={"inputs": Feature(VOCAB), "targets": Feature(VOCAB)},
        **kwargs,
    )


def line(task, key, prediction, **extra):
    return json.dumps({"id": f"{task}/{SPLIT}/{key}", "prediction": prediction, **extra})


def write_lines(path, lines) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(entry + "\n" for entry in lines)
    return str(path)


# Five right (case differs, lower_text fixes it), one wrong.
def predictions_a(task="qa_a"):
    answers = dict(TARGETS, **{"1/1": "b"})
    return [line(task, key, text.upper()) for key, text in sorted(answers.items())]


# Targets ------------------------------------------------------------------------------------------


def test_source_targets_number_each_shards_output_stream(registry):
    task = add_qa_task(registry)
    got = [(i, text) for i, text, _ in SourceTargets(seed=0)(task, SPLIT)]
    assert got == [(f"qa_a/{SPLIT}/{key}", text) for key, text in TARGETS.items()]


def test_source_targets_prefer_targets_pretokenized(registry):
    task = add_qa_task(registry, preprocessors=(EncodeQA(keep_text=True),))
    texts = [text for _, text, _ in SourceTargets(seed=0)(task, SPLIT)]
    assert texts == ["Four", "Paris", "Blue", "Down", "A", "Earth"]


def test_source_targets_follow_the_seed_of_random_preprocessors(registry):
    task = add_qa_task(registry, preprocessors=(EncodeQA(), random_digit_suffix))

    def texts(seed):
        return [text for _, text, _ in SourceTargets(seed=seed)(task, SPLIT)]

    assert texts(1) == texts(1)
    assert texts(1) != texts(2)  # negative control: the seed reaches the targets
    assert [t.rstrip("0123456789") for t in texts(1)] == list(TARGETS.values())


def test_source_targets_reject_a_bad_seed():
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*63\)"):
        SourceTargets(seed=-1)


# Scoring ------------------------------------------------------------------------------------------


def test_evaluate_postprocesses_and_scores_a_task(registry, tmp_path):
    task = add_qa_task(registry)
    path = write_lines(tmp_path / "p.jsonl", predictions_a())
    report = evaluate(task, SPLIT, [path], SourceTargets(seed=0))
    assert report.kind == "task"
    assert (report.num_examples, report.num_scored, report.coverage) == (6, 6, 1.0)
    assert report.tasks[0].metrics == {"sequence_accuracy": pytest.approx(500 / 6)}
    assert report.overall == report.tasks[0].metrics
    assert report.targets_source == {"type": "source", "seed": 0}


def test_evaluate_without_postprocess_compares_raw_text(registry, tmp_path):
    task = add_qa_task(registry, postprocess_fn=None)
    path = write_lines(tmp_path / "p.jsonl", predictions_a())
    report = evaluate(task, SPLIT, [path], SourceTargets(seed=0))
    assert report.tasks[0].metrics == {"sequence_accuracy": 0.0}  # every prediction is upper-case


def test_evaluate_passes_the_example_to_postprocess_fn(registry, tmp_path):
    task = add_qa_task(registry, postprocess_fn=postprocessors.qa, metric_fns=(metrics.squad,))
    rows = [line("qa_a", key, text.capitalize() + ".") for key, text in TARGETS.items()]
    report = evaluate(task, SPLIT, [write_lines(tmp_path / "p.jsonl", rows)], SourceTargets(seed=0))
    # The answer "A" normalises to "" (an article): exact match, but F1 0 as in the official script.
    assert report.tasks[0].metrics == {"em": 100.0, "f1": pytest.approx(500 / 6)}


@settings(max_examples=25, deadline=None)
@given(order=st.permutations(range(6)), cuts=st.lists(st.integers(0, 6), max_size=3))
def test_join_is_independent_of_line_order_and_file_split(order, cuts):
    from taskdata.define.registry import Registry

    task = add_qa_task(Registry())
    rows = predictions_a()
    shuffled = [rows[i] for i in order]
    bounds = [0, *sorted(cuts), 6]
    with tempfile.TemporaryDirectory() as folder:
        paths = [
            write_lines(os.path.join(folder, f"part-{n}.jsonl"), shuffled[lo:hi])
            for n, (lo, hi) in enumerate(itertools.pairwise(bounds))
        ]
        report = evaluate(task, SPLIT, paths, SourceTargets(seed=0))
    assert report.tasks[0].num_scored == 6
    assert report.tasks[0].metrics == {"sequence_accuracy": pytest.approx(500 / 6)}


def test_mixture_overall_is_the_unweighted_mean_of_shared_metrics(registry, tmp_path):
    add_qa_task(registry, "qa_a")
    add_qa_task(
        registry,
        "qa_b",
        postprocess_fn=postprocessors.lower_text,
        metric_fns=(metrics.sequence_accuracy, metrics.squad),
    )
    mixture = registry.add_mixture("qa_mix", [("qa_a", 1.0), ("qa_b", 9.0)])
    rows_b = [line("qa_b", key, text) for key, text in TARGETS.items()]
    path = write_lines(tmp_path / "p.jsonl", predictions_a() + rows_b)
    report = evaluate(mixture, SPLIT, [path], SourceTargets(seed=0))
    assert [t.task for t in report.tasks] == ["qa_a", "qa_b"]
    assert report.tasks[1].metrics == {"em": 100.0, "f1": pytest.approx(500 / 6), "sequence_accuracy": 100.0}
    # Not weighted by the 1:9 rates; em and f1 are not shared by qa_a so they have no overall value.
    assert report.overall == {"sequence_accuracy": pytest.approx((500 / 6 + 100) / 2)}
    assert report.overall_tasks == ("qa_a", "qa_b")
    assert "unweighted mean over the tasks ['qa_a', 'qa_b']" in report.to_dict()["overall_method"]


def test_mixture_overall_leaves_out_tasks_without_predictions(registry, tmp_path):
    add_qa_task(registry, "qa_a")
    add_qa_task(registry, "qa_b")
    mixture = registry.add_mixture("qa_mix", ["qa_a", "qa_b"], default_rate=1.0)
    path = write_lines(tmp_path / "p.jsonl", predictions_a())
    report = evaluate(mixture, SPLIT, [path], SourceTargets(seed=0), allow_partial=True)
    assert report.tasks[1].num_scored == 0 and report.tasks[1].metrics == {}
    assert report.overall == report.tasks[0].metrics
    assert report.overall_tasks == ("qa_a",)
    assert (report.num_examples, report.num_scored, report.num_missing) == (12, 6, 6)


def test_score_metrics_read_per_token_scores(registry, tmp_path):
    task = add_qa_task(registry, score_metric_fns=(metrics.log_likelihood, metrics.perplexity))
    rows = [line("qa_a", key, text, score=[-0.5, -1.5]) for key, text in TARGETS.items()]
    report = evaluate(task, SPLIT, [write_lines(tmp_path / "p.jsonl", rows)], SourceTargets(seed=0))
    assert report.tasks[0].metrics == {
        "log_likelihood": -2.0,
        "perplexity": pytest.approx(math.e),
        "sequence_accuracy": 100.0,
        "token_log_likelihood": -1.0,
    }


def test_score_metrics_need_a_score_on_every_prediction(registry, tmp_path):
    task = add_qa_task(registry, score_metric_fns=(metrics.log_likelihood,))
    rows = [line("qa_a", key, text, score=-1.0) for key, text in TARGETS.items()]
    rows[3] = line("qa_a", "1/0", "down")
    path = write_lines(tmp_path / "p.jsonl", rows)
    with pytest.raises(PredictionFileError) as info:
        evaluate(task, SPLIT, [path], SourceTargets(seed=0))
    assert str(info.value).startswith(
        f"{path}, line 4, id 'qa_a/{SPLIT}/1/0': no 'score', but task 'qa_a' has score metrics ['log_likelihood']"
    )


@pytest.mark.parametrize(
    ("fns", "fragment"),
    [
        (
            (metrics.sequence_accuracy, metrics.sequence_accuracy),
            "metrics sequence_accuracy and sequence_accuracy both report 'sequence_accuracy'",
        ),
        (
            (reports_an_array,),
            "metric reports_an_array reported 'confusion': [[1, 0], [0, 1]]; a report holds",
        ),
    ],
)
def test_bad_metric_results_are_errors(registry, tmp_path, fns, fragment):
    task = add_qa_task(registry, metric_fns=fns)
    with pytest.raises(EvaluationError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        evaluate(task, SPLIT, [write_lines(tmp_path / "p.jsonl", predictions_a())], SourceTargets(seed=0))


def test_a_failing_metric_says_which_task_and_metric(registry, tmp_path):
    task = add_qa_task(registry, metric_fns=(broken_metric,))
    with pytest.raises(ZeroDivisionError) as info:
        evaluate(task, SPLIT, [write_lines(tmp_path / "p.jsonl", predictions_a())], SourceTargets(seed=0))
    assert info.value.__notes__ == ["(while computing metric broken_metric of task 'qa_a' on 6 examples)"]


def test_a_failing_postprocessor_names_the_example(registry, tmp_path):
    task = add_qa_task(registry, postprocess_fn=postprocessors.string_to_float)
    path = write_lines(tmp_path / "p.jsonl", predictions_a())
    with pytest.raises(ValueError, match=r"string_to_float: target 'four' is not a number") as info:
        evaluate(task, SPLIT, [path], SourceTargets(seed=0))
    assert info.value.__notes__ == [
        f"(while postprocessing example 'qa_a/{SPLIT}/0/0' of task 'qa_a'; its prediction is at {path}, line 1)"
    ]


# Bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        (b"not json", "line 2: not valid JSON (Expecting value at column 1)"),
        (b"[1, 2]", "line 2: expected a JSON object"),
        (b"", "line 2: blank line"),
        (b"\xff\xfe", "line 2: not UTF-8 (bad byte at offset 0)"),
        (b'{"prediction": "x"}', "line 2: the object has no 'id' (keys: ['prediction'])"),
        (
            b'{"id": "qa_a/validation/0/1"}',
            "line 2, id 'qa_a/validation/0/1': the object has no 'prediction'",
        ),
        (b'{"id": 7, "prediction": "x"}', "line 2: 'id' must be a string"),
        (
            b'{"id": "qa_a/validation/zero/1", "prediction": "x"}',
            "line 2: Invalid example id 'qa_a/validation/zero/1'",
        ),
        (
            b'{"id": "qa_a/validation/0/1", "prediction": 3}',
            "line 2, id 'qa_a/validation/0/1': 'prediction' must be a string",
        ),
        (
            b'{"id": "qa_a/validation/0/1", "prediction": "x", "score": "high"}',
            "line 2, id 'qa_a/validation/0/1': 'score' must be a number",
        ),
    ],
)
def test_malformed_lines_name_file_line_and_id(registry, tmp_path, bad, fragment):
    task = add_qa_task(registry)
    path = tmp_path / "p.jsonl"
    path.write_bytes(predictions_a()[0].encode() + b"\n" + bad + b"\n")
    with pytest.raises(PredictionFileError) as info:
        evaluate(task, SPLIT, [str(path)], SourceTargets(seed=0))
    assert str(info.value).startswith(f"{path}, {fragment}")
    assert (info.value.path, info.value.line) == (str(path), 2)


@pytest.mark.parametrize(
    ("example_id", "fragment"),
    [
        (
            "qa_a/validation/0/3",
            "unknown id: task 'qa_a' split 'validation' has no such example (it has 6 examples)",
        ),
        ("qa_a/validation/7/0", "unknown id: task 'qa_a' split 'validation' has no such example"),
        ("qa_z/validation/0/0", "unknown id: task 'qa_z' is not part of the task 'qa_a'"),
        ("qa_a/train/0/0", "unknown id: it is from split 'train' but this evaluates split 'validation'"),
    ],
)
def test_unknown_ids_name_file_line_and_id(registry, tmp_path, example_id, fragment):
    task = add_qa_task(registry)
    rows = predictions_a()
    rows.insert(2, json.dumps({"id": example_id, "prediction": "x"}))
    path = write_lines(tmp_path / "p.jsonl", rows)
    with pytest.raises(PredictionFileError) as info:
        evaluate(task, SPLIT, [path], SourceTargets(seed=0), allow_partial=True)
    assert str(info.value).startswith(f"{path}, line 3, id '{example_id}': {fragment}")


def test_unknown_ids_are_counted(registry, tmp_path):
    task = add_qa_task(registry)
    rows = [*predictions_a(), line("qa_a", "0/9", "x"), line("qa_a", "1/9", "y")]
    with pytest.raises(
        PredictionFileError, match=r"line 7, .* 1 more predictions also have ids without a target"
    ):
        evaluate(task, SPLIT, [write_lines(tmp_path / "p.jsonl", rows)], SourceTargets(seed=0))


def test_duplicate_ids_name_both_places(registry, tmp_path):
    task = add_qa_task(registry)
    rows = predictions_a()
    first = write_lines(tmp_path / "host0.jsonl", rows[:4])
    second = write_lines(tmp_path / "host1.jsonl", [rows[2], *rows[4:]])
    with pytest.raises(PredictionFileError) as info:
        evaluate(task, SPLIT, [first, second], SourceTargets(seed=0))
    assert str(info.value).startswith(
        f"{second}, line 1, id 'qa_a/{SPLIT}/0/2': duplicate id: it was already predicted at {first}, line 3."
    )


def test_a_file_given_twice_is_an_error(registry, tmp_path):
    task = add_qa_task(registry)
    path = write_lines(tmp_path / "p.jsonl", predictions_a())
    with pytest.raises(EvaluationError, match=r"Prediction files \[.*p\.jsonl'\] are given more than once"):
        evaluate(task, SPLIT, [path, path], SourceTargets(seed=0))


def test_missing_predictions_say_how_many_and_which(registry, tmp_path):
    task = add_qa_task(registry)
    rows = predictions_a()
    path = write_lines(tmp_path / "p.jsonl", rows[:1] + rows[2:5])
    with pytest.raises(MissingPredictionsError) as info:
        evaluate(task, SPLIT, [path], SourceTargets(seed=0))
    assert (info.value.missing, info.value.total) == (2, 6)
    message = str(info.value)
    assert message.startswith(
        f"2 of 6 examples (33.33%) of split 'validation' have no prediction in ['{path}']: "
    )
    assert f"task 'qa_a': 2 of 6 missing, e.g. ['qa_a/{SPLIT}/0/1', 'qa_a/{SPLIT}/1/2']" in message
    assert "pass allow_partial=True (--allow-partial) to score only the 4 examples" in message


def test_allow_partial_scores_what_is_there_and_says_how_much(registry, tmp_path):
    task = add_qa_task(registry)
    rows = predictions_a()
    path = write_lines(tmp_path / "p.jsonl", rows[:1] + rows[2:5])  # 0/0, 0/2, 1/0, 1/1 ("B": wrong)
    report = evaluate(task, SPLIT, [path], SourceTargets(seed=0), allow_partial=True)
    assert (report.num_scored, report.num_missing, report.coverage) == (4, 2, pytest.approx(4 / 6))
    assert report.tasks[0].metrics == {"sequence_accuracy": 75.0}
    data = report.to_dict()
    assert (data["num_scored"], data["num_missing"], data["allow_partial"]) == (4, 2, True)
    assert data["tasks"][0]["coverage"] == pytest.approx(4 / 6)
    assert "4 of 6 examples scored (66.67%); PARTIAL: 2 examples have no prediction" in format_report(report)


def test_unknown_split_and_empty_split(registry, tmp_path):
    path = write_lines(tmp_path / "p.jsonl", predictions_a())
    task = add_qa_task(registry)
    with pytest.raises(
        EvaluationError, match=r"Task 'qa_a' has no split 'test' \(it has \['validation', 'train'\]\)"
    ):
        evaluate(task, "test", [path], SourceTargets(seed=0))
    empty = add_qa_task(registry, "qa_empty", fn=no_records)
    with pytest.raises(EvaluationError, match=r"Task 'qa_empty' split 'validation' has no examples"):
        evaluate(empty, SPLIT, [write_lines(tmp_path / "e.jsonl", [])], SourceTargets(seed=0))


@dataclasses.dataclass(frozen=True)
class RepeatingTargets:
    """A faulty targets source that yields its first example twice."""

    def __call__(self, task, split):
        records = list(SourceTargets(seed=0)(task, split))
        return [records[0], *records]

    def describe(self):
        return {"type": "repeating"}


def test_a_targets_source_must_yield_each_id_once(registry, tmp_path):
    task = add_qa_task(registry)
    path = write_lines(tmp_path / "p.jsonl", predictions_a())
    with pytest.raises(
        EvaluationError,
        match=r"targets source \{'type': 'repeating'\} yielded id 'qa_a/validation/0/0' a second",
    ):
        evaluate(task, SPLIT, [path], RepeatingTargets())


# Reports ------------------------------------------------------------------------------------------


def test_report_table_and_json(registry, tmp_path):
    add_qa_task(registry, "qa_a")
    add_qa_task(registry, "qa_b", metric_fns=(metrics.sequence_accuracy, reports_pi))
    mixture = registry.add_mixture("qa_mix", ["qa_a", "qa_b"], default_rate=1.0)
    rows_b = [line("qa_b", key, text) for key, text in TARGETS.items()]
    path = write_lines(tmp_path / "p.jsonl", predictions_a() + rows_b)
    report = evaluate(mixture, SPLIT, [path], SourceTargets(seed=0))
    assert format_report(report).splitlines() == [
        "mixture 'qa_mix', split 'validation': 12 of 12 examples scored (100.00%)",
        "task     examples  scored  inf  nan      pi  sequence_accuracy",
        "-------  --------  ------  ---  ---  ------  -----------------",
        "qa_a            6       6    -    -       -            83.3333",
        "qa_b            6       6  inf  nan  3.1416           100.0000",
        "overall        12      12    -    -       -            91.6667",
        "overall = unweighted mean over the tasks ['qa_a', 'qa_b'] of each metric that all of them report "
        "(tasks without any scored example are left out)",
    ]
    out = tmp_path / "out" / "report.json"
    write_report(report, str(out))
    data = json.loads(out.read_text())
    assert data["tasks"][1]["metrics"] == {
        "inf": "Infinity",
        "nan": "NaN",
        "pi": math.pi,
        "sequence_accuracy": 100.0,
    }
    assert data["overall"] == {"sequence_accuracy": pytest.approx(275 / 3)}
    assert (data["name"], data["kind"], data["split"], data["coverage"]) == ("qa_mix", "mixture", SPLIT, 1.0)
    assert data["prediction_files"] == [path]


# Command line -------------------------------------------------------------------------------------


def parse(argv):
    parser = argparse.ArgumentParser(prog="taskdata eval")
    add_eval_arguments(parser)
    return parser.parse_args(argv)


def test_main_eval_prints_the_table_and_writes_json(registry, tmp_path, capsys):
    add_qa_task(registry)
    rows = predictions_a()
    write_lines(tmp_path / "preds-0.jsonl", rows[:3])
    write_lines(tmp_path / "preds-1.jsonl", rows[3:])
    out = tmp_path / "report.json"
    args = parse(
        ["qa_a", "--predictions", str(tmp_path / "preds-*.jsonl"), "--seed", "0", "--output", str(out)]
    )
    assert main_eval(args, registry) == 0
    printed = capsys.readouterr().out
    assert "task 'qa_a', split 'validation': 6 of 6 examples scored (100.00%)" in printed
    assert f"wrote {out}" in printed
    data = json.loads(out.read_text())
    assert len(data["prediction_files"]) == 2
    assert data["tasks"][0]["metrics"] == {"sequence_accuracy": pytest.approx(500 / 6)}


def test_main_eval_reports_bad_predictions_with_exit_code_1(registry, tmp_path, capsys):
    add_qa_task(registry)
    path = write_lines(tmp_path / "p.jsonl", predictions_a()[:5])
    assert main_eval(parse(["qa_a", "--predictions", path, "--seed", "0"]), registry) == 1
    assert capsys.readouterr().err.startswith("taskdata eval: error: 1 of 6 examples (16.67%)")
    assert main_eval(parse(["qa_a", "--predictions", path, "--seed", "0", "--allow-partial"]), registry) == 0
    assert (
        main_eval(parse(["qa_a", "--predictions", str(tmp_path / "none-*.jsonl"), "--seed", "0"]), registry)
        == 1
    )
    assert "pattern" in capsys.readouterr().err


def test_main_eval_usage_errors(registry, tmp_path):
    add_qa_task(registry)
    path = write_lines(tmp_path / "p.jsonl", predictions_a())
    with pytest.raises(ValueError, match=r"--seed is required when the targets are recomputed"):
        main_eval(parse(["qa_a", "--predictions", path]), registry)
    with pytest.raises(ValueError, match=r"/c holds no complete cache of task 'qa_a'"):
        main_eval(parse(["qa_a", "--predictions", path, "--cache", "/c"]), registry)
    with pytest.raises(UnknownNameError, match=r"Unknown task or mixture 'qa_b'.*Did you mean: qa_a"):
        main_eval(parse(["qa_b", "--predictions", path, "--seed", "0"]), registry)


def test_main_eval_uses_the_cache_targets_hook(registry, tmp_path, capsys):
    add_qa_task(registry)
    path = write_lines(tmp_path / "p.jsonl", predictions_a())
    calls = []

    def cache_targets(cache_dir, seed):
        calls.append((cache_dir, seed))
        return SourceTargets(seed=0)

    args = parse(["qa_a", "--predictions", path, "--cache", "/caches/qa_a", "--split", SPLIT])
    assert main_eval(args, registry, cache_targets=cache_targets) == 0
    assert calls == [("/caches/qa_a", None)]
