"""Verification levels and parallel verification: what ``listing`` proves and what only ``full`` (or the
reader) finds, the same first problem for any worker count, and both levels on a GCS emulator."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from taskdata.cache.format import load_manifest
from taskdata.cache.reader import CacheReader
from taskdata.cache.tfrecord import CorruptRecordError, read_offsets
from taskdata.cache.verify import check_split, verify_version
from taskdata.cli import main
from tests.cache_helpers import build
from tests.gcs_emulator import gcs_emulator

pytestmark = pytest.mark.slow  # cache jobs (Beam), servers

REPO = Path(__file__).resolve().parent.parent
SHARD = "train.tfrecord-00001-of-00003"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return build(tmp_path_factory.mktemp("pristine"), task="toy_det", num_shards=3).version_dir


@pytest.fixture
def cache(pristine, tmp_path):
    copy = tmp_path / "copy" / Path(pristine).name
    shutil.copytree(pristine, copy)
    return copy


def _flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x10
    path.write_bytes(bytes(data))


def _record_starts(cache: Path, name: str) -> list[int]:
    sidecar = cache / "index" / f"{name}.offsets"
    return [int(x) for x in read_offsets(sidecar.read_bytes(), str(sidecar))]


def test_both_levels_pass_a_fresh_cache_and_return_every_shards_offsets(cache):
    manifest = load_manifest(str(cache))
    for level in ("listing", "full"):
        assert verify_version(str(cache), level=level, workers=2) == []
        check = check_split(str(cache), "train", manifest.split("train"), level=level, workers=3)
        assert check.ok and check.level == level
        for offsets, entry in zip(check.offsets, manifest.split("train").shards, strict=True):
            sidecar = cache / entry.offsets_file
            assert offsets.tolist() == read_offsets(sidecar.read_bytes(), str(sidecar)).tolist()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda c: (c / SHARD).unlink(), f"shard {SHARD} of split 'train' is missing"),
        (lambda c: (c / "index" / f"{SHARD}.offsets").unlink(), f"offsets sidecar index/{SHARD}.offsets of shard"),
        (lambda c: (c / SHARD).write_bytes((c / SHARD).read_bytes()[:-7]), "bytes but the manifest says"),
        (lambda c: (c / SHARD).write_bytes((c / SHARD).read_bytes() + b"x"), "bytes but the manifest says"),
        (lambda c: _flip(c / "index" / f"{SHARD}.offsets", 30), "does not match its checksum in the manifest"),
    ],
    ids=["shard deleted", "sidecar deleted", "truncated", "extended", "sidecar edited"],
)
def test_the_listing_level_finds_missing_resized_and_edited_files_without_reading_a_record(cache, damage, message):
    damage(cache)
    problems = verify_version(str(cache), level="listing")
    assert len(problems) == 1 and message in problems[0] and SHARD in problems[0], problems


def test_a_flipped_byte_passes_the_listing_level_but_full_and_the_reader_name_its_record(cache, capsys):
    # What the listing level cannot see is found by full verification and, record by record, by every
    # read of a trainer: full content is never trusted unverified, only verified later.
    starts = _record_starts(cache, SHARD)
    record = len(starts) // 2
    _flip(cache / SHARD, starts[record] + 14)
    assert verify_version(str(cache), level="listing") == []
    assert main(["verify", "--level", "listing", str(cache)]) == 0
    assert "listing verified (sizes and offsets sidecars)" in capsys.readouterr().out
    problems = verify_version(str(cache), level="full", workers=2)
    assert problems == [f"shard {SHARD}: record {record} at byte offset {starts[record]}: the CRC of the record data "
                        "does not match"]
    with CacheReader(str(cache)) as reader, pytest.raises(CorruptRecordError) as error:
        reader.read_records("train", [1, 1], [record - 1, record])
    assert (error.value.record_index, error.value.byte_offset) == (record, starts[record])
    assert SHARD in str(error.value)


def test_parallel_full_verification_reports_what_one_worker_reports(cache):
    first, last = "train.tfrecord-00000-of-00003", "train.tfrecord-00002-of-00003"
    _flip(cache / last, _record_starts(cache, last)[1] + 13)
    _flip(cache / first, _record_starts(cache, first)[2] + 13)
    reports = {workers: verify_version(str(cache), workers=workers) for workers in (1, 2, 5)}
    assert reports[1] == reports[2] == reports[5] and len(reports[1]) == 1 and reports[1][0].startswith(f"shard {first}")
    manifest = load_manifest(str(cache))
    every = [check_split(str(cache), "train", manifest.split("train"), workers=w, stop_at_first=False).problems
             for w in (1, 3)]
    assert every[0] == every[1] and [p.split(":")[0] for p in every[0]] == [f"shard {first}", f"shard {last}"]
    verified: list[str] = []
    check_split(str(cache), "train", manifest.split("train"), workers=3, stop_at_first=False, on_shard=verified.append)
    assert verified == [SHARD]  # the undamaged shard only


def test_bad_levels_and_worker_counts_are_refused(cache, capsys):
    manifest = load_manifest(str(cache))
    with pytest.raises(ValueError, match="one of \\('listing', 'full'\\) but got 'quick'"):
        check_split(str(cache), "train", manifest.split("train"), level="quick")
    with pytest.raises(ValueError, match="workers must be a positive integer but got 0"):
        check_split(str(cache), "train", manifest.split("train"), workers=0)
    assert main(["verify", "--workers", "0", str(cache)]) == 2
    assert "--workers must be at least 1 but got 0" in capsys.readouterr().err


# --- on a GCS emulator --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emulator():
    with gcs_emulator("caches") as env:
        yield env


def _on_gcs(env: dict, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_both_levels_on_gcs_find_what_they_find_locally(emulator, cache):
    starts = _record_starts(cache, SHARD)
    upload = f"from gcsfs import GCSFileSystem\nGCSFileSystem().put({str(cache)!r}, 'caches/v', recursive=True)\n"
    assert _on_gcs(emulator, upload).returncode == 0
    verify = ("import sys\nfrom taskdata.cli import main\n"
              "sys.exit(main(['verify', '--level', sys.argv[1], '--workers', '2', 'gs://caches/v']))\n")
    for level in ("listing", "full"):
        out = subprocess.run([sys.executable, "-c", verify, level], env=emulator, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0 and out.stdout.startswith("OK gs://caches/v: 6 shards"), out.stdout + out.stderr
    # A flipped byte in the bucket: listing passes, full names the record; a truncated shard: both fail.
    original = (cache / SHARD).read_bytes()
    damaged = bytearray(original)
    damaged[starts[1] + 13] ^= 0x10
    (cache / "flipped").write_bytes(bytes(damaged))
    (cache / "cut").write_bytes(original[:-5])
    for name, expected in (("flipped", {"listing": "OK", "full": f"shard {SHARD}: record 1 at byte offset "
                                                                  f"{starts[1]}: the CRC of the record data"}),
                           ("cut", {"listing": "bytes but the manifest says", "full": "truncated shard"})):
        put = f"from gcsfs import GCSFileSystem\nGCSFileSystem().put_file({str(cache / name)!r}, 'caches/v/{SHARD}')\n"
        assert _on_gcs(emulator, put).returncode == 0
        for level, text in expected.items():
            out = subprocess.run([sys.executable, "-c", verify, level], env=emulator, capture_output=True, text=True,
                                 timeout=300)
            assert text in out.stdout and out.returncode == (0 if text == "OK" else 1), (name, level, out.stdout)
