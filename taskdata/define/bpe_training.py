"""Deterministic byte-level BPE training with Hugging Face ``tokenizers``, written as a ``tokenizer.json``.

The tokenizer is GPT-2's kind: text is split by the byte-level pre-tokenizer (GPT-2's regex, no prefix
space) into words of UTF-8 bytes, and merges are learned over those words, so every text encodes
(no unknown token is ever needed) and decodes back to itself. The special tokens follow T5's ids:
``<pad>`` 0, ``</s>`` 1 (the end of a document), ``<unk>`` 2; the 256 byte symbols come next, then the
merges.

The same text and options give a byte-identical file in any process, with any number of threads (the
trainer's counts are sums and its merge order breaks ties by the pair itself; ``tests/test_bpe_training.py``
trains twice and with other thread counts). The input is every text in order, never sampled: a limit
is applied by taking the first ``max_docs`` documents. The file is written whole (temporary name, then
rename), so a reader never sees half a tokenizer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from taskdata import fs
from taskdata.define.vocab_training import source_texts
from taskdata.sources.base import Source

if TYPE_CHECKING:
    from taskdata.define.task import Task

__all__ = ["SPECIAL_TOKENS", "BpeOptions", "train_bpe", "train_bpe_from_source", "train_bpe_from_task"]

# Bumped whenever the way this module builds or configures the tokenizer changes.
TRAINING_RECIPE_VERSION = 1
# T5's ids: pad 0, eos 1, unk 2 (HuggingFaceVocabulary's defaults name the first two).
SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")
_BYTES = 256


@dataclasses.dataclass(frozen=True)
class BpeOptions:
    """Everything that determines the trained tokenizer besides its text.

    Attributes:
      vocab_size: tokens in the tokenizer: the 3 special tokens, the 256 byte symbols and the merges.
      min_frequency: a pair seen fewer times than this in the text is never merged.
    """

    vocab_size: int
    min_frequency: int = 2

    def __post_init__(self) -> None:
        for name in ("vocab_size", "min_frequency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"BPE option {name} must be a positive integer but got {value!r}.")
        smallest = len(SPECIAL_TOKENS) + _BYTES
        if self.vocab_size <= smallest:
            raise ValueError(
                f"BPE vocab_size must be more than {smallest} (the {len(SPECIAL_TOKENS)} special tokens and the "
                f"{_BYTES} byte symbols) but got {self.vocab_size}."
            )

    @property
    def file_tag(self) -> str:
        """A short name for file names: the size and a hash of every option and the recipe."""
        described = json.dumps(
            {"recipe": TRAINING_RECIPE_VERSION, **dataclasses.asdict(self)}, sort_keys=True
        ).encode("utf-8")
        return f"bpe{self.vocab_size}-{hashlib.sha256(described).hexdigest()[:8]}"


def _checked(texts: Iterable[str], counter: list[int]) -> Iterator[str]:
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"Text {index} for BPE training must be a str but got {type(text).__name__}.")
        counter[0] += 1
        yield text


def train_bpe(texts: Iterable[str], vocab_size: int, out_path: str, **options: Any) -> str:
    """Trains a byte-level BPE tokenizer on ``texts`` (whole documents) and writes its ``tokenizer.json``.

    ``options`` are the fields of ``BpeOptions`` other than ``vocab_size``. ``out_path`` may be local or
    any fsspec URL; it is replaced whole. Returns ``out_path``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    settings = BpeOptions(vocab_size=vocab_size, **options)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=settings.vocab_size,
        min_frequency=settings.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    count = [0]
    tokenizer.train_from_iterator(_checked(texts, count), trainer)
    if count[0] == 0:
        raise ValueError("BPE training got no text. Check the split.")
    trained = tokenizer.get_vocab_size(with_added_tokens=True)
    if trained < settings.vocab_size:
        raise ValueError(
            f"BPE training made {trained} tokens from {count[0]} texts, fewer than the {settings.vocab_size} asked "
            f"for: the text has no more pairs seen {settings.min_frequency} times or more. Choose a vocabulary size "
            f"<= {trained} or train on more text."
        )
    fs.write_atomic(out_path, tokenizer.to_str().encode("utf-8"))
    return out_path


def train_bpe_from_source(source: Source, split: str, vocab_size: int, out_path: str, *,
                          max_docs: int | None = None, text_key: str = "text", **options: Any) -> str:
    """Trains on the first ``max_docs`` records (all if None) of ``source``'s ``split``, in source order."""
    return train_bpe(source_texts(source, split, max_docs, text_key), vocab_size, out_path, **options)


def train_bpe_from_task(task: Task, split: str, vocab_size: int, out_path: str, max_docs: int | None = None,
                        **options: Any) -> str:
    """Trains on the text of ``task``'s source (``taskdata vocab train --kind bpe --task NAME --size N --out FILE``).

    ``task`` is a ``taskdata.Task``; its source's records must have a ``text`` field (or pass ``text_key=``).
    Returns ``out_path``.
    """
    return train_bpe_from_source(task.source, split, vocab_size, out_path, max_docs=max_docs, **options)
