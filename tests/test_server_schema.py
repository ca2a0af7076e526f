"""The OpenAPI schema: a reviewed snapshot, and schema-driven requests (schemathesis) with no server error.

The snapshot is tests/test_server_openapi.json. After an intended API change, regenerate it with

    TASKDATA_UPDATE_OPENAPI=1 PYTHONPATH=. python -m pytest tests/test_server_schema.py -k snapshot

and review the diff with the code change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings, strategies
from schemathesis.checks import positive_data_acceptance

from server.main import create_app
from server.settings import Settings
from server.state import build_state
from tests.run_helpers import copy_caches, make_registry, mix_run, shared_caches

pytestmark = pytest.mark.slow  # cache jobs (Beam)

SNAPSHOT = Path(__file__).with_name("test_server_openapi.json")
UPDATE = "TASKDATA_UPDATE_OPENAPI"
TOKEN = "schema-test-token"


def test_openapi_schema_matches_the_reviewed_snapshot():
    schema = json.dumps(create_app().openapi(), indent=1, sort_keys=True) + "\n"
    if os.environ.get(UPDATE):
        SNAPSHOT.write_text(schema)
    assert SNAPSHOT.exists(), f"No snapshot yet: run with {UPDATE}=1 to write {SNAPSHOT.name}."
    assert schema == SNAPSHOT.read_text(), (
        f"The OpenAPI schema changed. If that is intended, regenerate with {UPDATE}=1 (see this module's "
        "docstring) and review the diff."
    )


def test_every_parameter_is_bounded_and_every_operation_documents_its_errors():
    schema = create_app().openapi()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                spec = parameter["schema"].get("anyOf", [parameter["schema"]])[0]
                if spec["type"] == "integer":
                    assert "minimum" in spec and ("maximum" in spec or "exclusiveMaximum" in spec), (
                        path,
                        parameter,
                    )
                elif "enum" in spec:
                    assert spec["type"] == "string" and spec["enum"], (path, parameter)
                else:
                    assert spec.get("maxLength") and spec.get("pattern"), (path, parameter)
            if operation.get("parameters"):
                assert "422" in operation["responses"], (path, method)
            if path != "/healthz":
                assert "401" in operation["responses"] and operation["security"] == [{"HTTPBearer": []}], path
            assert "200" in operation["responses"] or "201" in operation["responses"], (path, method)


# Generated requests go to this app; the fixture below gives it its state (caches, runs) first.
APP = create_app(registry=make_registry())
schema = schemathesis.openapi.from_dict(APP.openapi())
schema.app = APP


@schema.auth()
class BearerToken:
    """Schemathesis adds the token itself, so its auth checks (no or a wrong token -> 401) can remove it."""

    def get(self, case, context):
        return TOKEN

    def set(self, case, data, context):
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = copy_caches(tmp_path_factory, "schema")
    runs_file = root.parent / "runs.json"
    runs_file.write_text(json.dumps([mix_run(root).to_dict()]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TASKDATA_TEST_TEXT_DIR", str(shared_caches(tmp_path_factory).parent / "caches-text"))
        settings_ = Settings(cache_root=str(root), runs_file=str(runs_file), token=TOKEN)
        APP.state.server = build_state(settings_, APP.state.registry)
        yield APP
        APP.state.server = None


# One test per operation, each named by pytest: schemathesis's own parametrize gives every operation the same
# node id, and pytest-xdist, which runs the suite, keeps one test per node id.
OPERATIONS = [(method.upper(), path) for path, methods in APP.openapi()["paths"].items() for method in methods]


@pytest.mark.parametrize("method, path", OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=strategies.data())
def test_generated_requests_never_get_a_server_error_and_answers_match_the_schema(method, path, data, served):
    # Excluded: "a schema-valid request is accepted". Whether a host index, a batch split or a mixture name
    # is valid depends on the run and the registry, which a schema cannot express; those answers are 400
    # or 404 with a message (pinned in tests/test_server.py). Every other check applies, server errors first.
    case = data.draw(schema[path][method].as_strategy())
    case.call_and_validate(excluded_checks=[positive_data_acceptance])
