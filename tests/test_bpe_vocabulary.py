"""HuggingFaceVocabulary and deterministic BPE training: ids are tokenizers' own, files are reproducible."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from tokenizers import Tokenizer

from taskdata.cli import main
from taskdata.define.bpe_training import SPECIAL_TOKENS, BpeOptions, train_bpe, train_bpe_from_source
from taskdata.define.hf_vocabulary import HuggingFaceVocabulary
from taskdata.define.vocabularies import EOS_ID, PAD_ID, UNK_ID
from tests.pydoc_corpus import pydoc_topics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    return train_bpe(pydoc_topics(0), 600, str(tmp_path_factory.mktemp("bpe") / "tokenizer.json"))


def test_special_ids_follow_t5_and_the_byte_symbols_come_next(small_tokenizer):
    tokenizer = Tokenizer.from_file(small_tokenizer)
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD_ID, EOS_ID, UNK_ID]
    assert tokenizer.get_vocab_size() == 600
    vocab = HuggingFaceVocabulary(small_tokenizer)
    assert (vocab.eos_id, vocab.vocab_size) == (EOS_ID, 600)


def test_ids_are_tokenizers_own_and_decode_gives_the_text_back(small_tokenizer):
    texts = [*pydoc_topics(200, 5), "", "ünïcödé — ∑ 😀 text\twith\ttabs\n\nand blank lines", "  leading spaces"]
    tokenizer = Tokenizer.from_file(small_tokenizer)
    vocab = HuggingFaceVocabulary(small_tokenizer)
    encoded = vocab.encode_batch(texts)
    assert [ids.tolist() for ids in encoded] == [tokenizer.encode(text).ids for text in texts]
    assert all(ids.dtype == np.int32 for ids in encoded)
    assert [vocab.decode(ids) for ids in encoded] == texts
    assert vocab.decode([*encoded[0][:5], EOS_ID, *encoded[1]]) == vocab.decode(encoded[0][:5])  # stops at EOS
    assert vocab.decode([PAD_ID, *encoded[0][:5], PAD_ID]) == vocab.decode(encoded[0][:5])  # drops its padding


def test_a_tokenizer_without_padding_keeps_id_zero(small_tokenizer):
    vocab = HuggingFaceVocabulary(small_tokenizer, pad_token=None)
    assert vocab.decode([PAD_ID, 300]) == Tokenizer.from_file(small_tokenizer).decode([PAD_ID, 300], skip_special_tokens=False)


def test_errors_name_the_file_and_the_fix(small_tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"has no token '<\|endoftext\|>' to end documents with \(its added tokens: "
                                         r"\['</s>', '<pad>', '<unk>'\]\)\. Pass eos_token="):
        HuggingFaceVocabulary(small_tokenizer, eos_token="<|endoftext|>").encode("x")
    with pytest.raises(FileNotFoundError, match=r"Train one with 'taskdata vocab train --kind bpe"):
        HuggingFaceVocabulary(str(tmp_path / "missing.json")).encode("x")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"is not a Hugging Face tokenizer.json"):
        HuggingFaceVocabulary(str(tmp_path / "bad.json")).encode("x")
    with pytest.raises(ValueError, match=r"Cannot decode id 600 at position 1: it is outside this tokenizer's 600 ids"):
        HuggingFaceVocabulary(small_tokenizer).decode([5, 600])
    with pytest.raises(ValueError, match=r"eos_token must name"):
        HuggingFaceVocabulary(small_tokenizer, eos_token="")
    with pytest.raises(ValueError, match=r"BPE vocab_size must be more than 259"):
        BpeOptions(259)
    with pytest.raises(ValueError, match=r"made \d+ tokens from 1 texts, fewer than the 5000 asked for"):
        train_bpe(["tiny text"], 5000, str(tmp_path / "t.json"))


def test_the_fingerprint_is_the_content(small_tokenizer, tmp_path):
    copy = tmp_path / "copy.json"
    copy.write_bytes(pathlib.Path(small_tokenizer).read_bytes())
    same = HuggingFaceVocabulary(str(copy)).fingerprint_description()
    assert same == HuggingFaceVocabulary(small_tokenizer).fingerprint_description()
    other = train_bpe(pydoc_topics(0), 601, str(tmp_path / "other.json"))
    assert HuggingFaceVocabulary(other).fingerprint_description() != same
    assert HuggingFaceVocabulary(str(copy), add_special_tokens=True).fingerprint_description() != same


@pytest.mark.slow
def test_same_text_and_options_give_byte_identical_tokenizers_in_any_process_and_thread_count(tmp_path):
    first = train_bpe(pydoc_topics(0), 800, str(tmp_path / "a.json"))
    script = textwrap.dedent(
        f"""
        from tests.pydoc_corpus import pydoc_topics
        from taskdata.define.bpe_training import train_bpe
        train_bpe(pydoc_topics(0), 800, {str(tmp_path / "b.json")!r})
        """
    )
    for threads in ("1", "3"):
        env = {**os.environ, "PYTHONPATH": REPO, "PYTHONHASHSEED": threads, "RAYON_NUM_THREADS": threads}
        subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=REPO, timeout=120)
        assert (tmp_path / "b.json").read_bytes() == pathlib.Path(first).read_bytes()
    other = train_bpe(pydoc_topics(60), 800, str(tmp_path / "other.json"))
    assert pathlib.Path(other).read_bytes() != pathlib.Path(first).read_bytes(), "other text must give another tokenizer"


@pytest.mark.slow
def test_vocab_train_kind_bpe_trains_on_the_tasks_text(tmp_path, capsys):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("\n".join(f"line {i} of some text about alpha beta gamma {i % 7}" for i in range(400)))
    os.environ["TASKDATA_TEST_TEXT_DIR"] = str(texts)
    try:
        for out in ("one.json", "two.json"):
            assert main(["vocab", "train", "--kind", "bpe", "--task", "toy_text", "--module", "tests.cache_tasks",
                         "--size", "300", "--out", str(tmp_path / out)]) == 0
    finally:
        del os.environ["TASKDATA_TEST_TEXT_DIR"]
    assert (tmp_path / "one.json").read_bytes() == (tmp_path / "two.json").read_bytes()
    assert HuggingFaceVocabulary(str(tmp_path / "one.json")).decode(
        HuggingFaceVocabulary(str(tmp_path / "one.json")).encode("line 3 of alpha")) == "line 3 of alpha"
    assert capsys.readouterr().out.startswith("wrote ")


@pytest.mark.slow
def test_on_the_c4_corpus_ids_equal_tokenizers_and_decode_round_trips(tmp_path):
    """The built-in C4-format corpus: a tokenizer trained on train documents, checked on the validation split's
    first file, through the vocabulary, its TensorFlow path and the task's Tokenize step."""
    import tensorflow as tf

    from taskdata.define.features import Feature
    from taskdata.define.task import Task
    from taskdata.preprocessors import Rekey, Tokenize
    from taskdata.sources import C4Source
    from taskdata.tasks.corpus import ensure_builtin_corpus

    source = C4Source(ensure_builtin_corpus())
    path = train_bpe_from_source(source, "train", 2000, str(tmp_path / "tokenizer.json"), max_docs=2000)
    tokenizer = Tokenizer.from_file(path)
    vocab = HuggingFaceVocabulary(path)
    first_file = source.list_shards("validation")[0]
    texts = [record["text"] for record in source.read_shard("validation", first_file)]
    assert len(texts) == 600
    encoded = [ids.tolist() for ids in vocab.encode_batch(texts)]
    assert encoded == [encoding.ids for encoding in tokenizer.encode_batch(texts)]
    assert [vocab.decode(ids) for ids in encoded] == texts
    assert vocab.tf_encode(tf.constant(texts[:50])).to_list() == encoded[:50]
    task = Task("lm_ids", source, [Rekey({"targets": "text"}), Tokenize()], {"targets": Feature(vocab)})
    examples = task.process_shard(task.shard_context("validation", 0, seed=0), first_file)
    assert [example["targets"].tolist() for example in examples] == encoded
