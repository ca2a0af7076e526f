"""A mixture of two cache-test tasks, for command-line tests of runs: load after ``tests.cache_tasks``
(``--module tests.cache_tasks --module tests.stage_tasks``)."""

from __future__ import annotations


def register_tasks(registry) -> None:
    registry.add_mixture("toy_pair", [("toy_det", 3), ("toy_random", 1)])
