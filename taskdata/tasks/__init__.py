"""Built-in tasks and mixtures, and the process-wide default registry that holds them.

``register_builtin_tasks(registry, config)`` adds the built-in tasks to any registry (tests use a fresh
``Registry``). ``default_registry(config)`` is the registry that user modules register into with
``taskdata.add_task`` / ``taskdata.add_mixture``: the built-in tasks, installed ``taskdata.tasks`` entry
points and whatever ``--module`` imported.
"""

from __future__ import annotations

import threading
from typing import Any

from taskdata.config import Config
from taskdata.define.mixture import Mixture
from taskdata.define.registry import Registry
from taskdata.define.task import Task
from taskdata.tasks.c4 import register_builtin_tasks

__all__ = ["add_mixture", "add_task", "default_registry", "register_builtin_tasks"]

_default: Registry | None = None
_default_config: Config | None = None
_lock = threading.Lock()


def default_registry(config: Config | None = None) -> Registry:
    """The process-wide registry: built-in tasks, installed entry points and user modules.

    The first call builds it, with the built-in tasks reading ``config`` (default ``Config()``). A later
    call with another ``config`` registers the built-in tasks again, reading from it (an entry point
    such as the command line runs once per process, but tests call it many times); user tasks and
    mixtures stay as they were registered. ``None`` keeps whatever is in force.
    """
    global _default, _default_config
    with _lock:
        if _default is None:
            _default_config = config or Config()
            registry = Registry()
            register_builtin_tasks(registry, _default_config)
            registry.load_entry_points()
            _default = registry
        elif config is not None and config != _default_config:
            register_builtin_tasks(_default, config, replace=True)
            _default_config = config
        return _default


def add_task(*args: Any, **kwargs: Any) -> Task:
    """Registers a task in the default registry (for user modules)."""
    return default_registry().add_task(*args, **kwargs)


def add_mixture(*args: Any, **kwargs: Any) -> Mixture:
    """Registers a mixture in the default registry (for user modules)."""
    return default_registry().add_mixture(*args, **kwargs)
