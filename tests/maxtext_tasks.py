"""A small decoder-only task for the MaxText tests (``--module tests.maxtext_tasks``): a C4-format corpus and a
BPE tokenizer.json named by the environment (the test that builds them sets both), rows of 128 tokens."""

from __future__ import annotations

import os

from taskdata.define.features import Feature
from taskdata.define.hf_vocabulary import HuggingFaceVocabulary
from taskdata.define.task import Task
from taskdata.preprocessors import ConcatenateAndChunk, Rekey, Tokenize
from taskdata.sources import C4Source

ROW_LENGTH = 128


def register_tasks(registry) -> None:
    vocabulary = HuggingFaceVocabulary(lambda: os.environ["TASKDATA_TEST_TOKENIZER"])
    registry.add(Task("maxtext_lm", C4Source(lambda: os.environ["TASKDATA_TEST_C4_DIR"]),
                      [Rekey({"targets": "text"}), Tokenize(), ConcatenateAndChunk()],
                      {"targets": Feature(vocabulary)}, sequence_length={"targets": ROW_LENGTH}))
