"""``Tokenize``: text features to int32 token arrays, many examples per vocabulary call."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
from collections.abc import Iterator, Mapping

import numpy as np

from taskdata.define.vocabularies import Vocabulary
from taskdata.preprocessors.base import Example, ShardContext

__all__ = ["Tokenize"]


@dataclasses.dataclass(frozen=True)
class Tokenize:
    """Tokenizes every output feature that an example holds as text (seqio's ``tokenize``).

    Each output feature is encoded with its own vocabulary; features stored as strings
    (``dtype="string"``) and values that are not text (already tokenized) are left alone. With
    ``keep_text``, the text is kept as ``{key}_pretokenized``. No EOS is added (``AppendEos`` does).

    ``batch_size`` examples are encoded per vocabulary call, which is much faster than one call per
    example (the first calls of a stream take an eighth of that, then a quarter and a half, so that the
    helper thread starts early); it changes nothing in the output and so is not part of the fingerprint. Up to
    ``batches_ahead`` batches are handed to a helper thread before the examples of the oldest one go on
    down the stream: SentencePiece releases the GIL while it encodes, so the later preprocessors and the
    cache job's record writing run beside it instead of after it. More than one batch, because the
    consumer takes documents in bursts: span corruption reads ~600 documents (a window of 512 chunks)
    and then turns them into records without reading any, and the tokenizer must have work queued for
    that whole time (speed only, not in the fingerprint). Every batch is still encoded whole and yielded
    in order.
    """

    keep_text: bool = False
    batch_size: int = dataclasses.field(default=256, compare=False)
    batches_ahead: int = dataclasses.field(default=4, compare=False)

    def __post_init__(self) -> None:
        for name in ("batch_size", "batches_ahead"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Tokenize: {name} must be a positive integer but got {value!r}.")

    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        vocabularies = {key: f.vocabulary for key, f in ctx.output_features.items() if f.dtype != "string"}
        empty: dict[str, np.ndarray] = {}  # the ids of "" per feature, encoded once
        ahead = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tokenize")
        pending: collections.deque[tuple[list[Example], dict[str, tuple[list[int], list[str]]],
                                         concurrent.futures.Future[dict[str, list[np.ndarray]]]]] = collections.deque()
        try:
            # The first batches are smaller (an eighth of batch_size, doubling), so that the helper thread
            # starts encoding after a few documents instead of a whole batch at the start of every shard.
            size = max(1, self.batch_size // 8)
            while batch := list(itertools.islice(examples, size)):
                size = min(2 * size, self.batch_size)
                batch = [dict(example) for example in batch]
                texts = {key: _texts(batch, key) for key in vocabularies}
                # Only the vocabulary calls go to the helper thread: Python work there would hold the GIL.
                pending.append((batch, texts, ahead.submit(_encode, vocabularies, texts)))
                if len(pending) > self.batches_ahead:
                    yield from self._filled(*pending.popleft(), vocabularies, empty)
            while pending:
                yield from self._filled(*pending.popleft(), vocabularies, empty)
        finally:
            # An abandoned stream (an error downstream, or a reader that stopped) encodes nothing more.
            ahead.shutdown(wait=True, cancel_futures=True)

    def _filled(self, batch: list[Example], texts: Mapping[str, tuple[list[int], list[str]]],
                encoding: concurrent.futures.Future[dict[str, list[np.ndarray]]],
                vocabularies: Mapping[str, Vocabulary], empty: dict[str, np.ndarray]) -> list[Example]:
        """``batch`` with the ids of its texts in place of them (and the texts kept on request)."""
        encoded = encoding.result()
        for key, (positions, key_texts) in texts.items():
            ids = iter(encoded[key])
            for i, text in zip(positions, key_texts, strict=True):
                if self.keep_text:
                    batch[i][f"{key}_pretokenized"] = text
                if text:
                    batch[i][key] = next(ids)
                else:
                    if key not in empty:
                        empty[key] = vocabularies[key].encode_batch([""])[0]
                    batch[i][key] = empty[key].copy()
        return batch


def _texts(batch: list[Example], key: str) -> tuple[list[int], list[str]]:
    """(positions, texts) of the examples of ``batch`` that hold ``key`` as text."""
    positions = [i for i, example in enumerate(batch) if isinstance(example.get(key), str | bytes)]
    return positions, [_as_text(batch[i][key]) for i in positions]


def _encode(vocabularies: Mapping[str, Vocabulary], texts: Mapping[str, tuple[list[int], list[str]]],
            ) -> dict[str, list[np.ndarray]]:
    """The ids of every non-empty text, per feature. Empty texts (T5's objectives Rekey "inputs" to "") are
    left out: SentencePiece spends as long on a batch of empty strings as on ~30 documents.

    encode_batch, not encode_flat: measured on the built-in corpus, one array per text costs less than
    flattening sentencepiece's lists through a generator and cutting the result.
    """
    out = {}
    for key, (_, key_texts) in texts.items():
        filled = [text for text in key_texts if text]
        out[key] = vocabularies[key].encode_batch(filled) if filled else []
    return out


def _as_text(value: str | bytes) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value
