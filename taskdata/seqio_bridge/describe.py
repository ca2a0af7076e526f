"""Fingerprint descriptions of what decides a bridged seqio task's bytes: its source and preprocessors.

A source is described by its type, its files (names and sizes, as taskdata's file sources are) or its
function, and the parameters that change what it reads. A preprocessor is described by its qualified
name and, for ``functools.partial``, its bound arguments; seqio vocabularies, TensorFlow dtypes and
``tf.io`` feature specs among those arguments are described by what they mean. Anything else that cannot
be described stably (a lambda, a local function, an arbitrary object) is an error naming the task, the
preprocessor and the fix: a cache must never be reused for a definition it was not built from.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from taskdata.fingerprint import describe
from taskdata.seqio_bridge.errors import SeqioBridgeError
from taskdata.seqio_bridge.runtime import import_seqio
from taskdata.seqio_bridge.vocabulary import describe_seqio_vocabulary
from taskdata.sources.base import files_description

__all__ = ["describe_preprocessor", "describe_source", "qualified_name"]


def qualified_name(obj: Any) -> str:
    if isinstance(obj, functools.partial):
        return qualified_name(obj.func)
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    module = getattr(obj, "__module__", None) or type(obj).__module__
    return f"{module}.{name}"


def describe_preprocessor(preprocessor: Any, task: str) -> Any:
    """A stable description of one seqio preprocessor (a function, a partial or a describable object)."""
    return _describe(preprocessor, task, f"preprocessor {qualified_name(preprocessor)}")


def describe_source(source: Any, task: str) -> dict[str, Any]:
    """A stable description of a seqio ``DataSource``: its type, files or function, and parameters."""
    seqio = import_seqio()
    where = f"source {type(source).__qualname__}"
    own = getattr(source, "fingerprint_description", None)
    if callable(own):
        return {"type": qualified_name(source), "description": own()}
    description: dict[str, Any] = {"type": f"{type(source).__module__}.{type(source).__qualname__}",
                                   "splits": list(source.splits)}
    if isinstance(source, seqio.FileDataSource):
        description["files"] = files_description({s: list(source.list_shards(s)) for s in source.splits})
        if isinstance(source, seqio.TextLineDataSource):
            description["skip_header_lines"] = source._skip_header_lines
        elif isinstance(source, seqio.TFExampleDataSource):
            description["feature_description"] = _describe(source.feature_description, task, where)
            description["reader"] = _describe(source.reader_cls, task, where)
        elif isinstance(source, seqio.ProtoDataSource):
            description["decode_proto_fn"] = _describe(source.decode_proto_fn, task, where)
            description["reader"] = _describe(source.reader_cls, task, where)
        else:
            description["read_file_fn"] = _describe(source._reader, task, where)
    elif isinstance(source, seqio.FunctionDataSource):
        description["dataset_fn"] = _describe(source._dataset_fn, task, where)
    elif isinstance(source, seqio.TfdsDataSource):
        description["tfds"] = str(source.tfds_dataset)
        description["shards"] = {s: list(source.list_shards(s)) for s in source.splits}
    else:
        raise SeqioBridgeError(
            f"seqio task {task!r}: cannot fingerprint its {where}: taskdata knows seqio's file, function and TFDS "
            "sources. Give the source class a fingerprint_description() method returning what decides its records "
            "(for example its files with their sizes) as plain values."
        )
    return description


def _describe(value: Any, task: str, where: str) -> Any:
    seqio = import_seqio()
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return describe(value)
    own = getattr(value, "fingerprint_description", None)
    if callable(own) and not isinstance(value, type):
        return own()
    if isinstance(value, seqio.Vocabulary):
        return describe_seqio_vocabulary(value)
    if isinstance(value, functools.partial):
        return {"partial": _describe(value.func, task, where),
                "args": [_describe(a, task, where) for a in value.args],
                "kwargs": {k: _describe(v, task, where) for k, v in sorted(value.keywords.items())}}
    dtype_name = _tf_dtype_name(value)
    if dtype_name is not None:
        return {"tf_dtype": dtype_name}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # tf.io.FixedLenFeature and friends
        return {"type": qualified_name(type(value)),
                "fields": {f: _describe(getattr(value, f), task, where) for f in value._fields}}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": qualified_name(type(value)),
                "fields": {f.name: _describe(getattr(value, f.name), task, where) for f in dataclasses.fields(value)}}
    if isinstance(value, Mapping):
        return {str(k): _describe(v, task, where) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_describe(v, task, where) for v in value]
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        return describe(value)
    if callable(value) and hasattr(value, "__qualname__"):
        name = qualified_name(value)
        if "<lambda>" in name or "<locals>" in name:
            raise SeqioBridgeError(
                f"seqio task {task!r}: its {where} uses {name}, a lambda or local function, which has no stable name "
                "to fingerprint. Define it at module level (bind parameters with functools.partial)."
            )
        return {"function": name}
    raise SeqioBridgeError(
        f"seqio task {task!r}: its {where} holds a {type(value).__qualname__} ({value!r:.80}), which taskdata cannot "
        "fingerprint. Bind plain values (numbers, strings, lists, dicts, seqio vocabularies), or give its class a "
        "fingerprint_description() method."
    )


def _tf_dtype_name(value: Any) -> str | None:
    import tensorflow as tf

    return value.name if isinstance(value, tf.dtypes.DType) else None
