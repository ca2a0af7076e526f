"""Data sources: each lists its shards in a deterministic order and reads each shard in a
deterministic order, so that every record has a stable (shard, index) identity."""

from taskdata.sources.base import Source, SourceError
from taskdata.sources.c4 import C4Source
from taskdata.sources.files import ParquetSource, TextLineSource, TFExampleSource
from taskdata.sources.function import FunctionSource

__all__ = [
    "C4Source",
    "FunctionSource",
    "ParquetSource",
    "Source",
    "SourceError",
    "TFExampleSource",
    "TextLineSource",
]
