"""The package's folders are its layers, and imports point down only.

foundation (conf, models, permissions, checks) < engine < surfaces (web, api, ops) < wiring (apps,
urls, admin, commands); bench sits apart and nothing in the product imports it. The graph is read
from the source (imports inside functions included), so a lazy import cannot hide an arrow.
"""

import ast
import pydoc
from pathlib import Path

import pytest

import queues
from queues.engine.schedules import SCHEDULES
from queues.moved import MOVED

PACKAGE = Path(queues.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {MOVED.get(target, target) for target in found if target in modules} - {name}


def graph() -> dict[str, set[str]]:
    paths = [p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts]
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, modules) for p in paths}


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in {"engine", "web", "api", "ops", "bench"}:
        return parts[1]
    if len(parts) > 1 and parts[1] == "templatetags":
        return "web"  # Django's place for them, the dashboard's helpers
    if len(parts) > 1 and parts[1] in {"conf", "models", "permissions", "checks", "moved"}:
        return "foundation"
    return "wiring"


# What each layer may import besides itself.
ALLOWED = {
    "foundation": {"foundation"},
    "engine": {"foundation"},
    "web": {"foundation", "engine"},
    "api": {"foundation", "engine"},
    "ops": {"foundation", "engine"},
    "wiring": {"foundation", "engine", "web", "api", "ops"},
    "bench": {"foundation", "engine", "web", "api", "ops", "wiring"},
}


def test_arrows_point_down_only():
    wrong = sorted(
        f"{source} -> {target}"
        for source, targets in graph().items() for target in targets
        if layer(target) != layer(source) and layer(target) not in ALLOWED[layer(source)]
    )
    assert not wrong, f"imports against the layers: {wrong}"


def test_the_app_never_imports_the_standalone_project():
    # A host project installs the wheel, which holds the queues package and nothing else.
    paths = [p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts]
    wrong = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            wrong += [f"{module_name(path)} -> {n}" for n in names
                      if n.split(".")[0] == "queueadmin"]
    assert not wrong, wrong


def test_nothing_in_the_product_imports_the_bench():
    assert not [source for source, targets in graph().items()
                if layer(source) != "bench" and any(layer(t) == "bench" for t in targets)]


def test_no_module_imports_itself_through_others():
    edges = graph()

    def reaches(start, goal, seen):
        for nxt in edges.get(start, ()):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                if reaches(nxt, goal, seen):
                    return True
        return False

    circles = sorted(module for module in edges if reaches(module, module, set()))
    assert not circles, f"modules in an import circle: {circles}"


@pytest.mark.parametrize("path", sorted(
    {spec["func"] for spec in SCHEDULES}
    | {"queues.selector.tick", "queues.sweeper.run", "queues.worker.run_batch",
       "queues.bulk.run", "queues.engine.worker.run_batch", "queues.engine.bulk.run"}))
def test_every_stored_task_path_still_resolves_as_django_q2_resolves_it(path):
    # Schedule rows and tasks queued before an upgrade name functions by these dotted paths.
    assert callable(pydoc.locate(path))


def test_the_public_names_of_the_spec_still_import():
    from queues.fairness import plan_batch
    from queues.handlers import PermanentError, RetryableError, handler

    from queues import enqueue, enqueue_many  # noqa: F401
    from queues.engine import fairness, handlers

    assert plan_batch is fairness.plan_batch
    assert (handler, RetryableError, PermanentError) == (
        handlers.handler, handlers.RetryableError, handlers.PermanentError)
