"""The server fault drills (``deploy/fault_drills/server.py``) in CI sizes, and the runner that finds them.

Each drill starts a real ``taskdata serve`` on 127.0.0.1 over caches built with ``taskdata cache`` (once
per process); the full sizes run with ``python deploy/faults.py`` (figures in RELIABILITY.md).
"""

from __future__ import annotations

import pytest
import requests
import schemathesis

from deploy import faults
from deploy.fault_drills import server as drills
from server.main import create_app

pytestmark = pytest.mark.slow


def test_the_runner_finds_every_server_drill():
    names = [name for name, _ in faults.drills()]
    assert [name for name in names if name.startswith("server-")] == [name for name, _ in drills.DRILLS]
    assert len(drills.DRILLS) == 5


def test_auth_matrix_refuses_every_route_without_the_token():
    figures = drills.auth_matrix()
    assert figures["ok"], figures
    assert figures["routes"] == 11 and figures["refused_401"] == 2 * 2 * 10 + 2  # 10 routes but /healthz


def test_name_corpus_is_never_accepted_and_touches_no_file():
    names = [
        "..",
        "%2e%2e",
        "a/b",
        "a\\b",
        "drill\x00",
        "rnl\n",
        "\uff0e\uff0e",
        "dr\u0456ll",
        "a" * 201,
        "_runs",
    ]
    figures = drills.name_corpus(names)
    assert figures["ok"], figures
    assert figures["accepted"] == figures["server_errors"] == figures["files_created_or_changed"] == 0
    assert figures["valid_name_control"] == 200  # the same requests with a valid name are answered


def test_the_corpus_holds_only_invalid_names():
    with pytest.raises(ValueError, match="'drill' is a valid name"):
        drills.name_corpus(["drill"])


def test_oversize_and_slow_headers_are_cut_off():
    figures = drills.headers(slow_clients=20, idle_clients=5, requests=30, header_timeout=1, keep_alive=1)
    assert figures["ok"], figures
    assert figures["cut_off"] == 25 and figures["still_held"] == 0
    assert set(figures["oversize_header_statuses"].values()) <= {200, 431, "closed"}


def test_unauthenticated_uploads_are_refused_unread_and_big_bodies_capped():
    figures = drills.bodies(uploads=2, upload_mb=20)
    assert figures["ok"], figures
    assert figures["capped_declared_status"] == figures["capped_streamed_status"] == 413


def test_schemathesis_finds_no_server_error():
    figures = drills.schemathesis_run(max_examples=5)
    assert figures["ok"], figures
    assert figures["operations"] == 11 and figures["requests"] > 0 and figures["server_errors"] == 0


def test_the_schemathesis_drill_would_see_a_server_error():
    # Negative control for the drill's failure path: the same validation call on a 500 answer raises.
    schema = schemathesis.openapi.from_dict(create_app().openapi())
    case = schema["/runs"]["GET"].Case()
    broken = requests.Response()
    broken.status_code, broken._content = 500, b"Internal Server Error"
    broken.headers["Content-Type"] = "text/plain"
    broken.request = requests.Request("GET", "http://127.0.0.1/runs").prepare()
    broken.url = broken.request.url
    with pytest.raises(BaseExceptionGroup) as raised:
        case.validate_response(broken)
    assert sorted(drills.failure_kinds(raised.value)) == ["ServerError", "UndefinedStatusCode"]
