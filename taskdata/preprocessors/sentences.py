"""``SplitSentences``: one example per sentence of a text feature (a sentence-level task's first step)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

from taskdata.preprocessors.base import Example, ShardContext

__all__ = ["SplitSentences"]

# A sentence ends at '.', '!' or '?' (or one of them then a closing quote or bracket) before white space.
_SENTENCE_END = re.compile(r"(?<=[.!?][\"')\]])\s+|(?<=[.!?])\s+")


@dataclasses.dataclass(frozen=True)
class SplitSentences:
    """Replaces each example by one example per sentence of its text feature ``feature``, in order.

    Sentences are cut after '.', '!' or '?' (and a closing quote or bracket) before white space; surrounding white space is removed and
    empty pieces are skipped. Other features and the metadata (``_source_index``: the document a sentence
    came from) are copied to every sentence. Documents without any sentence are counted.
    """

    feature: str = "targets"

    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        for example in examples:
            text = example.get(self.feature)
            if not isinstance(text, str):
                raise TypeError(f"SplitSentences in task {ctx.task!r}: feature {self.feature!r} must be text but got "
                                f"{type(text).__name__}. Put SplitSentences before Tokenize().")
            sentences = [s.strip() for s in _SENTENCE_END.split(text)]
            sentences = [s for s in sentences if s]
            if not sentences:
                ctx.count("split_sentences/empty_documents")
            for sentence in sentences:
                yield {**example, self.feature: sentence}
