"""Compact provenance (cache format 4) and the formats before it (2, and 3 for packed rows), still read.

``tests/data/old_caches/formats_2_and_3.tar.gz`` holds two caches built by taskdata before format 4 (commit
d231ed2, ``tests.test_cache_job.build``, split train, 2 shards): ``toy_random`` with seed 3 (format 2) and
``toy_packed`` with seed 0 (format 3). The same tasks built now hold the same examples in the same order, so
everything read from the old caches must equal what is read from the new ones.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from taskdata.cache.format import (
    FORMAT,
    FORMAT_PACKED,
    FORMAT_SEQIO_PROVENANCE,
    CacheFormatError,
    current_version,
)
from taskdata.cache.provenance import ORIGIN, origin_values, provenance_spec, read_provenance
from taskdata.cache.reader import CacheReader
from taskdata.cache.verify import verify_version
from taskdata.define.registry import Registry
from taskdata.evaluation import CacheTargets
from taskdata.example import RaggedFeature, decode_example, encode_example
from taskdata.index import BatchSchedule, RunPlan, TaskCache
from taskdata.runs import LedgerError, example_ledger, open_views, step_ledger
from tests.cache_helpers import build, records_of

pytestmark = pytest.mark.slow  # cache jobs (Beam)

OLD_CACHES = Path(__file__).resolve().parent / "data" / "old_caches" / "formats_2_and_3.tar.gz"


@pytest.fixture(autouse=True)
def _worker_import_path(monkeypatch):
    root = str(Path(__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """(cache root of the old caches, cache root of the same tasks built now)."""
    old = tmp_path_factory.mktemp("old")
    with tarfile.open(OLD_CACHES) as archive:
        archive.extractall(old, filter="data")
    new = tmp_path_factory.mktemp("new")
    build(new, task="toy_random", seed=3, num_shards=2, splits=("train",))
    build(new, task="toy_packed", seed=0, num_shards=2, splits=("train",))
    return old, new


def version(root: Path, task: str) -> str:
    found = current_version(str(root / task))
    assert found is not None
    return found


def provenance_of(version_dir: str):
    reader = CacheReader(version_dir)
    records = records_of(version_dir)
    return reader.manifest, read_provenance(reader.manifest, "train", reader.decode(records, provenance_spec(reader.manifest)))


def test_old_caches_keep_their_formats_and_verify(roots):
    old, new = roots
    formats = {task: CacheReader(version(old, task)).manifest.format for task in ("toy_random", "toy_packed")}
    assert formats == {"toy_random": FORMAT_SEQIO_PROVENANCE, "toy_packed": FORMAT_PACKED}
    assert {CacheReader(version(new, task)).manifest.format for task in ("toy_random", "toy_packed")} == {FORMAT}
    for root in roots:
        for task in ("toy_random", "toy_packed"):
            assert verify_version(version(root, task)) == []


@pytest.mark.parametrize("task", ["toy_random", "toy_packed"])
def test_old_and_new_caches_give_the_same_provenance_for_every_example(roots, task):
    (old_manifest, old), (new_manifest, new) = (provenance_of(version(root, task)) for root in roots)
    assert not old_manifest.compact_provenance and new_manifest.compact_provenance
    records = len(records_of(version(roots[1], task)))
    assert len(new.source_shard) > records if task == "toy_packed" else len(new.source_shard) == records
    for name in ("source_shard", "ordinal", "source_file", "first_document", "last_document", "examples_per_record"):
        np.testing.assert_array_equal(getattr(old, name), getattr(new, name), err_msg=name)
    assert old.ids(task, "train") == new.ids(task, "train")
    assert set(new.source_file.tolist()) == set(new_manifest.split("train").source_files) == {str(s) for s in range(6)}


@pytest.mark.parametrize("task", ["toy_random", "toy_packed"])
def test_evaluation_reads_the_same_targets_by_id_from_old_and_new_caches(roots, task):
    registry = Registry()
    registry.load_module("tests.cache_tasks")
    definition = registry.get_task(task)
    old, new = ({i: e["targets"].tolist() for i, _, e in CacheTargets(version(root, task), seed=None)(definition, "train")}
                for root in roots)
    assert old == new and len(old) > 100


def test_records_carry_a_fraction_of_the_provenance_bytes_they_did(roots):
    def provenance_bytes(record: bytes) -> int:
        example = decode_example(record)
        return len(record) - len(encode_example({k: v for k, v in example.items() if not k.startswith("provenance/")}))

    old, new = (records_of(version(root, "toy_random")) for root in roots)
    assert len(old) == len(new)
    old_bytes, new_bytes = sum(map(provenance_bytes, old)) / len(old), sum(map(provenance_bytes, new)) / len(new)
    assert old_bytes > 200 and new_bytes < 32, (old_bytes, new_bytes)
    assert sum(map(len, old)) - sum(map(len, new)) == pytest.approx((old_bytes - new_bytes) * len(old))


def _plan(root: Path, task: str) -> RunPlan:
    reader = CacheReader(version(root, task))
    return RunPlan(name="prov", mixture=task, caches={task: TaskCache(reader.manifest_sha256, reader.record_counts("train"))},
                   rates={task: 1}, seed=5, schedule=BatchSchedule(start=16, end=16), num_data_shards=4)


@pytest.mark.parametrize("step", [0, 3, 41, 10**9])
def test_the_ledger_of_an_old_cache_is_the_ledger_of_the_same_cache_built_now(roots, step):
    ledgers = []
    for root in roots:
        plan = _plan(root, "toy_random")
        views = open_views(plan, str(root))
        try:
            ledger = step_ledger(plan, views, step)
            ledgers.append(ledger)
            entry = ledger.entries[len(ledger.entries) // 2]
            found = example_ledger(plan, views, entry.id, from_step=step, limit=1)
            assert (found.shard, found.record, found.reads[0].step) == (entry.shard, entry.record, step)
        finally:
            for view in views.values():
                view.close()
    old, new = ledgers
    assert old.entries == new.entries and len(old.entries) == 16
    assert all(e.documents == (int(e.id.rsplit("/", 1)[1]),) * 2 for e in new.entries)  # one example per document


def test_the_ledger_refuses_packed_rows_in_either_format(roots):
    for root in roots:
        plan = _plan(root, "toy_packed")
        views = open_views(plan, str(root))
        try:
            with pytest.raises(LedgerError, match="holds packed rows of several examples"):
                step_ledger(plan, views, 0)
        finally:
            for view in views.values():
                view.close()


def test_origin_values_refuse_a_backward_document_range():
    assert origin_values(3, 17, 40, 42) == [3, 17, 40, 2]
    with pytest.raises(ValueError, match=r"Example 3/17 names source documents 40\.\.39"):
        origin_values(3, 17, 40, 39)


def test_a_damaged_origin_is_an_error_naming_it(roots):
    manifest = CacheReader(version(roots[1], "toy_random")).manifest

    def origin(values, splits):
        return {ORIGIN: RaggedFeature(np.array(values, np.int64), np.array(splits, np.int64))}

    with pytest.raises(CacheFormatError, match="names source shard 6 of 6"):
        read_provenance(manifest, "train", origin([1, 0, 0, 0, 6, 0, 0, 0], [0, 4, 8]))
    with pytest.raises(CacheFormatError, match="record 1 of the batch has 3 provenance/origin values"):
        read_provenance(manifest, "train", origin([1, 0, 0, 0, 6, 0, 0], [0, 4, 7]))


@pytest.mark.parametrize("task", ["toy_random", "toy_packed"])
def test_the_record_size_bench_s_before_is_exactly_what_caches_before_format_4_hold(roots, task):
    from bench.bench_record_size import seqio_style_record

    old, new = (version(root, task) for root in roots)
    manifest = CacheReader(new).manifest
    assert [seqio_style_record(r, manifest, "train") for r in records_of(new)] == records_of(old)


def test_a_job_reusing_an_old_format_version_says_how_to_rebuild_it_compact(roots, tmp_path):
    import shutil

    root = tmp_path / "root"
    shutil.copytree(roots[0] / "toy_random", root / "toy_random")
    logs: list[str] = []
    result = build(root, task="toy_random", seed=3, num_shards=2, splits=("train",), logs=logs)
    assert result.reused and result.manifest.format == FORMAT_SEQIO_PROVENANCE
    assert any("cache format taskdata.cache/2" in line and "--force rebuilds it in taskdata.cache/4" in line
               for line in logs), logs
    again = build(root, task="toy_random", seed=3, num_shards=2, splits=("train",), logs=logs, force=True)
    assert not again.reused and again.manifest.format == FORMAT
