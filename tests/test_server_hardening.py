"""The assignment service against careless and hostile requests (issue 15), in-process.

- authentication comes before the request body: without the token, nothing of the body is read;
- request bodies are capped (``max_body_bytes``), by Content-Length and by the bytes actually streamed;
- error answers name files relative to the cache root, never the server's absolute paths.

Header limits and timeouts belong to the HTTP server, not the app: tests/test_server_limits.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import types

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from server.main import create_app
from server.settings import Settings
from tests.run_helpers import copy_caches, current_dir, make_registry, mix_run, shared_caches

pytestmark = pytest.mark.slow  # cache jobs (Beam)

TOKEN = "hardening-token-1c9d2e"
GOOD = {"Authorization": f"Bearer {TOKEN}"}
RUN = {"name": "r", "mixture": "toy_det", "seed": 0, "schedule": {"start": 4}, "num_data_shards": 1}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = copy_caches(tmp_path_factory, "hardening")
    runs_file = root.parent / "runs.json"
    runs_file.write_text(json.dumps([mix_run(root).to_dict()]))
    text_dir = shared_caches(tmp_path_factory).parent / "caches-text"
    return types.SimpleNamespace(root=root, runs_file=runs_file, text_dir=text_dir)


def make_app(root, runs_file=None, **settings):
    return create_app(
        Settings(cache_root=str(root), runs_file=str(runs_file) if runs_file else None, **settings),
        make_registry(),
    )


@pytest.fixture(scope="module")
def client(env):
    with TestClient(make_app(env.root, env.runs_file, token=SecretStr(TOKEN))) as client:
        yield client


# --- authentication before the body ---------------------------------------------------------------


def test_a_request_without_the_token_is_refused_before_its_body_is_parsed(client):
    # Before: FastAPI parsed and validated the body first, so a malformed body got 422 without any token.
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        response = client.post(
            "/runs", content=b"{not json", headers={**headers, "Content-Type": "application/json"}
        )
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert TOKEN not in response.text
    malformed = client.post(
        "/runs", content=b"{not json", headers={**GOOD, "Content-Type": "application/json"}
    )
    assert malformed.status_code == 422  # with the token, the body is read and its error reported


def call_app(
    app, method: str, path: str, headers: dict[str, str], body_chunks: list[bytes]
) -> tuple[int, int]:
    """(status, body messages the app took from the server) of one request sent straight to the ASGI app."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    taken = 0
    status = None

    async def receive():
        nonlocal taken
        if taken < len(body_chunks):
            taken += 1
            return {
                "type": "http.request",
                "body": body_chunks[taken - 1],
                "more_body": taken < len(body_chunks),
            }
        await asyncio.sleep(3600)  # the client waits for the answer
        return {"type": "http.disconnect"}

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    asyncio.run(app(scope, receive, send))
    return status, taken


def test_without_the_token_not_one_byte_of_the_body_is_taken(env):
    app = make_app(env.root, env.runs_file, token=SecretStr(TOKEN))
    chunks = [b"x" * 65_536] * 800  # 50 MiB, streamed
    assert call_app(app, "POST", "/runs", {"transfer-encoding": "chunked"}, chunks) == (401, 0)
    assert call_app(
        app, "POST", "/runs", {"authorization": "Bearer wrong", "content-length": str(50 << 20)}, chunks
    ) == (401, 0)
    # The same body with the token is read only up to the cap, then refused.
    status, taken = call_app(app, "POST", "/runs", {**GOOD, "transfer-encoding": "chunked"}, chunks)
    assert status == 413 and taken <= (1 << 20) // 65_536 + 1


def test_bodies_over_the_cap_are_refused_with_413_by_length_or_as_streamed(env):
    with TestClient(make_app(env.root, env.runs_file, token=SecretStr(TOKEN), max_body_bytes=4096)) as client:
        big = json.dumps({**RUN, "skip": [[i, i + 1] for i in range(0, 2000, 2)]}).encode()
        assert len(big) > 4096
        declared = client.post("/runs", content=big, headers={**GOOD, "Content-Type": "application/json"})
        assert declared.status_code == 413, declared.text
        assert declared.json()["detail"] == (
            f"The request body has {len(big):,} bytes, more than this server accepts (4,096 bytes; a run plan "
            "takes a few KB). Send a smaller body, or raise the server's max_body_bytes."
        )
        assert declared.headers["connection"] == "close"  # the rest of the body is never read

        def streamed():
            for i in range(0, len(big), 1000):
                yield big[i : i + 1000]

        chunked = client.post(
            "/runs", content=streamed(), headers={**GOOD, "Content-Type": "application/json"}
        )
        assert (
            chunked.status_code == 413
            and "more than this server accepts (4,096 bytes" in chunked.json()["detail"]
        )
        small = client.post("/runs", json=RUN, headers=GOOD)
        assert small.status_code == 201, small.text


def test_healthz_stays_open_and_unknown_paths_need_the_token_too(client):
    assert client.get("/healthz").status_code == 200
    assert client.get("/nowhere").status_code == 401  # nothing about the routes is told without a token
    assert client.get("/nowhere", headers=GOOD).status_code == 404
    assert client.post("/healthz").status_code == 405


# --- paths relative to the cache root ---------------------------------------------------------------


def test_error_answers_name_files_relative_to_the_cache_root(env, tmp_path_factory):
    root = copy_caches(tmp_path_factory, "relative")
    shutil.copy(env.runs_file, root.parent / "runs.json")
    (root / "_runs").mkdir()
    for name, task in (("solo", "toy_det"), ("rand", "toy_random")):
        (root / "_runs" / f"{name}.json").write_bytes(mix_run(root, name=name, mixture=task).to_bytes())
    (root / "_runs" / "broken.json").write_text("{")
    (current_dir(root, "toy_random") / "COMPLETED").unlink()
    det = current_dir(root, "toy_det")
    shard = det / "train.tfrecord-00002-of-00003"
    data = shard.read_bytes()
    shard.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    answers = {}
    with TestClient(make_app(root, root.parent / "runs.json")) as client:
        answers["verification"] = client.get("/shards", params={"host": 0, "step": 0, "run": "solo"})
        answers["incomplete"] = client.get("/shards", params={"host": 0, "step": 0, "run": "rand"})
        answers["uncached"] = client.post("/runs", json={**RUN, "mixture": "toy_uncached"})
        answers["broken run"] = client.get("/runs/broken")
        tasks = {name: client.get(f"/tasks/{name}").json() for name in ("toy_det", "toy_random")}
    details = {what: response.json()["detail"] for what, response in answers.items()}
    assert [r.status_code for r in answers.values()] == [503, 503, 503, 400]
    assert (
        f"verification of toy_det/{det.name} failed: shard train.tfrecord-00002-of-00003"
        in details["verification"]
    )
    assert "no complete version under toy_random/ has manifest sha256" in details["incomplete"]
    assert "toy_uncached has no CURRENT" in details["uncached"]
    assert "'taskdata cache --task toy_uncached --output <cache root>'" in details["uncached"]
    assert "Stored run _runs/broken.json is not valid JSON" in details["broken run"]
    reported = [
        tasks["toy_det"]["versions"][0]["splits"]["train"]["verification"],
        tasks["toy_random"]["versions"][0]["problem"],
    ]
    assert reported[0].startswith(f"failed: verification of toy_det/{det.name} failed")
    assert reported[1].startswith(
        f"toy_random/{current_dir(root, 'toy_random').name} is not a complete cache"
    )
    base = str(tmp_path_factory.getbasetemp())
    assert not [text for text in [*details.values(), *reported] if base in text]


# --- found by the drills --------------------------------------------------------------------------


def test_listing_tasks_does_not_hold_up_other_requests(env, monkeypatch):
    # Fingerprinting every task lists source files, and the built-in tasks' first fingerprint trains their
    # vocabulary (45 s on a fresh home): GET /tasks did that on the event loop, and /healthz waited.
    from server.routers import tasks

    healthz_answered = threading.Event()
    answered_while_listing = []
    real = tasks.task_summaries

    def slow_summaries(registry):
        answered_while_listing.append(healthz_answered.wait(5))
        return real(registry)

    monkeypatch.setattr(tasks, "task_summaries", slow_summaries)

    async def both() -> tuple[int, int]:
        transport = httpx.ASGITransport(app=make_app(env.root, env.runs_file))
        async with httpx.AsyncClient(transport=transport, base_url="http://drill") as client:
            listing = asyncio.ensure_future(client.get("/tasks"))
            await asyncio.sleep(0.05)
            health = await asyncio.wait_for(client.get("/healthz"), 5)
            healthz_answered.set()
            return (await listing).status_code, health.status_code

    assert asyncio.run(both()) == (200, 200) and answered_while_listing == [True]


def test_405_lists_the_methods_of_the_path(client):
    for path, allowed in (
        ("/healthz", "GET"),
        ("/runs", "GET, POST"),
        ("/runs/mix", "GET"),
        ("/shards", "GET"),
    ):
        response = client.request("DELETE", path, headers=GOOD)
        assert response.status_code == 405 and response.headers["allow"] == allowed, path
