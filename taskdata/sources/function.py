"""A source backed by a Python function with declared shards."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from taskdata.fingerprint import describe
from taskdata.sources.base import Source, SourceError

__all__ = ["FunctionSource"]


class FunctionSource(Source):
    """``fn(split, shard) -> iterable of dicts``; ``shards`` declares each split's shard names in order.

    A shard for which ``fn`` yields nothing is an error when a task reads it, unless
    ``allow_empty_shards``.

    The function must be a module-level function (it is fingerprinted by name) and must yield the
    same records in the same order every time it is called with the same arguments.
    """

    def __init__(self, fn: Callable[[str, str], Iterable[Mapping[str, Any]]], shards: Mapping[str, Sequence[str]],
                 version: str = "1", *, allow_empty_shards: bool = False):
        if not callable(fn):
            raise ValueError(f"FunctionSource takes fn(split, shard) -> records first but got {fn!r}: "
                            "FunctionSource(read, {'train': ['0', '1']}).")
        if not isinstance(shards, Mapping) or not shards:
            raise ValueError(f"FunctionSource needs a mapping of split name to shard names but got {shards!r}: "
                             "FunctionSource(read, {'train': ['0', '1'], 'validation': ['0']}).")
        for split, names in shards.items():
            if isinstance(names, str):
                raise ValueError(f"FunctionSource split {split!r} declares the string {names!r}: give a list of "
                                 f"shard names, e.g. {{{split!r}: [{names!r}]}}.")
            if not names:
                raise ValueError(f"FunctionSource split {split!r} declares no shards.")
            if len(set(names)) != len(names):
                raise ValueError(f"FunctionSource split {split!r} declares duplicate shard names: {list(names)}.")
        self._fn = fn
        self._shards = {s: list(v) for s, v in shards.items()}
        self._version = version
        self.allows_empty_shards = bool(allow_empty_shards)

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self._shards)

    def list_shards(self, split: str) -> list[str]:
        self.check_split(split)
        return list(self._shards[split])

    def read_shard(self, split: str, shard: str) -> Iterator[dict[str, Any]]:
        for index, record in enumerate(self._fn(split, shard)):
            if not isinstance(record, Mapping):
                raise SourceError(
                    f"{self._fn.__module__}.{self._fn.__qualname__}", f"shard {shard!r} record {index}",
                    f"expected a mapping but got {type(record).__name__}",
                )
            yield dict(record)

    def fingerprint_description(self) -> Any:
        # A function's output cannot be hashed without running it; 'version' is the user's handle
        # for saying that the function's output changed.
        return {"type": "FunctionSource", "fn": describe(self._fn), "shards": self._shards, "version": self._version}
