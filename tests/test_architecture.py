"""The layout holds: the core imports no Django, and no module of ratelimit_app imports itself back
through another (no import cycles), at import time or inside functions."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ratelimit_app"


def test_the_core_imports_no_django() -> None:
    modules = sorted(f"ratelimit_app.core.{path.stem}" for path in (PACKAGE / "core").glob("*.py"))
    code = (f"import sys\nfor name in {modules!r}:\n    __import__(name)\n"
            "print(sorted(m for m in sys.modules if m == 'django' or m.startswith(('django.', 'rest_framework'))))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=PACKAGE.parent)
    assert found.stdout.strip() == "[]"
    assert len(modules) >= 10  # the test does look at the core


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """The ratelimit_app modules `path` imports, anywhere in it (top level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_module_imports_itself_back() -> None:
    paths = [p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts]
    modules = {_module_name(p): p for p in paths}
    graph = {name: {m for m in _imports(path, name) if m in modules and m != name} for name, path in modules.items()}
    # packages (their __init__) only group modules: an edge into a package is no cycle of ours
    graph = {name: {m for m in targets if modules[m].name != "__init__.py"} for name, targets in graph.items()}
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append([*trail[trail.index(target):], target])
            elif target not in state:
                visit(target, [*trail, target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


STABLE_PATHS = ["middleware", "throttling", "decorators", "routes", "limiting", "metrics", "logs", "prometheus",
                "dashboard"]


def test_the_stable_paths_are_the_code_itself() -> None:
    """The root modules users import from (MIDDLEWARE, DEFAULT_THROTTLE_CLASSES, the decorators) hand out the
    very objects the code defines: a setting naming the root path and one naming the code's path agree."""
    for stem in STABLE_PATHS:
        module = importlib.import_module(f"ratelimit_app.{stem}")
        assert module.__all__, stem
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) or inspect.isfunction(value):
                home = value.__module__
                assert home.startswith(("ratelimit_app.apply.", "ratelimit_app.observability.")), (stem, name, home)
                assert getattr(importlib.import_module(home), name) is value, (stem, name)


def test_the_apply_folder_holds_every_way_to_apply_limits() -> None:
    for stem in ["middleware", "throttling", "decorators", "routes", "limiting"]:
        shim = (PACKAGE / f"{stem}.py").read_text()
        assert "def " not in shim and "class " not in shim, f"{stem}.py only re-exports"
        assert (PACKAGE / "apply" / f"{stem}.py").exists()
