"""The index math of a training run, as pure functions: step -> positions -> tasks -> records -> reads.

Nothing here reads files or talks to the network; the server and the trainer client call these
functions and never re-derive them. The chain from a stream position to a record (``chain``) goes
through the plan's mixing (``stages``), its epoch order (``orders``: one module per order) and the
caches' shard layouts. A step's reads for a host slice are one value (``StepReads``), computed by
``step_slices`` and written and read as ``/shards`` JSON by ``to_json`` / ``from_json``.
"""

from taskdata.index.assign import (
    Extent,
    HostAssignment,
    assign,
    extents,
    global_batch,
    locate_example,
    slice_positions,
)
from taskdata.index.chain import ExampleArrays, ExampleRef, example_arrays, examples_at, fits_int64
from taskdata.index.errors import PlanError
from taskdata.index.host_slices import RunTables, ShardTable, StepSlices, host_slice_for, step_slices
from taskdata.index.layout import ShardLayout
from taskdata.index.mixing import Mixing
from taskdata.index.occurrences import Occurrence, occurrences, reads_before
from taskdata.index.orders import FEISTEL, EpochOrder, epoch_order
from taskdata.index.orders.block import BlockOrder
from taskdata.index.orders.feistel import FeistelOrder
from taskdata.index.orders.windowed import WindowedOrder
from taskdata.index.plan import INDEX_MATH_VERSION, RunPlan, SkipRange, TaskCache, data_shard_for_host
from taskdata.index.progress import RunProgress, TaskProgress, progress
from taskdata.index.read_bound import reads_bound, requests_bound
from taskdata.index.schedule import BatchSchedule
from taskdata.index.stages import STAGE_SYNTAX, Stage, StagedMixing, StagedSchedule, parse_stage
from taskdata.index.step_json import MAX_LOOKAHEAD, StepJson, from_json, to_json
from taskdata.index.step_reads import READ_COLUMNS, CacheFiles, ReadsError, StepReads, TaskReads

__all__ = [
    "FEISTEL",
    "INDEX_MATH_VERSION",
    "MAX_LOOKAHEAD",
    "READ_COLUMNS",
    "STAGE_SYNTAX",
    "BatchSchedule",
    "BlockOrder",
    "CacheFiles",
    "EpochOrder",
    "ExampleArrays",
    "ExampleRef",
    "Extent",
    "FeistelOrder",
    "HostAssignment",
    "Mixing",
    "Occurrence",
    "PlanError",
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
    "WindowedOrder",
    "assign",
    "data_shard_for_host",
    "epoch_order",
    "example_arrays",
    "examples_at",
    "extents",
    "fits_int64",
    "from_json",
    "global_batch",
    "host_slice_for",
    "locate_example",
    "occurrences",
    "parse_stage",
    "progress",
    "reads_before",
    "reads_bound",
    "requests_bound",
    "slice_positions",
    "step_slices",
    "to_json",
]
