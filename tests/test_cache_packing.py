"""Packed caches from the Beam job: rows hold exactly the task's examples, deterministically, with provenance."""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import numpy as np
import pytest

from taskdata.beam.job import CacheJobError
from taskdata.cache.format import (
    FORMAT,
    FORMAT_PACKED,
    FORMAT_SEQIO_PROVENANCE,
    CacheFormatError,
    Manifest,
    load_manifest,
)
from taskdata.evaluation import CacheTargets
from taskdata.example import decode_example
from taskdata.example.packing import trim_to_length, unpack_row
from tests.cache_helpers import build, examples_by_id, files_of, origins, records_of
from tests.cache_tasks import PACKED_LENGTHS, SEQUENCE_LENGTHS

pytestmark = pytest.mark.slow  # cache jobs (Beam)


@pytest.fixture(autouse=True)
def _worker_import_path(monkeypatch):
    root = str(Path(__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """toy_det's examples (seed 0) and the same examples packed (toy_packed, seed 0), 3 shards each."""
    root = tmp_path_factory.mktemp("packing")
    return build(root / "plain", task="toy_det", num_shards=3), build(root / "packed", task="toy_packed", num_shards=3)


def trimmed(examples):
    """The examples cut to toy_packed's rows by the task's rule (EOS, id 1, kept: ByteVocabulary add_eos)."""
    return {key: tuple(trim_to_length(np.array(v), PACKED_LENGTHS[k], 1).tolist() for k, v in zip(("inputs", "targets"), pair, strict=True))
            for key, pair in examples.items()}


def test_packed_rows_unpack_to_exactly_the_unpacked_examples(caches):
    plain, packed = caches
    for split in ("train", "validation"):
        assert examples_by_id(packed.version_dir, split) == trimmed(examples_by_id(plain.version_dir, split))


def test_rows_are_full_length_t5x_rows_that_hold_several_examples(caches):
    _, packed = caches
    rows = [decode_example(r) for r in records_of(packed.version_dir)]
    for row in rows:
        n = len(origins(row))
        assert [k for k in row if k.startswith("provenance/")] == ["provenance/origin"]
        for key, length in PACKED_LENGTHS.items():
            tokens, ids, positions = row[key], row[f"{key}_segment_ids"], row[f"{key}_positions"]
            assert len(tokens) == len(ids) == len(positions) == length
            assert ((tokens != 0) == (ids != 0)).all() and (positions[ids == 0] == 0).all()
            assert ids.max() == n and (np.diff(ids[ids > 0]) >= 0).all()
            for s in range(1, n + 1):
                assert positions[ids == s].tolist() == list(range(int((ids == s).sum())))
    assert max(len(origins(r)) for r in rows) > 2


def test_the_manifest_counts_examples_rows_tokens_and_what_was_trimmed(caches):
    plain, packed = caches
    manifest = packed.manifest
    assert manifest.to_json()["format"] == FORMAT == plain.manifest.to_json()["format"]
    assert manifest.packing == {"lengths": PACKED_LENGTHS, "open_rows": 16}
    examples = examples_by_id(plain.version_dir)
    too_long = [t for _, t in examples.values() if len(t) > PACKED_LENGTHS["targets"]]
    assert too_long, "the fixture must trim some examples"
    counters = manifest.split("train").counters
    assert counters["packing/targets_examples_trimmed"] == len(too_long)
    assert counters["packing/targets_tokens_trimmed"] == sum(len(t) - PACKED_LENGTHS["targets"] for t in too_long)
    assert "packing/inputs_examples_trimmed" not in counters
    assert counters["packing/examples"] == plain.manifest.split("train").num_records == len(examples)
    assert counters["packing/rows"] == manifest.split("train").num_records < len(examples)
    assert counters["packing/targets_tokens"] == sum(len(t) for _, t in trimmed(examples).values())
    stats = json.loads(Path(packed.version_dir, "stats.train.json").read_text())
    assert stats["examples"] == counters["packing/rows"] and stats["targets_max_tokens"] == PACKED_LENGTHS["targets"]
    assert load_manifest(packed.version_dir) == manifest


def test_a_manifest_whose_format_does_not_match_its_packing_is_refused(caches):
    _, packed = caches
    data = packed.manifest.to_json()
    old = {**data, "splits": {name: {k: v for k, v in split.items() if k != "source_files"}
                              for name, split in data["splits"].items()}}
    with pytest.raises(CacheFormatError, match="format 'taskdata.cache/2' has no place for a packing section"):
        Manifest.from_json({**old, "format": FORMAT_SEQIO_PROVENANCE})
    with pytest.raises(CacheFormatError, match="format 'taskdata.cache/3' needs a packing section"):
        Manifest.from_json({k: v for k, v in old.items() if k != "packing"} | {"format": FORMAT_PACKED})
    with pytest.raises(CacheFormatError, match="format 'taskdata.cache/3': every split has no place for a table"):
        Manifest.from_json({**data, "format": FORMAT_PACKED})
    with pytest.raises(CacheFormatError, match="format 'taskdata.cache/4': every split needs a table of source files"):
        Manifest.from_json(old)
    assert Manifest.from_json({**old, "format": FORMAT_PACKED}).format == FORMAT_PACKED


def test_a_packed_rerun_is_byte_identical(caches, tmp_path):
    _, packed = caches
    again = build(tmp_path, task="toy_packed", num_shards=3, spill_buffer_bytes=2048)
    assert files_of(again.version_dir) == files_of(packed.version_dir)


@pytest.mark.slow
def test_a_packed_multi_process_build_is_byte_identical(caches, tmp_path):
    _, packed = caches
    again = build(tmp_path, task="toy_packed", num_shards=3,
                  beam_args=["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    assert files_of(again.version_dir) == files_of(packed.version_dir)


def test_another_seed_packs_other_rows(caches, tmp_path):
    _, packed = caches
    other = build(tmp_path, task="toy_packed", seed=1, num_shards=3)
    mine = {tuple(origins(decode_example(r))[:, 1].tolist()) for r in records_of(packed.version_dir)}
    theirs = {tuple(origins(decode_example(r))[:, 1].tolist()) for r in records_of(other.version_dir)}
    assert mine != theirs
    assert len(mine & theirs) < len(mine) / 2


def test_pack_option_packs_a_task_at_its_sequence_lengths(tmp_path):
    result = build(tmp_path, task="toy_lengths", num_shards=2, pack=True)
    assert result.manifest.task == "toy_lengths" and result.manifest.packing["lengths"] == SEQUENCE_LENGTHS
    unpacked = build(tmp_path / "plain", task="toy_lengths", num_shards=2)
    assert examples_by_id(result.version_dir) == examples_by_id(unpacked.version_dir)
    assert result.manifest.task_fingerprint != unpacked.manifest.task_fingerprint


def test_pack_option_on_a_task_without_lengths_names_the_fix(tmp_path):
    with pytest.raises(ValueError, match="'toy_random' asks for packing but has no sequence_length to pack to"):
        build(tmp_path, task="toy_random", num_shards=2, pack=True)


def test_eval_reads_every_example_of_a_packed_cache_by_its_id(caches):
    from taskdata.define.registry import Registry

    plain, packed = caches
    registry = Registry()
    registry.load_module("tests.cache_tasks")
    read = {i: ids.tolist() for i, _, e in CacheTargets(packed.version_dir)(registry.get_task("toy_packed"), "train")
            for ids in [e["targets"]]}
    expected = {i: ids.tolist() for i, _, e in CacheTargets(plain.version_dir)(registry.get_task("toy_det"), "train")
                for ids in [e["targets"]]}
    assert set(read) == {i.replace("toy_det", "toy_packed") for i in expected}
    cut = {i.replace("toy_det", "toy_packed"): trim_to_length(np.array(t), PACKED_LENGTHS["targets"], 1).tolist()
           for i, t in expected.items()}
    assert read == cut


def test_an_unpacked_build_does_not_write_packing_results(caches):
    plain, _ = caches
    assert plain.manifest.packing is None and "packing/rows" not in plain.manifest.split("train").counters
    assert collections.Counter(len(origins(decode_example(r))) for r in records_of(plain.version_dir)) == {1: plain.manifest.split("train").num_records}


def test_a_failed_packed_build_is_a_cache_job_error_not_a_partial_cache(tmp_path, monkeypatch):
    from taskdata.beam import rows

    def broken(*args, **kwargs):
        raise RuntimeError("row writer broke")

    monkeypatch.setattr(rows, "pack_entries", broken)
    with pytest.raises(CacheJobError, match="row writer broke"):
        build(tmp_path, task="toy_packed", num_shards=2)
    assert not list(Path(tmp_path).rglob("COMPLETED"))


def _run(root, name, readers, rates):
    from taskdata.index import BatchSchedule, RunPlan, TaskCache
    from taskdata.runs import RunStore, StoredRun

    plan = RunPlan(name=name, mixture=name, caches={t: TaskCache(r.manifest_sha256, r.record_counts("train"))
                                                    for t, r in readers.items()},
                   rates=rates, seed=3, schedule=BatchSchedule(start=8, end=8), num_data_shards=2)
    RunStore(str(root)).create(StoredRun(plan))
    return RunStore(str(root)).get(name)


def test_the_client_reads_a_packed_row_as_one_example_with_its_segment_ids_and_positions(tmp_path):
    from taskdata.cache.reader import CacheReader
    from taskdata.index import assign
    from trainer_client.assignments import AssignmentError, HostSlice
    from trainer_client.local_source import LocalAssignments
    from trainer_client.reading import BatchReader

    packed = build(tmp_path, task="toy_packed", num_shards=2)
    plain = build(tmp_path, task="toy_det", num_shards=2)
    readers = {"toy_packed": CacheReader(packed.version_dir)}
    source = LocalAssignments.from_cache_root(_run(tmp_path, "packed_run", readers, {"toy_packed": 1}), str(tmp_path))
    reader = BatchReader(source.run_info(), PACKED_LENGTHS)
    batch = reader.read(source.fetch(5, 1, HostSlice(1, 2))[0])
    examples = assign(source.run_info().plan, 5, 1, 2).examples
    assert sorted(batch.features) == sorted(f"{k}{s}" for k in PACKED_LENGTHS for s in ("", "_segment_ids", "_positions"))
    for i, e in enumerate(examples):  # each of the 4 examples of the host's slice is one whole row
        row = decode_example(readers["toy_packed"].read_records("train", [e.shard], [e.record])[0])
        for name, values in batch.features.items():
            assert values.shape == (4, PACKED_LENGTHS[name.split("_")[0]]) and values.dtype == np.int32
            np.testing.assert_array_equal(values[i], row[name], err_msg=name)
    assert batch.num_tokens == sum(int(np.count_nonzero(batch.features[k])) for k in PACKED_LENGTHS)

    readers["toy_det"] = CacheReader(plain.version_dir)
    mixed = LocalAssignments.from_cache_root(
        _run(tmp_path, "mixed_run", readers, {"toy_packed": 1, "toy_det": 1}), str(tmp_path))
    with pytest.raises(AssignmentError, match="a batch cannot mix packed rows with examples"):
        BatchReader(mixed.run_info(), PACKED_LENGTHS).read(mixed.fetch(0, 1, HostSlice(0, 1))[0])


def test_a_decoder_only_task_is_packed_in_the_lm_layout(caches, tmp_path):
    plain, _ = caches
    lm = build(tmp_path, task="toy_lm", num_shards=2)
    rows = [decode_example(r) for r in records_of(lm.version_dir)]
    assert {k for k in rows[0] if not k.startswith("provenance/")} == {"targets", "targets_segment_ids",
                                                                       "targets_positions"}
    got = {}
    for row in rows:
        ids = [tuple(origin) for origin in origins(row)[:, :2].tolist()]
        for key, part in zip(ids, unpack_row(row, ["targets"], len(ids)), strict=True):
            got[key] = part["targets"].tolist()
    assert got == {key: trim_to_length(np.array(t), 128, 1).tolist() for key, (_, t) in examples_by_id(plain.version_dir).items()}
