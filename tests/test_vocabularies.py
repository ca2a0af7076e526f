import numpy as np
import pytest

from taskdata.define.vocabularies import ByteVocabulary, SentencePieceVocabulary

TEXTS = ["Hello world.", "The quick brown fox jumps over the lazy dog!", "", "ünïcödé text — and 123 numbers"]


def test_sentencepiece_t5_conventions(tiny_sp_model):
    vocab = SentencePieceVocabulary(tiny_sp_model, extra_ids=100)
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
    assert vocab.vocab_size == 300 + 100
    assert vocab.sentinel_id(0) == 399
    assert vocab.sentinel_id(99) == 300
    with pytest.raises(ValueError, match=r"Sentinel index must be in \[0, 100\) but got 100"):
        vocab.sentinel_id(100)


def test_decode_renders_sentinels_and_stops_at_eos(tiny_sp_model):
    vocab = SentencePieceVocabulary(tiny_sp_model, extra_ids=100)
    ids = [*vocab.encode("hello"), vocab.sentinel_id(0), *vocab.encode("world"), 1, *vocab.encode("ignored")]
    assert vocab.decode(ids) == "hello<extra_id_0>world"


@pytest.mark.parametrize("bad", [400, 32127, -1])
def test_decode_of_an_id_outside_the_vocabulary_is_an_error(tiny_sp_model, bad):
    vocab = SentencePieceVocabulary(tiny_sp_model, extra_ids=100)
    with pytest.raises(ValueError) as raised:
        vocab.decode([5, 6, bad, 1])
    assert str(raised.value).splitlines()[0] == (
        f"Cannot decode id {bad} at position 2: it is outside this vocabulary of 400 ids (300 pieces + 100 extra "
        "ids). Ids must come from a model whose vocabulary size equals the task's."
    )
    assert vocab.decode([5, 6, 399, 1]).endswith("<extra_id_0>")  # the top id is still the first sentinel


def test_numpy_and_tensorflow_paths_agree_sentencepiece(tiny_sp_model):
    import tensorflow as tf

    vocab = SentencePieceVocabulary(tiny_sp_model)
    tf_ids = vocab.tf_encode(tf.constant(TEXTS)).to_list()
    np_ids = [ids.tolist() for ids in vocab.encode_batch(TEXTS)]
    assert np_ids == tf_ids
    flat, lengths = vocab.encode_flat(TEXTS)
    assert np.split(flat, np.cumsum(lengths)[:-1])[1].tolist() == np_ids[1]


def test_numpy_and_tensorflow_paths_agree_bytes():
    import tensorflow as tf

    vocab = ByteVocabulary()
    tf_ids = vocab.tf_encode(tf.constant(TEXTS)).to_list()
    assert [ids.tolist() for ids in vocab.encode_batch(TEXTS)] == tf_ids
    assert vocab.decode(vocab.encode(TEXTS[3])) == TEXTS[3]
    assert vocab.vocab_size == 259 + 125 and vocab.sentinel_id(0) == 383


def test_model_with_wrong_special_ids_is_rejected(tmp_path):
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["abc def ghi"] * 50 + ["xyz uvw"] * 50),
                                   model_writer=model, vocab_size=20, minloglevel=2)
    path = tmp_path / "default_ids.model"
    path.write_bytes(model.getvalue())
    with pytest.raises(ValueError, match=r"has \(pad, eos, unk\) ids \(-1, 2, 0\) but T5's conventions need \(0, 1, 2\)"):
        SentencePieceVocabulary(str(path)).encode("abc")


def test_missing_model_file_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="taskdata vocab train"):
        SentencePieceVocabulary(str(tmp_path / "nope.model")).encode("x")
