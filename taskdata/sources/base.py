"""The source interface and its error type."""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from typing import Any

from taskdata import fs

__all__ = [
    "Source",
    "SourceError",
    "describe_file",
    "estimated_file_bytes",
    "files_description",
    "iter_text_lines",
]


class SourceError(ValueError):
    """A source file or record that cannot be read; names the file and the line or record."""

    def __init__(self, path: str, position: str, reason: str):
        self.path = path
        self.position = position
        self.reason = reason
        super().__init__(f"{path}, {position}: {reason}")


class Source(abc.ABC):
    """A sharded, ordered source of raw examples (dicts of Python values)."""

    # A shard with no records is an error when read through a task unless the source allows it.
    allows_empty_shards: bool = False

    @property
    @abc.abstractmethod
    def splits(self) -> tuple[str, ...]:
        """The split names this source provides."""

    @abc.abstractmethod
    def list_shards(self, split: str) -> list[str]:
        """The shards of ``split`` in a deterministic order (e.g. sorted file paths)."""

    @abc.abstractmethod
    def read_shard(self, split: str, shard: str) -> Iterator[dict[str, Any]]:
        """The records of one shard, in a deterministic order."""

    @abc.abstractmethod
    def fingerprint_description(self) -> Any:
        """What identifies this source's data (e.g. file names, sizes and content digests)."""

    def estimated_bytes(self, split: str) -> int | None:
        """Roughly how many bytes of text ``split`` holds, to size output shards; None if unknown."""
        return None

    def describe_shard(self, shard: str) -> str:
        """A few words about ``shard`` for an error about its contents (file sources give its size)."""
        return f"shard {shard!r}"

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ValueError(f"Unknown split {split!r}: this source has splits {list(self.splits)}.")


# gzip'd JSON or text holds about 2.6x its size (measured on C4's .json.gz files).
GZIP_EXPANSION = 2.6


def estimated_file_bytes(paths: list[str]) -> int:
    return int(sum(fs.size(p) * (GZIP_EXPANSION if p.endswith(".gz") else 1) for p in paths))


def describe_file(path: str) -> str:
    """The size of a source file, and what an empty one is, for errors about its contents."""
    size = fs.size(path)
    if path.endswith(".gz"):
        if size == 0:
            return "the file is 0 bytes: not even a gzip header"
        return f"the file is a gzip stream of {size} bytes that holds no data"
    return f"the file is {size} bytes"


def iter_text_lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a UTF-8 text file, gzip'd if it ends in .gz; errors name the exact line.

    Lines are split as bytes and decoded one by one, so a decoding error is reported on its own line
    rather than wherever a buffered decoder happened to stop. A gzip file is decompressed a block ahead
    in a helper thread (``taskdata.sources.gunzip``).
    """
    import zlib

    line_no = 0
    with fs.open_file(path, "rb") as raw:
        try:
            lines = _gzip_lines(raw) if path.endswith(".gz") else raw
            for line_no, data in enumerate(lines, start=1):
                try:
                    yield line_no, data.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise SourceError(path, f"line {line_no}", f"not valid UTF-8 ({e.reason} at byte {e.start})") from e
        except (EOFError, zlib.error) as e:
            raise SourceError(path, f"line {line_no + 1}", f"cannot read: {e}") from e


def _gzip_lines(raw: Any) -> Iterator[bytes]:
    """The lines of a gzip stream, each with its b"\\n" (the last one without, if the text does not end in one),
    as iterating a ``gzip.GzipFile`` gives them."""
    from taskdata.sources.gunzip import gunzipped_blocks

    rest = b""
    for block in gunzipped_blocks(raw):
        lines = (rest + block).split(b"\n")
        rest = lines.pop()
        for line in lines:
            yield line + b"\n"
    if rest:
        yield rest


def files_description(files_by_split: Mapping[str, list[str]]) -> dict[str, list[list[Any]]]:
    """Base name, size and content digest of every file, per split (paths differ between machines; names
    and contents do not). The digest makes an edit that keeps a file's size change the fingerprint."""
    from taskdata.sources.digest import file_digest

    return {
        split: [[path.rsplit("/", 1)[-1], fs.size(path), file_digest(path)] for path in files]
        for split, files in sorted(files_by_split.items())
    }
