"""C4 pretraining tasks as T5 and BERT define them, and decoder-only language modelling.

The source is C4 in allenai/c4's JSON-lines format: ``config.c4_dir`` if given, else the built-in corpus
(built into ``config.home`` on first use). The T5 and BERT objectives' vocabulary is ``config.vocab`` (a
SentencePiece model with T5's special ids, e.g. T5's ``cc_all.32000`` model) if given, else one trained on
the built-in corpus; both with T5's 100 extra ids.

``c4_lm`` is what decoder-only models train on (MaxText, GPT-style trainers): documents joined with EOS and
cut into rows of 512 tokens (``ConcatenateAndChunk``), tokenized with a byte-level BPE ``tokenizer.json``
(Hugging Face ``tokenizers``) trained on the built-in corpus.

Their metrics say how much of the hidden text a model restores: span corruption reports
``span_exact_match`` (whole targets), ``span_accuracy`` (spans under their sentinel) and
``token_accuracy`` (target tokens at their position); prefix LM and MLM report ``sequence_accuracy``
(whole targets) and ``token_accuracy``.
"""

from __future__ import annotations

from taskdata.config import Config
from taskdata.define.features import Feature
from taskdata.define.hf_vocabulary import HuggingFaceVocabulary
from taskdata.define.packing import Packing
from taskdata.define.registry import Registry
from taskdata.define.vocabularies import SentencePieceVocabulary
from taskdata.metrics import TokenAccuracy, sequence_accuracy, span_accuracy
from taskdata.preprocessors import (
    AppendEosAfterTrim,
    ConcatenateAndChunk,
    MaskedLM,
    PrefixLM,
    Rekey,
    SpanCorruption,
    SplitSentences,
    Tokenize,
)
from taskdata.sources import C4Source

__all__ = ["register_builtin_tasks"]


def register_builtin_tasks(registry: Registry, config: Config | None = None, *, replace: bool = False) -> None:
    """Adds the built-in tasks and mixtures, reading what ``config`` says (default: ``Config()``).

    ``replace=True`` registers them again over earlier built-in definitions of the same names.
    """
    config = config or Config()
    home = config.home

    def builtin_corpus() -> str:
        from taskdata.tasks import corpus  # builds on first use: never at import or registration

        return corpus.ensure_builtin_corpus(home=home)

    def builtin_vocabulary() -> str:
        from taskdata.tasks import corpus

        return corpus.ensure_builtin_vocabulary(home=home)

    def builtin_tokenizer() -> str:
        from taskdata.tasks import corpus

        return corpus.ensure_builtin_tokenizer(home=home)

    vocabulary = SentencePieceVocabulary(config.vocab or builtin_vocabulary, extra_ids=100)
    features = {
        "inputs": Feature(vocabulary=vocabulary, add_eos=True),
        "targets": Feature(vocabulary=vocabulary, add_eos=True),
    }
    source = C4Source(config.c4_dir or builtin_corpus)
    text_to_targets = Rekey({"inputs": None, "targets": "text"})
    registry.add_task(
        "c4_span_corruption",
        source,
        [text_to_targets, Tokenize(), SpanCorruption(), AppendEosAfterTrim()],
        output_features=features,
        sequence_length={"inputs": 512, "targets": 114},
        metric_fns=[span_accuracy, TokenAccuracy(vocabulary)],
        replace=replace,
    )
    registry.add_task(
        "c4_prefix_lm",
        source,
        [text_to_targets, Tokenize(), PrefixLM(), AppendEosAfterTrim()],
        output_features=features,
        sequence_length={"inputs": 512, "targets": 512},
        metric_fns=[sequence_accuracy, TokenAccuracy(vocabulary)],
        replace=replace,
    )
    registry.add_task(
        "c4_mlm",
        source,
        [Rekey({"inputs": "text", "targets": None}), Tokenize(), MaskedLM()],
        output_features=features,
        sequence_length={"inputs": 512, "targets": 512},
        metric_fns=[sequence_accuracy, TokenAccuracy(vocabulary)],
        replace=replace,
    )
    # Prefix LM over single sentences: ~30 tokens an example, so unpacked rows would be mostly padding;
    # the _packed variant stores rows of several sentences (t5x's packed layout).
    sentences = registry.add_task(
        "c4_sentence_prefix_lm",
        source,
        [text_to_targets, SplitSentences(), Tokenize(), PrefixLM(), AppendEosAfterTrim()],
        output_features=features,
        sequence_length={"inputs": 256, "targets": 256},
        replace=replace,
    )
    registry.add(sentences.with_packing(Packing(), name="c4_sentence_prefix_lm_packed"), replace=replace)
    registry.add_task(
        "c4_lm",
        source,
        [Rekey({"targets": "text"}), Tokenize(), ConcatenateAndChunk()],
        output_features={"targets": Feature(vocabulary=HuggingFaceVocabulary(builtin_tokenizer), add_eos=True)},
        sequence_length={"targets": 512},
        replace=replace,
    )
    registry.add_mixture(
        "c4_span_corruption_prefix_lm",
        [("c4_span_corruption", 1.0), ("c4_prefix_lm", 1.0)],
        replace=replace,
    )
