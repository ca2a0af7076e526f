"""Pydantic models of the HTTP API: they document the OpenAPI schema and validate request bodies.

They mirror the frozen dataclasses of ``taskdata`` (``RunPlan``, ``BatchSchedule``, ``StepReads``) at the
edge. ``/shards`` steps are written by ``taskdata.index.to_json`` (and read back by ``from_json``); these
models describe that JSON exactly, and the schema test checks real answers against them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, model_validator

from taskdata.index import MAX_LOOKAHEAD
from taskdata.index.columns import COMPACT_COLUMN_PATTERN, ColumnEncoding, column_values
from taskdata.names import NAME_PATTERN

__all__ = [
    "BASE64_PATTERN",
    "MAX_BATCH_SIZE",
    "MAX_HOSTS",
    "MAX_LEDGER_READS",
    "MAX_LOOKAHEAD",
    "MAX_SEED",
    "MAX_STEP",
    "NAME_PATTERN",
    "CachedSplit",
    "CachedVersion",
    "ErrorResponse",
    "ExampleLedgerResponse",
    "FileNames",
    "Health",
    "HostBytes",
    "HostMapping",
    "LedgerEntry",
    "LedgerQuery",
    "MixtureComponent",
    "Occurrence",
    "PathName",
    "PlanModel",
    "PositionRange",
    "ReadColumns",
    "RunCreate",
    "RunDetail",
    "RunList",
    "RunSummary",
    "ScheduleModel",
    "ScheduleRequest",
    "ShardFile",
    "ShardsQuery",
    "ShardsResponse",
    "StageInForce",
    "StageModel",
    "StageRequest",
    "StepLedgerResponse",
    "StepReads",
    "SummaryQuery",
    "SummaryResponse",
    "TaskCacheModel",
    "TaskDetail",
    "TaskList",
    "TaskProgress",
    "TaskReads",
    "TaskSummary",
    "TokenCount",
]

# Steps are bounded so that every step number is exact in any JSON reader (IEEE doubles hold 2**53).
MAX_STEP = 2**53 - 1
MAX_HOSTS = 65_536
MAX_BATCH_SIZE = 1 << 30
MAX_SEED = 2**63 - 1
MAX_LEDGER_READS = 1000  # reads of one example listed per request
# NAME_PATTERN is taskdata.names' rule; the server also rejects '..' inside a name (validate_name), with
# its message. MAX_LOOKAHEAD (steps per request) is the wire format's, shared with the client.
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"

Name = Annotated[str, Field(min_length=1, max_length=200, pattern=NAME_PATTERN)]
# The same rule for a name in a URL path (/runs/{name}, /tasks/{name}).
PathName = Annotated[str, Path(min_length=1, max_length=200, pattern=NAME_PATTERN)]
Count = Annotated[int, Field(ge=0)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorResponse(_Model):
    detail: str = Field(description="What was wrong, which value, what is allowed and how to fix it.")


class Health(_Model):
    status: Literal["ok"]


# --- /shards -----------------------------------------------------------------------------------


class ShardsQuery(_Model):
    """The query parameters of ``GET /shards`` (unknown parameters are refused, so a typo is an error)."""

    host: int = Field(ge=0, lt=MAX_HOSTS, description="Host index in [0, num_hosts).")
    step: int = Field(ge=0, le=MAX_STEP, description="First step of the window.")
    steps: int = Field(1, ge=1, le=MAX_LOOKAHEAD, description="Number of steps (lookahead).")
    run: Name | None = Field(None, description="Run name (default: the default run).")
    num_hosts: int | None = Field(
        None,
        ge=1,
        le=MAX_HOSTS,
        description="Hosts reading the run (default: num_data_shards), a multiple or a divisor of its "
        "num_data_shards (D). A multiple H: host h reads data shard h // (H / D), so the H / D consecutive hosts "
        "of one model replica read the same slice. A divisor H (fewer hosts, e.g. after resuming on a smaller "
        "slice): host h reads the D / H consecutive data shards from h * D / H on, as one slice (the global "
        "batch does not depend on how it is cut).",
    )
    encoding: ColumnEncoding = Field(
        "ints",
        description="How integer columns (reads, order) are written: JSON arrays of integers, base64 of "
        "their little-endian int64 bytes (fast to decode), or compact (what the trainer client uses): base64 of "
        "the narrowest of uint8/uint16/uint32/int64 that holds the column, named in front ('u1:...'), and each "
        "task's files named once by a pattern (`names`) instead of one object per file: about a sixth of "
        "base64's bytes for 256 examples.",
    )


Base64Int64 = Annotated[
    str,
    Field(
        pattern=BASE64_PATTERN,
        description="encoding=base64: the column's values as little-endian int64, base64-encoded (RFC 4648).",
    ),
]


CompactColumn = Annotated[
    str,
    Field(
        pattern=COMPACT_COLUMN_PATTERN,
        description="encoding=compact: the column's type (u1, u2, u4: unsigned 1, 2, 4 bytes; i8: int64), a "
        "colon, then its values as little-endian bytes of that type, base64-encoded (RFC 4648).",
    ),
]


class FileNames(_Model):
    """encoding=compact: shard ``s``'s file is ``prefix + str(s).zfill(digits) + suffix``."""

    prefix: str = Field(min_length=1, description="The file URI up to the shard number.")
    digits: Annotated[int, Field(ge=1)] = Field(description="The shard number's width, zero-padded.")
    suffix: str = Field(description="The file URI after the shard number.")


class ShardFile(_Model):
    shard: Count = Field(description="Shard index within the task's split.")
    uri: str = Field(description="The shard file (local path or gs:// URL) inside the pinned cache version.")


class ReadColumns(_Model):
    """One task's reads for a step, as columns: read ``i`` is records ``[first_record[i],
    first_record[i] + count[i])`` of shard ``shard[i]``, one ranged read of ``byte_length[i]`` bytes at
    ``byte_offset[i]``. All columns have the same length; the reads are in the order the host uses them."""

    shard: list[Count] | Base64Int64 | CompactColumn = Field(
        description="Shard index of each read (its file is in `files`, or named by `names`)."
    )
    first_record: list[Count] | Base64Int64 | CompactColumn
    count: list[Annotated[int, Field(ge=1)]] | Base64Int64 | CompactColumn = Field(
        description="Records of each read."
    )
    byte_offset: list[Count] | Base64Int64 | CompactColumn = Field(
        description="Byte offset of first_record in the shard (from its offsets sidecar)."
    )
    byte_length: list[Annotated[int, Field(ge=16)]] | Base64Int64 | CompactColumn = Field(
        description="Bytes of the `count` framed records."
    )

    @model_validator(mode="after")
    def _consistent(self) -> ReadColumns:
        values = {name: column_values(getattr(self, name)) for name in type(self).model_fields}
        lengths = {name: len(column) for name, column in values.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"read columns must have one length, but have {lengths}")
        minimum = {"shard": 0, "first_record": 0, "count": 1, "byte_offset": 0, "byte_length": 16}
        for name, column in values.items():
            if column and min(column) < minimum[name]:
                raise ValueError(f"read column {name} holds {min(column)}, below its minimum {minimum[name]}")
        return self


class TaskReads(_Model):
    task: str
    version: str = Field(description="Cache version folder whose manifest sha256 the run pins.")
    files: list[ShardFile] | None = Field(
        None,
        description="encoding=ints or base64: the shard files this step reads, by shard index: each shard of "
        "`reads` once.",
    )
    names: FileNames | None = Field(
        None, description="encoding=compact, instead of `files`: how every shard file of the cache is named."
    )
    reads: ReadColumns = Field(
        description="This task's records for this step, in the order the host uses them."
    )

    @model_validator(mode="after")
    def _files_cover_reads(self) -> TaskReads:
        if (self.files is None) == (self.names is None):
            raise ValueError("a task's reads come with either files (ints, base64) or names (compact)")
        if self.files is not None:
            shards, read = [f.shard for f in self.files], sorted(set(column_values(self.reads.shard)))
            if shards != read:
                raise ValueError(f"files name shards {shards} but the reads are of shards {read}")
        return self


class PositionRange(_Model):
    start: Count
    stop: Count


class StepReads(_Model):
    step: Count
    skipped: bool = Field(
        description="True if the plan skips this step: nothing is read and the trainer skips it."
    )
    global_batch_size: Annotated[int, Field(ge=1)]
    positions: PositionRange = Field(
        description="Positions of the run's example stream the host's slice covers."
    )
    tasks: list[TaskReads] = Field(description="One entry per task of the run, in the run's task order.")
    order: list[Count] | Base64Int64 | CompactColumn = Field(
        description="For each example of the host's batch, in order, the index into `tasks` it comes from; "
        "each task's examples are its reads' records, consumed in order."
    )


class ShardsResponse(_Model):
    run: str
    fingerprint: str = Field(
        description="The fingerprint of the run's plan as far as it decides these steps (the run's "
        "fingerprint, unless stages start after them): a checkpoint resumes only against the same one."
    )
    split: str
    host: Count
    num_hosts: Annotated[int, Field(ge=1)]
    data_shard: Count = Field(
        description="The first data shard of the host's slice: host // (num_hosts / num_data_shards) when "
        "num_hosts is a multiple of num_data_shards, host * (num_data_shards / num_hosts) when it divides it."
    )
    num_data_shards: Annotated[int, Field(ge=1)]
    steps: list[StepReads]


# --- /runs ---------------------------------------------------------------------------------------


class ScheduleModel(_Model):
    """Global batch size per step: constant (ramp_steps 0, end = start) or a linear ramp to ``end``."""

    start: Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]
    end: Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]
    ramp_steps: Annotated[int, Field(ge=0, le=MAX_STEP)]
    multiple_of: Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]


class ScheduleRequest(_Model):
    start: Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)] = Field(description="Global batch size at step 0.")
    end: Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)] | None = Field(None, description="Default: start.")
    ramp_steps: Annotated[int, Field(ge=0, le=MAX_STEP)] = 0
    multiple_of: Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)] = 1


SkipPair = tuple[Annotated[int, Field(ge=0, le=MAX_STEP)], Annotated[int, Field(ge=1, le=MAX_STEP)]]


class RunCreate(_Model):
    """A run over the CURRENT complete cache of every task of ``mixture``."""

    name: Name
    mixture: Name = Field(description="A registered task or mixture.")
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)]
    schedule: ScheduleRequest
    num_data_shards: Annotated[int, Field(ge=1, le=MAX_HOSTS)]
    skip: Annotated[list[SkipPair], Field(max_length=10_000)] = Field(
        [], description="[start, stop) step ranges whose data is never delivered."
    )
    split: Name = "train"


class StageRequest(_Model):
    """A stage to append: from step ``start`` on, other rates and/or another batch schedule."""

    start: Annotated[int, Field(ge=1, le=MAX_STEP)] = Field(description="The step the stage starts at.")
    rates: dict[Name, Annotated[str, Field(max_length=100)] | Annotated[int, Field(ge=0)] | float] | None = Field(
        None,
        description="Rate of every task of the run (any scale: '7/10', 0.7, 7; 0 leaves a task out of the "
        "stage); null keeps the rates in force.",
    )
    batch: ScheduleRequest | None = Field(
        None, description="The global batch schedule from `start` on (a ramp counts steps from `start`); null "
        "keeps the schedule in force."
    )
    current_step: Annotated[int, Field(ge=0, le=MAX_STEP)] = Field(
        description="A step no trainer of the run has read yet, its lookahead included (the step it trains next "
        "plus the steps it fetched ahead). The stage must start at or after it, and after the run's last stage."
    )


class StageModel(_Model):
    """One ``Stage`` of ``RunPlan.to_dict()``."""

    start: Annotated[int, Field(ge=1)]
    rates: dict[str, str] | None = Field(description="Exact shares ('1/4'; '0' leaves a task out), or null.")
    schedule: ScheduleModel | None = Field(description="The batch schedule from `start` on, or null.")


class TaskCacheModel(_Model):
    fingerprint: str = Field(description="Manifest sha256 of the pinned cache version.")
    shard_record_counts: list[Count]


class EpochOrderModel(_Model):
    """``EpochOrder.to_dict()``: how a task's epochs after the first order its records
    (``taskdata.index.orders``); the options present are those of its kind."""

    kind: str = Field(description="A registered epoch order: 'feistel' (per record), 'block' or 'windowed'.")
    block_size: Annotated[int, Field(ge=1)] | None = Field(None, description="Records per block ('block', 'windowed').")
    width: Annotated[int, Field(ge=1)] | None = Field(
        None, description="How wide a batch each block is dealt out over, one record a step ('windowed')."
    )


class PlanModel(_Model):
    """``RunPlan.to_dict()``."""

    name: str
    mixture: str
    caches: dict[str, TaskCacheModel]
    rates: dict[str, str] = Field(description="Exact rates as fractions ('7/10').")
    seed: Count
    schedule: ScheduleModel
    num_data_shards: Annotated[int, Field(ge=1)]
    skip: list[tuple[int, int]]
    split: str = Field(description="The cache split every task is read from (part of the fingerprint).")
    stages: list[StageModel] = Field(
        [], description="Stages after stage 0 (rates and schedule above), by start step; absent when none."
    )
    epoch_order: EpochOrderModel | None = Field(
        None, description="The order of every epoch after the first; absent for the per-record order."
    )


class HostMapping(_Model):
    num_data_shards: Annotated[int, Field(ge=1)]
    rule: str
    valid_num_hosts: str


class RunSummary(_Model):
    name: str
    mixture: str
    fingerprint: str
    split: str
    num_data_shards: Annotated[int, Field(ge=1)]
    tasks: list[str]
    source: Literal["config", "store"] = Field(
        description="The runs file, or the cache root's _runs/ folder."
    )


class RunList(_Model):
    runs: list[RunSummary]


class RunDetail(_Model):
    name: str
    fingerprint: str
    split: str
    source: Literal["config", "store"]
    plan: PlanModel
    hosts: HostMapping
    examples_per_data_shard: dict[str, int] = Field(
        description="Examples each data shard reads per step at the start and end of the schedule."
    )
    served_before: int = Field(
        ge=0,
        description="Servers answer steps of the run below this only (they raise it before answering later "
        "ones): a new stage must start at or after it. 0 for a run of the runs file, which never changes.",
    )


# --- /runs/{name}/ledger and /summary -----------------------------------------------------------

ExampleId = Annotated[
    str,
    Field(
        max_length=450,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:]*/[A-Za-z0-9][A-Za-z0-9_.:]*/[0-9]{1,18}/[0-9]{1,18}$",
        description="A stable example id: task/split/source_shard/ordinal.",
    ),
]


class LedgerQuery(_Model):
    """``step`` (with ``host`` and ``num_hosts`` for one host's slice) or ``example`` (with ``from_step``,
    ``until_step`` and ``limit``)."""

    step: int | None = Field(None, ge=0, le=MAX_STEP, description="List the examples of this step.")
    host: int | None = Field(None, ge=0, lt=MAX_HOSTS, description="With step: only this host's slice.")
    num_hosts: int | None = Field(
        None, ge=1, le=MAX_HOSTS, description="With host: the hosts reading the run (a multiple or a divisor of num_data_shards)."
    )
    example: ExampleId | None = Field(None, description="List the steps at which this example is read.")
    from_step: int = Field(0, ge=0, le=MAX_STEP, description="With example: reads from this step on.")
    until_step: int | None = Field(
        None, ge=0, le=MAX_STEP, description="With example: reads before this step (and how many there are)."
    )
    limit: int = Field(100, ge=0, le=MAX_LEDGER_READS, description="With example: list at most this many reads.")

    @model_validator(mode="after")
    def _one_question(self) -> LedgerQuery:
        if (self.step is None) == (self.example is None):
            raise ValueError("give exactly one of step (a step's examples) and example (an example's steps)")
        if self.step is None and (self.host is not None or self.num_hosts is not None):
            raise ValueError("host and num_hosts go with step")
        if (self.host is None) != (self.num_hosts is None):
            raise ValueError("give host and num_hosts together (one host's slice), or neither (the whole batch)")
        if self.example is None and (self.from_step, self.until_step, self.limit) != (0, None, 100):
            raise ValueError("from_step, until_step and limit go with example")
        return self


class LedgerEntry(_Model):
    position: Count = Field(description="Position in the run's example stream.")
    data_shard: Count
    task: str
    epoch: Count = Field(description="The task's epoch this read is in.")
    index: Count = Field(description="The record's index in the task's cache order.")
    shard: Count = Field(description="Cache shard of the task's split.")
    record: Count = Field(description="Record within the cache shard.")
    id: str = Field(description="Stable example id: task/split/source_shard/ordinal.")
    source_file: str | None = Field(description="The source file (base name) the example was made from.")
    documents: list[int] | None = Field(description="First and last source document it was made from.")


class StepLedgerResponse(_Model):
    run: str
    fingerprint: str = Field(description="Of what decides this step (as /shards gives it for the step).")
    step: Count
    skipped: bool = Field(description="The plan skips this step: its examples are never delivered.")
    stage: Count = Field(description="The stage in force (0: the plan's own rates and schedule).")
    global_batch_size: Annotated[int, Field(ge=1)]
    data_shard: Count | None = Field(description="The host's data shard; null for the whole global batch.")
    num_data_shards: Annotated[int, Field(ge=1)]
    positions: PositionRange
    examples: list[LedgerEntry] = Field(description="In the order the batch holds them.")


class Occurrence(_Model):
    epoch: Count
    step: Count
    position: Count
    data_shard: Count
    skipped: bool = Field(description="The plan skips this step: the example is not delivered here.")


class ExampleLedgerResponse(_Model):
    run: str
    fingerprint: str
    id: str
    task: str
    shard: Count = Field(description="Cache shard holding the example.")
    record: Count = Field(description="Record within the cache shard.")
    index: Count = Field(description="The record's index in the task's cache order.")
    from_step: Count
    until_step: Count | None
    total: Count | None = Field(description="Reads in [from_step, until_step) (null without until_step).")
    skipped: Count | None = Field(description="Of those, reads in skipped steps (never delivered).")
    reads: list[Occurrence] = Field(description="The first `limit` reads, in order.")
    truncated: bool = Field(description="More reads follow in the range.")


class SummaryQuery(_Model):
    step: int = Field(ge=0, le=MAX_STEP, description="The run as it stands before this step.")


class StageInForce(_Model):
    index: Count
    start: Count
    batch_size: Annotated[int, Field(ge=1)]
    rates: dict[str, str] = Field(description="Exact shares of the stage ('0' for a task it leaves out).")


class TokenCount(_Model):
    value: Count
    exact: bool = Field(description="False: estimated at the split's mean length (stats.{split}.json).")


class TaskProgress(_Model):
    task: str
    records: Annotated[int, Field(ge=1)] = Field(description="Records in one epoch of the task.")
    taken: Count = Field(description="Examples of the task's stream covered by the steps before `step`.")
    delivered: Count = Field(description="Of those, the ones not in skipped steps.")
    skipped: Count
    epoch: Count = Field(description="The epoch the task's next example comes from.")
    repeated: Count = Field(description="Examples taken that had been taken before.")
    share: float | None = Field(description="The task's share of the examples covered.")
    target_share: float | None = Field(description="The share the stages' rates call for over those examples.")
    stage_rate: float = Field(description="The task's rate in the stage in force.")
    exact_stage_rate: str
    tokens: dict[str, TokenCount] = Field(description="Tokens delivered per token feature.")


class HostBytes(_Model):
    skipped: bool
    examples: list[Count] = Field(description="Examples each data shard reads at `step`.")
    bytes: list[Count] = Field(description="Bytes (framed records) each data shard reads at `step`.")


class SummaryResponse(_Model):
    run: str
    fingerprint: str
    step: Count
    positions: Count = Field(description="Examples the steps before `step` cover.")
    stage: StageInForce
    tasks: list[TaskProgress]
    hosts: HostBytes


# --- /tasks --------------------------------------------------------------------------------------


class TaskSummary(_Model):
    name: str
    kind: Literal["task", "mixture"]
    fingerprint: str | None = Field(description="Null when the definition cannot be fingerprinted here.")
    problem: str | None = Field(description="Why there is no fingerprint (e.g. source files not reachable).")


class TaskList(_Model):
    tasks: list[TaskSummary]


class CachedSplit(_Model):
    num_shards: Count
    num_records: Count
    stats: dict[str, Any] | None = Field(description="stats.{split}.json of the version (seqio's keys).")
    verification: str | None = Field(
        description="'verified' (every byte), 'listing verified' (sizes and offsets sidecars: the server's "
        "first_use_check is 'listing') or 'failed: ...' once this server has served the split; null before."
    )


class CachedVersion(_Model):
    version: str
    current: bool
    complete: bool
    problem: str | None = Field(description="Why the version is not a complete cache (null when it is).")
    manifest_sha256: str | None
    task_fingerprint: str | None
    matches_definition: bool | None = Field(description="Built from the task's current definition.")
    seed: int | None
    splits: dict[str, CachedSplit]


class MixtureComponent(_Model):
    task: str
    rate: float = Field(description="The task's share of the mixture's examples (shares sum to 1), as a float.")
    exact_rate: str = Field(description="The same share exactly, as a fraction ('1/3'); a task's own is '1'.")


class TaskDetail(_Model):
    name: str
    kind: Literal["task", "mixture"]
    fingerprint: str | None = Field(description="Null when the definition cannot be fingerprinted here.")
    problem: str | None = Field(description="Why there is no fingerprint or definition.")
    definition: dict[str, Any] | None = Field(description="The fingerprinted description of the definition.")
    tasks: list[MixtureComponent] = Field(description="A mixture's tasks and rates; a task lists itself.")
    versions: list[CachedVersion] = Field(
        description="Cache versions of a task, oldest first (none for mixtures)."
    )
