"""Shared fixtures: a fresh registry per test and a tiny SentencePiece model trained once per session."""

from __future__ import annotations

import os

import pytest

from taskdata.define.registry import Registry

# Tests must never reach for the network or the user's real cache folder.
os.environ.setdefault("TASKDATA_HOME", os.path.join(os.environ.get("TMPDIR", "/tmp"), "taskdata-test-home"))


@pytest.fixture
def registry() -> Registry:
    return Registry()


def _pydoc_text(limit_chars: int) -> list[str]:
    import pydoc_data.topics

    lines: list[str] = []
    total = 0
    for key in sorted(pydoc_data.topics.topics):
        for line in pydoc_data.topics.topics[key].splitlines():
            line = line.strip()
            if len(line) > 20:
                lines.append(line)
                total += len(line)
        if total > limit_chars:
            break
    return lines


@pytest.fixture(scope="session")
def tiny_sp_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 300-piece SentencePiece model with T5's special ids, trained on Python's bundled docs."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_pydoc_text(200_000)), model_writer=model, vocab_size=300,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, model_type="unigram", num_threads=1,
        minloglevel=2,
    )
    path = tmp_path_factory.mktemp("vocab") / "tiny.model"
    path.write_bytes(model.getvalue())
    return str(path)
