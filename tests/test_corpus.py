"""The built-in C4-format corpus: determinism, C4's exact format, C4-like lengths, safe reuse."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from taskdata.define.vocabularies import SentencePieceVocabulary
from taskdata.sources import C4Source
from taskdata.tasks import corpus

pytestmark = pytest.mark.slow  # subprocesses

SMALL = dict(num_train_docs=240, num_validation_docs=40, train_files=3, validation_files=2)
SMALL_PARAMS = corpus.CorpusParameters(**SMALL)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _c4_files(folder: str) -> dict[str, bytes]:
    return {
        name: pathlib.Path(folder, name).read_bytes()
        for name in sorted(os.listdir(folder))
        if name.startswith("c4-")
    }


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("corpus") / "c4")
    corpus.build_corpus(out, **SMALL)
    return out


def test_same_recipe_gives_byte_identical_files_and_another_seed_differs(small_corpus, tmp_path):
    again = str(tmp_path / "again")
    corpus.build_corpus(again, **SMALL)
    assert _c4_files(again) == _c4_files(small_corpus)

    other_seed = str(tmp_path / "seed1")
    corpus.build_corpus(other_seed, **{**SMALL, "seed": 1})
    first, second = _c4_files(small_corpus), _c4_files(other_seed)
    assert first.keys() == second.keys()
    assert all(first[name] != second[name] for name in first)


def test_files_are_named_like_allenai_c4_and_gzip_headers_carry_no_time_or_name(small_corpus):
    names = sorted(_c4_files(small_corpus))
    assert names == [
        "c4-train.00000-of-00003.json.gz",
        "c4-train.00001-of-00003.json.gz",
        "c4-train.00002-of-00003.json.gz",
        "c4-validation.00000-of-00002.json.gz",
        "c4-validation.00001-of-00002.json.gz",
    ]
    for data in _c4_files(small_corpus).values():
        assert data[:3] == b"\x1f\x8b\x08"
        assert data[3] & 0x08 == 0, "the FNAME flag must be off"
        assert data[4:8] == b"\x00\x00\x00\x00", "mtime must be 0"


def test_every_line_is_c4_json_and_reads_back_through_c4source(small_corpus):
    source = C4Source(small_corpus)
    manifest = corpus.read_manifest(small_corpus)
    for split, expected_docs in (("train", 240), ("validation", 40)):
        records = [r for shard in source.list_shards(split) for r in source.read_shard(split, shard)]
        assert len(records) == expected_docs == manifest["splits"][split]["documents"]
        assert len({r["text"] for r in records}) == expected_docs, "documents must be distinct"
        for shard in source.list_shards(split):
            with gzip.open(shard, "rt", encoding="utf-8") as f:
                for line in f:
                    assert line.startswith('{"text":"') and line.endswith('"}\n'), "compact, as allenai/c4"
                    record = json.loads(line)
                    assert list(record) == ["text", "timestamp", "url"]
                    assert re.fullmatch(r"2019-04-(1[89]|2[0-6])T\d\d:\d\d:\d\dZ", record["timestamp"])
                    assert re.fullmatch(r"https://[a-z.]+\.(org|com)/\S+", record["url"])
                    assert record["text"] == record["text"].strip() and "\n\n" not in record["text"]


def test_document_lengths_look_like_c4(tmp_path):
    out = str(tmp_path / "c4")
    corpus.build_corpus(out, num_train_docs=2000, num_validation_docs=20, train_files=1, validation_files=1)
    source = C4Source(out)
    lengths = np.array(
        [len(r["text"]) for s in source.list_shards("train") for r in source.read_shard("train", s)]
    )
    # C4 en: mean ~2,200 characters, long-tailed (median well below the mean, a few very long pages).
    assert 1_800 <= lengths.mean() <= 2_700
    assert np.median(lengths) < 0.8 * lengths.mean()
    assert lengths.max() > 4 * lengths.mean()
    assert lengths.min() >= 100


def test_validation_never_shares_a_paragraph_with_train():
    pools, _ = corpus._pools()
    train = {" ".join(p) for p in pools["train"].paragraphs}
    validation = {" ".join(p) for p in pools["validation"].paragraphs}
    assert validation and train and not train & validation


def test_python_texts_do_not_depend_on_what_the_caller_imported_or_patched(monkeypatch):
    import collections.abc
    import subprocess

    # What a fresh interpreter holds (this one may have imported TensorFlow already).
    original = subprocess.run(
        [sys.executable, "-I", "-c", "import collections.abc, sys; sys.stdout.write(collections.abc.Mapping.get.__doc__)"],
        capture_output=True, text=True, check=True,
    ).stdout
    # TensorFlow, once imported, rewrites this very docstring; a recipe must not see that.
    monkeypatch.setattr(collections.abc.Mapping.get, "__doc__", "Patched by a library in this process.")
    texts = corpus._python_texts()
    assert "Patched by a library" not in texts["modules"]["collections.abc"]
    assert original in texts["modules"]["collections.abc"]
    assert texts["python"] == sys.version.split()[0] and "assert" in texts["topics"]


def test_manifest_records_parameters_sources_and_file_hashes(small_corpus):
    manifest = corpus.read_manifest(small_corpus)
    assert manifest["recipe_version"] == corpus.RECIPE_VERSION
    assert manifest["parameters"] == {**SMALL, "seed": 0}
    sources = manifest["sources"]
    assert sources["python"] == sys.version.split()[0]
    assert sources["pydoc_topics"]["count"] > 50
    assert sources["stdlib_docstrings"]["modules"] + len(sources["stdlib_docstrings"]["missing"]) == len(
        corpus.STDLIB_MODULES
    )
    found_licenses = [p for p in sources["files"] if p.startswith(corpus.LICENSES_DIR)]
    missing_licenses = [p for p in sources["files_missing"] if p.startswith(corpus.LICENSES_DIR)]
    assert len(found_licenses) + len(missing_licenses) == len(corpus.COMMON_LICENSES)
    for split in ("train", "validation"):
        for entry in manifest["splits"][split]["files"]:
            data = pathlib.Path(small_corpus, entry["name"]).read_bytes()
            assert entry["sha256"] == hashlib.sha256(data).hexdigest()
            assert entry["bytes"] == len(data)


def test_parameters_are_checked_with_a_message_naming_the_value():
    with pytest.raises(ValueError, match=r"train_files must be a positive integer but got 0"):
        corpus.CorpusParameters(train_files=0)
    with pytest.raises(ValueError, match=r"validation_files=5 must be at most num_validation_docs=3"):
        corpus.CorpusParameters(num_validation_docs=3, validation_files=5)
    with pytest.raises(ValueError, match=r"seed must be an integer"):
        corpus.CorpusParameters(seed=-1)


def test_build_refuses_an_existing_folder_and_remote_paths(small_corpus):
    with pytest.raises(FileExistsError, match="already exists"):
        corpus.build_corpus(small_corpus, **SMALL)
    with pytest.raises(ValueError, match="local folders only"):
        corpus.build_corpus("gs://bucket/c4", **SMALL)


def _counting_builds(monkeypatch) -> list[str]:
    calls: list[str] = []
    original = corpus._build_into

    def counted(folder, params):
        calls.append(folder)
        return original(folder, params)

    monkeypatch.setattr(corpus, "_build_into", counted)
    return calls


def test_ensure_builds_once_then_reuses(tmp_path, monkeypatch):
    calls = _counting_builds(monkeypatch)
    first = corpus.ensure_builtin_corpus(SMALL_PARAMS, home=str(tmp_path))
    marker = os.path.join(first, corpus.CORPUS_MANIFEST)
    mtime = os.stat(marker).st_mtime_ns
    second = corpus.ensure_builtin_corpus(SMALL_PARAMS, home=str(tmp_path))
    assert first == second == corpus.builtin_corpus_dir(SMALL_PARAMS, home=str(tmp_path))
    assert len(calls) == 1 and os.stat(marker).st_mtime_ns == mtime
    assert os.path.basename(first) == "c4-builtin-v1-train240x3-validation40x2-seed0"
    assert C4Source(first).list_shards("train")


def test_ensure_never_uses_a_folder_without_its_manifest(tmp_path):
    partial = corpus.builtin_corpus_dir(SMALL_PARAMS, home=str(tmp_path))
    os.makedirs(partial)
    pathlib.Path(partial, "c4-train.00000-of-00003.json.gz").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"not a complete built-in corpus: it has no CORPUS.json"):
        corpus.ensure_builtin_corpus(SMALL_PARAMS, home=str(tmp_path))


def test_a_losing_publisher_leaves_the_winners_folder_alone(tmp_path):
    out = str(tmp_path / "c4")
    assert corpus._publish_folder(out, SMALL_PARAMS) is True
    before = {name: os.stat(os.path.join(out, name)).st_mtime_ns for name in os.listdir(out)}
    assert corpus._publish_folder(out, SMALL_PARAMS) is False
    assert {name: os.stat(os.path.join(out, name)).st_mtime_ns for name in os.listdir(out)} == before
    assert os.listdir(tmp_path) == ["c4"], "the loser's temporary folder is removed"


_RACER = textwrap.dedent(
    """
    import json, sys
    from taskdata.tasks import corpus
    from taskdata.define import vocab_training

    builds, trainings = [], []
    build_into, train = corpus._build_into, vocab_training.train_from_source
    corpus._build_into = lambda *a: builds.append(1) or build_into(*a)
    vocab_training.train_from_source = lambda *a, **k: trainings.append(1) or train(*a, **k)
    params = corpus.CorpusParameters(**json.loads(sys.argv[2]))
    path = corpus.ensure_builtin_vocabulary(300, params, home=sys.argv[1])
    print(json.dumps({"path": path, "builds": len(builds), "trainings": len(trainings)}))
    """
)


def test_racing_processes_build_once_and_agree(tmp_path):
    env = {**os.environ, "PYTHONPATH": REPO}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(tmp_path), json.dumps(SMALL)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(2)
    ]
    results = []
    for racer in racers:
        out, err = racer.communicate(timeout=180)
        assert racer.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[0]["path"] == results[1]["path"]
    assert sum(r["builds"] for r in results) == 1
    assert sum(r["trainings"] for r in results) == 1
    corpus_dir = os.path.dirname(results[0]["path"])
    assert not [n for n in os.listdir(os.path.dirname(corpus_dir)) if ".tmp-" in n]
    assert not [n for n in os.listdir(corpus_dir) if ".tmp-" in n]
    vocabulary = SentencePieceVocabulary(results[0]["path"], extra_ids=100)
    assert vocabulary.base_vocab_size == 300
    assert vocabulary.decode(vocabulary.encode("Return the value.")) == "Return the value."


def test_builtin_vocabulary_is_trained_once_and_fits_t5_conventions(tmp_path, monkeypatch):
    from taskdata.define import vocab_training

    trainings: list[str] = []
    original = vocab_training.train_from_source

    def counted(*args, **kwargs):
        trainings.append(args[3])
        return original(*args, **kwargs)

    monkeypatch.setattr(vocab_training, "train_from_source", counted)
    path = corpus.ensure_builtin_vocabulary(300, SMALL_PARAMS, home=str(tmp_path))
    mtime = os.stat(path).st_mtime_ns
    assert corpus.ensure_builtin_vocabulary(300, SMALL_PARAMS, home=str(tmp_path)) == path
    assert trainings == [path] and os.stat(path).st_mtime_ns == mtime
    assert os.path.dirname(path) == corpus.builtin_corpus_dir(SMALL_PARAMS, home=str(tmp_path))
    vocabulary = SentencePieceVocabulary(path, extra_ids=100)
    assert (vocabulary.pad_id, vocabulary.eos_id, vocabulary.unk_id) == (0, 1, 2)
    assert vocabulary.vocab_size == 400


def test_building_the_corpus_reports_each_file_and_a_summary(tmp_path, capsys):
    corpus.ensure_builtin_corpus(SMALL_PARAMS, home=str(tmp_path))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        f"[corpus] building the built-in C4-format corpus into {corpus.builtin_corpus_dir(SMALL_PARAMS, str(tmp_path))} "
        "(once per home folder)"
    )
    files = [line for line in lines if line.startswith("[corpus] train: file ") or "validation: file" in line]
    assert [line.split(",")[0] for line in files] == [
        "[corpus] train: file 1/3", "[corpus] train: file 2/3", "[corpus] train: file 3/3",
        "[corpus] validation: file 1/2", "[corpus] validation: file 2/2",
    ]
    assert files[-1].startswith("[corpus] validation: file 2/2, 40/40 documents (") and "ETA 0 s" in files[-1]
    assert lines[-1].startswith("[corpus] built 280 documents in ")
    corpus.ensure_builtin_corpus(SMALL_PARAMS, home=str(tmp_path))
    assert capsys.readouterr().err == ""  # reused silently
