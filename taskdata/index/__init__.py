"""The index math of a training run, as pure functions: step -> positions -> tasks -> records -> reads.

Nothing here reads files or talks to the network; the server and the trainer client call these
functions and never re-derive them. A step's reads for a host slice are one value (``StepReads``),
computed by ``step_slices`` / ``step_reads`` and written and read as ``/shards`` JSON by ``to_json`` /
``from_json``.
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
from taskdata.index.block_order import BlockPermutation, block_permute_many
from taskdata.index.epoch_order import FEISTEL, EpochOrder, epoch_and_index_in, task_position_in
from taskdata.index.errors import PlanError
from taskdata.index.host_reads import (
    RunTables,
    ShardTable,
    StepSlices,
    host_slice_for,
    step_reads,
    step_slice,
    step_slices,
)
from taskdata.index.layout import ShardLayout
from taskdata.index.mixing import Mixing
from taskdata.index.occurrences import Occurrence, occurrences, reads_before
from taskdata.index.permutation import EpochPermutation, epoch_and_index, permute_many, task_position_of
from taskdata.index.plan import INDEX_MATH_VERSION, RunPlan, SkipRange, TaskCache, data_shard_for_host
from taskdata.index.progress import RunProgress, TaskProgress, progress
from taskdata.index.read_bound import reads_bound, requests_bound, runs_per_block
from taskdata.index.reads import READ_COLUMNS, CacheFiles, ReadsError, StepReads, TaskReads
from taskdata.index.reads_json import MAX_LOOKAHEAD, StepJson, from_json, to_json
from taskdata.index.schedule import BatchSchedule
from taskdata.index.stages import STAGE_SYNTAX, Stage, StagedMixing, StagedSchedule, parse_stage
from taskdata.index.windowed_order import WindowedPermutation, windowed_permute_many

__all__ = [
    "FEISTEL",
    "INDEX_MATH_VERSION",
    "MAX_LOOKAHEAD",
    "READ_COLUMNS",
    "STAGE_SYNTAX",
    "BatchSchedule",
    "BlockPermutation",
    "CacheFiles",
    "EpochOrder",
    "EpochPermutation",
    "ExampleArrays",
    "ExampleRef",
    "HostAssignment",
    "Mixing",
    "Occurrence",
    "PlanError",
    "ReadRun",
    "ReadsError",
    "RunPlan",
    "RunProgress",
    "RunTables",
    "ShardLayout",
    "ShardTable",
    "SkipRange",
    "Stage",
    "StagedMixing",
    "StagedSchedule",
    "StepJson",
    "StepReads",
    "StepSlices",
    "TaskCache",
    "TaskProgress",
    "TaskReads",
    "WindowedPermutation",
    "assign",
    "block_permute_many",
    "data_shard_for_host",
    "epoch_and_index",
    "epoch_and_index_in",
    "example_arrays",
    "examples_at",
    "fits_int64",
    "from_json",
    "global_batch",
    "host_slice_for",
    "locate_example",
    "occurrences",
    "parse_stage",
    "permute_many",
    "progress",
    "read_runs",
    "reads_before",
    "reads_bound",
    "requests_bound",
    "run_starts",
    "runs_per_block",
    "slice_positions",
    "step_reads",
    "step_slice",
    "step_slices",
    "task_position_in",
    "task_position_of",
    "to_json",
    "windowed_permute_many",
]
