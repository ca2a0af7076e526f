"""A seqio vocabulary as a taskdata ``Vocabulary``, described by what decides its ids.

A bridged task's output features keep the seqio task's own vocabulary: encoding and decoding go through
seqio, so that targets are decoded exactly as seqio's evaluator decodes them before a postprocessor sees
them. The fingerprint names what decides the ids: a SentencePiece model's bytes (with the extra ids seqio
appends to it), or a byte vocabulary's number of extra ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from taskdata.define.vocabularies import Vocabulary
from taskdata.seqio_bridge.errors import SeqioBridgeError
from taskdata.seqio_bridge.runtime import import_seqio

__all__ = ["SeqioVocabulary", "describe_seqio_vocabulary"]


def describe_seqio_vocabulary(vocabulary: Any) -> dict[str, Any]:
    """What identifies the ids of a seqio vocabulary, as plain JSON values."""
    own = getattr(vocabulary, "fingerprint_description", None)
    if callable(own):
        return own()
    seqio = import_seqio()
    kind = f"{type(vocabulary).__module__}.{type(vocabulary).__qualname__}"
    if isinstance(vocabulary, seqio.SentencePieceVocabulary):
        # sp_model is the model as seqio uses it: extra ids and normalizer overrides included.
        return {"type": kind, "model_sha256": hashlib.sha256(vocabulary.sp_model).hexdigest(),
                "extra_ids": vocabulary.extra_ids}
    if isinstance(vocabulary, seqio.ByteVocabulary):
        return {"type": kind, "extra_ids": vocabulary.extra_ids}
    if isinstance(vocabulary, seqio.PassThroughVocabulary):
        return {"type": kind, "vocab_size": vocabulary.vocab_size, "eos_id": vocabulary.eos_id}
    raise SeqioBridgeError(
        f"Cannot fingerprint the seqio vocabulary {kind}: taskdata knows SentencePieceVocabulary, ByteVocabulary "
        "and PassThroughVocabulary. Give its class a fingerprint_description() method that returns what decides "
        "its ids as plain values (for example the sha256 of its model file)."
    )


class SeqioVocabulary(Vocabulary):
    """Wraps a ``seqio.Vocabulary``: ids, special ids and decoding are seqio's."""

    def __init__(self, vocabulary: Any):
        super().__init__(extra_ids=int(vocabulary.extra_ids or 0))
        self.seqio_vocabulary = vocabulary
        self.pad_id = vocabulary.pad_id
        self.eos_id = vocabulary.eos_id
        self.unk_id = vocabulary.unk_id
        self._description: dict[str, Any] | None = None

    @property
    def base_vocab_size(self) -> int:
        return int(self.seqio_vocabulary.vocab_size) - self.extra_ids

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(self.seqio_vocabulary.encode(text), dtype=np.int32) for text in texts]

    def decode(self, ids: Iterable[int]) -> str:
        # seqio's own decoding (up to EOS, its rendering of extra ids): what seqio's evaluator shows.
        return self.seqio_vocabulary.decode([int(i) for i in ids])

    def _decode_base(self, ids: list[int]) -> str:
        return self.decode(ids)

    def tf_encode(self, texts: Any) -> Any:
        import tensorflow as tf

        return tf.map_fn(self.seqio_vocabulary.encode_tf, texts,
                         fn_output_signature=tf.RaggedTensorSpec([None], tf.int32))

    def fingerprint_description(self) -> dict[str, Any]:
        if self._description is None:
            self._description = describe_seqio_vocabulary(self.seqio_vocabulary)
        return self._description
