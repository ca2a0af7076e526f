"""``Mixture``: tasks sampled together at given rates (seqio's Mixture), nested mixtures flattened.

Rates are exact fractions of any positive scale, as the user wrote them (see ``taskdata.rates``), so that
``taskdata show`` prints the user's numbers. A run plan built from a mixture gets them as they are and
normalises them itself: the one normalisation on the way to the data (a plan must normalise anyway, as
plans are also made from raw counts and read back from storage). ``Mixture.shares`` is the same exact
division, for display and for flattening a nested mixture.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

from taskdata.define.features import Feature
from taskdata.define.task import Task
from taskdata.fingerprint import fingerprint
from taskdata.names import validate_name
from taskdata.rates import parse_rate

__all__ = ["Mixture", "MixtureError"]

Number = int | float | Fraction | Decimal | str
Rate = Number | Callable[[Task], Number]


class MixtureError(ValueError):
    """A mixture whose tasks do not fit together."""


@dataclasses.dataclass(frozen=True, eq=False)
class Mixture:
    """A named set of tasks with positive rates (already flattened; any scale, stored as exact fractions).

    Build mixtures with ``Registry.add_mixture``, which resolves names, flattens nested mixtures and
    evaluates rate functions (e.g. a task's example count).
    """

    name: str
    tasks: tuple[Task, ...]
    rates: tuple[Fraction, ...]

    def __post_init__(self) -> None:
        validate_name(self.name, kind="mixture")
        if not self.tasks:
            raise MixtureError(f"Mixture {self.name!r} has no tasks.")
        if len(self.tasks) != len(self.rates):
            raise MixtureError(f"Mixture {self.name!r}: {len(self.tasks)} tasks but {len(self.rates)} rates.")
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise MixtureError(f"Mixture {self.name!r} lists a task twice: {names}.")
        rates = []
        for task, rate in zip(self.tasks, self.rates, strict=True):
            try:
                rates.append(parse_rate(rate, f"Mixture {self.name!r}: rate of task {task.name!r}"))
            except ValueError as error:
                raise MixtureError(str(error)) from None
        object.__setattr__(self, "rates", tuple(rates))
        check_same_output_features(self.name, self.tasks)

    @property
    def task_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tasks)

    @functools.cached_property
    def shares(self) -> tuple[Fraction, ...]:
        """Each task's share of the examples: the rates divided by their sum, exactly."""
        total = sum(self.rates)
        return tuple(rate / total for rate in self.rates)

    def fingerprint_description(self) -> dict[str, Any]:
        return {
            "mixture": self.name,
            "tasks": [[t.name, t.fingerprint(), str(r)] for t, r in zip(self.tasks, self.rates, strict=True)],
        }

    def fingerprint(self) -> str:
        return fingerprint(self)


def check_same_output_features(mixture_name: str, tasks: tuple[Task, ...]) -> None:
    first = tasks[0]
    reference = first.output_features
    for task in tasks[1:]:
        features = task.output_features
        for key in sorted(set(reference) | set(features)):
            if key not in features or key not in reference:
                has, lacks = (first, task) if key not in features else (task, first)
                raise MixtureError(
                    f"Mixture {mixture_name!r}: task {lacks.name!r} lacks output feature {key!r} that task "
                    f"{has.name!r} has. All tasks of a mixture must share output features."
                )
            mismatch = _feature_mismatch(reference[key], features[key])
            if mismatch:
                raise MixtureError(
                    f"Mixture {mixture_name!r}: output feature {key!r} of task {task.name!r} differs from "
                    f"task {first.name!r}'s in its {mismatch}. All tasks of a mixture must share output "
                    "features (same vocabulary, dtype, rank and add_eos)."
                )


def _feature_mismatch(a: Feature, b: Feature) -> str | None:
    for attr in ("dtype", "rank", "add_eos"):
        if getattr(a, attr) != getattr(b, attr):
            return f"{attr} ({getattr(b, attr)!r} vs {getattr(a, attr)!r})"
    if a.vocabulary is not b.vocabulary and (
        a.vocabulary.fingerprint_description() != b.vocabulary.fingerprint_description()
    ):
        return "vocabulary"
    return None
