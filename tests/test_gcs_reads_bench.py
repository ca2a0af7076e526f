"""The test object store's own instruments (bench/object_store.py): it passes the bytes through unchanged,
answers ranges as GCS does, serves many requests at once, counts exactly the requests made (by kind and
object), and everything it starts is stopped."""

from __future__ import annotations

import concurrent.futures
import json
import os
import urllib.error
import urllib.request

import pytest

from bench.object_store import running_store

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def test_the_store_serves_ranges_many_at_once_and_counts_each_request(tmp_path):
    data = os.urandom(10_000)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "obj.bin").write_bytes(data)
    with running_store(str(tmp_path), "b", delay_ms=300) as store:
        media = f"{store.url}/download/storage/v1/b/b/o/dir%2Fobj.bin?alt=media"
        assert _get(media, {"Range": "bytes=10-19"})[:2] == (206, data[10:20])
        assert _get(media, {"Range": "bytes=9990-"})[1] == data[9990:]
        assert _get(media, {"Range": "bytes=-5"})[1] == data[-5:]
        assert _get(media, {"Range": "bytes=20000-20010"})[0] == 416
        assert _get(media)[:2] == (200, data)
        status, body, _ = _get(f"{store.url}/storage/v1/b/b/o/dir%2Fobj.bin")
        assert status == 200 and json.loads(body)["size"] == "10000"
        listing = json.loads(_get(f"{store.url}/storage/v1/b/b/o?prefix=&delimiter=/")[1])
        assert listing["prefixes"] == ["dir/"] and listing["items"] == []
        assert _get(f"{store.url}/download/storage/v1/b/b/o/..%2Fescape?alt=media")[0] == 404
        assert _get(f"{store.url}/upload/storage/v1/b/b/o")[0] == 501
        before = store.counts(reset_max=True)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            bodies = list(pool.map(lambda i: _get(media, {"Range": f"bytes={i * 100}-{i * 100 + 99}"})[1], range(8)))
        assert bodies == [data[i * 100 : i * 100 + 100] for i in range(8)]
        served = store.counts() - before
        # Eight requests of 300 ms in flight together, each counted once, by kind and by object.
        assert served.max_in_flight == served.max_ranged_in_flight == 8
        assert served.requests == {"media ranged": 8} and served.objects == {"dir/obj.bin media": 8}
        assert served.media_bytes == 800
        pid = store.pid
    assert not _alive(pid)


def test_injected_faults_fail_and_stall_every_nth_object_read(tmp_path):
    (tmp_path / "x").write_bytes(b"0123456789")
    with running_store(str(tmp_path), "b", fail_every=2, stall_every=3, stall_s=0.2) as store:
        media = f"{store.url}/download/storage/v1/b/b/o/x?alt=media"
        statuses = [_get(media, {"Range": "bytes=0-3"})[0] for _ in range(6)]
        served = store.counts()
    assert statuses == [206, 503, 206, 503, 206, 503]  # the 3rd stalled; the 6th failed (a failure is not held)
    assert (served.failed, served.stalled) == (3, 1)
