"""Output features: what a task produces and how it is tokenized (seqio's ``Feature``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from taskdata.define.vocabularies import Vocabulary

__all__ = ["Feature"]

_DTYPES = ("int32", "int64", "float32", "string")


@dataclasses.dataclass(frozen=True)
class Feature:
    """One output feature of a task.

    Attributes:
      vocabulary: turns text into ids and back.
      add_eos: whether preprocessing appends EOS (and keeps it when trimming).
      dtype: the stored dtype: int32, int64, float32 or string.
      rank: 1 for a sequence of ids (the usual case).
      required: whether every example must have it.
    """

    vocabulary: Vocabulary
    add_eos: bool = True
    dtype: str = "int32"
    rank: int = 1
    required: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"Feature dtype must be one of {_DTYPES} but got {self.dtype!r}.")
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"Feature rank must be a non-negative integer but got {self.rank!r}.")

    def fingerprint_description(self) -> dict[str, Any]:
        return {
            "vocabulary": self.vocabulary.fingerprint_description(),
            "add_eos": self.add_eos,
            "dtype": self.dtype,
            "rank": self.rank,
            "required": self.required,
        }
