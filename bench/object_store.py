"""A test object store that behaves like one: GCS's JSON API object reads, many at once, at a set latency.

``python -m bench.object_store --root DIR --bucket B --port P --delay-ms 20`` serves the files under
``DIR`` as the objects of bucket ``B`` (object name = path relative to ``DIR``) on 127.0.0.1, over the
routes gcsfs reads with (``STORAGE_EMULATOR_HOST=http://127.0.0.1:P``):

- ``GET /download/storage/v1/b/B/o/NAME?alt=media`` (and the same without ``/download``): the object's
  bytes, a ``Range: bytes=a-b`` (``a-``, ``-n``) as 206 with ``Content-Range``, a range past the end as 416;
- ``GET /storage/v1/b/B/o/NAME``: the object's metadata (size, crc32c, generation, times);
- ``GET /storage/v1/b/B/o?prefix=P&delimiter=/``: a listing (one page); ``GET /storage/v1/b/B``: the bucket.

Every request waits ``--delay-ms`` before it is answered (a round trip to GCS; the store itself answers
on loopback in well under a millisecond) without holding up the others: it is one asyncio server, not
the single-threaded emulator, with a listen backlog of 1,024. Writes are refused (501): the emulator
(``tests/gcs_emulator.py``) stays for listings of what is written and for writes.

Faults, for tests of the client's retries: ``--fail-every N`` answers every Nth read of object bytes
with 503, ``--stall-every N --stall-s S`` holds every Nth one S seconds longer before answering it.
Both count the reads of object bytes in the order they arrive, so a run's faults are reproducible.

``GET /_store/counts`` (never delayed, never counted; ``?reset_max=1`` then starts the maxima afresh) returns what has been served: requests by kind
(``media ranged``, ``media whole``, ``metadata``, ``list``, ``bucket``, ``refused``) and by object and
kind (``NAME media``, ``NAME metadata``), the faults injected, the most requests in flight at once
(``max_in_flight``; of ranged object reads alone, ``max_ranged_in_flight``), and the bytes of the object
reads' bodies.
``running_store`` starts one in a child process for a bench or a test and stops it by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

__all__ = ["StoreCounts", "running_store", "serve"]

COUNTS_PATH = "/_store/counts"
BACKLOG = 1024


@dataclasses.dataclass(frozen=True)
class StoreCounts:
    """What a store has served so far (``GET /_store/counts``)."""

    requests: Counter[str]
    objects: Counter[str]  # "NAME media" / "NAME metadata": requests per object
    failed: int
    stalled: int
    max_in_flight: int
    max_ranged_in_flight: int
    media_bytes: int

    def __sub__(self, before: StoreCounts) -> StoreCounts:
        """What was served between two readings (the maxima in flight are the later reading's)."""
        return StoreCounts(self.requests - before.requests, self.objects - before.objects, self.failed - before.failed,
                           self.stalled - before.stalled, self.max_in_flight, self.max_ranged_in_flight,
                           self.media_bytes - before.media_bytes)

    @property
    def media(self) -> int:
        """Reads of object bytes (GETs with ``alt=media``), ranged or whole."""
        return self.requests["media ranged"] + self.requests["media whole"]


class _Store:
    def __init__(self, root: str, bucket: str, delay_s: float, fail_every: int, stall_every: int, stall_s: float):
        self.root = os.path.realpath(root)
        self.bucket = bucket
        self.delay_s = delay_s
        self.fail_every = fail_every
        self.stall_every = stall_every
        self.stall_s = stall_s
        self.requests: Counter[str] = Counter()
        self.objects: Counter[str] = Counter()
        self.media_reads = 0
        self.failed = 0
        self.stalled = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.ranged_in_flight = 0
        self.max_ranged_in_flight = 0
        self.media_bytes = 0
        self._crc32c: dict[str, tuple[float, int, str]] = {}

    # --- objects on disk ---------------------------------------------------------------------------

    def path_of(self, name: str) -> str | None:
        """The file of object ``name``; None for a name that is not a file under the root."""
        if not name or name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/")):
            return None
        path = os.path.realpath(os.path.join(self.root, name))
        if not path.startswith(self.root + os.sep) or not os.path.isfile(path):
            return None
        return path

    def metadata(self, name: str, path: str) -> dict[str, Any]:
        stat = os.stat(path)
        updated = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(stat.st_mtime))
        return {"kind": "storage#object", "bucket": self.bucket, "name": name, "size": str(stat.st_size),
                "generation": str(stat.st_mtime_ns), "metageneration": "1", "contentType": "application/octet-stream",
                "crc32c": self.crc32c(path, stat), "timeCreated": updated, "updated": updated}

    def crc32c(self, path: str, stat: os.stat_result) -> str:
        """The object's CRC32C as GCS states it (base64 of the big-endian value), computed once per version."""
        import google_crc32c

        cached = self._crc32c.get(path)
        if cached is None or cached[:2] != (stat.st_mtime, stat.st_size):
            with open(path, "rb") as f:
                value = base64.b64encode(google_crc32c.value(f.read()).to_bytes(4, "big")).decode()
            cached = self._crc32c[path] = (stat.st_mtime, stat.st_size, value)
        return cached[2]

    def listing(self, prefix: str, delimiter: str) -> dict[str, Any]:
        items, prefixes = [], set()
        for folder, dirs, files in os.walk(self.root):
            dirs.sort()
            for file in sorted(files):
                path = os.path.join(folder, file)
                name = os.path.relpath(path, self.root).replace(os.sep, "/")
                if not name.startswith(prefix):
                    continue
                rest = name[len(prefix):]
                if delimiter and delimiter in rest:
                    prefixes.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
                else:
                    items.append(self.metadata(name, path))
        return {"kind": "storage#objects", "items": items, "prefixes": sorted(prefixes)}

    # --- HTTP -----------------------------------------------------------------------------------------

    async def handle(self, request: Any) -> Any:
        from aiohttp import web

        if request.path == COUNTS_PATH:
            response = web.json_response({"requests": dict(self.requests), "objects": dict(self.objects),
                                      "failed": self.failed, "stalled": self.stalled,
                                      "max_in_flight": self.max_in_flight,
                                      "max_ranged_in_flight": self.max_ranged_in_flight,
                                      "media_bytes": self.media_bytes})
            if request.query.get("reset_max"):
                self.max_in_flight, self.max_ranged_in_flight = self.in_flight, self.ranged_in_flight
            return response
        ranged = int(request.query.get("alt") == "media" and "Range" in request.headers)
        self.in_flight += 1
        self.ranged_in_flight += ranged
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.max_ranged_in_flight = max(self.max_ranged_in_flight, self.ranged_in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            return await self._answer(request)
        finally:
            self.in_flight -= 1
            self.ranged_in_flight -= ranged

    async def _answer(self, request: Any) -> Any:
        from aiohttp import web

        path = request.raw_path.split("?", 1)[0]
        query = request.query
        bucket_path = f"/storage/v1/b/{self.bucket}"
        if request.method != "GET":
            return self._refuse(f"{request.method} is not served: this store only reads (use the emulator to write)")
        if path == bucket_path:
            self.requests["bucket"] += 1
            return web.json_response({"kind": "storage#bucket", "name": self.bucket, "id": self.bucket})
        if path == bucket_path + "/o":
            self.requests["list"] += 1
            return web.json_response(self.listing(query.get("prefix", ""), query.get("delimiter", "")))
        for base in (bucket_path + "/o/", "/download" + bucket_path + "/o/"):
            if path.startswith(base):
                name = unquote(path[len(base):])
                break
        else:
            return self._refuse(f"no such route: {path} (this store serves bucket {self.bucket!r}'s object reads)")
        file = self.path_of(name)
        if query.get("alt") != "media":
            self.requests["metadata"] += 1
            self.objects[f"{name} metadata"] += 1
            if file is None:
                return _error(404, f"No such object: {self.bucket}/{name}")
            return web.json_response(self.metadata(name, file))
        return await self._media(request, name, file)

    async def _media(self, request: Any, name: str, file: str | None) -> Any:
        from aiohttp import web

        ranged = "Range" in request.headers
        self.requests["media ranged" if ranged else "media whole"] += 1
        self.objects[f"{name} media"] += 1
        self.media_reads += 1
        if self.fail_every and self.media_reads % self.fail_every == 0:
            self.failed += 1
            return _error(503, "Service unavailable (injected by --fail-every)")
        if self.stall_every and self.media_reads % self.stall_every == 0:
            self.stalled += 1
            await asyncio.sleep(self.stall_s)
        if file is None:
            return _error(404, f"No such object: {self.bucket}/{name}")
        size = os.path.getsize(file)
        start, stop = 0, size
        if ranged:
            parsed = _parse_range(request.headers["Range"], size)
            if parsed is None:
                return web.Response(status=416, headers={"Content-Range": f"bytes */{size}"},
                                    text=f"Range {request.headers['Range']!r} not satisfiable for {size} bytes")
            start, stop = parsed
        with open(file, "rb") as f:
            body = os.pread(f.fileno(), stop - start, start)
        self.media_bytes += len(body)
        headers = {"Content-Type": "application/octet-stream"}
        if ranged:
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        return web.Response(status=206 if ranged else 200, body=body, headers=headers)

    def _refuse(self, message: str) -> Any:
        self.requests["refused"] += 1
        return _error(501, message)


def _error(status: int, message: str) -> Any:
    from aiohttp import web

    return web.json_response({"error": {"code": status, "message": message}}, status=status)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """[start, stop) of one ``bytes=`` range of an object of ``size`` bytes; None when it is not satisfiable."""
    unit, _, spec = header.partition("=")
    first, dash, last = spec.strip().partition("-")
    if unit.strip() != "bytes" or not dash or "," in spec:
        return None
    try:
        if not first:  # the last n bytes
            n = int(last)
            return (max(0, size - n), size) if n > 0 and size else None
        start = int(first)
        stop = size if not last else min(size, int(last) + 1)
    except ValueError:
        return None
    return (start, stop) if start < size and start < stop else None


async def serve(root: str, bucket: str, port: int, delay_ms: float, fail_every: int = 0, stall_every: int = 0,
                stall_s: float = 0.0) -> None:
    """Serves until cancelled (or the process is stopped)."""
    from aiohttp import web

    store = _Store(root, bucket, delay_ms / 1000, fail_every, stall_every, stall_s)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", store.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=BACKLOG)
    await site.start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def read_counts(url: str, reset_max: bool = False) -> StoreCounts:
    with urllib.request.urlopen(url + COUNTS_PATH + ("?reset_max=1" if reset_max else ""), timeout=10) as response:
        data = json.loads(response.read())
    return StoreCounts(Counter(data["requests"]), Counter(data["objects"]), data["failed"], data["stalled"],
                       data["max_in_flight"], data["max_ranged_in_flight"], data["media_bytes"])


@dataclasses.dataclass(frozen=True)
class RunningStore:
    """A store started by ``running_store``: its address (``STORAGE_EMULATOR_HOST``), bucket and pid."""

    url: str
    bucket: str
    pid: int

    def counts(self, reset_max: bool = False) -> StoreCounts:
        """What it has served so far; with ``reset_max``, its maxima in flight start afresh after this reading."""
        return read_counts(self.url, reset_max)


@contextlib.contextmanager
def running_store(root: str, bucket: str, *, delay_ms: float = 0.0, fail_every: int = 0, stall_every: int = 0,
                  stall_s: float = 0.0, port: int | None = None) -> Iterator[RunningStore]:
    """Starts ``python -m bench.object_store`` serving ``root`` as ``bucket``; stops it (by pid) on the way out."""
    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = [sys.executable, "-m", "bench.object_store", "--root", root, "--bucket", bucket, "--port", str(port),
            "--delay-ms", str(delay_ms), "--fail-every", str(fail_every), "--stall-every", str(stall_every),
            "--stall-s", str(stall_s)]
    process = subprocess.Popen(args, cwd=repo, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                read_counts(url)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the object store (pid {process.pid}) did not answer {url} within 30 s "
                                       f"(exit code {process.poll()})") from None
                time.sleep(0.1)
        yield RunningStore(url, bucket, process.pid)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description="Serves a folder as a GCS bucket's object reads, at a set latency.")
    parser.add_argument("--root", required=True, help="folder whose files are the bucket's objects")
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="latency added to every request")
    parser.add_argument("--fail-every", type=int, default=0, help="answer every Nth object read with 503 (0: never)")
    parser.add_argument("--stall-every", type=int, default=0, help="hold every Nth object read --stall-s longer")
    parser.add_argument("--stall-s", type=float, default=0.0)
    args = parser.parse_args()
    for flag in ("delay_ms", "fail_every", "stall_every", "stall_s"):
        if getattr(args, flag) < 0:
            parser.error(f"--{flag.replace('_', '-')} must be >= 0 but got {getattr(args, flag)}")
    if not os.path.isdir(args.root):
        parser.error(f"--root {args.root!r} is not a folder")
    try:  # uvloop where installed: the store's own CPU per request is then about half asyncio's
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(args.root, args.bucket, args.port, args.delay_ms, args.fail_every, args.stall_every,
                         args.stall_s))


if __name__ == "__main__":
    main()
