"""The preprocessing seed ``seqio_cache_tasks`` gives each source shard, computed as seqio 0.0.20 does.

``scripts/cache_tasks_main.py``: with ``--base_seed B`` (0 and -1 mean no base seed) a task's seed is
md5(task name), read as a little-endian integer, plus B. ``beam_utils.PreprocessTask``: source shard
``i`` gets md5(task name + "shard{i}") plus the task's seed; when that passes 2**63 - 1, the first 7
bytes of the md5 are used instead; the result is taken modulo 2**63 - 1. A bridged task is built with
taskdata's ``--seed`` as seqio's ``--base_seed``, so both jobs run every preprocessor with one seed.
"""

from __future__ import annotations

import hashlib

from taskdata.seeding import check_seed

__all__ = ["SEEDING", "seqio_shard_seed"]

_INT64_MAX = 2**63 - 1

# Goes into a bridged task's fingerprint: a change of the scheme must not reuse caches built with another.
SEEDING = "seqio-0.0.20: md5(task + 'shard{i}') + md5(task) + base_seed, mod 2**63-1"


def seqio_shard_seed(task_name: str, shard_index: int, base_seed: int) -> int:
    """The seed seqio's cache job passes to source shard ``shard_index`` of ``task_name``."""
    check_seed(base_seed)
    if isinstance(shard_index, bool) or not isinstance(shard_index, int) or shard_index < 0:
        raise ValueError(f"A shard index must be a non-negative integer but got {shard_index!r}.")
    task_seed = int.from_bytes(hashlib.md5(task_name.encode()).digest(), "little") + base_seed if base_seed else 0
    digest = hashlib.md5((task_name + f"shard{shard_index}").encode()).digest()
    seed = int.from_bytes(digest, "little") + task_seed
    if seed > _INT64_MAX:
        seed = int.from_bytes(digest[:7], "little") + task_seed
    return seed % _INT64_MAX
