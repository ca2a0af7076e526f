"""The index math of a training run, as pure functions: step -> positions -> tasks -> records.

Nothing here reads files or talks to the network; the server and the trainer client call these
functions and never re-derive them.
"""

from taskdata.index.arrays import ExampleArrays, example_arrays, fits_int64, run_starts
from taskdata.index.assign import (
    ExampleRef,
    HostAssignment,
    ReadRun,
    assign,
    examples_at,
    global_batch,
    locate_example,
    read_runs,
    slice_positions,
)
from taskdata.index.errors import PlanError
from taskdata.index.layout import ShardLayout
from taskdata.index.mixing import Mixing
from taskdata.index.permutation import EpochPermutation, epoch_and_index, permute_many, task_position_of
from taskdata.index.plan import INDEX_MATH_VERSION, RunPlan, SkipRange, TaskCache, data_shard_for_host
from taskdata.index.schedule import BatchSchedule
from taskdata.index.stages import Stage, StagedMixing, StagedSchedule

__all__ = [
    "INDEX_MATH_VERSION",
    "BatchSchedule",
    "EpochPermutation",
    "ExampleArrays",
    "ExampleRef",
    "HostAssignment",
    "Mixing",
    "PlanError",
    "ReadRun",
    "RunPlan",
    "ShardLayout",
    "SkipRange",
    "Stage",
    "StagedMixing",
    "StagedSchedule",
    "TaskCache",
    "assign",
    "data_shard_for_host",
    "epoch_and_index",
    "example_arrays",
    "examples_at",
    "fits_int64",
    "global_batch",
    "locate_example",
    "permute_many",
    "read_runs",
    "run_starts",
    "slice_positions",
    "task_position_of",
]
