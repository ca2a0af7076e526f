"""The cache job: determinism across runs, runners and bundle splits; commit protocol; bad input."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from taskdata.beam.job import CacheJobError
from taskdata.cache.reader import CacheReader
from taskdata.define.registry import Registry
from taskdata.define.task import Task
from taskdata.example import decode_example
from tests.cache_helpers import MODULE, Killed, build, files_of, records_of
from tests.cache_tasks import FEATURES, EncodeText

pytestmark = pytest.mark.slow  # cache jobs (Beam)


@pytest.fixture(autouse=True)
def _worker_import_path(monkeypatch):
    # Beam's worker processes import the task module by name.
    root = str(Path(__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))


def content_hash(record: bytes) -> str:
    example = decode_example(record)
    return hashlib.sha256(bytes(example["inputs"].astype("<i8")) + b"|" + bytes(example["targets"].astype("<i8"))).hexdigest()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """toy_random built once in-process with seed 0: what every other build must equal byte for byte."""
    return build(tmp_path_factory.mktemp("ref"), task="toy_random", num_shards=3)


def test_cache_layout_is_seqio_compatible_and_complete(reference):
    files = files_of(reference.version_dir)
    assert set(files) == {
        *(f"train.tfrecord-{i:05d}-of-00003" for i in range(3)),
        *(f"validation.tfrecord-{i:05d}-of-00003" for i in range(3)),
        *(f"index/train.tfrecord-{i:05d}-of-00003.offsets" for i in range(3)),
        *(f"index/validation.tfrecord-{i:05d}-of-00003.offsets" for i in range(3)),
        *(f"index/{split}.tfrecord-{i:05d}-of-00003.origins" for split in ("train", "validation") for i in range(3)),
        "info.train.json", "info.validation.json", "stats.train.json", "stats.validation.json",
        "manifest.json", "COMPLETED",
    }
    manifest = reference.manifest
    assert manifest.split("train").num_records == sum(40 + 7 * s for s in range(6))
    assert manifest.split("validation").num_records == 40 + 47
    assert manifest.seed == 0 and manifest.task == "toy_random"
    current = Path(reference.version_dir).parent / "CURRENT"
    assert current.read_text().strip() == Path(reference.version_dir).name


def test_records_carry_provenance_back_to_the_source_document(reference):
    from tests.cache_tasks import synthetic_documents

    files = reference.manifest.split("train").source_files
    assert files == tuple(str(s) for s in range(6))  # FunctionSource's shard names, by source shard index
    for record in records_of(reference.version_dir)[:20]:
        example = decode_example(record)
        # Only the provenance/origin numbers: the task, seed and source file names are the manifest's.
        assert [k for k in example if k.startswith("provenance/")] == ["provenance/origin"]
        shard, index, first, more = example["provenance/origin"].tolist()
        document = list(synthetic_documents("train", files[shard]))[first]
        assert index == first and more == 0  # one example per document
        assert bytes((example["inputs"] - 3).astype("uint8")).decode() == document["text"][:8]


def test_same_seed_in_process_twice_is_byte_identical(reference, tmp_path):
    again = build(tmp_path, task="toy_random", num_shards=3)
    assert files_of(again.version_dir) == files_of(reference.version_dir)


def test_different_spill_sizes_and_bundles_are_byte_identical(reference, tmp_path):
    # A 2 KB spill buffer splits every source shard into many sorted runs (many segments per shard).
    again = build(tmp_path, task="toy_random", num_shards=3, spill_buffer_bytes=2048)
    assert files_of(again.version_dir) == files_of(reference.version_dir)


@pytest.mark.slow
def test_multi_process_runner_is_byte_identical(reference, tmp_path):
    again = build(tmp_path, task="toy_random", num_shards=3,
                  beam_args=["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    assert files_of(again.version_dir) == files_of(reference.version_dir)


@pytest.mark.slow
def test_multi_threaded_runner_with_other_worker_count_is_byte_identical(reference, tmp_path):
    again = build(tmp_path, task="toy_random", num_shards=3,
                  beam_args=["--direct_running_mode=multi_threading", "--direct_num_workers=3"])
    assert files_of(again.version_dir) == files_of(reference.version_dir)


def test_different_seed_gives_different_order_and_same_multiset(tmp_path):
    a = build(tmp_path / "a", task="toy_det", seed=1, num_shards=3)
    b = build(tmp_path / "b", task="toy_det", seed=2, num_shards=3)
    hashes_a = [content_hash(r) for r in records_of(a.version_dir)]
    hashes_b = [content_hash(r) for r in records_of(b.version_dir)]
    assert hashes_a != hashes_b
    assert sorted(hashes_a) == sorted(hashes_b)


def test_different_seed_changes_random_preprocessing(reference, tmp_path):
    other = build(tmp_path, task="toy_random", seed=7, num_shards=3)
    assert sorted(map(content_hash, records_of(other.version_dir))) != sorted(
        map(content_hash, records_of(reference.version_dir)))


def test_global_order_is_sorted_by_shuffle_key(reference):
    from taskdata.cache.shuffle import shuffle_key

    keys = []
    for record in records_of(reference.version_dir):
        example = decode_example(record)
        source_shard, ordinal = example["provenance/origin"][:2].tolist()
        keys.append(shuffle_key(0, "toy_random", "train", source_shard, ordinal))
    assert keys == sorted(keys)


def test_rerun_reuses_a_complete_cache_unless_forced(tmp_path):
    logs: list[str] = []
    first = build(tmp_path, logs=logs)
    second = build(tmp_path, logs=logs)
    assert second.reused and second.version_dir == first.version_dir
    assert any("reusing complete cache" in line for line in logs)
    before = files_of(first.version_dir)
    forced = build(tmp_path, force=True)
    assert not forced.reused and forced.version_dir != first.version_dir
    assert files_of(first.version_dir) == before  # a rebuild never touches a complete version
    assert files_of(forced.version_dir) == before


def test_changed_definition_reports_the_old_cache_as_stale(tmp_path, monkeypatch):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("one line\nanother line\n")
    monkeypatch.setenv("TASKDATA_TEST_TEXT_DIR", str(texts))
    old = build(tmp_path / "cache", task="toy_text", num_shards=2)
    (texts / "a.txt").write_text("one line\nanother line\na third line\n")
    logs: list[str] = []
    new = build(tmp_path / "cache", task="toy_text", num_shards=2, logs=logs)
    assert new.version_dir != old.version_dir and not new.reused
    assert any(line.startswith(f"[cache] stale: {old.version_dir}") for line in logs)
    assert new.manifest.split("train").num_records == 3


def test_unknown_task_lists_close_names(tmp_path):
    with pytest.raises(KeyError, match="Unknown task or mixture 'toy_dett'. Did you mean: toy_det"):
        build(tmp_path, task="toy_dett")


def test_missing_source_files_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKDATA_TEST_TEXT_DIR", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="No .txt files in"):
        build(tmp_path / "cache", task="toy_text")
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("COMPLETED"))


def test_unparseable_source_record_fails_naming_file_and_line(tmp_path, monkeypatch):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_bytes(b"fine\n\xff\xfe broken utf-8\n")
    monkeypatch.setenv("TASKDATA_TEST_TEXT_DIR", str(texts))
    with pytest.raises(CacheJobError) as info:
        build(tmp_path / "cache", task="toy_text")
    message = str(info.value)
    assert f"{texts / 'a.txt'}, line 2: not valid UTF-8" in message
    assert "is not marked complete" in message
    assert not list((tmp_path / "cache").rglob("COMPLETED"))


def test_unwritable_output_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises((CacheJobError, OSError)):
        build(blocker / "cache")


def test_duplicate_shuffle_keys_are_an_error(tmp_path):
    from taskdata.beam.pipeline import CacheJobSpec, encode_cache_record, write_output_shard
    from taskdata.beam.spill import SpillWriter

    spec = CacheJobSpec(task="toy_det", task_fingerprint="x", modules=(), config=("/tmp", None, None), seed=0,
                        version_dir=str(tmp_path / "v"), tmp_dir=str(tmp_path / "v" / "_tmp"),
                        num_shards=(("train", 1),))
    record = encode_cache_record({"inputs": [5], "targets": [6]}, 0, 0)
    spiller = SpillWriter(str(tmp_path / "spill"), 1)
    spiller.add(12345, record)
    spiller.add(12345, record)
    segments = [segment.to_tuple() for _, segment in spiller.close()]
    with pytest.raises(RuntimeError, match=r"same shuffle key: source shard 0, example 0 and source shard 0, example 0"):
        write_output_shard(spec, "train", 0, segments)


def _die_before_current_moves(monkeypatch):
    from taskdata import cas

    swap = cas.swap

    def dying(version, data):
        if version.path.endswith("/CURRENT"):
            raise Killed(version.path)
        return swap(version, data)

    monkeypatch.setattr(cas, "swap", dying)
    return lambda: monkeypatch.setattr(cas, "swap", swap)


def _two_text_dirs(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, text in ((a, "one line\nanother line\n"), (b, "other text\nand more of it\nthree\n")):
        folder.mkdir()
        (folder / "doc.txt").write_text(text)
    return a, b


def test_a_rerun_that_reuses_a_version_moves_current_to_it_after_a_crash_between_completed_and_current(
        tmp_path, monkeypatch):
    a, b = _two_text_dirs(tmp_path)
    monkeypatch.setenv("TASKDATA_TEST_TEXT_DIR", str(a))
    old = build(tmp_path / "cache", task="toy_text", num_shards=2)
    monkeypatch.setenv("TASKDATA_TEST_TEXT_DIR", str(b))
    revive = _die_before_current_moves(monkeypatch)
    with pytest.raises(Killed):
        build(tmp_path / "cache", task="toy_text", num_shards=2)
    revive()
    pointer = tmp_path / "cache" / "toy_text" / "CURRENT"
    assert pointer.read_text().strip() == Path(old.version_dir).name
    logs: list[str] = []
    again = build(tmp_path / "cache", task="toy_text", num_shards=2, logs=logs)
    assert again.reused and again.version_dir != old.version_dir
    assert pointer.read_text().strip() == Path(again.version_dir).name
    assert f"[cache] CURRENT pointed at {old.version_dir}; moved it to {Path(again.version_dir).name}" in logs


def test_plan_refuses_a_current_cache_built_from_another_definition_of_the_task(tmp_path, monkeypatch, capsys):
    from taskdata.cli import main
    from taskdata.index import BatchSchedule
    from taskdata.runs import CacheUnavailableError, build_run

    a, b = _two_text_dirs(tmp_path)
    root = tmp_path / "cache"
    monkeypatch.setenv("TASKDATA_TEST_TEXT_DIR", str(a))
    old = build(root, task="toy_text", num_shards=2)
    monkeypatch.setenv("TASKDATA_TEST_TEXT_DIR", str(b))
    registry = Registry()
    registry.load_module(MODULE)
    now = registry.get_task("toy_text").fingerprint()
    with pytest.raises(CacheUnavailableError) as info:
        build_run(registry, str(root), name="r", mixture="toy_text", seed=0, schedule=BatchSchedule(2, 2),
                  num_data_shards=1)
    message = str(info.value)
    assert old.manifest.task_fingerprint in message and now in message
    assert f"its CURRENT version {old.version_dir} was built from another definition" in message
    assert "differing: source)" in message
    assert f"'taskdata cache --task toy_text --output {root}'" in message
    argv = ["plan", "--module", MODULE, "--name", "r", "--mixture", "toy_text", "--cache-root", str(root),
            "--seed", "0", "--batch-size", "2", "--num-data-shards", "1"]
    assert main(argv) == 2
    assert "taskdata plan: error: Cache of task 'toy_text' is not available: its CURRENT version" in capsys.readouterr().err
    new = build(root, task="toy_text", num_shards=2)
    run = build_run(registry, str(root), name="r", mixture="toy_text", seed=0, schedule=BatchSchedule(2, 2),
                    num_data_shards=1)
    assert run.plan.caches["toy_text"].fingerprint == CacheReader(new.version_dir).manifest_sha256
    # Where the sources cannot be listed (a server that only reads caches), the check cannot be made: said.
    monkeypatch.delenv("TASKDATA_TEST_TEXT_DIR")
    warnings: list[str] = []
    build_run(registry, str(root), name="r", mixture="toy_text", seed=0, schedule=BatchSchedule(2, 2),
              num_data_shards=1, warn=warnings.append)
    assert warnings == [f"cannot check that the cache of task 'toy_text' ({new.version_dir}) was built from the task "
                        "as defined here: fingerprinting the definition failed (KeyError: 'TASKDATA_TEST_TEXT_DIR'); "
                        "it is pinned unchecked"]


GAP_ERROR = (
    "Cache build of task 'toy_gap' failed in the Beam pipeline: Task 'toy_gap', split 'train', source shard 2 "
    "('2'): preprocessor 1 of 1 (tests.cache_tasks.EncodeText(prefix_chars=8)) failed at its input example 5 "
    "(6 source records read): KeyError: 'text'\n"
)


def test_a_preprocessor_error_names_task_split_shard_example_preprocessor_and_exception(tmp_path):
    with pytest.raises(CacheJobError) as info:
        build(tmp_path, task="toy_gap", num_shards=2)
    assert str(info.value).startswith(GAP_ERROR), str(info.value)
    assert not list(tmp_path.rglob("COMPLETED"))


@pytest.mark.slow
def test_a_preprocessor_error_in_a_worker_process_names_the_same_place(tmp_path):
    with pytest.raises(CacheJobError) as info:
        build(tmp_path, task="toy_gap", num_shards=2,
              beam_args=["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    assert str(info.value).startswith(GAP_ERROR), str(info.value)


def test_the_same_error_reaches_inspect_without_beam(capsys):
    from taskdata.cli import main

    assert main(["inspect", "toy_gap", "--module", MODULE, "-n", "1000"]) == 2
    assert capsys.readouterr().err == "taskdata inspect: error: " + GAP_ERROR.split("failed in the Beam pipeline: ")[1]


def _c4_line(i: int) -> str:
    import json

    return json.dumps({"text": f"document {i} of the corpus", "timestamp": "2019-04-25T00:00:00Z", "url": f"u{i}"})


EMPTY_FILES = {
    "zero-byte .json.gz": ("c4-train.00001-of-00002.json.gz", b"", "the file is 0 bytes: not even a gzip header"),
    "empty gzip": ("c4-train.00001-of-00002.json.gz", None, "the file is a gzip stream of 20 bytes that holds no data"),
    "zero-byte .json": ("c4-train.00001-of-00002.json", b"", "the file is 0 bytes"),
}


@pytest.mark.parametrize("kind", sorted(EMPTY_FILES))
def test_an_empty_source_file_is_an_error_unless_empty_files_are_expected(tmp_path, monkeypatch, kind):
    import gzip

    name, data, description = EMPTY_FILES[kind]
    corpus = tmp_path / "c4"
    corpus.mkdir()
    (corpus / "c4-train.00000-of-00002.json").write_text("".join(_c4_line(i) + "\n" for i in range(5)))
    (corpus / name).write_bytes(gzip.compress(b"", mtime=0) if data is None else data)
    monkeypatch.setenv("TASKDATA_TEST_C4_DIR", str(corpus))
    with pytest.raises(CacheJobError) as info:
        build(tmp_path / "cache", task="toy_c4", num_shards=2)
    assert (f"Task 'toy_c4', split 'train', source shard 1 ('{corpus / name}'): the source shard holds no records "
            f"({description}). Remove it if it is a broken export; if empty source files are expected, build the "
            "source with allow_empty_files=True (allow_empty_shards=True for a FunctionSource) or pass 'taskdata "
            "cache --allow-empty-source-files'.") in str(info.value)
    assert not list((tmp_path / "cache").rglob("COMPLETED"))
    allowed = build(tmp_path / "cache", task="toy_c4", num_shards=2, allow_empty_source_files=True)
    assert allowed.manifest.split("train").num_records == 5
    assert allowed.manifest.split("train").counters == {"empty_source_shards": 1}


def test_the_cli_flag_and_the_source_option_allow_empty_files(tmp_path, monkeypatch):
    from taskdata.cli import main
    from taskdata.sources import C4Source

    corpus = tmp_path / "c4"
    corpus.mkdir()
    (corpus / "c4-train.00000-of-00002.json").write_text(_c4_line(0) + "\n")
    (corpus / "c4-train.00001-of-00002.json").write_bytes(b"")
    monkeypatch.setenv("TASKDATA_TEST_C4_DIR", str(corpus))
    argv = ["cache", "--task", "toy_c4", "--module", MODULE, "--output", str(tmp_path / "cache"), "--quiet"]
    assert main(argv) == 3  # taskdata.exits.EXIT_DATA: the job failed on its data
    assert main([*argv, "--allow-empty-source-files"]) == 0
    records = [example for _, example in Task(
        "c4_allowing", C4Source(str(corpus), splits=("train",), allow_empty_files=True), [EncodeText()], FEATURES,
    ).iter_examples("train", seed=0)]
    assert len(records) == 1


def test_a_same_size_edit_of_a_source_file_makes_the_cache_stale_not_reused(tmp_path, monkeypatch):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("the word found\nanother line\n")
    monkeypatch.setenv("TASKDATA_TEST_TEXT_DIR", str(texts))
    old = build(tmp_path / "cache", task="toy_text", num_shards=2)
    (texts / "a.txt").write_text("the word FOUND\nanother line\n")
    logs: list[str] = []
    new = build(tmp_path / "cache", task="toy_text", num_shards=2, logs=logs)
    assert not new.reused and new.version_dir != old.version_dir
    assert any(line.startswith(f"[cache] stale: {old.version_dir}") for line in logs)
    from tests.cache_tasks import VOCAB

    texts_in_cache = {VOCAB.decode(decode_example(r)["targets"]) for r in records_of(new.version_dir)}
    assert texts_in_cache == {"the word FOUND", "another line"}
