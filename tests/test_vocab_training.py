"""Deterministic SentencePiece training with T5's special ids."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import sentencepiece as spm

from taskdata.define.features import Feature
from taskdata.define.task import Task
from taskdata.define.vocab_training import SentencePieceOptions, train_from_task, train_sentencepiece
from taskdata.define.vocabularies import ByteVocabulary, SentencePieceVocabulary
from taskdata.sources import FunctionSource, SourceError
from tests.pydoc_corpus import python_docs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))




@pytest.mark.slow
def test_same_text_and_options_give_byte_identical_models_in_any_process(tmp_path):
    first = train_sentencepiece(python_docs(0), 300, str(tmp_path / "a.model"))
    second = train_sentencepiece(python_docs(0), 300, str(tmp_path / "b.model"))
    script = textwrap.dedent(
        f"""
        from tests.pydoc_corpus import python_docs
        from taskdata.define.vocab_training import train_sentencepiece
        train_sentencepiece(python_docs(0), 300, {str(tmp_path / "c.model")!r})
        """
    )
    env = {**os.environ, "PYTHONPATH": REPO, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=REPO, timeout=120)
    models = [pathlib.Path(p).read_bytes() for p in (first, second, tmp_path / "c.model")]
    assert models[0] == models[1] == models[2]

    other = train_sentencepiece(python_docs(20), 300, str(tmp_path / "other.model"))
    assert pathlib.Path(other).read_bytes() != models[0], "a different corpus must give a different model"
    assert sorted(os.listdir(tmp_path)) == ["a.model", "b.model", "c.model", "other.model"]


def test_model_has_t5_special_ids_and_loads_as_a_vocabulary(tmp_path):
    path = train_sentencepiece(python_docs(0), 300, str(tmp_path / "t5.model"))
    processor = spm.SentencePieceProcessor(model_file=path)
    assert (processor.pad_id(), processor.eos_id(), processor.unk_id(), processor.bos_id()) == (0, 1, 2, -1)
    assert [processor.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
    assert processor.get_piece_size() == 300
    vocabulary = SentencePieceVocabulary(path, extra_ids=100)
    assert vocabulary.vocab_size == 400
    ids = vocabulary.encode("The assert statement is a convenient way.")
    assert ids.min() > 2 and vocabulary.decode(ids) == "The assert statement is a convenient way."


@pytest.mark.slow  # seconds
def test_texts_are_split_into_lines_so_one_multiline_text_equals_its_lines(tmp_path):
    lines = python_docs(0)
    joined = train_sentencepiece(
        ["\n".join(lines[:300]), "\n".join(lines[300:])], 300, str(tmp_path / "j.model")
    )
    separate = train_sentencepiece(lines, 300, str(tmp_path / "s.model"))
    assert pathlib.Path(joined).read_bytes() == pathlib.Path(separate).read_bytes()


def test_file_tag_names_size_and_changes_with_every_option():
    base = SentencePieceOptions(8000)
    assert base.file_tag.startswith("unigram8000-")
    assert SentencePieceOptions(8000).file_tag == base.file_tag
    others = [
        SentencePieceOptions(8000, num_threads=2),
        SentencePieceOptions(8000, byte_fallback=True),
        SentencePieceOptions(8000, character_coverage=1.0),
        SentencePieceOptions(8001),
    ]
    assert len({o.file_tag for o in others} | {base.file_tag}) == 5


def test_t5_conventions_are_in_the_trainer_arguments():
    arguments = SentencePieceOptions(32000).trainer_arguments()
    assert {k: arguments[k] for k in ("pad_id", "eos_id", "unk_id", "bos_id")} == {
        "pad_id": 0,
        "eos_id": 1,
        "unk_id": 2,
        "bos_id": -1,
    }
    assert arguments["input_sentence_size"] == 0 and arguments["shuffle_input_sentence"] is False
    assert arguments["num_threads"] == 1 and arguments["model_type"] == "unigram"


def test_options_are_checked_with_messages_naming_the_value():
    with pytest.raises(ValueError, match=r"vocab_size must be a positive integer but got 0"):
        SentencePieceOptions(0)
    with pytest.raises(ValueError, match=r"model_type must be one of \['unigram', 'bpe'\] but got 'word'"):
        SentencePieceOptions(8000, model_type="word")
    with pytest.raises(ValueError, match=r"character_coverage must be in \[0.9, 1.0\] but got 2"):
        SentencePieceOptions(8000, character_coverage=2)
    with pytest.raises(ValueError, match=r"num_threads must be a positive integer but got True"):
        SentencePieceOptions(8000, num_threads=True)


def test_a_vocabulary_too_large_for_the_text_names_the_largest_possible(tmp_path):
    with pytest.raises(
        ValueError, match=r"cannot make 5000 pieces from this text \(40 lines\): it supports at most \d+"
    ):
        train_sentencepiece(python_docs(0)[:40], 5000, str(tmp_path / "x.model"))
    assert not os.listdir(tmp_path)


def test_no_text_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="got no text"):
        train_sentencepiece(["", "\n\n"], 300, str(tmp_path / "x.model"))


def docs_then_a_record_without_text(split: str, shard: str) -> Iterator[dict]:
    yield from ({"text": text} for text in python_docs(0))
    yield {"body": "no text field"}


def _task() -> Task:
    return Task(
        name="vocab_source",
        source=FunctionSource(docs_then_a_record_without_text, {"train": ["only"]}),
        preprocessors=[],
        output_features={"targets": Feature(ByteVocabulary())},
    )


@pytest.mark.slow  # seconds
def test_train_from_task_reads_the_task_source_in_order_up_to_max_docs(tmp_path):
    count = len(python_docs(0))
    from_task = train_from_task(_task(), "train", 300, str(tmp_path / "task.model"), max_docs=count)
    direct = train_sentencepiece(python_docs(0), 300, str(tmp_path / "direct.model"))
    assert pathlib.Path(from_task).read_bytes() == pathlib.Path(direct).read_bytes()
    fewer = train_from_task(_task(), "train", 300, str(tmp_path / "fewer.model"), max_docs=count // 2)
    assert pathlib.Path(fewer).read_bytes() != pathlib.Path(direct).read_bytes()


def test_a_record_without_text_is_reported_with_its_position(tmp_path):
    count = len(python_docs(0))
    with pytest.raises(
        SourceError, match=rf"only, record {count}: has no string field 'text'.*fields: \['body'\]"
    ):
        train_from_task(_task(), "train", 300, str(tmp_path / "x.model"))


def test_train_from_task_checks_split_and_max_docs(tmp_path):
    with pytest.raises(ValueError, match=r"Unknown split 'test'"):
        train_from_task(_task(), "test", 300, str(tmp_path / "x.model"))
    with pytest.raises(ValueError, match=r"max_docs must be a positive integer or None but got 0"):
        train_from_task(_task(), "train", 300, str(tmp_path / "x.model"), max_docs=0)
