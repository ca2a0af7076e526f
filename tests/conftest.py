"""Shared fixtures: a fresh registry per test and a tiny SentencePiece model trained once per session."""

from __future__ import annotations

import os

import pytest

from taskdata.define.registry import Registry
from tests.pydoc_corpus import pydoc_lines

# Tests must never reach for the network or the user's real cache folder.
os.environ.setdefault("TASKDATA_HOME", os.path.join(os.environ.get("TMPDIR", "/tmp"), "taskdata-test-home"))


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture(scope="session")
def tiny_sp_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 300-piece SentencePiece model with T5's special ids, trained on Python's bundled docs."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(pydoc_lines(200_000)), model_writer=model, vocab_size=300,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, model_type="unigram", num_threads=1,
        minloglevel=2,
    )
    path = tmp_path_factory.mktemp("vocab") / "tiny.model"
    path.write_bytes(model.getvalue())
    return str(path)


@pytest.fixture(scope="module")
def c4_folder(tmp_path_factory):
    """A small C4 folder (60 train and 4 validation documents of Python's docs), gzipped JSON lines."""
    import gzip
    import json

    folder = tmp_path_factory.mktemp("c4_sentences")
    lines = pydoc_lines(40_000)
    docs = [" ".join(lines[i : i + 12]) for i in range(0, len(lines), 12)]
    for split, chosen in (("train", docs[:60]), ("validation", docs[60:64])):
        with gzip.open(folder / f"c4-{split}.00000-of-00001.json.gz", "wt") as out:
            for doc in chosen:
                out.write(json.dumps({"text": doc, "timestamp": "2019-04-25T00:00:00Z", "url": "https://x.org"}) + "\n")
    return folder
