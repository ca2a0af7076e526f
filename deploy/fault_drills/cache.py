"""Cache drills: kill the cache job, damage finished caches, truncate shards under readers.

Every drill works in its own temporary folder on local disk, starts only processes it stops itself
(by process group id), and returns counts: what was done and how much of it was caught and located;
``ok`` says whether every expectation held.

- ``cache-sigkill-in-process`` / ``cache-sigkill-multi-process``: ``taskdata cache`` SIGKILLed at random
  moments (up to the length of an unkilled build, so kills land in every phase, the commit included),
  with Beam's in-process runner and with its multi-process runner. After every kill: every version
  marked complete verifies, CURRENT names a complete version; at the end a rerun is byte-identical
  to an unkilled build.
- ``cache-kill-between-completed-and-current``: the job killed exactly between a new version's
  COMPLETED and the move of CURRENT, after the task's definition changed (another source folder, as
  with another ``--c4-dir``). ``taskdata plan`` must refuse the stale CURRENT; the rerun that reuses the
  new version must move CURRENT to it; ``plan`` must then pin that version.
- ``cache-byte-flips``: single-bit flips stratified over a frame's length field, length CRC, payload,
  payload CRC and the last record of a shard; each must be caught by ``taskdata verify`` and by the
  trainer's read path (``CacheReader.read_records``), both naming the flipped record and its offset.
- ``cache-structural-damage``: truncated, extended, deleted and swapped shards, records swapped inside
  a shard, edited manifests, sidecars and markers; each must be caught (and located where it is one
  record's damage).
- ``cache-truncate-under-reader``: a reader process reads a shard in a loop while it is truncated at a
  random moment and place; the reader must get a ``CorruptRecordError`` naming the cut record, never a
  bus error.
- ``cache-abandoned-versions``: jobs killed before their commit leave incomplete versions; the next job
  removes those whose lease went stale, keeps one a live job is writing, never touches a complete one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

REPO = str(Path(__file__).resolve().parent.parent.parent)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from taskdata.cache.format import CURRENT, current_version, list_versions, load_manifest  # noqa: E402
from taskdata.cache.reader import CacheReader  # noqa: E402
from taskdata.cache.tfrecord import CorruptRecordError  # noqa: E402
from taskdata.cache.verify import verify_version  # noqa: E402

__all__ = ["DRILLS"]

MODULE = "deploy.fault_drills._tasks"
MULTI_PROCESS = ("--", "--direct_running_mode=multi_processing", "--direct_num_workers=2")
# Runs the command line with CURRENT's swap held back: the process says so on stdout, then waits to be killed.
_HOLD_CURRENT = (
    "import sys, time\n"
    "from taskdata import cas\n"
    "swap = cas.swap\n"
    "def held(version, data):\n"
    "    if version.path.endswith('/CURRENT'):\n"
    "        print('HOLDING-CURRENT', flush=True)\n"
    "        time.sleep(600)\n"
    "    return swap(version, data)\n"
    "cas.swap = held\n"
    "from taskdata.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


class DrillFailure(AssertionError):
    """A drill whose setup did not go as planned (not a finding: findings are counted)."""


@contextlib.contextmanager
def _work_dir(name: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"taskdata-{name}-") as folder:
        yield Path(folder)


def _env(work: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKDATA_")}
    env.update(PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""), TASKDATA_HOME=str(work / "home"), **extra)
    return env


def _cache_command(output: Path, task: str = "drill_docs", *extra: str) -> list[str]:
    return [sys.executable, "-m", "taskdata", "cache", "--task", task, "--module", MODULE, "--output", str(output),
            "--num-shards", "3", "--quiet", *extra]


def _run(command: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)


def _files_of(version_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(version_dir)): p.read_bytes() for p in sorted(version_dir.rglob("*")) if p.is_file()}


def _check_root(task_root: Path) -> tuple[int, int, int]:
    """(complete versions, complete versions that fail verification, CURRENT not naming a complete version)."""
    complete = bad = 0
    for marker in task_root.glob("v*/COMPLETED"):
        complete += 1
        if verify_version(str(marker.parent)) != []:
            bad += 1
    dangling = 0
    if (task_root / CURRENT).exists():
        current = current_version(str(task_root))
        dangling = int(current is None or not Path(current, "COMPLETED").exists())
    return complete, bad, dangling


def sigkill(kills: int = 25, seed: int = 0, multi_process: bool = False, max_attempts: int | None = None) -> dict:
    """Random-time SIGKILLs of ``taskdata cache``; nothing incomplete may look complete."""
    rng = random.Random(seed)
    extra = ("--force", *(MULTI_PROCESS if multi_process else ()))
    with _work_dir("sigkill") as work:
        env = _env(work)
        started = time.monotonic()
        reference = _run(_cache_command(work / "reference", "drill_docs", *extra), env)
        reference_seconds = time.monotonic() - started
        shortest_build = reference_seconds  # kills are drawn within it
        if reference.returncode != 0:
            raise DrillFailure(f"the unkilled reference build failed: {reference.stderr[-2000:]}")
        output = work / "crashy"
        task_root = output / "drill_docs"
        counts = {"runs": 0, "killed": 0, "finished_before_kill": 0, "complete_versions_left_by_killed_runs": 0,
                  "complete_looking_but_failing_verify": 0, "current_not_naming_a_complete_version": 0}
        phases: dict[str, int] = {}
        while counts["killed"] < kills and counts["runs"] < (max_attempts or 3 * kills):
            counts["runs"] += 1
            before = set(list_versions(str(task_root)))
            complete_before = len(list(task_root.glob("v*/COMPLETED")))
            process = subprocess.Popen(_cache_command(output, "drill_docs", *extra), env=env, cwd=REPO,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            delay = rng.uniform(0.05, shortest_build)
            time.sleep(delay)
            if process.poll() is None:
                _kill_group(process)
                counts["killed"] += 1
                complete, bad, dangling = _check_root(task_root)
                counts["complete_versions_left_by_killed_runs"] += complete - complete_before
                new = sorted(set(list_versions(str(task_root))) - before)
                phase = _phase(task_root / new[-1]) if new else "before_its_version_folder"
                phases[phase] = phases.get(phase, 0) + 1
            else:
                process.wait()
                counts["finished_before_kill"] += 1
                # Builds can be faster than the reference one (a machine less loaded now): later kills are drawn
                # within the time this one is known to have taken, so that they land inside a build.
                shortest_build = min(shortest_build, delay)
                complete, bad, dangling = _check_root(task_root)
            counts["complete_looking_but_failing_verify"] += bad
            counts["current_not_naming_a_complete_version"] += dangling
        counts["kills_by_phase"] = dict(sorted(phases.items()))
        final = _run(_cache_command(output, "drill_docs", *extra), env)
        reference_dir = next((work / "reference" / "drill_docs").glob("v*/COMPLETED")).parent
        current = Path(current_version(str(task_root)) or "")
        counts["rerun_byte_identical_to_unkilled_build"] = int(
            final.returncode == 0 and _files_of(current) == _files_of(reference_dir))
        counts["unkilled_build_seconds"] = round(reference_seconds, 2)
        counts["ok"] = (counts["killed"] == kills and counts["complete_looking_but_failing_verify"] == 0
                        and counts["current_not_naming_a_complete_version"] == 0
                        and counts["rerun_byte_identical_to_unkilled_build"] == 1)
        return counts


def _phase(version_dir: Path) -> str:
    """How far a killed build got, from what its version folder holds."""
    if (version_dir / "COMPLETED").exists():
        return "after_completed"
    if (version_dir / "manifest.json").exists():
        return "between_manifest_and_completed"
    if list(version_dir.glob("*.tfrecord-*")):
        return "writing_or_verifying_shards"
    return "preprocessing"


def sigkill_in_process(kills: int = 25, seed: int = 0) -> dict:
    return sigkill(kills, seed, multi_process=False)


def sigkill_multi_process(kills: int = 25, seed: int = 1) -> dict:
    return sigkill(kills, seed, multi_process=True)


def kill_between_completed_and_current(rounds: int = 10) -> dict:
    """The stale-pointer case, aimed at: killed after COMPLETED, before CURRENT, with a changed definition."""
    counts = {"aimed_kills": 0, "current_left_on_the_other_definition": 0, "plan_refused_the_stale_current": 0,
              "rerun_reused_and_moved_current": 0, "plan_pinned_the_reported_version": 0}
    with _work_dir("stale-pointer") as work:
        folders = []
        for name, lines in (("a", ["one line", "another line"]), ("b", ["other text", "and more of it", "three"])):
            folder = work / name
            folder.mkdir()
            (folder / "doc.txt").write_text("".join(line + "\n" for line in lines))
            folders.append(folder)
        output = work / "cache"
        task_root = output / "drill_text"
        first = _run(_cache_command(output, "drill_text"), _env(work, TASKDATA_DRILL_TEXT_DIR=str(folders[0])))
        if first.returncode != 0:
            raise DrillFailure(f"the first build failed: {first.stderr[-2000:]}")
        for round_ in range(rounds):
            env = _env(work, TASKDATA_DRILL_TEXT_DIR=str(folders[(round_ + 1) % 2]))
            old_current = (task_root / CURRENT).read_text()
            held = subprocess.Popen([sys.executable, "-c", _HOLD_CURRENT, *_cache_command(output, "drill_text",
                                                                                          "--force")[3:]],
                                    env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                    start_new_session=True)
            try:
                line = held.stdout.readline() if held.stdout else ""
            finally:
                _kill_group(held)
            if line.strip() != "HOLDING-CURRENT":
                raise DrillFailure("the held build did not reach its commit")
            counts["aimed_kills"] += 1
            counts["current_left_on_the_other_definition"] += (task_root / CURRENT).read_text() == old_current
            plan = ["plan", "--module", MODULE, "--name", f"r{round_}", "--mixture", "drill_text", "--cache-root",
                    str(output), "--seed", "0", "--batch-size", "2", "--num-data-shards", "1"]
            refused = _run([sys.executable, "-m", "taskdata", *plan], env)
            counts["plan_refused_the_stale_current"] += (
                refused.returncode != 0 and "was built from another definition" in refused.stderr)
            rerun = _run(_cache_command(output, "drill_text"), env)
            reported = rerun.stdout.strip().splitlines()[-1] if rerun.stdout.strip() else ""
            counts["rerun_reused_and_moved_current"] += (
                rerun.returncode == 0 and "reusing complete cache" in rerun.stderr
                and current_version(str(task_root)) == reported)
            planned = _run([sys.executable, "-m", "taskdata", *plan], env)
            pinned = reported and CacheReader(reported).manifest_sha256
            counts["plan_pinned_the_reported_version"] += (
                planned.returncode == 0
                and bool(pinned) and pinned in (output / "_runs" / f"r{round_}.json").read_text())
    counts["ok"] = set(counts.values()) == {rounds}
    return counts


def _build_in_process(output: Path) -> str:
    from taskdata.beam.job import CacheOptions, run_cache_job
    from taskdata.define.registry import Registry

    registry = Registry()
    registry.load_module(MODULE)
    options = CacheOptions(task="drill_docs", output=str(output), num_shards=3, modules=(MODULE,), progress=False)
    return run_cache_job(options, registry, log=lambda message: None).version_dir


def _frame_strata(offsets: np.ndarray, record: int) -> dict[str, tuple[int, int]]:
    start, end = int(offsets[record]), int(offsets[record + 1])
    return {"length": (start, start + 8), "length_crc": (start + 8, start + 12), "payload": (start + 12, end - 4),
            "payload_crc": (end - 4, end)}


def _caught(version_dir: str, split: str, shard_file: str, shard: int, record: int, offset: int) -> dict[str, int]:
    """Whether verify and the trainer's read path catch damage to ``record``, and name it and its offset."""
    problems = verify_version(version_dir)
    out = {"detected_by_verify": int(bool(problems)),
           "located_by_verify": int(bool(problems) and problems[0].startswith(
               f"shard {shard_file}: record {record} at byte offset {offset}:"))}
    try:
        with CacheReader(version_dir) as reader:
            reader.read_records(split, [shard], [record])
        out.update(detected_by_reader=0, located_by_reader=0)
    except CorruptRecordError as e:
        out.update(detected_by_reader=1, located_by_reader=int((e.record_index, e.byte_offset) == (record, offset)))
    return out


def byte_flips(per_stratum: int = 200, seed: int = 0) -> dict:
    """Single-bit flips stratified over a frame's fields and the last record; each caught and located."""
    rng = random.Random(seed)
    strata = ("length", "length_crc", "payload", "payload_crc", "last_record")
    counts = {s: dict.fromkeys(("flips", "detected_by_verify", "located_by_verify", "detected_by_reader",
                                "located_by_reader"), 0) for s in strata}
    with _work_dir("flips") as work:
        version_dir = _build_in_process(work / "cache")
        manifest = load_manifest(version_dir)
        reader = CacheReader(version_dir)
        shards = [(split, i, entry.file) for split, m in sorted(manifest.splits.items())
                  for i, entry in enumerate(m.shards) if entry.records]
        for stratum in strata:
            for _ in range(per_stratum):
                split, shard, shard_file = rng.choice(shards)
                offsets = reader.shard_offsets(split, shard)
                record = len(offsets) - 2 if stratum == "last_record" else rng.randrange(len(offsets) - 1)
                if stratum == "last_record":
                    lo, hi = int(offsets[record]), int(offsets[record + 1])
                else:
                    lo, hi = _frame_strata(offsets, record)[stratum]
                position = rng.randrange(lo, hi)
                path = Path(version_dir, shard_file)
                original = path.read_bytes()
                damaged = bytearray(original)
                damaged[position] ^= 1 << rng.randrange(8)
                path.write_bytes(bytes(damaged))
                try:
                    found = _caught(version_dir, split, shard_file, shard, record, int(offsets[record]))
                finally:
                    path.write_bytes(original)
                counts[stratum]["flips"] += 1
                for key, value in found.items():
                    counts[stratum][key] += value
        reader.close()
        if verify_version(version_dir) != []:
            raise DrillFailure("the cache did not verify after every flip was undone")
    counts["total"] = {key: sum(c[key] for c in counts.values()) for key in counts["length"]}
    counts["ok"] = set(counts["total"].values()) == {5 * per_stratum}
    return counts


def _equal_length_records(offsets: np.ndarray, rng: random.Random) -> tuple[int, int] | None:
    sizes = np.diff(offsets)
    by_size: dict[int, list[int]] = {}
    for i, size in enumerate(sizes.tolist()):
        by_size.setdefault(size, []).append(i)
    pairs = [(a, b) for group in by_size.values() for a, b in itertools.pairwise(group) if b > a + 1]
    return rng.choice(pairs) if pairs else None


def structural_damage(truncations: int = 20, swaps: int = 20, seed: int = 0) -> dict:
    """Truncate, extend, delete and swap shards and records; edit the manifest, sidecars and markers."""
    rng = random.Random(seed)
    results: dict[str, dict[str, int]] = {}

    def count(case: str, detected: bool, located: bool | None = None) -> None:
        entry = results.setdefault(case, {"cases": 0, "detected": 0, "located": 0})
        entry["cases"] += 1
        entry["detected"] += int(detected)
        entry["located"] += int(detected if located is None else located)

    with _work_dir("structural") as work:
        pristine = Path(_build_in_process(work / "cache"))
        manifest = load_manifest(str(pristine))
        train = manifest.splits["train"].shards

        def fresh() -> Path:
            copy = work / "copy" / pristine.name
            if copy.parent.exists():
                shutil.rmtree(copy.parent)
            shutil.copytree(pristine, copy)
            return copy

        def read_error(version_dir: Path, shard: int = 0) -> str | None:
            """What the trainer's read path says about record 0 of ``shard`` (None: it read fine)."""
            try:
                with CacheReader(str(version_dir)) as reader:
                    reader.read_records("train", [shard], [0])
            except (CorruptRecordError, ValueError, OSError) as e:
                return str(e)
            return None

        def verify_error(version_dir: Path) -> str | None:
            try:
                problems = verify_version(str(version_dir))
            except (ValueError, OSError) as e:
                return str(e)
            return problems[0] if problems else None

        def count_file(case: str, message: str | None, *names: str) -> None:
            """Damage to a whole file is located when the error names the file."""
            count(case, message is not None, message is not None and any(n in message for n in names))

        offsets = CacheReader(str(pristine)).shard_offsets("train", 1)
        for _ in range(truncations):
            copy = fresh()
            cut = rng.randrange(1, int(offsets[-1]))
            os.truncate(copy / train[1].file, cut)
            record = int(np.searchsorted(offsets, cut, side="right")) - 1
            problems = verify_version(str(copy))
            count("truncate_shard_verify", bool(problems),
                  bool(problems) and f": record {record} at byte offset {int(offsets[record])}:" in problems[0])
            try:
                with CacheReader(str(copy)) as reader:
                    reader.read_records("train", [1] * train[1].records, list(range(train[1].records)))
                count("truncate_shard_reader", False)
            except CorruptRecordError as e:
                count("truncate_shard_reader", True, (e.record_index, e.byte_offset) == (record, int(offsets[record])))

        copy = fresh()
        with open(copy / train[0].file, "ab") as f:
            f.write(b"appended bytes")  # outside every record: only verify can see it, and the reader need not
        count_file("append_to_shard_verify", verify_error(copy), train[0].file)

        copy = fresh()
        (copy / train[2].file).unlink()
        count_file("delete_shard_verify", verify_error(copy), train[2].file)
        count_file("delete_shard_reader", read_error(copy, 2), train[2].file)

        copy = fresh()
        _swap(copy / train[0].file, copy / train[1].file)
        count_file("swap_shards_verify", verify_error(copy), train[0].file)
        count_file("swap_shards_reader", read_error(copy), train[0].file)

        for _ in range(swaps):
            copy = fresh()
            shard = rng.randrange(len(train))
            shard_offsets = CacheReader(str(copy)).shard_offsets("train", shard)
            pair = _equal_length_records(shard_offsets, rng)
            if pair is None:
                continue
            i, j = pair
            path = copy / train[shard].file
            data = bytearray(path.read_bytes())
            x = slice(int(shard_offsets[i]), int(shard_offsets[i + 1]))
            y = slice(int(shard_offsets[j]), int(shard_offsets[j + 1]))
            data[x], data[y] = data[y], data[x]
            path.write_bytes(bytes(data))
            problems = verify_version(str(copy))
            count("swap_equal_length_records_verify", bool(problems), bool(problems) and problems[0].startswith(
                f"shard {train[shard].file}: record {i} at byte offset {int(shard_offsets[i])}:"))
            try:
                with CacheReader(str(copy)) as reader:
                    reader.read_records("train", [shard, shard], [j, i])
                count("swap_equal_length_records_reader", False)
            except CorruptRecordError as e:
                count("swap_equal_length_records_reader", True,
                      (e.record_index, e.byte_offset) == (i, int(shard_offsets[i])))

        sidecar = train[0].offsets_file
        edits: dict[str, tuple[Callable[[Path], object], tuple[str, ...]]] = {
            "edit_manifest_seed": (lambda c: _replace(c / "manifest.json", b'"seed": 0', b'"seed": 1'),
                                   ("manifest.json",)),
            "edit_manifest_record_count": (lambda c: _replace(
                c / "manifest.json", f'"records": {train[0].records},'.encode(),
                f'"records": {train[0].records - 1},'.encode()), ("manifest.json",)),
            "edit_completed": (lambda c: _flip(c / "COMPLETED", 25), ("COMPLETED",)),
            "delete_completed": (lambda c: (c / "COMPLETED").unlink(), ("COMPLETED",)),
            "flip_sidecar_offset": (lambda c: _flip(c / sidecar, 24 + 8 * 3), (sidecar,)),
            "flip_sidecar_crc": (lambda c: _flip(c / sidecar, -2), (sidecar,)),
            "truncate_sidecar": (lambda c: os.truncate(c / sidecar, 30), (sidecar,)),
            "delete_sidecar": (lambda c: (c / sidecar).unlink(), (sidecar,)),
            "swap_sidecars": (lambda c: _swap(c / sidecar, c / train[1].offsets_file), (sidecar,)),
        }
        for case, (edit, names) in edits.items():
            copy = fresh()
            edit(copy)
            count_file(f"{case}_verify", verify_error(copy), *names)
            count_file(f"{case}_reader", read_error(copy), *names)
    results["total"] = {key: sum(r[key] for r in results.values()) for key in ("cases", "detected", "located")}
    return {**results, "ok": len(set(results["total"].values())) == 1}


def _replace(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    if old not in data:
        raise DrillFailure(f"{path} holds no {old!r} to edit")
    path.write_bytes(data.replace(old, new, 1))


def _flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x10
    path.write_bytes(bytes(data))


def _swap(a: Path, b: Path) -> None:
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


_READ_LOOP = (
    "import sys\n"
    "from taskdata.cache.reader import CacheReader\n"
    "from taskdata.cache.tfrecord import CorruptRecordError\n"
    "reader = CacheReader(sys.argv[1])\n"
    "n = reader.record_counts('train')[0]\n"
    "print('READING', flush=True)\n"
    "try:\n"
    "    while True:\n"
    "        reader.read_records('train', [0] * n, list(range(n)))\n"
    "except CorruptRecordError as e:\n"
    "    print(f'CORRUPT {e.record_index} {e.byte_offset}', flush=True)\n"
)


def truncate_under_reader(rounds: int = 30, seed: int = 0) -> dict:
    """A shard cut short while a reader process reads it in a loop: an error naming the record, no SIGBUS."""
    rng = random.Random(seed)
    counts = {"rounds": 0, "corrupt_record_error": 0, "named_the_cut_record": 0, "killed_by_a_signal": 0}
    with _work_dir("truncate-reader") as work:
        pristine = Path(_build_in_process(work / "cache"))
        entry = load_manifest(str(pristine)).splits["train"].shards[0]
        offsets = CacheReader(str(pristine)).shard_offsets("train", 0)
        for _ in range(rounds):
            copy = work / "copy" / pristine.name
            if copy.parent.exists():
                shutil.rmtree(copy.parent)
            shutil.copytree(pristine, copy)
            reader = subprocess.Popen([sys.executable, "-c", _READ_LOOP, str(copy)], env=_env(work), cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                      start_new_session=True)
            try:
                if reader.stdout is None or reader.stdout.readline().strip() != "READING":
                    raise DrillFailure("the reader process did not start reading")
                time.sleep(rng.uniform(0.0, 0.2))
                cut = rng.randrange(1, int(offsets[-1]))
                os.truncate(copy / entry.file, cut)
                out, _ = reader.communicate(timeout=60)
            finally:
                if reader.poll() is None:
                    _kill_group(reader)
            counts["rounds"] += 1
            record = int(np.searchsorted(offsets, cut, side="right")) - 1
            if reader.returncode < 0:
                counts["killed_by_a_signal"] += 1
            elif out.startswith("CORRUPT"):
                counts["corrupt_record_error"] += 1
                counts["named_the_cut_record"] += out.split()[1:] == [str(record), str(int(offsets[record]))]
    counts["ok"] = counts["corrupt_record_error"] == counts["named_the_cut_record"] == rounds
    return counts


# Runs the command line with the manifest's write held back: a live job, holding its lease, that never ends.
_HOLD_MANIFEST = (
    "import sys, time\n"
    "from taskdata import fs\n"
    "write_atomic = fs.write_atomic\n"
    "def held(path, data):\n"
    "    if path.endswith('/manifest.json'):\n"
    "        print('HOLDING-MANIFEST', flush=True)\n"
    "        time.sleep(600)\n"
    "    write_atomic(path, data)\n"
    "fs.write_atomic = held\n"
    "from taskdata.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def abandoned_versions(kills: int = 12, stale_after_s: float = 3.0, seed: int = 0) -> dict:
    """Killed jobs' incomplete versions are removed once stale; a live job's and complete ones are kept."""
    rng = random.Random(seed)
    with _work_dir("abandoned") as work:
        env = _env(work)
        output = work / "cache"
        task_root = output / "drill_docs"
        patient = ("--force", "--stale-after", "900")  # these jobs remove nothing of the others'
        eager = ("--stale-after", str(stale_after_s))
        started = time.monotonic()
        if _run(_cache_command(output, "drill_docs", *patient), env).returncode != 0:
            raise DrillFailure("the first build failed")
        full_run = time.monotonic() - started
        for _ in range(kills):
            process = subprocess.Popen(_cache_command(output, "drill_docs", *patient), env=env, cwd=REPO,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            time.sleep(rng.uniform(0.3, full_run))
            _kill_group(process)
        complete = {p.parent.name for p in task_root.glob("v*/COMPLETED")}
        left = set(list_versions(str(task_root))) - complete
        live_log = work / "live.log"
        with open(live_log, "w") as log_file:
            live = subprocess.Popen(
                [sys.executable, "-c", _HOLD_MANIFEST, *_cache_command(output, "drill_docs", "--force", *eager)[3:]],
                env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=log_file, text=True, start_new_session=True)
        try:
            if live.stdout is None or live.stdout.readline().strip() != "HOLDING-MANIFEST":
                raise DrillFailure("the live build did not reach its commit")
            time.sleep(stale_after_s * 2)  # every killed job's version is stale now; the live job's lease is not
            cleaner = _run(_cache_command(output, "drill_docs", *eager), env)
            after = set(list_versions(str(task_root)))
        finally:
            _kill_group(live)
        live_versions = after - complete - left
        said = [line for line in live_log.read_text().splitlines() + cleaner.stderr.splitlines()
                if "removed abandoned incomplete version" in line]
        counts = {
            "killed_jobs": kills,
            "complete_versions": len(complete),
            "incomplete_versions_left_by_killed_jobs": len(left),
            "removed": len(left - after),
            "removals_logged": len(said),
            "complete_versions_removed": len(complete - after),
            "live_version_kept": len(live_versions),
            "incomplete_versions_left_after_cleanup": len(left & after),
        }
        counts["ok"] = (counts["removed"] == counts["removals_logged"] == len(left) and not complete - after
                        and not left & after and len(live_versions) == 1)
        return counts


DRILLS: list[tuple[str, Callable[[], dict]]] = [
    ("cache-sigkill-in-process", sigkill_in_process),
    ("cache-sigkill-multi-process", sigkill_multi_process),
    ("cache-kill-between-completed-and-current", kill_between_completed_and_current),
    ("cache-byte-flips", byte_flips),
    ("cache-structural-damage", structural_damage),
    ("cache-truncate-under-reader", truncate_under_reader),
    ("cache-abandoned-versions", abandoned_versions),
]
