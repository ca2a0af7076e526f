"""Preprocessors: functions over one source shard's example stream (see ``base``)."""

from taskdata.preprocessors.base import Example, Preprocessor, ShardContext
from taskdata.preprocessors.concat_chunk import ConcatenateAndChunk
from taskdata.preprocessors.eos import AppendEos, AppendEosAfterTrim
from taskdata.preprocessors.filter import Filter, FilterEmpty
from taskdata.preprocessors.masked_lm import MaskedLM
from taskdata.preprocessors.prefix_lm import PrefixLM
from taskdata.preprocessors.rekey import Rekey
from taskdata.preprocessors.sentences import SplitSentences
from taskdata.preprocessors.span_corruption import (
    SpanCorruption,
    random_spans_helper,
    random_spans_noise_mask,
    span_corruption_lengths,
)
from taskdata.preprocessors.tokenize import Tokenize
from taskdata.preprocessors.trim import Trim

__all__ = [
    "AppendEos",
    "AppendEosAfterTrim",
    "ConcatenateAndChunk",
    "Example",
    "Filter",
    "FilterEmpty",
    "MaskedLM",
    "PrefixLM",
    "Preprocessor",
    "Rekey",
    "ShardContext",
    "SpanCorruption",
    "SplitSentences",
    "Tokenize",
    "Trim",
    "random_spans_helper",
    "random_spans_noise_mask",
    "span_corruption_lengths",
]
