"""Prediction files: JSON lines, one object per example, in any order and spread over any number of files.

A multi-host inference job writes one file per host::

    {"id": "squad_v1/validation/3/17", "prediction": "Denver Broncos", "score": -1.25}

``id`` is the stable example id (``taskdata.seeding.format_example_id``), ``prediction`` the decoded
model output, and the optional ``score`` the model's log-likelihood of the target: one number for the
whole sequence or a list of per-token values. Other keys (e.g. the inputs) are ignored.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

from taskdata import fs
from taskdata.seeding import parse_example_id

__all__ = [
    "EvaluationError",
    "MissingPredictionsError",
    "Prediction",
    "PredictionFileError",
    "Score",
    "expand_prediction_paths",
    "is_number",
    "read_predictions",
]

Score = float | tuple[float, ...]

_LINE_EXAMPLE = '{"id": "task/validation/0/17", "prediction": "text"}'


class EvaluationError(ValueError):
    """Predictions or targets that cannot be evaluated."""


class PredictionFileError(EvaluationError):
    """A bad prediction line; the message starts with the file, the line and (when known) the id."""

    def __init__(self, path: str, line: int, example_id: str | None, reason: str):
        self.path = path
        self.line = line
        self.example_id = example_id
        where = f"{path}, line {line}" + (f", id {example_id!r}" if example_id is not None else "")
        super().__init__(f"{where}: {reason}")


class MissingPredictionsError(EvaluationError):
    """Targets without a prediction (and ``allow_partial`` not set)."""

    def __init__(self, message: str, missing: int, total: int):
        self.missing = missing
        self.total = total
        super().__init__(message)


# Predictions -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One prediction line, with where it was read from (every error about it names that place)."""

    example_id: str
    text: str
    score: Score | None
    path: str
    line: int

    def __post_init__(self) -> None:
        if not isinstance(self.example_id, str):
            raise self.error(
                f"'id' must be a string such as 'task/validation/0/17' but got {self.example_id!r:.80}.",
                with_id=False,
            )
        try:
            parse_example_id(self.example_id)
        except ValueError as e:
            raise self.error(str(e), with_id=False) from None
        if not isinstance(self.text, str):
            raise self.error(
                f"'prediction' must be a string (the decoded model output) but got {self.text!r:.80}."
            )
        object.__setattr__(self, "score", self._checked_score(self.score))

    def _checked_score(self, score: Any) -> Score | None:
        if score is None or is_number(score):
            return None if score is None else float(score)
        if isinstance(score, list | tuple) and all(is_number(v) for v in score):
            return tuple(float(v) for v in score)
        raise self.error(
            f"'score' must be a number (the target's log-likelihood) or a list of numbers (per-token "
            f"log-likelihoods) but got {score!r:.80}."
        )

    def error(self, reason: str, with_id: bool = True) -> PredictionFileError:
        """An error about this prediction, located at its file and line."""
        return PredictionFileError(self.path, self.line, self.example_id if with_id else None, reason)


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def read_predictions(paths: Sequence[str]) -> dict[str, Prediction]:
    """Every prediction of ``paths`` by example id, in file and line order; duplicates are errors."""
    if not paths:
        raise EvaluationError("No prediction files were given; pass at least one JSON-lines file.")
    if len(set(paths)) != len(paths):
        twice = sorted({p for p in paths if paths.count(p) > 1})
        raise EvaluationError(f"Prediction files {twice} are given more than once; give each file once.")
    by_id: dict[str, Prediction] = {}
    for path in paths:
        for prediction in _read_file(path):
            first = by_id.get(prediction.example_id)
            if first is not None:
                raise PredictionFileError(
                    path,
                    prediction.line,
                    prediction.example_id,
                    f"duplicate id: it was already predicted at {first.path}, line {first.line}. Each example "
                    "must be predicted exactly once; remove one of the two (did an inference host's output "
                    "get written twice?).",
                )
            by_id[prediction.example_id] = prediction
    return by_id


def _read_file(path: str) -> Iterable[Prediction]:
    if not fs.exists(path):
        raise EvaluationError(
            f"Prediction file {path!r} does not exist. Check the path given to --predictions."
        )
    with fs.open_file(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            yield _parse_line(path, number, raw)


def _parse_line(path: str, number: int, raw: bytes) -> Prediction:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PredictionFileError(path, number, None, f"not UTF-8 (bad byte at offset {e.start}).") from None
    if not text.strip():
        raise PredictionFileError(
            path, number, None, f"blank line; every line must be one JSON object like {_LINE_EXAMPLE}."
        )
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise PredictionFileError(
            path,
            number,
            None,
            f"not valid JSON ({e.msg} at column {e.colno}); every line must be one JSON "
            f"object like {_LINE_EXAMPLE}.",
        ) from None
    if not isinstance(obj, dict):
        raise PredictionFileError(
            path,
            number,
            None,
            f"expected a JSON object like {_LINE_EXAMPLE} but got a JSON {type(obj).__name__}.",
        )
    if "id" not in obj:
        raise PredictionFileError(path, number, None, f"the object has no 'id' (keys: {sorted(obj)}).")
    if "prediction" not in obj:
        example_id = obj["id"] if isinstance(obj["id"], str) else None
        raise PredictionFileError(
            path, number, example_id, f"the object has no 'prediction' (keys: {sorted(obj)})."
        )
    return Prediction(
        example_id=obj["id"], text=obj["prediction"], score=obj.get("score"), path=path, line=number
    )


def expand_prediction_paths(patterns: Sequence[str]) -> list[str]:
    """Paths as given, with glob patterns (``*``, ``?``, ``[``) expanded; also for gs:// URLs."""
    paths: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            matched = fs.glob(pattern)
            if not matched:
                raise EvaluationError(f"Prediction file pattern {pattern!r} matches no files.")
            paths.extend(matched)
        else:
            paths.append(pattern)
    return paths
