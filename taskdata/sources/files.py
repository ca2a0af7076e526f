"""File sources: text lines, TFRecord files of ``tf.train.Example``, and Parquet files.

Each takes, per split, a glob pattern or an explicit list of paths (local or ``gs://``). Files are
read in sorted order; every file is one shard. A file with no records is an error when a task reads it
unless the source is built with ``allow_empty_files=True``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from taskdata import fs
from taskdata.sources.base import (
    Source,
    SourceError,
    describe_file,
    estimated_file_bytes,
    files_description,
    iter_text_lines,
)

__all__ = ["ParquetSource", "TFExampleSource", "TextLineSource"]


class _FileSource(Source):
    def __init__(self, split_to_files: Mapping[str, str | Sequence[str]], *, allow_empty_files: bool = False):
        _check_split_to_files(type(self).__name__, split_to_files)
        self._split_to_files = {s: (f if isinstance(f, str) else tuple(f)) for s, f in split_to_files.items()}
        self.allows_empty_shards = bool(allow_empty_files)

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self._split_to_files)

    def list_shards(self, split: str) -> list[str]:
        self.check_split(split)
        spec = self._split_to_files[split]
        if isinstance(spec, str):
            files = fs.glob(spec)
            if not files:
                raise FileNotFoundError(f"No files match {spec!r} for split {split!r} of {type(self).__name__}.")
            return files
        for path in spec:
            if not fs.exists(path):
                raise FileNotFoundError(f"Source file {path!r} of split {split!r} does not exist.")
        return sorted(spec)

    def estimated_bytes(self, split: str) -> int | None:
        return estimated_file_bytes(self.list_shards(split))

    def describe_shard(self, shard: str) -> str:
        return describe_file(shard)

    def fingerprint_description(self) -> Any:
        return {
            "type": type(self).__name__,
            "files": files_description({s: self.list_shards(s) for s in self.splits}),
            **self._extra_description(),
        }

    def _extra_description(self) -> dict[str, Any]:
        return {}

    @abc.abstractmethod
    def read_shard(self, split: str, shard: str) -> Iterator[dict[str, Any]]: ...


_EXAMPLE_FILES = {"TextLineSource": "data/train-*.txt", "TFExampleSource": "data/train-*.tfrecord",
                  "ParquetSource": "data/train-*.parquet"}


def _check_split_to_files(source: str, split_to_files: Any) -> None:
    """A mapping of split name -> a glob pattern or a list of paths; anything else shows the right call."""
    pattern = _EXAMPLE_FILES.get(source, "data/train-*")
    right = f"{source}({{'train': {pattern!r}, 'validation': [...]}}) with, per split, a glob pattern or a list of paths"
    if isinstance(split_to_files, str | list | tuple):
        files = split_to_files if isinstance(split_to_files, str) else list(split_to_files)
        raise ValueError(
            f"{source} takes a mapping of split name to files, not {type(split_to_files).__name__} {split_to_files!r}: "
            f"write {source}({{'train': {files!r}}}) for a single split, or {right}."
        )
    if not isinstance(split_to_files, Mapping) or not split_to_files:
        raise ValueError(f"{source} needs at least one split but got {split_to_files!r}: {right}.")
    for split, files in split_to_files.items():
        paths = [files] if isinstance(files, str) else files
        if (not isinstance(split, str) or not isinstance(paths, list | tuple) or not paths
                or not all(isinstance(p, str) and p for p in paths)):
            raise ValueError(f"{source} split {split!r} has files {files!r}: {right}.")


class TextLineSource(_FileSource):
    """Each line (without its newline) becomes ``{"text": line}``; gzip files by ``.gz`` suffix."""

    def read_shard(self, split: str, shard: str) -> Iterator[dict[str, Any]]:
        for line_no, line in iter_text_lines(shard):
            del line_no
            yield {"text": line.rstrip("\n")}


class TFExampleSource(_FileSource):
    """TFRecord files of ``tf.train.Example``; every record's CRCs are checked.

    ``features`` optionally names the expected features and their kinds (``"int"``, ``"float"`` or
    ``"bytes"``/``"string"``); a record without one or of another kind is an error naming the record.
    """

    def __init__(self, split_to_files: Mapping[str, str | Sequence[str]], features: Mapping[str, str] | None = None,
                 *, allow_empty_files: bool = False):
        super().__init__(split_to_files, allow_empty_files=allow_empty_files)
        self._features = dict(features or {})

    def _extra_description(self) -> dict[str, Any]:
        return {"features": dict(sorted(self._features.items()))}

    def read_shard(self, split: str, shard: str) -> Iterator[dict[str, Any]]:
        from taskdata.cache import tfrecord
        from taskdata.example import decode_example, has_kind

        with fs.open_file(shard, "rb") as f:
            for index, record in enumerate(tfrecord.iter_records(f, shard)):
                try:
                    example = decode_example(record)
                except ValueError as e:
                    raise SourceError(shard, f"record {index}", f"not a tf.train.Example: {e}") from e
                for name, kind in self._features.items():
                    if name not in example:
                        raise SourceError(shard, f"record {index}", f"missing feature {name!r}")
                    if not has_kind(example[name], kind):
                        raise SourceError(
                            shard, f"record {index}", f"feature {name!r} is not of kind {kind!r}"
                        )
                yield {k: _unwrap_bytes(v) for k, v in example.items()}


def _unwrap_bytes(value: Any) -> Any:
    # Single strings come back as text, which is what preprocessors expect for text features.
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], bytes):
        try:
            return value[0].decode("utf-8")
        except UnicodeDecodeError:
            return value[0]
    return value


class ParquetSource(_FileSource):
    """Parquet files (pyarrow); each row becomes a dict. ``columns`` selects columns (all by default)."""

    def __init__(self, split_to_files: Mapping[str, str | Sequence[str]], columns: Sequence[str] | None = None,
                 batch_size: int = 1024, *, allow_empty_files: bool = False):
        super().__init__(split_to_files, allow_empty_files=allow_empty_files)
        self._columns = tuple(columns) if columns else None
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive but got {batch_size}.")
        self._batch_size = batch_size

    def _extra_description(self) -> dict[str, Any]:
        return {"columns": list(self._columns) if self._columns else None}

    def read_shard(self, split: str, shard: str) -> Iterator[dict[str, Any]]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        with fs.open_file(shard, "rb") as f:
            try:
                parquet = pq.ParquetFile(f)
                missing = [c for c in self._columns or () if c not in parquet.schema_arrow.names]
                if missing:
                    raise SourceError(shard, "schema", f"missing columns {missing}; it has {parquet.schema_arrow.names}")
                row = 0
                for batch in parquet.iter_batches(batch_size=self._batch_size, columns=self._columns):
                    for record in batch.to_pylist():
                        yield record
                        row += 1
            except (pa.ArrowInvalid, OSError) as e:
                raise SourceError(shard, "file", f"not a readable Parquet file: {e}") from e
