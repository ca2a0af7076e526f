"""Which Beam runner the cache job gets from the options after '--' (taskdata.beam.runners), without running one.

The jobs themselves, on a real Dask cluster, are in test_cache_dask.py.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from taskdata.beam import runners


@pytest.fixture(autouse=True)
def _dask_installed():
    if importlib.util.find_spec("distributed") is None:
        message = "dask[distributed] is not installed (pip install -e '.[test]' installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def _dask_settings(options):
    from apache_beam.runners.dask.dask_runner import DaskOptions

    return options.view_as(DaskOptions).get_all_options(drop_default=True, current_only=True)


@pytest.mark.parametrize("name", ["dask", "DaskRunner", runners.DASK_RUNNER])
def test_dask_by_any_of_its_names_is_beams_dask_runner_with_one_task_per_source_shard(name):
    options = runners.pipeline_options([f"--runner={name}", "--dask_client_address=tcp://10.0.0.1:8786"], 12)
    assert runners.is_dask(options)
    assert _dask_settings(options) == {"address": "tcp://10.0.0.1:8786", "npartitions": 12}


def test_a_grouping_given_for_dask_is_kept():
    options = runners.pipeline_options(["--runner", "dask", "--dask_scheduler_file=/s.json", "--dask_partition_size=4"],
                                       12)
    assert _dask_settings(options) == {"scheduler_file": "/s.json", "partition_size": 4}


def test_dask_without_a_scheduler_is_refused_with_the_flag_to_add():
    with pytest.raises(ValueError, match=r"^--runner=dask needs the Dask scheduler's address: add "
                                         r"--dask_client_address=tcp://HOST:8786 \(or --dask_scheduler_file=FILE\)"):
        runners.pipeline_options(["--runner=dask"], 3)


@pytest.mark.parametrize("args", [[], ["--runner=DirectRunner"], ["--direct_running_mode=multi_processing",
                                                                  "--direct_num_workers=2"]])
def test_local_runs_get_beams_python_runner_not_prism(args):
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    options = runners.pipeline_options(args, 3)
    assert not runners.is_dask(options)
    assert isinstance(runners.new_pipeline(options).runner, FnApiRunner)
