"""The origins sidecar (``taskdata.cache.origins``): what the cache job writes, what verification checks, and
the ledger answering from it exactly as it answers from the records.

``tests/data/old_caches/format_4_before_origins.tar.gz`` holds two caches built by taskdata just before the
sidecar existed (commit 9e71447, ``tests.test_cache_job.build``, split train): ``toy_random`` with seed 3 in
2 shards and ``toy_det`` with seed 0 in 3 shards. The same tasks built now hold the same record bytes, plus
the sidecars; everything the ledger says about them must be the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from server.main import create_app
from server.settings import Settings
from taskdata.cache.format import (
    FORMAT_SEQIO_PROVENANCE,
    CacheFormatError,
    Manifest,
    SidecarEntry,
    current_version,
    load_manifest,
    manifest_bytes,
)
from taskdata.cache.origins import OriginsCollector, origins_sidecar, read_origins
from taskdata.cache.provenance import ORIGIN
from taskdata.cache.reader import CacheReader
from taskdata.cache.tfrecord import iter_records
from taskdata.cache.verify import verify_version
from taskdata.cli import main
from taskdata.example import decode_batch, encode_example
from taskdata.index import BatchSchedule, RunPlan, TaskCache
from taskdata.runs import RunStore, StoredRun, example_ledger, open_views, step_ledger
from tests.cache_helpers import build, files_of

pytestmark = pytest.mark.slow  # cache jobs (Beam)

OLD_CACHES = Path(__file__).resolve().parent / "data" / "old_caches" / "format_4_before_origins.tar.gz"
SHARD = "train.tfrecord-00001-of-00003"
SIDECAR = f"index/{SHARD}.origins"
MULTI_PROCESS = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")


@pytest.fixture(autouse=True)
def _worker_import_path(monkeypatch):
    root = str(Path(__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))


def record_origins(version_dir: str, split: str = "train") -> list[np.ndarray]:
    """Each shard's records' own ``provenance/origin``, read from the records: ``[records, 4]`` per shard."""
    out = []
    for shard in load_manifest(version_dir).split(split).shards:
        with open(os.path.join(version_dir, shard.file), "rb") as f:
            records = list(iter_records(f, shard.file))
        origin = decode_batch(records, {ORIGIN: "int64"})[ORIGIN]
        assert np.all(np.diff(origin.row_splits) == 4)
        out.append(np.asarray(origin.values).reshape(-1, 4))
    return out


def assert_sidecars_are_the_records_origins(version_dir: str, split: str = "train") -> None:
    manifest = load_manifest(version_dir)
    listed = manifest.split(split).origins
    assert listed is not None and len(listed) == len(manifest.split(split).shards)
    with CacheReader(version_dir) as reader:
        for shard, (entry, expected) in enumerate(zip(listed, record_origins(version_dir, split), strict=True)):
            data = (Path(version_dir) / entry.file).read_bytes()
            assert hashlib.sha256(data).hexdigest() == entry.sha256
            assert entry.file == f"index/{manifest.split(split).shards[shard].file}.origins"
            every = np.arange(len(expected))
            assert np.array_equal(read_origins(data, entry.file, len(expected)).rows(every), expected)
            table = reader.shard_origins(split, shard)
            assert table is not None and np.array_equal(table.rows(every), expected)


# --- what the cache job writes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "num_shards", "beam_args"),
    [("toy_det", 1, ()), ("toy_det", 4, ()), ("toy_random", 3, ()), ("toy_random", 3, MULTI_PROCESS),
     ("toy_lengths", 2, MULTI_PROCESS)],
    ids=["toy_det-1", "toy_det-4", "toy_random-3", "toy_random-3-multi-process", "toy_lengths-2-multi-process"],
)
def test_every_shards_sidecar_is_its_records_origins_row_for_row(tmp_path, task, num_shards, beam_args):
    version_dir = build(tmp_path, task=task, num_shards=num_shards, beam_args=beam_args).version_dir
    for split in ("train", "validation"):
        assert_sidecars_are_the_records_origins(version_dir, split)
    assert verify_version(version_dir) == [] and verify_version(version_dir, level="listing") == []


@pytest.mark.slow
def test_the_sidecars_are_byte_identical_in_process_and_multi_process_and_differ_with_the_seed(tmp_path):
    one = files_of(build(tmp_path / "a", task="toy_random", num_shards=3).version_dir)
    many = files_of(build(tmp_path / "b", task="toy_random", num_shards=3, beam_args=MULTI_PROCESS).version_dir)
    other = files_of(build(tmp_path / "c", task="toy_random", num_shards=3, seed=1).version_dir)
    sidecars = [name for name in one if name.endswith(".origins")]
    assert len(sidecars) == 6 and one == many
    assert all(other[name] != one[name] for name in sidecars)  # another seed: another order of records


def test_a_packed_cache_has_no_sidecar(tmp_path):
    version_dir = build(tmp_path, task="toy_packed", num_shards=2, splits=("train",)).version_dir
    assert load_manifest(version_dir).split("train").origins is None
    assert not list(Path(version_dir).glob("index/*.origins"))


@pytest.mark.parametrize(
    ("task", "num_shards"),
    [("c4_span_corruption", 2), ("c4_prefix_lm", 3), ("c4_mlm", 1), ("c4_sentence_prefix_lm", 2),
     ("c4_sentence_prefix_lm_packed", 2)],
)
def test_the_built_in_tasks_write_sidecars_that_are_their_records_origins(c4_folder, tiny_sp_model, task, num_shards):
    root = c4_folder / "caches" / f"{task}-{num_shards}"
    assert main(["cache", "--task", task, "--c4-dir", str(c4_folder), "--vocab", tiny_sp_model, "--output", str(root),
                 "--home", str(c4_folder / "home"), "--num-shards", str(num_shards), "--split", "train",
                 "--quiet"]) == 0
    version_dir = current_version(str(root / task))
    assert version_dir is not None
    if task.endswith("_packed"):  # rows of several examples: no sidecar (and the ledger refuses them)
        assert load_manifest(version_dir).split("train").origins is None
        return
    assert sum(len(rows) for rows in record_origins(version_dir)) > 20
    assert_sidecars_are_the_records_origins(version_dir)


# --- the file and the manifest entry ------------------------------------------------------------


def test_a_sidecar_round_trips_each_number_in_the_fewest_bytes_and_refuses_what_is_not_one():
    rows = np.array([[0, 5, 7, 0], [2, 9, 11, 3], [1, 70_000, 2**40, 255]], np.int64)
    data = origins_sidecar(rows)
    table = read_origins(data, "x.origins", 3)
    assert [column.dtype.itemsize for column in table.columns] == [1, 4, 8, 1]
    assert len(data) == 24 + 8 + 16 + 24 + 8  # each column padded to 8 bytes
    assert len(table) == 3 and np.array_equal(table.rows(np.array([2, 0, 2])), rows[[2, 0, 2]])
    assert np.array_equal(read_origins(origins_sidecar(np.array([[2**63 - 1] * 4])), "big", 1).rows(np.array([0])),
                          [[2**63 - 1] * 4])
    assert len(read_origins(origins_sidecar(np.zeros((0, 4), np.int64)), "empty", 0)) == 0
    for bad, message in [
        (data[:10], "Origins sidecar x.origins has 10 bytes, fewer than its 24-byte header; it is truncated"),
        (data[:-1], "Origins sidecar x.origins says 3 records in 79 bytes; its shard has 3 records, which take 80"),
        (b"TDOFFSET" + data[8:], "is not a taskdata origins file of version 1 (magic b'TDOFFSET', version 1, column "
                                 "widths [1, 4, 8, 1])"),
        (data[:12] + bytes([3]) + data[13:], "column widths [3, 4, 8, 1]"),
    ]:
        with pytest.raises(ValueError, match="rebuild it") as error:
            read_origins(bad, "x.origins", 3)
        assert message in str(error.value)
    with pytest.raises(ValueError, match="says 3 records in 80 bytes; its shard has 4 records"):
        read_origins(data, "x.origins", 4)
    for rows in (np.zeros((2, 3), np.int64), np.array([[0, -1, 0, 0]])):
        with pytest.raises(ValueError, match=r"\[records, 4\] array of numbers >= 0"):
            origins_sidecar(rows)


def test_the_collector_passes_records_through_and_names_one_without_an_origin():
    records = [encode_example({ORIGIN: [0, i, i, 0], "x": [i]}) for i in range(5000)]  # more than one chunk
    collector = OriginsCollector("shard-7")
    assert list(collector.passed(iter(records))) == records
    assert collector.rows()[:, 1].tolist() == list(range(5000))
    wrong = OriginsCollector("shard-7")
    with pytest.raises(ValueError, match=f"Record 1 of shard shard-7 has 8 {ORIGIN} values; a record of one example"):
        list(wrong.passed([records[0], encode_example({ORIGIN: [0, 1, 1, 0] * 2})]))
    with pytest.raises(ValueError, match=f"Record 4097 of shard shard-7: has no feature '{ORIGIN}'; it has"):
        list(OriginsCollector("shard-7").passed([*records[:4097], encode_example({"x": [1]})]))


def test_manifest_entries_name_a_file_under_index_and_only_format_4_examples_list_them():
    good = "0" * 64
    for file, sha in [("index/../x.origins", good), ("x.origins", good), ("index/a/b.origins", good),
                      ("index/a.origins", "abc")]:
        with pytest.raises(CacheFormatError, match="names a file directly under index/"):
            SidecarEntry(file, sha, 24)
    for size in (-1, 2.5, True, "24"):
        with pytest.raises(CacheFormatError, match=f"must give its size as a non-negative integer.*{size!r}"):
            SidecarEntry("index/a.origins", good, size)  # type: ignore[arg-type]
    with tarfile.open(OLD_CACHES) as archive:
        data = json.load(archive.extractfile(next(m for m in archive.getmembers() if m.name.endswith("manifest.json"))))
    assert "origins" not in data["splits"]["train"]
    shards = len(data["splits"]["train"]["shards"])
    data["splits"]["train"]["origins"] = [{"file": f"index/s{i}.origins", "sha256": good, "bytes": 24}
                                       for i in range(shards)]
    assert len(Manifest.from_json(data).split("train").origins or ()) == shards
    sizeless = json.loads(json.dumps(data))
    del sizeless["splits"]["train"]["origins"][0]["bytes"]  # as ledgerside's manifests were (never released)
    with pytest.raises(CacheFormatError, match=r"exactly the keys file, sha256 and bytes but got \['file', 'sha256'\]"
                       r".*must be rebuilt"):
        Manifest.from_json(sizeless)
    seqio_style = {name: value for name, value in data["splits"]["train"].items() if name != "source_files"}
    for change in ({"format": FORMAT_SEQIO_PROVENANCE, "splits": {"train": seqio_style}},
                   {"packing": {"lengths": {"targets": 8}, "open_rows": 1}}):
        with pytest.raises(CacheFormatError, match="list origins sidecars, which only a format taskdata.cache/4 cache"):
            Manifest.from_json({**data, **change})
    data["splits"]["train"]["origins"].pop()
    with pytest.raises(CacheFormatError, match=f"A split of {shards} shards lists {shards - 1} origins sidecars"):
        Manifest.from_json(data)


# --- the ledger with and without sidecars --------------------------------------------------------


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """(cache root of the caches built before the sidecar, cache root of the same caches built now), each with
    run ``pair`` over both tasks."""
    old = tmp_path_factory.mktemp("old") / "caches"
    with tarfile.open(OLD_CACHES) as archive:
        archive.extractall(old, filter="data")
    new = tmp_path_factory.mktemp("new") / "caches"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent) + os.pathsep
                     + os.environ.get("PYTHONPATH", ""))
        build(new, task="toy_random", seed=3, num_shards=2, splits=("train",))
        build(new, task="toy_det", seed=0, num_shards=3, splits=("train",))
    for root in (old, new):
        RunStore(str(root)).create(StoredRun(pair_plan(root)))
    return old, new


def version(root: Path, task: str) -> str:
    found = current_version(str(root / task))
    assert found is not None
    return found


def pair_plan(root: Path) -> RunPlan:
    caches = {}
    for task in ("toy_det", "toy_random"):
        with CacheReader(version(root, task)) as reader:
            caches[task] = TaskCache(reader.manifest_sha256, reader.record_counts("train"))
    return RunPlan(name="pair", mixture="pair", caches=caches, rates={"toy_det": 1, "toy_random": 2}, seed=11,
                   schedule=BatchSchedule(start=24, end=24), num_data_shards=4)


def test_the_old_caches_are_the_same_records_without_sidecars(roots):
    old, new = roots
    for task in ("toy_det", "toy_random"):
        before, now = files_of(version(old, task)), files_of(version(new, task))
        assert load_manifest(version(old, task)).split("train").origins is None
        assert {n for n in now if n.endswith(".origins")} == set(now) - set(before)
        assert all(before[n] == now[n] for n in before if ".tfrecord-" in n)  # records and offsets: the same bytes
        # A manifest without sidecars reads and writes back byte for byte: nothing in it is misread.
        manifest = Path(version(old, task)) / "manifest.json"
        assert manifest_bytes(Manifest.from_json(json.loads(manifest.read_bytes()))) == manifest.read_bytes()
        assert verify_version(version(old, task)) == []


@pytest.fixture
def records_read(monkeypatch):
    """The version folders whose records are read (``CacheReader.read_spans``) while the fixture is in use."""
    seen: list[str] = []
    original = CacheReader.read_spans

    def counting(self, *args, **kwargs):
        seen.append(self.version_dir)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CacheReader, "read_spans", counting)
    return seen


def without_fingerprints(answer: dict) -> dict:
    # The plans differ only in the caches' manifest sha256s (one manifest lists sidecars): so do their fingerprints.
    return {k: v for k, v in answer.items() if k != "fingerprint"}


@pytest.mark.parametrize("step", [0, 1, 7, 40, 10**6, 10**9])
def test_the_ledger_answers_the_same_from_sidecars_as_from_records(roots, records_read, step):
    ledgers, found = [], []
    for root in roots:
        plan = pair_plan(root)
        views = open_views(plan, str(root))
        try:
            ledger = step_ledger(plan, views, step)
            ledgers.append(ledger)
            found.append([example_ledger(plan, views, e.id, from_step=step, until_step=step + 1000, limit=3).to_dict()
                          for e in ledger.entries[::5]])
            assert step_ledger(plan, views, step, host=1, num_hosts=2).entries == ledger.entries[12:]  # data shards 2 and 3
        finally:
            for view in views.values():
                view.close()
    old, new = ledgers
    assert len(new.entries) == 24 and {e.task for e in new.entries} == {"toy_det", "toy_random"}
    assert old.entries == new.entries and old.to_dict()["examples"] == new.to_dict()["examples"]
    assert [without_fingerprints(a) for a in found[0]] == [without_fingerprints(a) for a in found[1]]
    assert all(f["reads"][0]["step"] == step for f in found[1])
    # The old caches' answers came from their records; the new ones' from the sidecars alone.
    old_root, new_root = (str(root) for root in roots)
    assert any(v.startswith(old_root) for v in records_read) and not any(v.startswith(new_root) for v in records_read)


def test_the_ledger_command_and_http_answer_the_same_with_and_without_sidecars(roots, capsys):
    answers = []
    for root in roots:
        cli = []
        for args in (["--step", "9"], ["--step", "123456789"], ["--step", "5", "--host", "3", "--num-hosts", "4"]):
            assert main(["ledger", "pair", *args, "--json", "--cache-root", str(root)]) == 0
            cli.append(json.loads(capsys.readouterr().out))
        example = cli[0]["examples"][3]["id"]
        assert main(["ledger", "pair", "--example", example, "--until-step", "300", "--json",
                     "--cache-root", str(root)]) == 0
        cli.append(json.loads(capsys.readouterr().out))
        with TestClient(create_app(Settings(cache_root=str(root)))) as client:
            http = [client.get("/runs/pair/ledger", params=params) for params in
                    ({"step": 9}, {"step": 123456789}, {"step": 5, "host": 3, "num_hosts": 4},
                     {"example": example, "until_step": 300})]
        assert all(r.status_code == 200 for r in http), [r.text for r in http]
        answers.append(([without_fingerprints(a) for a in cli], [without_fingerprints(r.json()) for r in http]))
    (old_cli, old_http), (new_cli, new_http) = answers
    assert old_cli == new_cli and old_http == new_http
    assert [a["examples"] for a in new_cli[:3]] == [a["examples"] for a in new_http[:3]]
    assert new_cli[3]["total"] == new_http[3]["total"] > 0


# --- verification ---------------------------------------------------------------------------------


def _edit_row(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[24 + 8] ^= 0x01  # record 8's source shard: a sidecar that still parses, naming another example
    path.write_bytes(bytes(data))


_MISMATCH = f"shard {SHARD}: origins sidecar {SIDECAR} does not match its checksum in the manifest"
_MISSING = f"origins sidecar {SIDECAR} of shard {SHARD} is missing"


_SIZED = "size"  # listing: "shard S: origins sidecar F has N bytes but the manifest says M", N and M from the files
# What each level says of each damage: full hashes every sidecar; listing reads none, so it sees only what the
# listing of index/ shows (an edit at the same size is the ledger's to refuse: it hashes a sidecar on first use).
DAMAGE = {
    "deleted": (lambda p: p.unlink(), {"full": _MISSING, "listing": _MISSING}),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:-8]), {"full": _MISMATCH, "listing": _SIZED}),
    "edited": (_edit_row, {"full": _MISMATCH, "listing": None}),
    "extended": (lambda p: p.write_bytes(p.read_bytes() + bytes(32)), {"full": _MISMATCH, "listing": _SIZED}),
}


@pytest.fixture
def damaged_root(roots, tmp_path):
    root = tmp_path / "caches"
    shutil.copytree(roots[1], root)
    return root


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_verification_at_either_level_names_a_damaged_sidecar(damaged_root, capsys, damage):
    harm, messages = DAMAGE[damage]
    version_dir = version(damaged_root, "toy_det")
    harm(Path(version_dir) / SIDECAR)
    size = (Path(version_dir) / SIDECAR).stat().st_size if damage != "deleted" else None
    for level in ("listing", "full"):
        message = messages[level]
        if message is None:  # listing reads no origins sidecar: the ledger below refuses the edit
            assert verify_version(version_dir, level=level) == []
            assert main(["verify", "--level", level, version_dir]) == 0
            continue
        if message == _SIZED:
            built = (load_manifest(version_dir).split("train").origins or ())[1].bytes
            assert size != built
            message = f"shard {SHARD}: origins sidecar {SIDECAR} has {size} bytes but the manifest says {built} "
        problems = verify_version(version_dir, level=level)
        assert len(problems) == 1 and problems[0].startswith(message), (level, problems)
        assert main(["verify", "--level", level, version_dir]) == 1
        assert message in capsys.readouterr().out
    # Negative control: the ledger never answers from it; it says which file to rebuild from.
    plan = pair_plan(damaged_root)
    views = open_views(plan, str(damaged_root))
    try:
        with pytest.raises(CacheFormatError, match=f"Origins sidecar .*{SIDECAR}.*rebuild"):
            views["toy_det"].find(views["toy_det"].ids(np.array([1]), np.array([0]))[0])
        with pytest.raises(CacheFormatError, match=f"Origins sidecar .*{SIDECAR}.*rebuild"):
            for step in range(10**6, 10**6 + 50):  # until a step reads that shard of toy_det
                step_ledger(plan, views, step)
    finally:
        for view in views.values():
            view.close()


def test_a_sidecar_that_parses_but_is_not_the_builds_would_name_other_examples(roots, damaged_root):
    # Why the checksum matters: the edited row is a valid sidecar of other provenance, not noise.
    version_dir = version(damaged_root, "toy_det")
    entry = load_manifest(version_dir).split("train").shards[1]
    edited = Path(version_dir) / SIDECAR
    _edit_row(edited)
    rows = read_origins(edited.read_bytes(), SIDECAR, entry.records).rows(np.arange(entry.records))
    assert not np.array_equal(rows, record_origins(version(roots[1], "toy_det"))[1])


def test_the_servers_first_use_refuses_a_cache_with_a_damaged_sidecar(damaged_root):
    for level in ("full", "listing"):
        with TestClient(create_app(Settings(cache_root=str(damaged_root), first_use_check=level))) as client:
            assert client.get("/shards", params={"run": "pair", "host": 0, "step": 0}).status_code == 200
    sidecar = Path(version(damaged_root, "toy_det")) / SIDECAR
    build = sidecar.read_bytes()
    for damage, level in (("edited", "full"), ("truncated", "listing"), ("extended", "listing")):
        sidecar.write_bytes(build)
        harm, messages = DAMAGE[damage]
        harm(sidecar)
        with TestClient(create_app(Settings(cache_root=str(damaged_root), first_use_check=level))) as client:
            response = client.get("/shards", params={"run": "pair", "host": 0, "step": 0})
            assert response.status_code == 503, response.text
            assert "Cache of task 'toy_det' is not available: verification of" in response.json()["detail"]
            expected = messages[level] if messages[level] != _SIZED else f"origins sidecar {SIDECAR} has "
            assert expected in response.json()["detail"]
            assert client.get("/runs/pair/ledger", params={"step": 0}).status_code == 503


def test_the_ledger_reads_sidecars_on_gcs_and_answers_as_locally(roots, capsys):
    from tests.gcs_emulator import gcs_emulator

    new = roots[1]
    assert main(["ledger", "pair", "--step", "1000000", "--json", "--cache-root", str(new)]) == 0
    local = json.loads(capsys.readouterr().out)
    ledger = ("import sys\nfrom taskdata.cli import main\n"
              "sys.exit(main(['ledger', 'pair', '--step', '1000000', '--json', '--cache-root', 'gs://caches/root']))\n")
    with gcs_emulator("caches") as env:
        upload = f"from gcsfs import GCSFileSystem\nGCSFileSystem().put({str(new)!r}, 'caches/root', recursive=True)\n"
        assert subprocess.run([sys.executable, "-c", upload], env=env, timeout=300).returncode == 0
        out = subprocess.run([sys.executable, "-c", ledger], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == local
        edited = Path(version(new, "toy_det")) / SIDECAR
        data = bytearray(edited.read_bytes())
        data[24 + 8] ^= 0x01
        remote = f"caches/root/toy_det/{Path(version(new, 'toy_det')).name}/{SIDECAR}"
        put = f"from gcsfs import GCSFileSystem\nGCSFileSystem().pipe({remote!r}, {bytes(data)!r})\n"
        assert subprocess.run([sys.executable, "-c", put], env=env, timeout=300).returncode == 0
        out = subprocess.run([sys.executable, "-c", ledger.replace("1000000", "1000003")], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode != 0 and f"Origins sidecar gs://{remote} does not match its checksum" in out.stderr, (
            out.stdout + out.stderr)
