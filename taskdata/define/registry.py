"""Registries of tasks and mixtures: plain objects, with one default instance for user modules.

User modules register into the default registry (``taskdata.tasks.default_registry``) with
``taskdata.add_task`` / ``taskdata.add_mixture``; tests make a fresh ``Registry()``. Names are looked up
here and nowhere else: a name never becomes a path without passing through ``get``.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import threading
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from taskdata.define.features import Feature
from taskdata.define.mixture import Mixture, MixtureError, Rate
from taskdata.define.task import Task
from taskdata.names import validate_name
from taskdata.preprocessors.base import PreprocessorLike
from taskdata.rates import parse_rate
from taskdata.sources.base import Source

__all__ = [
    "ENTRY_POINT_GROUP",
    "DuplicateNameError",
    "Registry",
    "UnknownNameError",
]

ENTRY_POINT_GROUP = "taskdata.tasks"


class DuplicateNameError(ValueError):
    """A name registered twice."""


class UnknownNameError(KeyError):
    """A name that is not registered; the message lists close matches."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0])


class Registry:
    """Tasks and mixtures by name, remembering where each was registered."""

    def __init__(self) -> None:
        self._items: dict[str, Task | Mixture] = {}
        self._origins: dict[str, str] = {}
        self._loaded_modules: set[str] = set()
        self._lock = threading.Lock()

    # Registration -------------------------------------------------------------------------
    def add(self, item: Task | Mixture, *, replace: bool = False) -> Task | Mixture:
        """Registers ``item``; a name registered before is an error unless ``replace``."""
        if not isinstance(item, Task | Mixture):
            raise TypeError(f"Only Task and Mixture objects can be registered, not {type(item).__name__}.")
        origin = _caller_location()
        with self._lock:
            if item.name in self._items and not replace:
                kind = "task" if isinstance(self._items[item.name], Task) else "mixture"
                raise DuplicateNameError(
                    f"{kind.capitalize()} {item.name!r} is already registered (first registered at "
                    f"{self._origins[item.name]}; again at {origin}). Choose another name, or remove "
                    "one of the registrations."
                )
            self._items[item.name] = item
            self._origins[item.name] = origin
        return item

    def add_task(self, name: str, source: Source, preprocessors: Sequence[PreprocessorLike] = (), *,
                 output_features: Mapping[str, Feature], replace: bool = False, **kwargs: Any) -> Task:
        task = Task(name=name, source=source, preprocessors=preprocessors, output_features=output_features, **kwargs)
        self.add(task, replace=replace)
        return task

    def add_mixture(self, name: str, tasks: Iterable[str | Task | Mixture | tuple[str | Task | Mixture, Rate]],
                    default_rate: Rate | None = None, *, replace: bool = False) -> Mixture:
        """Registers a mixture of ``tasks``: names or objects, each optionally paired with a rate.

        A rate is a positive number (an int, a float read as the decimal it prints as, a ``Fraction``
        or a string like '1/3') or a function of the task returning one (e.g. its example count). The
        mixture keeps the rates exactly, at the scale given. Nested mixtures are flattened: a
        sub-mixture with rate r contributes its tasks with r times their share of it.
        """
        validate_name(name, kind="mixture")
        weights: dict[str, Fraction] = {}
        resolved: dict[str, Task] = {}
        component: str | Task | Mixture
        rate: Rate | None
        for entry in tasks:
            if isinstance(entry, tuple):
                if len(entry) != 2:
                    raise MixtureError(f"Mixture {name!r}: an entry must be a name or (name, rate), got {entry!r}.")
                component, rate = entry
            else:
                component, rate = entry, default_rate
            if isinstance(component, str):
                component = self.get(component)
            if rate is None:
                raise MixtureError(
                    f"Mixture {name!r}: {component.name!r} has no rate. Give (name, rate) pairs or default_rate."
                )
            if isinstance(component, Mixture):
                total = _rate_value(name, component.name, rate, None)
                for task, share in zip(component.tasks, component.shares, strict=True):
                    resolved[task.name] = task
                    weights[task.name] = weights.get(task.name, 0) + total * share
            else:
                resolved[component.name] = component
                value = _rate_value(name, component.name, rate, component)
                weights[component.name] = weights.get(component.name, 0) + value
        if not weights:
            raise MixtureError(f"Mixture {name!r} has no tasks.")
        mixture = Mixture(name=name, tasks=tuple(resolved.values()), rates=tuple(weights.values()))
        self.add(mixture, replace=replace)
        return mixture

    # Lookup -------------------------------------------------------------------------------
    def get(self, name: str) -> Task | Mixture:
        validate_name(name, kind="task or mixture")
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self._unknown_message(name, "task or mixture", self._items)) from None

    def get_task(self, name: str) -> Task:
        item = self.get(name)
        if not isinstance(item, Task):
            raise UnknownNameError(f"{name!r} is a mixture, not a task; use one of its tasks: {list(item.task_names)}.")
        return item

    def get_mixture(self, name: str) -> Mixture:
        item = self.get(name)
        if not isinstance(item, Mixture):
            raise UnknownNameError(f"{name!r} is a task, not a mixture.")
        return item

    def origin(self, name: str) -> str:
        self.get(name)
        return self._origins[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def tasks(self) -> list[Task]:
        return [v for _, v in sorted(self._items.items()) if isinstance(v, Task)]

    def mixtures(self) -> list[Mixture]:
        return [v for _, v in sorted(self._items.items()) if isinstance(v, Mixture)]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)

    @staticmethod
    def _unknown_message(name: str, kind: str, known: Iterable[str]) -> str:
        close = difflib.get_close_matches(name, list(known), n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        return (f"Unknown {kind} {name!r}.{hint} Use 'taskdata list' to see registered names, or pass "
                "--module to import the module that registers it.")

    # Loading user modules -----------------------------------------------------------------
    def load_module(self, module_name: str) -> None:
        """Imports ``module_name``; if it defines ``register_tasks(registry)``, calls it with this registry.

        Loading the same module into the same registry again does nothing (the CLI and the Beam
        workers of an in-process run share the default registry).
        """
        if module_name in self._loaded_modules:
            return
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(
                f"Cannot import task module {module_name!r}: {e}. Is it installed or on PYTHONPATH?"
            ) from e
        hook = getattr(module, "register_tasks", None)
        if callable(hook):
            hook(self)
        self._loaded_modules.add(module_name)

    def load_entry_points(self) -> None:
        """Loads every installed ``taskdata.tasks`` entry point (a module, or a callable taking a registry)."""
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            loaded = entry_point.load()
            if callable(loaded) and not inspect.ismodule(loaded):
                loaded(self)


def _rate_value(mixture: str, component: str, rate: Rate, task: Task | None) -> Fraction:
    what = f"Mixture {mixture!r}: rate of {component!r}"
    if callable(rate):
        if task is None:
            raise MixtureError(f"Mixture {mixture!r}: a rate function cannot apply to sub-mixture {component!r}.")
        value = rate(task)
        what += f" (returned by {getattr(rate, '__qualname__', repr(rate))})"
    else:
        value = rate
    try:
        return parse_rate(value, what)
    except ValueError as error:
        raise MixtureError(str(error)) from None


# Frames of these modules are registration helpers (``taskdata.add_task`` lives in taskdata.tasks): the
# origin of a registration is the first frame outside them.
_HELPER_MODULES = frozenset({__name__, "taskdata.tasks"})


def _caller_location() -> str:
    for frame in inspect.stack()[1:]:
        if frame.frame.f_globals.get("__name__") not in _HELPER_MODULES:
            return f"{frame.filename}:{frame.lineno}"
    return "<unknown>"
