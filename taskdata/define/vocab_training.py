"""Deterministic SentencePiece training with T5's conventions (pad 0, eos 1, unk 2, no bos).

The same text and options give a byte-identical ``.model`` file in any process on any machine with
the same sentencepiece version. That needs more than a fixed seed:

- the input is streamed in order and never sampled (``input_sentence_size=0``; a limit is applied
  here, by taking the first ``max_docs`` documents, not by sentencepiece's reservoir sampling);
- ``num_threads`` is fixed by the options, not by the machine: sentencepiece splits its EM statistics
  by thread, and one thread and two threads give different models (measured);
- the file is written whole (temporary name, then rename), so a reader never sees half a model.

Sentences are the lines of each text (C4's documents are lines of paragraphs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from taskdata import fs
from taskdata.define.vocabularies import EOS_ID, PAD_ID, UNK_ID
from taskdata.sources.base import Source, SourceError

if TYPE_CHECKING:
    from taskdata.define.task import Task

__all__ = [
    "SentencePieceOptions",
    "source_texts",
    "train_from_source",
    "train_from_task",
    "train_sentencepiece",
]

# Bumped whenever the way this module feeds or configures sentencepiece changes.
TRAINING_RECIPE_VERSION = 1
_MODEL_TYPES = ("unigram", "bpe")
_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")


@dataclasses.dataclass(frozen=True)
class SentencePieceOptions:
    """Everything that determines the trained model besides its text.

    Attributes:
      vocab_size: pieces in the model, including pad, eos and unk (T5 uses 32,000, then adds 100
        extra ids in ``SentencePieceVocabulary``).
      model_type: ``unigram`` (T5) or ``bpe``.
      character_coverage: share of characters covered by pieces; the rest become unk, or bytes with
        ``byte_fallback``. 0.9999 suits English; use 1.0 to keep every character.
      byte_fallback: encode characters outside the pieces as UTF-8 byte pieces instead of unk.
      num_threads: sentencepiece's training threads. Part of the recipe: changing it changes the model.
      max_sentence_length: longest line in bytes that is used; longer lines are skipped.
      seed_sentencepiece_size: candidate pieces the unigram model starts from.
    """

    vocab_size: int
    model_type: str = "unigram"
    character_coverage: float = 0.9999
    byte_fallback: bool = False
    num_threads: int = 1
    max_sentence_length: int = 16_384
    seed_sentencepiece_size: int = 1_000_000

    def __post_init__(self) -> None:
        for name in ("vocab_size", "num_threads", "max_sentence_length", "seed_sentencepiece_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"SentencePiece option {name} must be a positive integer but got {value!r}.")
        # Below this, the three special pieces and a handful of characters do not fit.
        if self.vocab_size < 16:
            raise ValueError(f"SentencePiece vocab_size must be at least 16 but got {self.vocab_size}.")
        if self.model_type not in _MODEL_TYPES:
            raise ValueError(
                f"SentencePiece model_type must be one of {list(_MODEL_TYPES)} but got {self.model_type!r}."
            )
        coverage = self.character_coverage
        if isinstance(coverage, bool) or not isinstance(coverage, int | float) or not 0.9 <= coverage <= 1.0:
            raise ValueError(
                f"SentencePiece character_coverage must be in [0.9, 1.0] but got {coverage!r} "
                "(0.9999 for English, 0.9995 for languages with large character sets)."
            )
        if not isinstance(self.byte_fallback, bool):
            raise ValueError(
                f"SentencePiece byte_fallback must be True or False but got {self.byte_fallback!r}."
            )

    def trainer_arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``SentencePieceTrainer.train``, T5's special ids included."""
        return {
            "vocab_size": self.vocab_size,
            "model_type": self.model_type,
            "character_coverage": float(self.character_coverage),
            "byte_fallback": self.byte_fallback,
            "num_threads": self.num_threads,
            "max_sentence_length": self.max_sentence_length,
            "seed_sentencepiece_size": self.seed_sentencepiece_size,
            "pad_id": PAD_ID,
            "eos_id": EOS_ID,
            "unk_id": UNK_ID,
            "bos_id": -1,
            "input_sentence_size": 0,
            "shuffle_input_sentence": False,
            "minloglevel": 1,
        }

    @property
    def file_tag(self) -> str:
        """A short name for file names: model type, size and a hash of every option and the recipe."""
        described = json.dumps(
            {"recipe": TRAINING_RECIPE_VERSION, **dataclasses.asdict(self)}, sort_keys=True
        ).encode("utf-8")
        return f"{self.model_type}{self.vocab_size}-{hashlib.sha256(described).hexdigest()[:8]}"


def _sentences(texts: Iterable[str]) -> Iterator[str]:
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(
                f"Text {index} for SentencePiece training must be a str but got {type(text).__name__}."
            )
        for line in text.split("\n"):
            if line.strip():
                yield line


def train_sentencepiece(texts: Iterable[str], vocab_size: int, out_path: str, **options: Any) -> str:
    """Trains a SentencePiece model on ``texts`` (each split into lines) and writes it to ``out_path``.

    ``options`` are the fields of ``SentencePieceOptions`` other than ``vocab_size``. ``out_path`` may
    be local or any fsspec URL; it is replaced whole. Returns ``out_path``.
    """
    import sentencepiece as spm

    settings = SentencePieceOptions(vocab_size=vocab_size, **options)
    counted = _Counted(_sentences(texts))
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(counted), model_writer=model, **settings.trainer_arguments()
        )
    except RuntimeError as e:
        if counted.error is not None:
            raise counted.error from None
        raise _explain(e, settings, counted.count) from e
    fs.write_atomic(out_path, model.getvalue())
    return out_path


class _Counted:
    """Counts the sentences sentencepiece consumed and keeps any error the input raised.

    sentencepiece turns an exception inside the iterator into a RuntimeError holding only its text;
    keeping the original lets a SourceError reach the caller with its file and record.
    """

    def __init__(self, sentences: Iterator[str]):
        self._sentences = sentences
        self.count = 0
        self.error: Exception | None = None

    def __iter__(self) -> Iterator[str]:
        try:
            for sentence in self._sentences:
                self.count += 1
                yield sentence
        except Exception as e:
            self.error = e
            raise


def _explain(error: RuntimeError, settings: SentencePieceOptions, sentences: int) -> ValueError:
    too_high = _TOO_HIGH.search(str(error))
    if too_high:
        return ValueError(
            f"SentencePiece cannot make {settings.vocab_size} pieces from this text ({sentences} lines): "
            f"it supports at most {too_high.group(2)}. Choose a vocabulary size <= {too_high.group(2)} "
            "or train on more text."
        )
    if sentences == 0:
        return ValueError("SentencePiece training got no text: every document was empty. Check the split.")
    return ValueError(f"SentencePiece training failed on {sentences} lines with {settings}: {error}")


def source_texts(source: Source, split: str, max_docs: int | None, text_key: str = "text") -> Iterator[str]:
    """The ``text_key`` field of the first ``max_docs`` records (all if None) of the split, shard after shard in
    source order: what every vocabulary trainer reads (``bpe_training`` too)."""
    if max_docs is not None and (
        isinstance(max_docs, bool) or not isinstance(max_docs, int) or max_docs <= 0
    ):
        raise ValueError(f"max_docs must be a positive integer or None but got {max_docs!r}.")
    source.check_split(split)
    return _read_texts(source, split, max_docs, text_key)


def _read_texts(source: Source, split: str, max_docs: int | None, text_key: str) -> Iterator[str]:
    taken = 0
    for shard in source.list_shards(split):
        for index, record in enumerate(source.read_shard(split, shard)):
            text = record.get(text_key)
            if not isinstance(text, str):
                raise SourceError(
                    shard,
                    f"record {index}",
                    f"has no string field {text_key!r} to train a vocabulary on (fields: "
                    f"{sorted(record)}). Pass text_key= the field holding the text.",
                )
            yield text
            taken += 1
            if taken == max_docs:
                return


def train_from_source(
    source: Source,
    split: str,
    vocab_size: int,
    out_path: str,
    *,
    max_docs: int | None = None,
    text_key: str = "text",
    **options: Any,
) -> str:
    """Trains on the first ``max_docs`` records (all if None) of ``source``'s ``split``, in source order."""
    return train_sentencepiece(
        source_texts(source, split, max_docs, text_key), vocab_size, out_path, **options
    )


def train_from_task(
    task: Task,
    split: str,
    vocab_size: int,
    out_path: str,
    max_docs: int | None = None,
    **options: Any,
) -> str:
    """Trains on the text of ``task``'s source (``taskdata vocab train --task NAME --size N --out FILE``).

    ``task`` is a ``taskdata.Task``; its source's records must have a ``text`` field (or pass
    ``text_key=``). Returns ``out_path``.
    """
    return train_from_source(task.source, split, vocab_size, out_path, max_docs=max_docs, **options)
