"""Stable fingerprints of definitions: a sha256 over a canonical JSON description.

Everything that influences the bytes of a cache (source files, preprocessors and their parameters,
vocabularies, output features) is described as plain JSON values, sorted and hashed. The description
must not contain anything that varies between processes (ids, memory addresses, dict order, set order).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["FingerprintError", "canonical_json", "describe", "fingerprint"]


class FingerprintError(TypeError):
    """A definition that cannot be fingerprinted (a lambda, a local function, an object of no stable
    description): the user's definition to change, not a bug (``taskdata`` commands answer it as a usage error)."""


def describe(obj: Any) -> Any:
    """Turns ``obj`` into a JSON-serialisable description that is stable across processes.

    Objects may define ``fingerprint_description()`` to describe themselves; dataclasses are described
    by their type and fields; functions by their module and qualified name; ``functools.partial`` by
    its function and arguments.
    """
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return {"float": repr(obj)}
        return obj
    if isinstance(obj, bytes):
        return {"bytes_sha256": hashlib.sha256(obj).hexdigest()}
    if isinstance(obj, enum.Enum):
        return {"enum": f"{type(obj).__module__}.{type(obj).__qualname__}.{obj.name}"}
    describe_self = getattr(obj, "fingerprint_description", None)
    if callable(describe_self) and not isinstance(obj, type):
        return describe_self()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: describe(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.compare}
        return {"type": _qualified_name(type(obj)), "fields": fields}
    if isinstance(obj, functools.partial):
        return {
            "partial": describe(obj.func),
            "args": [describe(a) for a in obj.args],
            "kwargs": {k: describe(v) for k, v in sorted(obj.keywords.items())},
        }
    if isinstance(obj, Mapping):
        return {str(k): describe(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, list | tuple):
        return [describe(v) for v in obj]
    if isinstance(obj, set | frozenset):
        return sorted((describe(v) for v in obj), key=canonical_json)
    if callable(obj) and hasattr(obj, "__qualname__"):
        if "<lambda>" in obj.__qualname__ or "<locals>" in obj.__qualname__:
            # A lambda or closure has no stable identity: two different lambdas would share a name.
            raise FingerprintError(
                f"Cannot fingerprint {obj.__qualname__} from {obj.__module__}: lambdas and local "
                "functions have no stable name. Define it at module level, or use a dataclass whose "
                "fields are its parameters."
            )
        return {"function": _qualified_name(obj)}
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # numpy arrays and scalars
        return {"array": obj.tolist(), "dtype": str(obj.dtype)}
    raise FingerprintError(
        f"Cannot fingerprint a {type(obj).__name__}: give it a fingerprint_description() method or "
        "make it a dataclass of plain values."
    )


def _qualified_name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def fingerprint(obj: Any) -> str:
    """Hex sha256 of the canonical description of ``obj``."""
    return hashlib.sha256(canonical_json(describe(obj)).encode("ascii")).hexdigest()
