"""``taskdata verify`` finds every kind of damage and names shard, record and byte offset."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from taskdata.cache.format import CacheFormatError, load_manifest
from taskdata.cache.verify import verify_version
from taskdata.cli import main
from tests.cache_helpers import build

pytestmark = pytest.mark.slow  # cache jobs (Beam)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return build(tmp_path_factory.mktemp("pristine"), task="toy_det", num_shards=2).version_dir


@pytest.fixture
def cache(pristine, tmp_path):
    copy = tmp_path / "copy" / Path(pristine).name
    shutil.copytree(pristine, copy)
    return copy


def test_a_fresh_cache_verifies(cache, capsys):
    assert verify_version(str(cache)) == []
    assert main(["verify", str(cache)]) == 0
    assert capsys.readouterr().out.startswith(f"OK {cache}: 4 shards")


def test_verify_accepts_the_task_folder_and_uses_current(pristine, capsys):
    assert main(["verify", str(Path(pristine).parent)]) == 0
    assert f"OK {pristine}" in capsys.readouterr().out


def test_every_flipped_byte_is_detected_with_its_record(cache):
    shard = cache / "train.tfrecord-00001-of-00002"
    original = shard.read_bytes()
    manifest = load_manifest(str(cache))
    offsets = _record_offsets(cache, "train.tfrecord-00001-of-00002")
    positions = sorted({0, 5, 8, 11, 12, 13, len(original) // 3, len(original) // 2, len(original) - 5, len(original) - 1})
    for position in positions:
        damaged = bytearray(original)
        damaged[position] ^= 0x40
        shard.write_bytes(bytes(damaged))
        problems = verify_version(str(cache))
        record = max(i for i, start in enumerate(offsets) if start <= position)
        assert problems, f"flip at byte {position} went undetected"
        assert problems[0].startswith(
            f"shard train.tfrecord-00001-of-00002: record {record} at byte offset {offsets[record]}:"), problems[0]
    shard.write_bytes(original)
    assert manifest.split("train").num_records > 0 and verify_version(str(cache)) == []


def test_truncated_shard_is_detected(cache, capsys):
    shard = cache / "train.tfrecord-00000-of-00002"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 7])
    assert main(["verify", str(cache)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"FAILED {cache}: shard train.tfrecord-00000-of-00002: record ")
    assert "truncated shard" in out


def test_appended_bytes_are_detected(cache):
    shard = cache / "validation.tfrecord-00000-of-00002"
    shard.write_bytes(shard.read_bytes() + b"extra")
    problems = verify_version(str(cache))
    assert problems and "the file continues past the end of the last record" in problems[0]


def test_deleted_shard_is_detected(cache):
    (cache / "validation.tfrecord-00001-of-00002").unlink()
    assert verify_version(str(cache)) == ["shard validation.tfrecord-00001-of-00002 of split 'validation' is missing"]


def test_damaged_offsets_sidecar_is_detected(cache):
    sidecar = cache / "index" / "train.tfrecord-00000-of-00002.offsets"
    data = bytearray(sidecar.read_bytes())
    data[-3] ^= 1
    sidecar.write_bytes(bytes(data))
    problems = verify_version(str(cache))
    assert problems and "offsets sidecar index/train.tfrecord-00000-of-00002.offsets does not match" in problems[0]


def test_edited_manifest_no_longer_matches_completed(cache):
    manifest = cache / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"seed": 0', '"seed": 1'))
    with pytest.raises(CacheFormatError, match="does not match the hash in COMPLETED"):
        verify_version(str(cache))


def test_version_without_completed_is_not_a_cache(cache):
    (cache / "COMPLETED").unlink()
    with pytest.raises(CacheFormatError, match="has no COMPLETED marker"):
        verify_version(str(cache))


def _record_offsets(cache: Path, name: str) -> list[int]:
    from taskdata.cache.tfrecord import read_offsets

    path = cache / "index" / f"{name}.offsets"
    return [int(x) for x in read_offsets(path.read_bytes(), str(path))[:-1]]


def test_verify_on_a_cache_root_checks_every_tasks_current_version_one_line_each(tmp_path, capsys):
    root = tmp_path / "caches"
    det = build(root, task="toy_det", num_shards=2).version_dir
    rand = build(root, task="toy_random", num_shards=2).version_dir
    (root / "_runs").mkdir()
    (root / "_runs" / "r.json").write_text("{}")
    assert main(["verify", str(root)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"OK {det}: 4 shards, every record verified",
        f"OK {rand}: 4 shards, every record verified",
        f"2 of 2 tasks under {root} verified",
    ]
    shard = Path(rand) / "train.tfrecord-00001-of-00002"
    data = bytearray(shard.read_bytes())
    data[30] ^= 1
    shard.write_bytes(bytes(data))
    manifest = Path(det) / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"seed": 0', '"seed": 1'))
    assert main(["verify", str(root)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"FAILED {det}: {det}: manifest.json does not match the hash in COMPLETED; the cache was " \
                       "modified after it was built. Run 'taskdata verify' and rebuild."
    assert lines[1].startswith(f"FAILED {rand}: shard train.tfrecord-00001-of-00002: record 0 at byte offset 0: ")
    assert lines[2:] == [f"0 of 2 tasks under {root} verified"]


def test_verify_on_a_folder_without_caches_says_what_it_expected(tmp_path, capsys):
    assert main(["verify", str(tmp_path)]) == 2
    assert "is neither a cache version (no manifest.json), a task folder with a CURRENT version, nor a cache root" \
        in capsys.readouterr().err
