"""C4 in allenai/c4's exact JSON-lines format: ``{"text", "timestamp", "url"}`` per line.

Files are named like ``c4-train.00000-of-01024.json.gz`` (or ``.json``) in one folder, local or on
``gs://``. The folder may be given as a function that returns it, so that a task can be declared before
its files exist (the built-in tasks' corpus is built on first use).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
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

__all__ = ["C4Source"]


class C4Source(Source):
    """C4 JSON-lines files for the splits ``train`` and ``validation``."""

    def __init__(self, data_dir: str | Callable[[], str], splits: tuple[str, ...] = ("train", "validation"), *,
                 allow_empty_files: bool = False):
        if not callable(data_dir) and (not isinstance(data_dir, str) or not data_dir):
            raise ValueError(
                f"C4Source needs the folder of C4 JSON-lines files (or a function returning it) but got "
                f"{data_dir!r}: for example C4Source('gs://my-bucket/c4/en')."
            )
        if isinstance(splits, str) or not splits or not all(isinstance(split, str) for split in splits):
            raise ValueError(f"C4Source splits must be a tuple of split names, e.g. splits=('train',), but got {splits!r}.")
        self._data_dir = data_dir
        self._splits = tuple(splits)
        self.allows_empty_shards = bool(allow_empty_files)

    @property
    def data_dir(self) -> str:
        return self._data_dir() if callable(self._data_dir) else self._data_dir

    @property
    def splits(self) -> tuple[str, ...]:
        return self._splits

    def list_shards(self, split: str) -> list[str]:
        self.check_split(split)
        base = self.data_dir
        files = fs.glob(fs.join(base, f"c4-{split}.*-of-*.json*"))
        files = [f for f in files if f.endswith((".json", ".json.gz"))]
        if not files:
            raise FileNotFoundError(
                f"No C4 files for split {split!r} in {base!r}: expected files named like "
                f"'c4-{split}.00000-of-01024.json.gz'. Pass the folder of the C4 'en' variant (for the "
                "built-in tasks: taskdata --c4-dir DIR, or $TASKDATA_C4_DIR)."
            )
        return files

    def read_shard(self, split: str, shard: str) -> Iterator[dict[str, Any]]:
        for line_no, line in iter_text_lines(shard):
            yield _parse_c4_line(shard, line_no, line)

    def estimated_bytes(self, split: str) -> int | None:
        return estimated_file_bytes(self.list_shards(split))

    def describe_shard(self, shard: str) -> str:
        return describe_file(shard)

    def fingerprint_description(self) -> Any:
        return {
            "type": "C4Source",
            "files": files_description({s: self.list_shards(s) for s in self.splits}),
        }


def _parse_c4_line(path: str, line_no: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise SourceError(path, f"line {line_no}", f"not valid JSON ({e.msg} at column {e.colno})") from e
    if not isinstance(record, dict):
        raise SourceError(path, f"line {line_no}", f"expected a JSON object but got {type(record).__name__}")
    for key in ("text", "timestamp", "url"):
        if not isinstance(record.get(key), str):
            raise SourceError(
                path, f"line {line_no}", f"field {key!r} must be a string in C4's format but got {record.get(key)!r:.60}"
            )
    return {"text": record["text"], "timestamp": record["timestamp"], "url": record["url"]}
