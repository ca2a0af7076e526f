"""``HuggingFaceVocabulary``: a Hugging Face ``tokenizers`` tokenizer (a ``tokenizer.json``) as a vocabulary.

The ids are exactly what ``tokenizers`` returns for the same text: ``Tokenizer.encode_batch_fast(texts,
add_special_tokens=...)`` on the file's own tokenizer, nothing remapped. So a model trained on a cache
made with it reads the ids its tokenizer gives at inference. BPE tokenizers trained by
``taskdata vocab train --kind bpe`` (``taskdata.define.bpe_training``) follow T5's special ids (``<pad>``
0, ``</s>`` 1, ``<unk>`` 2); any other ``tokenizer.json`` works too (GPT-2's, Llama's) when its end of
document token is named with ``eos_token``.

The vocabulary is identified by the file's content (its sha256), the EOS token and whether the
tokenizer's post-processor runs (``add_special_tokens``): two files with the same bytes are the same
vocabulary wherever they are, and any edit makes caches built with the old file stale.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from taskdata.define.vocabularies import Vocabulary

__all__ = ["HuggingFaceVocabulary"]


class HuggingFaceVocabulary(Vocabulary):
    """The tokenizer in a ``tokenizer.json`` file, with its own ids.

    Args:
      tokenizer_file: a path (local or any fsspec URL such as ``gs://``) or a function returning one, so
        that a vocabulary can be declared before its file exists (the built-in one is trained on first use).
        The file is read once per process.
      eos_token: the token that ends a document (``AppendEos`` and ``ConcatenateAndChunk`` append its id,
        ``decode`` stops at it); it must be in the tokenizer's vocabulary.
      pad_token: the tokenizer's padding token, if it has one: ``decode`` drops it. ``None`` (or a token
        the tokenizer lacks) drops nothing: in a vocabulary without padding, id 0 is a real token.
      add_special_tokens: whether encoding runs the tokenizer's post-processor (e.g. Llama's BOS). By
        default it does not, as seqio vocabularies do not: EOS is the preprocessors' business.
    """

    def __init__(self, tokenizer_file: str | Callable[[], str], *, eos_token: str = "</s>",
                 pad_token: str | None = "<pad>", add_special_tokens: bool = False):
        super().__init__(extra_ids=0)
        if not isinstance(eos_token, str) or not eos_token:
            raise ValueError(f"HuggingFaceVocabulary: eos_token must name the tokenizer's end of document token "
                             f"but got {eos_token!r}.")
        if pad_token is not None and (not isinstance(pad_token, str) or not pad_token):
            raise ValueError(f"HuggingFaceVocabulary: pad_token must be a token or None but got {pad_token!r}.")
        if not isinstance(add_special_tokens, bool):
            raise ValueError(f"HuggingFaceVocabulary: add_special_tokens must be True or False but got "
                             f"{add_special_tokens!r}.")
        self._tokenizer_file = tokenizer_file
        self.eos_token = eos_token
        self.pad_token = pad_token
        self.add_special_tokens = add_special_tokens
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._file_bytes: bytes | None = None
        self._eos: int | None = None
        self._pad: int | None = None

    @property
    def tokenizer_file(self) -> str:
        return self._tokenizer_file() if callable(self._tokenizer_file) else self._tokenizer_file

    @property
    def tokenizer(self) -> Any:
        """The ``tokenizers.Tokenizer`` itself."""
        return self._load()

    @property
    def file_bytes(self) -> bytes:
        self._load()
        assert self._file_bytes is not None
        return self._file_bytes

    def _load(self) -> Any:
        if self._tokenizer is not None:
            return self._tokenizer
        with self._lock:
            if self._tokenizer is None:
                from tokenizers import Tokenizer

                from taskdata import fs

                path = self.tokenizer_file
                try:
                    data = fs.read_bytes(path)
                except FileNotFoundError:
                    raise FileNotFoundError(
                        f"Tokenizer file {path!r} does not exist. Train one with 'taskdata vocab train --kind bpe "
                        "--task NAME --size N --out tokenizer.json' or pass an existing tokenizer.json."
                    ) from None
                try:
                    tokenizer = Tokenizer.from_str(data.decode("utf-8"))
                except Exception as error:  # tokenizers raises a bare Exception on malformed JSON
                    raise ValueError(f"{path!r} is not a Hugging Face tokenizer.json: {error}") from None
                eos = tokenizer.token_to_id(self.eos_token)
                if eos is None:
                    special = sorted(t.content for t in tokenizer.get_added_tokens_decoder().values())
                    raise ValueError(
                        f"Tokenizer {path!r} has no token {self.eos_token!r} to end documents with (its added tokens: "
                        f"{special or 'none'}). Pass eos_token= the one it uses, e.g. '<|endoftext|>' for GPT-2."
                    )
                self._eos = eos
                self._pad = None if self.pad_token is None else tokenizer.token_to_id(self.pad_token)
                self._file_bytes = data
                self._tokenizer = tokenizer
        return self._tokenizer

    @property
    def eos_id(self) -> int:  # type: ignore[override]  # a class attribute in Vocabulary, the file's own id here
        self._load()
        assert self._eos is not None
        return self._eos

    @property
    def base_vocab_size(self) -> int:
        return int(self._load().get_vocab_size(with_added_tokens=True))

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self._load().encode_batch_fast(list(texts), add_special_tokens=self.add_special_tokens)
        return [np.asarray(encoding.ids, dtype=np.int32) for encoding in encodings]

    def decode(self, ids: Iterable[int]) -> str:
        """Decodes ids up to the first EOS, leaving out the tokenizer's padding token (if it has one).

        An id outside ``[0, vocab_size)`` is an error, as for every vocabulary.
        """
        kept: list[int] = []
        size = self.vocab_size
        for position, i in enumerate(int(x) for x in ids):
            if not 0 <= i < size:
                raise ValueError(
                    f"Cannot decode id {i} at position {position}: it is outside this tokenizer's {size} ids. Ids "
                    "must come from a model whose vocabulary size equals the task's."
                )
            if i == self.eos_id:
                break
            if i != self._pad:
                kept.append(i)
        return self._decode_base(kept)

    def _decode_base(self, ids: list[int]) -> str:
        return str(self._load().decode(ids, skip_special_tokens=False))

    def tf_encode(self, texts: Any) -> Any:
        import tensorflow as tf

        def encode(batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            encoded = self.encode_batch([t.decode("utf-8") for t in batch.tolist()])
            lengths = np.array([len(e) for e in encoded], dtype=np.int64)
            flat = np.concatenate(encoded) if encoded else np.zeros(0, np.int32)
            return flat.astype(np.int32, copy=False), lengths

        # tokenizers has no TensorFlow op: the batch goes through the same numpy path, in one call.
        flat, lengths = tf.numpy_function(encode, [texts], (tf.int32, tf.int64), stateful=False)
        return tf.RaggedTensor.from_row_lengths(tf.ensure_shape(flat, [None]), tf.ensure_shape(lengths, [None]))

    def fingerprint_description(self) -> dict[str, Any]:
        return {
            "type": "HuggingFaceVocabulary",
            "tokenizer_sha256": hashlib.sha256(self.file_bytes).hexdigest(),
            "eos_token": self.eos_token,
            "add_special_tokens": self.add_special_tokens,
        }
