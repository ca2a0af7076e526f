"""The cache job's progress: stages named, counts, rate and time left, and the job's own run of it."""

from __future__ import annotations

import pytest

from taskdata.beam.progress import JobProgress, progress_line


def test_stage_one_counts_source_shards_and_estimates_the_time_left():
    progress = JobProgress(sources_done=4, sources_total=10, examples=10_336, shards_done=0, shards_total=8, records=0)
    assert progress_line(progress, stage_elapsed_s=6.0, job_elapsed_s=7.2) == (
        "[cache] 1/3 preprocessing: source shards 4/10, 10,336 examples (1,723/s), 7 s, about 9 s left"
    )
    nothing = JobProgress(0, 10, 0, 0, 8, 0)
    assert progress_line(nothing, 0.5, 0.5) == (
        "[cache] 1/3 preprocessing: source shards 0/10, 0 examples, 0 s, time left unknown yet"
    )


def test_stage_two_counts_records_written_of_the_examples_read():
    progress = JobProgress(10, 10, 22_082, 2, 8, 5_000)
    assert progress_line(progress, stage_elapsed_s=2.0, job_elapsed_s=20.0) == (
        "[cache] 2/3 sorting and writing: output shards 2/8, 5,000 of 22,082 records (2,500/s), 20 s, about 7 s left"
    )
    with pytest.raises(ValueError, match="Inconsistent job progress"):
        JobProgress(11, 10, 0, 0, 8, 0)


@pytest.mark.slow
def test_a_cache_job_reports_each_stage_and_ends_with_a_summary(tmp_path):
    from taskdata.beam.job import CacheOptions, run_cache_job
    from taskdata.config import Config
    from taskdata.define.registry import Registry

    registry = Registry()
    registry.load_module("tests.cache_tasks")
    lines: list[str] = []
    options = CacheOptions(task="toy_det", output=str(tmp_path), seed=0, num_shards=3, config=Config(),
                           modules=("tests.cache_tasks",))
    run_cache_job(options, registry, log=lines.append)
    stage_two = [line for line in lines if line.startswith("[cache] 2/3 sorting and writing: output shards ")]
    assert stage_two and stage_two[-1].startswith("[cache] 2/3 sorting and writing: output shards 6/6, ")
    assert any(line.startswith("[cache] 3/3 verified every record of ") for line in lines)
    assert lines[-1].startswith("[cache] done in ")
