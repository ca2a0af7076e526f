"""The architecture's rules, checked on the source (ARCHITECTURE.md states them).

- No import circles anywhere, counting imports inside functions too.
- The core (``taskdata``) knows no HTTP and no JAX, and imports neither ``server`` nor
  ``trainer_client``; only ``taskdata.cli`` (``taskdata serve``) opens the door to the server.
- The server never builds caches (no ``taskdata.beam``); server and client meet only over HTTP.
- Only entry points read the environment: ``taskdata.config`` (for them), the CLI, the server's
  settings and the example trainer; and ``taskdata.seqio_bridge.runtime`` sets one variable for seqio.
- No test module imports another test module (or a conftest): shared builders live in helper modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("taskdata", "server", "trainer_client")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _module_level(tree: ast.AST) -> list[ast.AST]:
    """The nodes of a module that run when it is imported: not function bodies (nor TYPE_CHECKING blocks)."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)
    return out


def _imports(name: str, path: Path, *, at_import: bool = False) -> set[str]:
    """Every module ``name`` imports (at any depth of the file; with ``at_import``, only what runs when it
    is imported), internal or not, as dotted names."""
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in _module_level(tree) if at_import else ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name if _is_package(name) else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            for alias in node.names:
                # 'from pkg import sub' imports the submodule pkg.sub when there is one.
                out.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module)
    return out


GRAPH = {name: {m for m in _imports(name, path) if m in MODULES and m != name} for name, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(GRAPH[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    assert _cycles() == []


def test_the_cycle_finder_finds_a_circle():  # the negative control of the test above
    GRAPH["taskdata.names"].add("taskdata.define.registry")
    try:
        assert ["taskdata.define.registry", "taskdata.names"] in [
            [m for m in c if m in ("taskdata.define.registry", "taskdata.names")] for c in _cycles()
        ]
    finally:
        GRAPH["taskdata.names"].discard("taskdata.define.registry")


def _offenders(prefix: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> dict[str, list[str]]:
    bad = {}
    for name, path in MODULES.items():
        if not (name == prefix or name.startswith(prefix + ".")) or name in allowed:
            continue
        hits = sorted(m for m in _imports(name, path) if any(m == f or m.startswith(f + ".") for f in forbidden))
        if hits:
            bad[name] = hits
    return bad


def test_the_core_knows_no_http_no_jax_and_neither_server_nor_client():
    forbidden = ("server", "trainer_client", "fastapi", "starlette", "uvicorn", "jax", "jaxlib", "httpx")
    assert _offenders("taskdata", forbidden, allowed=("taskdata.cli",)) == {}
    # The CLI's door to the server is 'taskdata serve' alone.
    assert _offenders("taskdata.cli", ("trainer_client", "jax")) == {}


def test_the_server_never_builds_caches_and_meets_the_client_only_over_http():
    assert _offenders("server", ("taskdata.beam", "apache_beam", "trainer_client", "jax")) == {}
    assert _offenders("trainer_client", ("server", "taskdata.beam", "apache_beam", "fastapi")) == {}


def test_uvicorn_is_used_through_its_top_level_api_alone():
    # No framework internals (DESIGN.md): uvicorn's protocols, loops and server classes may change in any release.
    hits = {name: sorted(m for m in _imports(name, path) if m.startswith("uvicorn.")) for name, path in MODULES.items()}
    assert {name: found for name, found in hits.items() if found} == {}
    assert "uvicorn" in _imports("server.serving", MODULES["server.serving"])  # (the negative control: it is seen)


def _loaded_with(name: str) -> set[str]:
    """Every module importing ``name`` loads (what its module level and its internal modules' import)."""
    seen, todo, external = set(), [name], set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for imported in _imports(module, MODULES[module], at_import=True):
            parents = [".".join(imported.split(".")[:i]) for i in range(1, imported.count(".") + 2)]
            internal = [p for p in parents if p in MODULES]
            todo.extend(internal)
            if not internal:
                external.add(imported.split(".")[0])
    return external


HEAVY = ("tensorflow", "tensorflow_text", "apache_beam", "seqio")


def test_the_trainer_client_loads_no_tensorflow_beam_or_seqio():
    # 'pip install taskdata[client]' installs none of them: a trainer host imports the client, reads caches
    # (locally, on gs://, through the server) and builds arrays without them. tf_dataset imports TensorFlow
    # when called; the t5x dataset function runs where t5x (and so seqio) is installed.
    loaded = {name: sorted(_loaded_with(name) & set(HEAVY)) for name in MODULES
              if name.startswith("trainer_client") and name != "trainer_client.t5x_dataset"}
    assert {name: heavy for name, heavy in loaded.items() if heavy} == {}
    # Negative control: what a module loads includes its own module-level imports and its modules' ones.
    assert "grain" in _loaded_with("trainer_client.grain_dataset")
    assert "orbax" in _loaded_with("trainer_client.example.checkpoint")  # itself and through orbax_state


ENVIRONMENT_READERS = {
    "taskdata.config", "taskdata.cli", "server.settings", "trainer_client.example.train",
    # Not a reader but the one compatibility write: it sets protobuf's TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK
    # (setdefault) right before importing seqio, in the launcher and on Beam workers (see its docstring).
    "taskdata.seqio_bridge.runtime",
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_only_entry_points_read_the_environment(name):
    if name in ENVIRONMENT_READERS:
        return
    tree = ast.parse(MODULES[name].read_text())
    reads = [
        node.lineno
        for node in ast.walk(tree)
        if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "from_environment"))
    ]
    assert reads == [], f"{name} reads the environment at lines {reads}; take the value as an argument"


def test_only_the_seqio_bridge_imports_seqio_and_only_through_import_seqio():
    # seqio is an optional extra, and importing it needs protobuf's version check relaxed first.
    importers = {name for name, path in MODULES.items()
                 if any(m == "seqio" or m.startswith("seqio.") for m in _imports(name, path))}
    assert importers == {"taskdata.seqio_bridge.runtime"}


# --- The tests themselves -------------------------------------------------------------------------------

TESTS = ROOT / "tests"


def _test_modules_imported(source: str, package: str = "tests") -> list[str]:
    """The test modules (``tests.test_*``) and conftests that ``source``, a module of ``tests``, imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = package if node.level else (node.module or "")
            if node.level and node.module:
                module = f"{package}.{node.module}"
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if len(parts) > 1 and parts[0] == package and parts[1].startswith(("test_", "conftest")):
                found.append(f"{package}.{parts[1]}")
    return sorted(set(found))


def test_no_test_module_imports_another_test_module():
    # Shared builders and fixtures live in tests/conftest.py or in helper modules (tests/cache_helpers.py,
    # tests/run_helpers.py...): importing a test module collects its tests and fixtures a second time.
    offenders = {str(path.relative_to(ROOT)): hits for path in sorted(TESTS.rglob("*.py"))
                 if (hits := _test_modules_imported(path.read_text()))}
    assert offenders == {}, (
        f"{offenders}: move what they share into tests/conftest.py (fixtures) or a helper module under tests/ "
        "whose name does not start with test_")


def test_the_test_import_finder_finds_every_form():  # the negative control of the test above
    assert _test_modules_imported("from tests.test_cache_job import build") == ["tests.test_cache_job"]
    assert _test_modules_imported("from tests import test_sentence_task, helpers") == ["tests.test_sentence_task"]
    assert _test_modules_imported("import tests.test_runs as runs") == ["tests.test_runs"]
    assert _test_modules_imported("from .test_server import TOKEN") == ["tests.test_server"]
    assert _test_modules_imported("from . import test_server") == ["tests.test_server"]
    assert _test_modules_imported("def f():\n    from tests.conftest import x") == ["tests.conftest"]
    assert _test_modules_imported("from tests.cache_helpers import build\nimport testing.test_x") == []
