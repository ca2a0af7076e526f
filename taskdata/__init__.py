"""taskdata: deterministic, seqio-style data pipelines for training large models on many hosts.

The flow, one package each: ``define`` (tasks, mixtures, registry, vocabularies) with ``sources``,
``preprocessors``, ``metrics`` and the built-in ``tasks``; ``beam`` builds a ``cache``; ``index`` maps a
run's steps to records; ``runs`` stores plans next to their caches; ``evaluation`` scores predictions.
This module re-exports the names user code needs.
"""

from taskdata.config import Config
from taskdata.define.features import Feature
from taskdata.define.hf_vocabulary import HuggingFaceVocabulary
from taskdata.define.mixture import Mixture, MixtureError
from taskdata.define.registry import DuplicateNameError, Registry, UnknownNameError
from taskdata.define.task import OutputFeatureError, Task
from taskdata.define.vocabularies import ByteVocabulary, SentencePieceVocabulary, Vocabulary
from taskdata.names import InvalidNameError, validate_name
from taskdata.sources import (
    C4Source,
    FunctionSource,
    ParquetSource,
    Source,
    SourceError,
    TextLineSource,
    TFExampleSource,
)
from taskdata.tasks import add_mixture, add_task, default_registry

__version__ = "0.1.0"

__all__ = [
    "ByteVocabulary",
    "C4Source",
    "Config",
    "DuplicateNameError",
    "Feature",
    "FunctionSource",
    "HuggingFaceVocabulary",
    "InvalidNameError",
    "Mixture",
    "MixtureError",
    "OutputFeatureError",
    "ParquetSource",
    "Registry",
    "SentencePieceVocabulary",
    "Source",
    "SourceError",
    "TFExampleSource",
    "Task",
    "TextLineSource",
    "UnknownNameError",
    "Vocabulary",
    "__version__",
    "add_mixture",
    "add_task",
    "default_registry",
    "validate_name",
]
