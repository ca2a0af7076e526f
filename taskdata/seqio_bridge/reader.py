"""seqio reads a taskdata cache version in place, as one of its cached tasks.

seqio finds a cached task ``name`` at ``{global cache dir}/{name with ':' as '/'}/COMPLETED`` and reads
``info.{split}.json``, ``stats.{split}.json`` and the ``{split}.tfrecord-*-of-*`` files beside it; it never
reads ``CURRENT``. A version folder ``{root}/{task}/{version}`` is therefore seqio's cached task
``{task}:{version}`` under the global cache dir ``{root}`` (version names, ``v20261123T114254Z_e0bf6160``,
are valid seqio name parts). A task whose own name has a ':' would be split into folders by seqio; its
versions are read as the task ``{version}`` under the global cache dir ``{root}/{task}`` instead.

    seqio.add_global_cache_dirs([root]); task = seqio.get_mixture_or_task("c4_span_corruption:v2026..._e0bf6160")

``add_cached_task`` registers such a reading task (a ``CacheDatasetPlaceholder(required=True)`` and a
source that is never read) and adds its global cache dir.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from taskdata import fs
from taskdata.cache.format import current_version, load_manifest
from taskdata.seqio_bridge.errors import SeqioBridgeError
from taskdata.seqio_bridge.runtime import import_seqio

__all__ = ["add_cached_task", "seqio_cache_location"]

# seqio 0.0.20's dataset_providers._VALID_TASK_NAME_REGEX.
_SEQIO_NAME_RE = re.compile(r"^[\w\d\.\:_#]+$")


def seqio_cache_location(cache: str) -> tuple[str, str]:
    """(global cache dir, seqio task name) of a version folder, or of a task folder's CURRENT version."""
    version_dir = (cache if fs.is_remote(cache) else os.path.abspath(cache)).rstrip("/")
    if not fs.exists(fs.join(version_dir, "COMPLETED")):
        current = current_version(version_dir)
        if current is None:
            raise SeqioBridgeError(
                f"{cache} is neither a complete cache version (no COMPLETED) nor a task folder with a CURRENT version. "
                "Build one with 'taskdata cache'.")
        version_dir = current.rstrip("/")
    task_root, _, version = version_dir.rpartition("/")
    root, _, task = task_root.rpartition("/")
    if not _SEQIO_NAME_RE.fullmatch(version):
        raise SeqioBridgeError(
            f"Cache version {version!r} ({version_dir}) was named before versions were valid seqio task names. "
            f"Rename the folder to {version.replace('-', '_')!r} (nothing in it holds its name; run plans find it by "
            "its manifest hash) and point CURRENT at it, or rebuild it with 'taskdata cache --force'.")
    if ":" in task:
        return task_root, version
    return root, f"{task}:{version}"


def add_cached_task(cache: str, output_features: Mapping[str, Any]) -> str:
    """Registers, in seqio, the cached task that reads ``cache`` (a version or task folder); returns its name.

    ``output_features`` are seqio ``Feature``s, as for any seqio task (e.g. with
    ``seqio.SentencePieceVocabulary(model, extra_ids=100)`` for taskdata's built-in tasks).
    """
    seqio = import_seqio()
    global_dir, name = seqio_cache_location(cache)
    version_dir = fs.join(global_dir, *name.split(":"))
    if global_dir not in seqio.get_global_cache_dirs():
        seqio.add_global_cache_dirs([global_dir])
    if name not in seqio.TaskRegistry.names():
        seqio.TaskRegistry.add(
            name,
            source=seqio.FunctionDataSource(_cache_only, splits=tuple(sorted(load_manifest(version_dir).splits))),
            preprocessors=[seqio.CacheDatasetPlaceholder(required=True)],
            output_features=dict(output_features),
        )
    return name


def _cache_only(split: str, shuffle_files: bool) -> Any:
    raise RuntimeError(
        f"This seqio task reads a taskdata cache only; its source is never read (split {split!r}). Call get_dataset "
        "with use_cached=True.")
