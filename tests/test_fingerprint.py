import subprocess
import sys
from pathlib import Path

import pytest

from taskdata.define.vocabularies import SentencePieceVocabulary
from taskdata.fingerprint import fingerprint
from tests.helpers import make_task


def test_fingerprint_is_stable_for_the_same_definition():
    assert make_task().fingerprint() == make_task().fingerprint()


@pytest.mark.slow
def test_fingerprint_is_the_same_in_another_process():
    code = "from tests.helpers import make_task; print(make_task().fingerprint())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == make_task().fingerprint()


@pytest.mark.parametrize(
    "change",
    [
        {"prompt": "other:"},  # a preprocessor parameter
        {"shards": ("a", "b", "c")},  # the source's shards
        {"add_eos": False},  # an output feature
        {"name": "toy2"},
    ],
)
def test_fingerprint_changes_with_the_definition(change):
    assert make_task(**change).fingerprint() != make_task().fingerprint()


def test_fingerprint_changes_with_source_file_sizes(tmp_path):
    from taskdata.define.features import Feature
    from taskdata.define.task import Task
    from taskdata.sources import TextLineSource
    from tests.helpers import VOCAB, BytesToTargets

    path = tmp_path / "a.txt"
    path.write_text("one\n")

    def task():
        return Task("t", TextLineSource({"train": str(tmp_path / "*.txt")}), [BytesToTargets()],
                    {"targets": Feature(VOCAB)})

    before = task().fingerprint()
    path.write_text("one\ntwo\n")
    assert task().fingerprint() != before


def test_fingerprint_changes_with_vocabulary_file(tiny_sp_model, tmp_path):
    data = Path(tiny_sp_model).read_bytes()
    copy = tmp_path / "copy.model"
    copy.write_bytes(data)
    same = SentencePieceVocabulary(str(copy))
    assert fingerprint(same) == fingerprint(SentencePieceVocabulary(tiny_sp_model))
    assert fingerprint(SentencePieceVocabulary(tiny_sp_model, extra_ids=5)) != fingerprint(same)


def test_lambda_preprocessors_cannot_be_fingerprinted():
    with pytest.raises(TypeError, match="lambdas and local functions have no stable name"):
        fingerprint(lambda x: x)
