"""GET /shards at the door (``server.shards_fast``) answers as the whole app does, and the step cache's rules.

The whole app is reached by calling ``FastAPI.__call__`` on an ``AssignmentService``: the middleware, the
routing and the ``get_shards`` route, as before the door existed. Runs are tests/server_helpers.py's
(``mix``: 3 tasks, batch 16, 4 data shards; ``solo``: 2 data shards, a ramp and skipped steps).
"""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr, ValidationError

import server.assignments as assignments
import server.shards_fast as shards_fast
from server.assignments import AnswerCache, step_json
from server.auth import RequestGuard
from server.main import create_app
from server.metrics import MetricsMiddleware
from server.models import MAX_STEP, ShardsQuery
from server.shards_fast import AssignmentService, parse_query
from taskdata.index import PlanError, RunTables, step_slices, to_json
from tests.helpers import metric_samples
from tests.server_helpers import TOKEN, server_env
from tests.server_helpers import make_app as service
from tests.shards_fast_helpers import GOOD, random_requests

env = pytest.fixture(scope="module")(server_env)  # tests/server_helpers.py's caches and runs


class WholeApp:
    """An ``AssignmentService`` reached without its door: every request through FastAPI and its middleware."""

    def __init__(self, app: AssignmentService):
        self.app = app

    async def __call__(self, scope, receive, send):
        await FastAPI.__call__(self.app, scope, receive, send)


# --- parse_query reads what ShardsQuery reads -----------------------------------------------------------

NAMES = ["host", "step", "steps", "run", "num_hosts", "encoding", "bogus", "Host", ""]
VALUES = [
    "0", "1", "3", "7", "8", "15", "16", "64", "65", "65535", "65536", "65537", str(MAX_STEP), str(MAX_STEP + 1),
    "10000000000000000", "007", "00", "-1", "+3", " 3", "3 ", "3.0", "1e3", "1_000", "0x10", "", "x",
    "mix", "solo", "r64", "a.b:c_d", "_runs", "..", "a/b", "é", "a" * 200, "a" * 201, "%33", "ints", "base64",
    "compact", "hex", "INTS",
]  # fmt: skip


@st.composite
def query_strings(draw) -> bytes:
    anything = st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES))
    plain = st.sampled_from([("steps", "1"), ("steps", "64"), ("run", "mix"), ("run", "a.b:c_d"), ("run", "a" * 200),
                             ("num_hosts", "1"), ("num_hosts", "65536"), ("encoding", "ints"), ("encoding", "base64"),
                             ("encoding", "compact")])  # fmt: skip
    pairs = draw(st.lists(st.one_of(anything, plain, plain), max_size=5))
    if draw(st.booleans()):  # mostly well-formed: host and step first
        pairs = [("host", draw(st.sampled_from(VALUES[:8]))), ("step", draw(st.sampled_from(VALUES[:14]))), *pairs]
    text = "&".join(f"{name}={value}" if name != "Host" else name for name, value in pairs)
    return text.encode("utf-8")


def validated(query: bytes) -> dict | None:
    try:
        return ShardsQuery.model_validate(dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True))).model_dump()
    except ValidationError:
        return None


@pytest.mark.slow  # seconds
@settings(max_examples=1500, deadline=None)
@given(query_strings())
def test_what_the_door_parses_shards_query_validates_to_the_same_values(query):
    fields = parse_query(query)
    if fields is not None:
        assert validated(query) == fields


def test_the_door_takes_the_queries_trainers_send_and_leaves_the_rest_to_the_route():
    assert parse_query(b"host=3&step=12000&steps=16&run=r64&encoding=base64") == {
        "host": 3, "step": 12000, "steps": 16, "run": "r64", "num_hosts": None, "encoding": "base64",
    }  # fmt: skip
    assert parse_query(b"step=0&num_hosts=16&host=15") == validated(b"step=0&num_hosts=16&host=15")
    assert parse_query(f"host=0&step={MAX_STEP}".encode())["step"] == MAX_STEP
    # Valid for ShardsQuery too, but not plainly: the route reads them (same values, same answer).
    for query in (b"host=07&step=1", b"host=1&step=1&host=2", b"host=1&step=%31", b"host=1&step=1&run=a+b"):
        assert parse_query(query) is None
    # Invalid: the route says what is wrong (422).
    for query in (b"", b"host=1", b"step=1", b"host=1&step=-1", b"host=65536&step=0", b"host=0&step=0&steps=65",
                  b"host=0&step=0&steps=0", b"host=0&step=0&bogus=1", b"host=0&step=0&encoding=hex",
                  b"host=0&step=0&run=_runs", b"host&step=0", f"host=0&step={MAX_STEP + 1}".encode()):  # fmt: skip
        assert parse_query(query) is None and validated(query) is None, query


# --- the same answers, statuses, headers and metrics ----------------------------------------------------


@pytest.mark.slow
def test_the_door_answers_every_request_as_the_whole_app_does(env, monkeypatch):
    door, whole = service(env, token=SecretStr(TOKEN)), service(env, token=SecretStr(TOKEN))
    entered = []  # requests of the door's app that went through FastAPI (the guard, the route)
    through_fastapi = FastAPI.__call__

    async def spy(app, scope, receive, send):
        if app is door and scope["type"] == "http":
            entered.append(scope["path"])
        await through_fastapi(app, scope, receive, send)

    monkeypatch.setattr(FastAPI, "__call__", spy)
    statuses = []
    requests = random_requests(seed=11, count=400)
    with TestClient(door) as fast, TestClient(WholeApp(whole)) as slow:
        for path, headers in requests:
            a, b = fast.get(path, headers=headers), slow.get(path, headers=headers)
            assert (a.status_code, a.headers.items(), a.content) == (b.status_code, b.headers.items(), b.content), path
            statuses.append(a.status_code)
        scrapes = [client.get("/metrics", headers=GOOD).text for client in (fast, slow)]
    assert set(statuses) == {200, 400, 401, 404, 422}
    answered_at_the_door = len(requests) - entered.count("/shards")
    assert answered_at_the_door > len(requests) / 3  # the door was used, and the rest went through
    assert entered.count("/shards") > 50
    # Every series counts the same; only durations differ.
    door_samples, whole_samples = (metric_samples(text) for text in scrapes)
    for name in (
        "taskdata_http_requests_total",
        "taskdata_http_errors_total",
        "taskdata_http_request_duration_seconds_count",
        "taskdata_step_cache_lookups_total",
        "taskdata_step_cache_entries",
    ):
        assert door_samples[name] == whole_samples[name], name
    shards_200 = (("method", "GET"), ("route", "/shards"), ("status", "200"))
    assert door_samples["taskdata_http_requests_total"][shards_200] == statuses.count(200)


@pytest.mark.slow
def test_errors_inside_an_answer_go_to_the_apps_handlers_as_from_the_route(env, monkeypatch):
    async def plan_error(state, **fields):
        raise PlanError("No such step in this plan.")

    async def bug(state, **fields):
        raise RuntimeError("a bug")

    for failure, status, body in ((plan_error, 400, b'{"detail":"No such step in this plan."}'),
                                  (bug, 500, b"Internal Server Error")):  # fmt: skip
        monkeypatch.setattr(shards_fast, "answer", failure)
        monkeypatch.setattr("server.routers.shards.answer", failure)
        answers = []
        for app in (service(env), None):
            target = app if app is not None else WholeApp(service(env))
            with TestClient(target, raise_server_exceptions=False) as client:
                response = client.get("/shards?host=0&step=0")
                scraped = metric_samples(client.get("/metrics").text)["taskdata_http_requests_total"]
            answers.append((response.status_code, response.headers.items(), response.content, scraped))
        assert answers[0] == answers[1]
        assert answers[0][0] == status and answers[0][2] == body
        assert answers[0][3][(("method", "GET"), ("route", "/shards"), ("status", str(status)))] == 1


def test_the_door_knows_every_middleware_the_app_has():
    # The door does what these do for a GET /shards (count it; check the token and that there is no
    # body) and what Starlette does with an exception. A middleware added to the app must be taught to the
    # door (server/shards_fast.py) before this list changes.
    app = create_app()
    assert [m.cls for m in app.user_middleware] == [MetricsMiddleware, RequestGuard]
    assert not {500, Exception} & set(app.exception_handlers)  # the server error middleware's own 500


# --- the step cache: whole steps when hosts share them, bounded memory ----------------------------------


@pytest.fixture
def tables(env):
    app = service(env)
    with TestClient(app):
        state = app.state.server
        run, _ = state.find_run("mix")
        caches = state.resolver.resolve_run(run)
    return RunTables.of(run.plan, caches)


def counting(monkeypatch) -> dict[str, int]:
    calls = {"alone": 0, "whole": 0}
    real = assignments.step_slices

    def counted(*args, only=None):
        calls["whole" if only is None else "alone"] += 1
        return real(*args, only=only)

    monkeypatch.setattr(assignments, "step_slices", counted)
    return calls


@pytest.mark.slow
def test_hosts_of_a_step_share_its_index_math_and_lone_requests_compute_their_slice_alone(tables, monkeypatch):
    calls = counting(monkeypatch)
    cache = AnswerCache(0)

    def ask(step, hosts):
        for host in hosts:
            body = step_json(cache, "mix", tables, step, host, 4, "base64")
            assert body == to_json(step_slices(tables, step, 4, only=host)[0], "base64")

    ask(5, [2])  # a new step, nothing known of the run: this slice alone
    assert calls == {"alone": 1, "whole": 0}
    ask(5, [0, 1, 3])  # its second host computes the whole step; the others cut from it
    assert calls == {"alone": 1, "whole": 1}
    ask(6, [1, 0, 2, 3])  # the run's last new step was shared: the whole of the next at once
    assert calls == {"alone": 1, "whole": 2}
    ask(7, [0])  # one of the last two was shared: whole (two steps too many when the hosts stop sharing)
    ask(8, [3])
    assert calls == {"alone": 1, "whole": 4}
    ask(9, [1])  # the last two were asked for once each: alone again
    ask(10, [2])
    assert calls == {"alone": 3, "whole": 4}
    # Hosts in step again, two steps in flight: the first of a step comes before the second of the step
    # before. Once they share, a new step is computed whole even then.
    ask(12, [0])
    ask(13, [0])
    ask(12, [1, 2, 3])
    ask(13, [1, 2, 3])
    assert calls == {"alone": 5, "whole": 6}
    ask(14, [0])
    ask(15, [0])  # the step before has one host so far, the one before that all four: whole
    ask(14, [1, 2, 3])
    ask(15, [1, 2, 3])
    assert calls == {"alone": 5, "whole": 8}
    step_json(cache, "mix", tables, 21, 0, 2, "ints")  # another slice count keeps its own record
    assert calls["alone"] == 6


@pytest.mark.slow
def test_the_step_caches_are_bounded(tables):
    cache = AnswerCache(5)
    for step in range(3 * assignments._STEPS):
        for host in (0, 1):
            step_json(cache, "mix", tables, step, host, 4, "ints")
        cache.put(("mix", "f", 4, 0, step, "ints"), b"{}")
    for count in range(1, 2 * assignments._STEPS):  # many (run, slice count) records
        cache.step_reads(f"run{count}", tables, 0, 0, 1)
    assert len(cache) == 5 and len(cache._steps) == assignments._STEPS
    assert len(cache._latest) == assignments._STEPS
    nothing = AnswerCache(0)
    nothing.put(("mix", "f", 4, 0, 0, "ints"), b"{}")
    assert len(nothing) == 0
