"""What ``/tasks`` reports: registered tasks and mixtures, and the cache versions of a task on disk."""

from __future__ import annotations

import json
from typing import Any

from taskdata import fs
from taskdata.cache.format import (
    CacheFormatError,
    completed_path,
    current_version,
    list_versions,
    load_manifest,
    task_dir,
)
from taskdata.define.mixture import Mixture
from taskdata.define.registry import Registry
from taskdata.define.task import Task
from taskdata.fingerprint import describe
from taskdata.runs import CacheResolver

__all__ = ["task_detail", "task_summaries"]


def task_summaries(registry: Registry) -> list[dict[str, Any]]:
    out = []
    for name in registry.names():
        item = registry.get(name)
        fingerprint, problem = _fingerprint(item)
        out.append({"name": name, "kind": _kind(item), "fingerprint": fingerprint, "problem": problem})
    return out


def task_detail(registry: Registry, resolver: CacheResolver, name: str) -> dict[str, Any]:
    """``server.models.TaskDetail`` of a registered name (UnknownNameError if it is not registered)."""
    item = registry.get(name)  # validates the name before it can become part of a path
    fingerprint, problem = _fingerprint(item)
    if isinstance(item, Mixture):
        components = [
            {"task": t, "rate": float(share), "exact_rate": str(share)}
            for t, share in zip(item.task_names, item.shares, strict=True)
        ]
        versions = []
    else:
        components = [{"task": item.name, "rate": 1.0, "exact_rate": "1"}]
        versions = _versions(resolver, item.name, fingerprint)
    return {
        "name": item.name,
        "kind": _kind(item),
        "fingerprint": fingerprint,
        "problem": problem,
        "definition": None if problem else describe(item),
        "tasks": components,
        "versions": versions,
    }


def _kind(item: Task | Mixture) -> str:
    return "mixture" if isinstance(item, Mixture) else "task"


def _fingerprint(item: Task | Mixture) -> tuple[str | None, str | None]:
    """(fingerprint, None), or (None, why not): a definition's fingerprint covers its source files, which
    this machine may be unable to list (a folder only the cache builders mount, a missing credential)."""
    try:
        return item.fingerprint(), None
    except Exception as error:  # user-defined sources may raise anything; the catalog reports it
        return None, f"cannot fingerprint {item.name!r} here: {type(error).__name__}: {error}"


def _versions(resolver: CacheResolver, task: str, task_fingerprint: str | None) -> list[dict[str, Any]]:
    root = task_dir(resolver.cache_root, task)
    try:
        current = current_version(root)
    except CacheFormatError:
        current = None  # a damaged pointer: every version is listed, none as current
    out = []
    for version in list_versions(root):
        version_dir = fs.join(root, version)
        entry: dict[str, Any] = {
            "version": version,
            "current": version_dir == current,
            "complete": False,
            "problem": None,
            "manifest_sha256": None,
            "task_fingerprint": None,
            "matches_definition": None,
            "seed": None,
            "splits": {},
        }
        try:
            manifest = load_manifest(version_dir)
            sha = json.loads(fs.read_bytes(completed_path(version_dir)))["manifest_sha256"]
        except (CacheFormatError, OSError, ValueError) as error:
            entry["problem"] = resolver.relative(str(error))
            out.append(entry)
            continue
        entry.update(
            complete=True,
            manifest_sha256=sha,
            task_fingerprint=manifest.task_fingerprint,
            matches_definition=None
            if task_fingerprint is None
            else manifest.task_fingerprint == task_fingerprint,
            seed=manifest.seed,
        )
        for split_name, split in sorted(manifest.splits.items()):
            entry["splits"][split_name] = {
                "num_shards": len(split.shards),
                "num_records": split.num_records,
                "stats": _stats(version_dir, split_name),
                "verification": resolver.verification(task, sha, split_name),
            }
        out.append(entry)
    return out


def _stats(version_dir: str, split: str) -> dict[str, Any] | None:
    try:
        stats = json.loads(fs.read_bytes(fs.join(version_dir, f"stats.{split}.json")))
    except (OSError, ValueError):
        return None
    return stats if isinstance(stats, dict) else None
