"""Metric values against their reference implementations, and the postprocessors that feed them."""

from __future__ import annotations

import functools
import math
import re
import string

import numpy as np
import pytest
import sacrebleu
from hypothesis import given, settings
from hypothesis import strategies as st
from rouge_score import rouge_scorer

from taskdata import metrics
from taskdata.define import postprocessors
from taskdata.metrics import MetricError

# sacrebleu's README example: two reference streams for three sentences, BLEU 48.53 with the 13a tokenizer.
HYPS = ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]
REF_STREAMS = [
    ["The dog bit the man.", "It was not unexpected.", "The man bit him first."],
    ["The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."],
]
SUMMARIES = [
    ("the cat sat on the mat . it was happy .", "the cat sat . it was on the mat and happy"),
    ("police killed the gunman . the hostages are safe", "the gunman was shot by police . hostages safe"),
    ("a b c d e f", "f e d c b a"),
]


def t5_bleu_reference(predictions, streams, tokenize="intl"):
    return sacrebleu.corpus_bleu(
        predictions,
        streams,
        smooth_method="exp",
        smooth_value=0.0,
        force=False,
        lowercase=False,
        tokenize=tokenize,
        use_effective_order=False,
    ).score


def test_bleu_equals_sacrebleu_with_t5_settings_single_reference():
    got = metrics.bleu(REF_STREAMS[0], HYPS)
    assert got == {"bleu": t5_bleu_reference(HYPS, [REF_STREAMS[0]])}
    assert 0 < got["bleu"] < 100


def test_bleu_multi_reference_matches_the_published_sacrebleu_example():
    targets = [list(refs) for refs in zip(*REF_STREAMS, strict=True)]
    got = metrics.bleu(targets, HYPS, tokenizer="13a")["bleu"]
    assert got == pytest.approx(48.530827, abs=1e-5)
    assert got == t5_bleu_reference(HYPS, REF_STREAMS, tokenize="13a")
    assert metrics.bleu(targets, HYPS)["bleu"] == t5_bleu_reference(HYPS, REF_STREAMS)


def test_bleu_accepts_a_varying_number_of_references():
    targets = [
        [REF_STREAMS[0][0], REF_STREAMS[1][0]],
        [REF_STREAMS[0][1]],
        [REF_STREAMS[0][2], REF_STREAMS[1][2]],
    ]
    streams = [REF_STREAMS[0], [REF_STREAMS[1][0], None, REF_STREAMS[1][2]]]
    assert metrics.bleu(targets, HYPS)["bleu"] == t5_bleu_reference(HYPS, streams)


def test_bleu_rejects_an_empty_reference_list():
    with pytest.raises(
        MetricError, match=r"bleu: the target of example 1 must be a string or a non-empty list"
    ):
        metrics.bleu(["a b", [], "c"], ["a b", "x", "c"])


def _t5_rouge_reference(targets, predictions, keys):
    scorer = rouge_scorer.RougeScorer(list(keys))
    totals = dict.fromkeys(keys, 0.0)
    for target, prediction in zip(targets, predictions, strict=True):
        scores = scorer.score(target.replace(" . ", " .\n"), prediction.replace(" . ", " .\n"))
        for key in keys:
            totals[key] += scores[key].fmeasure
    return {key: 100 * v / len(targets) for key, v in totals.items()}


def test_rouge_equals_rouge_score_mean_f_measure():
    targets, predictions = zip(*SUMMARIES, strict=True)
    got = metrics.rouge(list(targets), list(predictions))
    assert set(got) == {"rouge1", "rouge2", "rougeL", "rougeLsum"}
    assert got == pytest.approx(
        _t5_rouge_reference(targets, predictions, metrics.DEFAULT_ROUGE_KEYS), abs=1e-12
    )
    # Reversed word order: all unigrams match, no bigram does.
    single = metrics.rouge(["a b c d e f"], ["f e d c b a"])
    assert single["rouge1"] == pytest.approx(100.0)
    assert single["rouge2"] == 0.0


def test_rouge_lsum_splits_sentences_at_spaced_periods_like_t5():
    target, prediction = "a b c . d e f", "d e f . a b c"
    got = metrics.rouge([target], [prediction], score_keys=("rougeL", "rougeLsum"))
    scorer = rouge_scorer.RougeScorer(["rougeLsum"])
    split = scorer.score("a b c .\nd e f", "d e f .\na b c")["rougeLsum"].fmeasure
    unsplit = scorer.score(target, prediction)["rougeLsum"].fmeasure
    assert split != unsplit  # the fixture is one where the newline handling matters
    assert got["rougeLsum"] == pytest.approx(100 * split)
    assert got["rougeLsum"] > got["rougeL"]  # summary-level LCS matches both sentences; plain LCS only one


def test_rouge_rejects_non_string_targets():
    with pytest.raises(MetricError, match=r"rouge: example 0 must pair a string target .* got list and str"):
        metrics.rouge([["a"]], ["a"])


# The official SQuAD v1.1 evaluate script (evaluate-v1.1.py), transcribed as the reference.
def official_normalize_answer(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an   apple, a day!", "apple day"),
        ("Theater", "theater"),  # articles only as whole words
        ("the-the", "thethe"),  # punctuation goes first, so the joined word is no article
        ("U.S.A.", "usa"),
        ("\u00e9t\u00e9 \u2014 2019", "\u00e9t\u00e9 \u2014 2019"),  # only ASCII punctuation is removed
    ],
)
def test_normalize_squad_worked_examples(raw, normalized):
    assert metrics.normalize_squad(raw) == normalized == official_normalize_answer(raw)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("aAnNtThHeE .,!-'\t\u00e9")), max_size=30))
def test_normalize_squad_equals_the_official_script(text):
    assert metrics.normalize_squad(text) == official_normalize_answer(text)


def test_squad_em_and_f1_worked_examples():
    targets = [
        ["Denver Broncos", "The Denver Broncos"],
        "Eiffel Tower",
        ["Saint Bernadette Soubirous"],
        "1990",
    ]
    predictions = ["the Denver Broncos!", "Eiffel", "Bernadette", "in 1991"]
    got = metrics.squad(targets, predictions)
    # em: only the first matches. f1: 1; 2*(1*.5)/1.5 = 2/3; 2*(1*(1/3))/(4/3) = 1/2; 0.
    assert got["em"] == pytest.approx(25.0)
    assert got["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 / 2 + 0) / 4)


def test_squad_rejects_an_empty_answer_list():
    with pytest.raises(
        MetricError, match=r"squad: example 0 .* non-empty list of answer strings.*postprocessors\.qa"
    ):
        metrics.squad([[]], ["x"])


def test_accuracy_and_sequence_accuracy():
    assert metrics.accuracy([0, 1, 1, 2], [0, 1, 0, -1]) == {"accuracy": 50.0}
    assert metrics.accuracy(["yes", "no"], ["yes", "yes"]) == {"accuracy": 50.0}
    assert metrics.sequence_accuracy(["a b", "c"], ["a b", "c "]) == {"sequence_accuracy": 50.0}
    assert metrics.sequence_accuracy([[1, 2], np.array([3])], [np.array([1, 2]), [4]]) == {
        "sequence_accuracy": 50.0
    }
    assert metrics.sequence_accuracy(["12"], [[1, 2]]) == {"sequence_accuracy": 0.0}


def test_accuracy_rejects_sequences_and_names_the_example():
    with pytest.raises(
        MetricError, match=r"accuracy: the prediction of example 1 is a list .*use sequence_accuracy"
    ):
        metrics.accuracy([1, 2], [1, [2]])


@pytest.mark.parametrize(
    ("targets", "predictions", "fragment"),
    [([1, 2], [1], "got 2 targets but 1 predictions"), ([], [], "got no examples")],
)
def test_metrics_reject_misaligned_or_empty_inputs(targets, predictions, fragment):
    for fn in (metrics.accuracy, metrics.sequence_accuracy, metrics.bleu, metrics.rouge, metrics.squad):
        with pytest.raises(MetricError, match=fragment):
            fn(targets, predictions)


def test_log_likelihood_takes_sequence_totals_or_token_lists():
    assert metrics.log_likelihood(["x", "y"], [-1.5, [-1.0, -2.5]]) == {"log_likelihood": -2.5}


def test_perplexity_is_token_weighted():
    got = metrics.perplexity(["x", "y"], [[-1.0, -1.0], [-2.0]])
    assert got["token_log_likelihood"] == pytest.approx(-4 / 3)
    assert got["perplexity"] == pytest.approx(math.exp(4 / 3))
    # Uniform over 10 outcomes at every token: perplexity 10.
    assert metrics.perplexity(["z"], [[math.log(0.1)] * 7])["perplexity"] == pytest.approx(10.0)


def test_perplexity_needs_per_token_scores():
    with pytest.raises(MetricError, match=r"perplexity: example 1 has a single score \(-3.0\).*per-token"):
        metrics.perplexity(["x", "y"], [[-1.0], -3.0])


@pytest.mark.parametrize("fn", [metrics.log_likelihood, metrics.perplexity])
def test_likelihood_metrics_reject_losses_and_nan(fn):
    with pytest.raises(
        MetricError, match=r"example 0 has log-likelihood 2.3.*If you wrote a loss .*negate it"
    ):
        fn(["x"], [[2.3]])
    with pytest.raises(MetricError, match=r"example 0 has log-likelihood nan"):
        fn(["x"], [[math.nan]])
    with pytest.raises(MetricError, match=r"score of example 0 must be a number or a list of numbers"):
        fn(["x"], [["-1"]])


def test_postprocessors_follow_t5_signatures():
    assert postprocessors.lower_text("Yes", example={}, is_target=True) == "yes"
    assert postprocessors.string_to_float("2.5", is_target=False) == 2.5
    assert math.isnan(postprocessors.string_to_float("two", is_target=False))
    with pytest.raises(ValueError, match=r"string_to_float: target 'two' is not a number"):
        postprocessors.string_to_float("two", is_target=True)
    to_class = functools.partial(postprocessors.string_label_to_class_id, label_classes=("no", "yes"))
    assert to_class("yes", is_target=True) == 1
    assert to_class("maybe", is_target=False) == -1
    with pytest.raises(ValueError, match=r"target 'maybe' is not one of the label classes \['no', 'yes'\]"):
        to_class("maybe", is_target=True)


def test_qa_postprocessor_gives_targets_all_answers():
    example = {"answers": [b"Denver Broncos", "Broncos"]}
    assert postprocessors.qa("Denver Broncos", example=example, is_target=True) == [
        "Denver Broncos",
        "Broncos",
    ]
    assert postprocessors.qa("Broncos!", example=example, is_target=False) == "Broncos!"
    with pytest.raises(
        ValueError, match=r"qa: a target needs the example's 'answers' .* its 'answers' is None"
    ):
        postprocessors.qa("x", example={}, is_target=True)


def test_span_accuracy_counts_whole_targets_and_spans_under_their_sentinel():
    targets = ["<extra_id_0> the cat<extra_id_1> sat", "<extra_id_0> on<extra_id_1> the mat"]
    predictions = ["<extra_id_0> the cat<extra_id_1> sat", "<extra_id_0> on<extra_id_1> a mat"]
    assert metrics.span_accuracy(targets, predictions) == {"span_exact_match": 50.0, "span_accuracy": 75.0}
    # A span under another sentinel does not count: the model must put it back where it was.
    assert metrics.span_accuracy(["<extra_id_0> a<extra_id_1> b"], ["<extra_id_1> a<extra_id_0> b"]) == {
        "span_exact_match": 0.0, "span_accuracy": 0.0}
    assert metrics.spans.split_spans("x <extra_id_0> a b<extra_id_3>c ") == {-1: "x", 0: "a b", 3: "c"}
    with pytest.raises(MetricError, match="span_accuracy: example 0 is not text"):
        metrics.span_accuracy([[1, 2]], ["x"])


def test_token_accuracy_compares_target_tokens_position_by_position():
    from taskdata.define.vocabularies import ByteVocabulary

    token_accuracy = metrics.TokenAccuracy(ByteVocabulary())
    assert token_accuracy.tokens("ab<extra_id_0>c") == [100, 101, 383, 102]  # bytes + 3; <extra_id_0> is the top id
    assert token_accuracy(["abcd"], ["abxd"]) == {"token_accuracy": 75.0}
    assert token_accuracy(["ab", "<extra_id_0>cd"], ["ab", "<extra_id_1>cd"]) == {"token_accuracy": 80.0}
    assert token_accuracy(["abcd"], ["ab"]) == {"token_accuracy": 50.0}  # a short prediction misses the rest
    assert token_accuracy(["ab"], ["<extra_id_999>ab"]) == {"token_accuracy": 0.0}  # unknown sentinel: -1, shifts


def test_built_in_tasks_score_restored_text_and_not_a_wrong_one(tiny_sp_model):
    from taskdata.config import Config
    from taskdata.define.registry import Registry
    from taskdata.tasks import register_builtin_tasks

    registry = Registry()
    register_builtin_tasks(registry, Config(vocab=tiny_sp_model))

    def scores(task: str, targets: list[str], predictions: list[str]) -> dict[str, float]:
        out: dict[str, float] = {}
        for fn in registry.get_task(task).metric_fns:
            out.update(fn(targets, predictions))
        return out

    target = "<extra_id_0> hello world<extra_id_1> again"
    assert scores("c4_span_corruption", [target], [target]) == {
        "span_exact_match": 100.0, "span_accuracy": 100.0, "token_accuracy": 100.0}
    wrong = scores("c4_span_corruption", [target], ["<extra_id_0> hello world<extra_id_1> other"])
    assert wrong["span_exact_match"] == 0.0 and wrong["span_accuracy"] == 50.0 and 0 < wrong["token_accuracy"] < 100
    for task in ("c4_prefix_lm", "c4_mlm"):
        assert scores(task, ["hello world"], ["hello world"]) == {"sequence_accuracy": 100.0, "token_accuracy": 100.0}
