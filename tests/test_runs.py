"""Runs next to their caches: plan construction, durable idempotent storage, verified cache resolution.

The caches are tests/run_helpers.py's ``shared_caches`` (built once per session by a Beam job), so the
whole module is slow; tests that damage a cache work on a copy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
from pathlib import Path

import pytest

from taskdata.cache.format import load_manifest
from taskdata.cache.tfrecord import iter_records, read_offsets
from taskdata.define.registry import UnknownNameError
from taskdata.index import BatchSchedule, RunPlan, SkipRange, assign
from taskdata.names import InvalidNameError
from taskdata.runs import (
    CacheResolver,
    CacheUnavailableError,
    RunConflictError,
    RunError,
    RunStore,
    StoredRun,
    build_run,
    cache_fingerprint,
)
from tests.cache_helpers import MODULE
from tests.run_helpers import (
    SHARDS,
    TASKS,
    build_caches,
    copy_caches,
    current_dir,
    make_registry,
    mix_run,
    shared_caches,
)

pytestmark = pytest.mark.slow  # cache jobs (Beam)


@pytest.fixture(scope="module")
def caches(tmp_path_factory) -> Path:
    return shared_caches(tmp_path_factory)


# --- build_run ----------------------------------------------------------------------------------


def test_build_run_pins_each_current_version_by_its_manifest_hash_and_counts(caches):
    run = mix_run(caches)
    plan = run.plan
    assert run.split == "train" and plan.task_names == TASKS and plan.mixture == "toy_mix"
    for task in TASKS:
        version = current_dir(caches, task)
        manifest_hash = hashlib.sha256((version / "manifest.json").read_bytes()).hexdigest()
        assert plan.caches[task].fingerprint == manifest_hash == cache_fingerprint(str(version))
        assert json.loads((version / "COMPLETED").read_text()) == {"manifest_sha256": manifest_hash}
        counts = load_manifest(str(version)).split("train").record_counts
        assert plan.caches[task].shard_record_counts == counts and len(counts) == SHARDS[task]
    # Exact: mixtures of floats made these 12500000000000000/24999999999999999, 5555555555555555/16666666666666666, 1/6.
    assert plan.to_dict()["rates"] == {"toy_det": "1/2", "toy_random": "1/3", "toy_text": "1/6"}


def test_build_run_passes_the_mixtures_exact_rates_to_the_plan(caches):
    registry = make_registry()
    registry.add_mixture("pair", [("toy_det", 1), ("toy_random", 2)])
    registry.add_mixture("tenths", [("toy_det", 0.1), ("toy_random", 0.2), ("toy_text", 0.7)])
    registry.add_mixture("nested", [("pair", 1), ("toy_text", "1/2")])
    fields = dict(name="r", seed=0, schedule=BatchSchedule.constant(16), num_data_shards=4)
    rates = {
        mixture: build_run(registry, str(caches), mixture=mixture, **fields).plan.to_dict()["rates"]
        for mixture in ("pair", "tenths", "nested")
    }
    assert rates == {
        "pair": {"toy_det": "1/3", "toy_random": "2/3"},
        "tenths": {"toy_det": "1/10", "toy_random": "1/5", "toy_text": "7/10"},
        "nested": {"toy_det": "2/9", "toy_random": "4/9", "toy_text": "1/3"},
    }


def test_build_run_is_deterministic_and_the_seed_changes_the_fingerprint(caches):
    assert mix_run(caches).plan.fingerprint() == mix_run(caches).plan.fingerprint()
    assert mix_run(caches, seed=8).plan.fingerprint() != mix_run(caches).plan.fingerprint()
    # The run's name and number of data shards do not decide the global batches.
    assert (
        mix_run(caches, name="other", num_data_shards=2).plan.fingerprint()
        == mix_run(caches).plan.fingerprint()
    )


def test_build_run_of_a_single_task_has_no_rates_to_give(caches):
    run = build_run(
        make_registry(),
        str(caches),
        name="solo",
        mixture="toy_det",
        seed=0,
        schedule=BatchSchedule.ramp(4, 8, 10, multiple_of=4),
        num_data_shards=2,
        skip=(SkipRange(3, 5),),
    )
    assert run.plan.task_names == ("toy_det",) and run.plan.skip == (SkipRange(3, 5),)


def test_build_run_names_unknown_and_invalid_mixtures(caches):
    with pytest.raises(UnknownNameError, match=r"Unknown task or mixture 'toy_mixx'.*Did you mean: toy_mix"):
        mix_run(caches, mixture="toy_mixx")
    for bad in ("../x", "..:..:etc", "a/b", ""):
        with pytest.raises(InvalidNameError):
            mix_run(caches, mixture=bad)


def test_build_run_refuses_a_split_the_caches_do_not_have(caches):
    with pytest.raises(
        RunError, match=r"Split 'validation' is not in the cache of task 'toy_det'.*\['train'\]"
    ):
        mix_run(caches, split="validation")


def test_build_run_says_how_to_build_a_missing_cache(caches):
    with pytest.raises(CacheUnavailableError, match=r"'toy_uncached'.*taskdata cache --task toy_uncached"):
        build_run(
            make_registry(),
            str(caches),
            name="r",
            mixture="toy_uncached",
            seed=0,
            schedule=BatchSchedule.constant(4),
            num_data_shards=1,
        )


def test_build_run_reports_plan_rules_as_run_errors(caches):
    with pytest.raises(RunError, match=r"Number of data shards \(3\) must divide every global batch size"):
        mix_run(caches, num_data_shards=3)


# --- RunStore ------------------------------------------------------------------------------------


def test_store_writes_one_json_file_and_is_idempotent(caches, tmp_path):
    store = RunStore(str(tmp_path))
    run = mix_run(caches)
    assert store.create(run) is True
    path = tmp_path / "_runs" / "mix.json"
    assert json.loads(path.read_text()) == run.to_dict() and run.to_dict()["format"] == "taskdata.run/4"
    before = path.read_bytes()
    assert store.create(mix_run(caches)) is False
    assert path.read_bytes() == before
    assert RunStore(str(tmp_path)).get("mix").to_dict() == run.to_dict()  # a fresh store reads it back
    assert store.names() == ["mix"] and store.get("nope") is None


def test_store_refuses_a_different_plan_under_a_taken_name(caches, tmp_path):
    RunStore(str(tmp_path)).create(mix_run(caches))
    with pytest.raises(
        RunConflictError, match=r"Run 'mix' already exists with a different plan.*another name"
    ):
        RunStore(str(tmp_path)).create(mix_run(caches, seed=8))
    with pytest.raises(RunConflictError):  # another split is another run too
        RunStore(str(tmp_path)).create(StoredRun(dataclasses.replace(mix_run(caches).plan, split="validation")))


def test_store_never_turns_a_bad_name_into_a_path(tmp_path):
    store = RunStore(str(tmp_path / "root"))
    for bad in ("../x", "..:..:etc", "a/b", "%2e%2e", "", ".hidden", "a..b"):
        with pytest.raises(RunError, match="name"):
            store.path(bad)
        with pytest.raises(RunError):
            store.get(bad)
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "root").exists()


def test_a_name_with_a_trailing_newline_is_refused_at_every_entry(caches, tmp_path, capsys):
    # re.match with '$' accepted 'rnl\n': a run GET /runs listed and no request could address.
    with pytest.raises(RunError, match=r"Invalid run name 'rnl\\n'"):
        mix_run(caches, name="rnl\n")
    from taskdata.cli import main

    argv = ["plan", "--module", MODULE, "--cache-root", str(caches), "--name", "rnl\n", "--mixture", "toy_det"]
    assert main([*argv, "--seed", "0", "--batch-size", "4", "--num-data-shards", "1"]) == 2
    assert "Invalid run name 'rnl\\n'" in capsys.readouterr().err
    assert not (caches / "_runs").exists()
    store = RunStore(str(tmp_path))
    store.create(mix_run(caches))
    stray = tmp_path / "_runs" / "rnl\n.json"  # a file written by an older version
    stray.write_text((tmp_path / "_runs" / "mix.json").read_text().replace('"name": "mix"', '"name": "rnl\\n"'))
    assert store.names() == ["mix"]
    with pytest.raises(RunError, match="Invalid run name"):
        store.get("rnl\n")


def test_store_ignores_leftovers_of_interrupted_writes(caches, tmp_path):
    store = RunStore(str(tmp_path))
    store.create(mix_run(caches))
    (tmp_path / "_runs" / "mix.json.tmp-0123").write_text("{")
    assert store.names() == ["mix"]


def test_stored_run_reads_a_bare_plan_as_the_train_split(caches):
    plan = mix_run(caches).plan
    assert StoredRun.from_dict(plan.to_dict()) == StoredRun(plan) and plan.split == "train"
    without_split = {k: v for k, v in plan.to_dict().items() if k != "split"}  # written before plans held one
    assert StoredRun.from_dict(without_split) == StoredRun(plan)
    with pytest.raises(RunError, match="format"):
        StoredRun.from_dict({"format": "taskdata.run/9", "plan": plan.to_dict(), "split": "train"})
    with pytest.raises(RunError, match="A run plan needs exactly the keys"):
        StoredRun.from_dict({"name": "x"})


def test_the_split_is_part_of_the_plan_and_of_its_fingerprint(caches):
    # One cache version (one cache fingerprint) holds every split: with equal record counts, only the split
    # tells a train run from a validation run, and a checkpoint of one must not resume on the other.
    plan = mix_run(caches).plan
    before = {k: v for k, v in plan.to_dict().items() if k != "split"}  # a taskdata.run/1 record's plan
    train = StoredRun.from_dict({"format": "taskdata.run/1", "plan": before, "split": "train"})
    validation = StoredRun.from_dict({"format": "taskdata.run/1", "plan": before, "split": "validation"})
    assert train == StoredRun(plan) and validation.split == "validation"
    assert validation.plan.fingerprint() != train.plan.fingerprint()
    assert StoredRun.from_dict(validation.to_dict()) == validation  # taskdata.run/2 on: the split in the plan
    assert validation.to_dict() == {"format": "taskdata.run/4", "plan": {**before, "split": "validation"},
                                    "served_before": 0}
    with pytest.raises(RunError, match="has no split of its own"):
        StoredRun.from_dict({"format": "taskdata.run/1", "plan": plan.to_dict(), "split": "train"})
    with pytest.raises(RunError, match=r"Split: Invalid split name '\.\./x'"):
        StoredRun.from_dict({**plan.to_dict(), "split": "../x"})


# --- CacheResolver -------------------------------------------------------------------------------


def test_resolver_loads_offsets_that_locate_every_read(caches):
    run = mix_run(caches)
    resolved = CacheResolver(str(caches)).resolve_run(run)
    assert [c.task for c in resolved] == list(TASKS)
    for cache in resolved:
        assert Path(cache.version_dir) == current_dir(caches, cache.task).resolve()
        for shard, uri in enumerate(cache.shard_uris):
            offsets_file = cache.manifest.split("train").shards[shard].offsets_file
            expected = read_offsets((Path(cache.version_dir) / offsets_file).read_bytes(), offsets_file)
            assert list(cache.offsets[shard]) == list(expected) and Path(uri).exists()
    for step in range(3):
        assignment = assign(run.plan, step, 1)
        for read in assignment.extents:
            cache = resolved[run.plan.task_index(read.task)]
            offset, length = cache.byte_range(read.shard, read.first_record, read.count)
            with open(cache.shard_uris[read.shard], "rb") as f:
                f.seek(offset)
                records = list(iter_records(io.BytesIO(f.read(length)), cache.shard_uris[read.shard]))
            assert len(records) == read.count


def test_resolver_follows_the_pinned_hash_not_current(caches, tmp_path_factory):
    root = copy_caches(tmp_path_factory)
    run = mix_run(root)
    pinned = current_dir(root, "toy_det")
    build_caches(root, seed=1, tasks=("toy_det",))  # a rebuild moves CURRENT to other bytes
    assert current_dir(root, "toy_det") != pinned
    resolved = CacheResolver(str(root)).resolve_run(run)
    assert Path(resolved[0].version_dir) == pinned.resolve()
    assert mix_run(root).plan.fingerprint() != run.plan.fingerprint()  # a new run pins the new version


def test_resolver_never_reads_a_version_without_completed(tmp_path_factory):
    root = copy_caches(tmp_path_factory)
    run = mix_run(root)
    (current_dir(root, "toy_random") / "COMPLETED").unlink()
    with pytest.raises(
        CacheUnavailableError, match=r"'toy_random'.*no complete version .* has manifest sha256"
    ):
        CacheResolver(str(root)).resolve_run(run)


def test_resolver_remembers_a_failed_verification(tmp_path_factory):
    root = copy_caches(tmp_path_factory)
    run = mix_run(root)
    shard = current_dir(root, "toy_text") / "train.tfrecord-00001-of-00002"
    original = shard.read_bytes()
    damaged = bytearray(original)
    damaged[40] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    resolver = CacheResolver(str(root))
    with pytest.raises(
        CacheUnavailableError, match=r"'toy_text'.*verification of .* failed: shard train.tfrecord-00001"
    ):
        resolver.resolve_run(run)
    assert resolver.verification("toy_text", run.plan.caches["toy_text"].fingerprint, "train").startswith(
        "failed"
    )
    shard.write_bytes(original)
    with pytest.raises(CacheUnavailableError, match="verification"):
        resolver.resolve_run(run)  # remembered: checked once per process
    assert len(CacheResolver(str(root)).resolve_run(run)) == 3  # a new process verifies again


def test_resolver_refuses_a_plan_whose_counts_were_edited(caches):
    data = mix_run(caches).plan.to_dict()
    counts = data["caches"]["toy_det"]["shard_record_counts"]
    counts[0] += 1
    edited = StoredRun(RunPlan.from_dict(data))
    with pytest.raises(CacheUnavailableError, match=r"shard record counts .* edited by hand"):
        CacheResolver(str(caches)).resolve_run(edited)


def test_resolved_cache_checks_its_tables(caches):
    cache = CacheResolver(str(caches)).resolve_run(mix_run(caches))[0]
    with pytest.raises(CacheUnavailableError, match="offset tables"):
        dataclasses.replace(cache, offsets=cache.offsets[:-1])
    with pytest.raises(CacheUnavailableError, match="shard 0 has"):
        dataclasses.replace(cache, offsets=(cache.offsets[0][:-1], *cache.offsets[1:]))


def test_plan_command_stores_the_block_epoch_order_and_states_its_reads_bound(caches, tmp_path, capsys):
    from taskdata.cli import main
    from taskdata.index import BlockOrder, reads_bound

    root = tmp_path / "root"
    shutil.copytree(caches, root)
    argv = ["plan", "--module", MODULE, "--cache-root", str(root), "--mixture", "toy_det", "--seed", "0",
            "--batch-size", "16", "--num-data-shards", "2"]
    assert main([*argv, "--name", "blocks", "--epoch-order", "block", "--block-size", "4"]) == 0
    out = capsys.readouterr().out
    plan = RunStore(str(root)).get("blocks").plan
    assert plan.epoch_order == BlockOrder(4)
    assert f"at most {reads_bound(plan, 8)} ranged reads per data shard (8 examples)" in out
    assert main([*argv, "--name", "records", "--epoch-order", "feistel"]) == 0
    records = RunStore(str(root)).get("records").plan
    assert "epoch_order" not in records.to_dict() and records.fingerprint() != plan.fingerprint()
    assert main([*argv, "--name", "x", "--epoch-order", "block"]) == 2
    assert "--epoch-order block: The block epoch order takes the options ['block_size'] but got none" in capsys.readouterr().err
    assert main([*argv, "--name", "x", "--epoch-order", "feistel", "--block-size", "4"]) == 2
    assert "--epoch-order feistel: The feistel epoch order takes no options but got ['block_size']" in capsys.readouterr().err
    assert main([*argv, "--name", "x", "--epoch-order", "block", "--block-size", "4", "--width", "4"]) == 2
    assert ("--epoch-order block: The block epoch order takes the options ['block_size'] but got ['block_size', "
            "'width']") in capsys.readouterr().err


def test_plan_command_stores_the_windowed_order_by_default_and_states_its_requests_and_memory(caches, tmp_path,
                                                                                             capsys):
    from taskdata.cache.reader import CacheReader
    from taskdata.cli import main
    from taskdata.index import WindowedOrder, requests_bound

    root = tmp_path / "root"
    shutil.copytree(caches, root)
    argv = ["plan", "--module", MODULE, "--cache-root", str(root), "--mixture", "toy_det", "--seed", "0",
            "--batch-size", "16", "--num-data-shards", "2"]
    assert main([*argv, "--name", "default"]) == 0
    # New runs read later epochs windowed: blocks of 64, as wide as the largest batch (a ramp's end here).
    assert RunStore(str(root)).get("default").plan.epoch_order == WindowedOrder(64, 16)
    assert main([*argv, "--name", "ramp", "--ramp-to", "32", "--ramp-steps", "10", "--multiple-of", "2"]) == 0
    assert RunStore(str(root)).get("ramp").plan.epoch_order == WindowedOrder(64, 32)
    capsys.readouterr()
    assert main([*argv, "--name", "windowed", "--epoch-order", "windowed", "--block-size", "4"]) == 0
    out = capsys.readouterr().out
    plan = RunStore(str(root)).get("windowed").plan
    assert plan.epoch_order == WindowedOrder(4, 16)
    version = CacheResolver(str(root)).resolve_run(RunStore(str(root)).get("windowed"))[0].version_dir
    largest = CacheReader(version).manifest.split("train").max_record_bytes
    assert "at most 8 ranged reads per data shard (8 examples)" in out
    assert (f"knowing 4 steps ahead (DataIterator's default lookahead covers it), a data shard makes at most "
            f"{requests_bound(plan, 8)} requests per step after its first") in out
    assert f"keeps at most 32 records for later steps ({32 * largest / 2**20:,.1f} MiB at the caches' largest " \
           f"record of {largest:,} bytes)" in out
    assert main([*argv, "--name", "wide", "--width", "64"]) == 0
    assert RunStore(str(root)).get("wide").plan.epoch_order == WindowedOrder(64, 64)
