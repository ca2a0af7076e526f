"""Registering seqio Tasks and Mixtures in a taskdata registry, under their seqio names.

``add_seqio_task(name)`` looks ``name`` up in seqio's ``TaskRegistry`` (the module that registers it must
be imported first, e.g. with ``--module``) and registers its bridged task; ``add_seqio_mixture(name)`` does
that for each task of a seqio Mixture (nested mixtures flattened, as seqio does) and registers a taskdata
mixture whose rates are seqio's ``Mixture.get_rate`` of each task. Both are idempotent for the same seqio
object, because the command line and the Beam workers of an in-process run share the default registry.
"""

from __future__ import annotations

import difflib
from typing import Any

from taskdata.define.mixture import Mixture
from taskdata.define.registry import Registry, UnknownNameError
from taskdata.rates import parse_rate
from taskdata.seqio_bridge.errors import SeqioBridgeError
from taskdata.seqio_bridge.runtime import import_seqio
from taskdata.seqio_bridge.task import SeqioTask, bridge_task

__all__ = ["add_seqio_mixture", "add_seqio_task"]


def add_seqio_task(name: str, registry: Registry | None = None) -> SeqioTask:
    """Registers the seqio Task ``name`` in ``registry`` (default: taskdata's default registry)."""
    registry = registry if registry is not None else _default_registry()
    seqio_task = _lookup(name, "task")
    if name in registry:
        existing = registry.get(name)
        if isinstance(existing, SeqioTask) and existing.source.seqio_task is seqio_task:
            return existing
        raise SeqioBridgeError(
            f"seqio task {name!r} cannot be bridged: taskdata already has a {type(existing).__name__.lower()} of that "
            f"name (registered at {registry.origin(name)}). Rename one of them."
        )
    task = bridge_task(seqio_task)
    registry.add(task)
    return task


def add_seqio_mixture(name: str, registry: Registry | None = None) -> Mixture:
    """Registers the seqio Mixture ``name`` and each of its tasks; seqio's rates become the mixture's."""
    registry = registry if registry is not None else _default_registry()
    seqio_mixture = _lookup(name, "mixture")
    entries = []
    for seqio_task in seqio_mixture.tasks:
        task = add_seqio_task(seqio_task.name, registry)
        try:
            rate = seqio_mixture.get_rate(seqio_task)
        except Exception as e:
            raise SeqioBridgeError(
                f"seqio mixture {name!r}: its rate of task {seqio_task.name!r} cannot be computed: {e}. A rate function "
                "such as seqio.mixing_rate_num_examples reads seqio's cached statistics or the source's "
                "num_input_examples; give the rate as a number, or give the source num_input_examples."
            ) from e
        entries.append((task, rate))
    if name in registry:
        existing = registry.get(name)
        wanted = [(t.name, parse_rate(r, f"seqio mixture {name!r}: rate of {t.name!r}")) for t, r in entries]
        if isinstance(existing, Mixture) and list(zip(existing.task_names, existing.rates, strict=True)) == wanted:
            return existing
        raise SeqioBridgeError(
            f"seqio mixture {name!r} cannot be bridged: taskdata already has a {type(existing).__name__.lower()} of that "
            f"name (registered at {registry.origin(name)}). Rename one of them."
        )
    return registry.add_mixture(name, entries)


def _lookup(name: str, kind: str) -> Any:
    seqio = import_seqio()
    tasks, mixtures = list(seqio.TaskRegistry.names()), list(seqio.MixtureRegistry.names())
    wanted, other = (tasks, mixtures) if kind == "task" else (mixtures, tasks)
    if name in wanted:
        return (seqio.TaskRegistry if kind == "task" else seqio.MixtureRegistry).get(name)
    if name in other:
        other_kind = "mixture" if kind == "task" else "task"
        raise SeqioBridgeError(f"{name!r} is a seqio {other_kind}, not a {kind}: use --seqio-{other_kind} {name} "
                               f"(add_seqio_{other_kind}).")
    close = difflib.get_close_matches(name, tasks + mixtures, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise UnknownNameError(
        f"Unknown seqio {kind} {name!r}.{hint} seqio has {len(tasks)} tasks and {len(mixtures)} mixtures registered; "
        "pass --module to import the module that registers it (seqio.TaskRegistry.add / seqio.MixtureRegistry.add)."
    )


def _default_registry() -> Registry:
    from taskdata.tasks import default_registry

    return default_registry()
