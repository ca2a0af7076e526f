"""Postprocessors: decoded model output (or target text) -> what a task's metrics compare.

Every function has T5/seqio's signature ``fn(text, example=None, is_target=False)``: evaluation calls
it once per target with ``is_target=True`` and once per prediction with ``is_target=False``, passing the
example (its features and any raw fields the preprocessors kept) as ``example``. Parameters beyond
those are bound with ``functools.partial``, which keeps a task's definition fingerprintable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["lower_text", "qa", "string_label_to_class_id", "string_to_float"]


def lower_text(text: str, example: Mapping[str, Any] | None = None, is_target: bool = False) -> str:
    """Lower-cases the text (targets and predictions alike)."""
    del example, is_target  # the same rule applies to both sides
    return text.lower()


def string_to_float(
    text: str, example: Mapping[str, Any] | None = None, is_target: bool = False, default: float = math.nan
) -> float:
    """Parses a number; an unparseable prediction becomes ``default`` (NaN, never equal to a target).

    A target that does not parse is a data error, not a model error, so it raises.
    """
    del example
    try:
        return float(text)
    except ValueError:
        if is_target:
            raise ValueError(
                f"string_to_float: target {text!r} is not a number. Check the task's targets, or use a "
                "postprocessor that matches their format."
            ) from None
        return default


def string_label_to_class_id(
    text: str,
    example: Mapping[str, Any] | None = None,
    is_target: bool = False,
    *,
    label_classes: Sequence[str],
    default: int = -1,
) -> int:
    """The index of ``text`` in ``label_classes``; an unknown prediction becomes ``default``.

    Bind the classes: ``functools.partial(string_label_to_class_id, label_classes=("no", "yes"))``.
    An unknown target raises, naming the classes.
    """
    del example
    classes = list(label_classes)
    if text in classes:
        return classes.index(text)
    if is_target:
        raise ValueError(
            f"string_label_to_class_id: target {text!r} is not one of the label classes {classes}. "
            "Add it to label_classes, or fix the task's targets."
        )
    return default


def qa(text: str, example: Mapping[str, Any] | None = None, is_target: bool = False) -> str | list[str]:
    """For question answering: a target becomes the example's list of acceptable ``answers``.

    The decoded target holds only the first answer; metrics such as ``squad`` take the best score over
    all of them, so the preprocessors must keep the raw ``answers`` field in each example. Predictions
    pass through unchanged.
    """
    if not is_target:
        return text
    answers = None if example is None else example.get("answers")
    if answers is None or isinstance(answers, str | bytes):
        found = "no example was given" if example is None else f"its 'answers' is {answers!r:.80}"
        raise ValueError(
            f"qa: a target needs the example's 'answers' (a list of strings) but {found}. Keep the raw "
            "'answers' field in the task's preprocessors."
        )
    return [a.decode("utf-8") if isinstance(a, bytes) else str(a) for a in answers]
