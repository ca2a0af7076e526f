"""seqio, both ways: seqio reads taskdata caches, and registered seqio Tasks and Mixtures are cached by taskdata.

Install with ``pip install 'taskdata[seqio]'`` (seqio 0.0.20). Nothing here imports seqio until it is used.

- ``add_seqio_task(name)`` / ``add_seqio_mixture(name)``: register a seqio Task or Mixture (imported from the
  user's module) in taskdata's registry; ``taskdata cache --seqio-task NAME --module M`` does it for the
  command line and its Beam workers. The bridged task runs the seqio task's source and every preprocessor
  before its ``CacheDatasetPlaceholder``, shard by shard with seqio's own per-shard seeds, inside taskdata's
  deterministic cache job.
- ``seqio_cache_location(version_dir)`` / ``add_cached_task(version_dir, output_features)``: read a taskdata
  cache version with seqio's own cached-task reader, in place.
"""

from taskdata.seqio_bridge.errors import SeqioBridgeError
from taskdata.seqio_bridge.reader import add_cached_task, seqio_cache_location
from taskdata.seqio_bridge.registry import add_seqio_mixture, add_seqio_task
from taskdata.seqio_bridge.runtime import import_seqio
from taskdata.seqio_bridge.seeds import seqio_shard_seed
from taskdata.seqio_bridge.task import SeqioSource, SeqioTask, bridge_task
from taskdata.seqio_bridge.vocabulary import SeqioVocabulary

__all__ = [
    "SeqioBridgeError",
    "SeqioSource",
    "SeqioTask",
    "SeqioVocabulary",
    "add_cached_task",
    "add_seqio_mixture",
    "add_seqio_task",
    "bridge_task",
    "import_seqio",
    "seqio_cache_location",
    "seqio_shard_seed",
]
