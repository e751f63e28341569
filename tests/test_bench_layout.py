"""bench/ keeps the package's house rules (tests/test_architecture.py): no module over 400 lines, no
import cycle among its modules, and a docstring saying what each module is for."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_architecture import _cycles

BENCH = Path(__file__).resolve().parent.parent / "bench"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    def name(path: Path) -> str:
        parts = path.relative_to(BENCH.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    return {name(path): path for path in BENCH.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The bench modules `path` imports, anywhere in it (top level or inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.update({f"{node.module}.{alias.name}" for alias in node.names} | {node.module})
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in modules}


def test_no_bench_module_is_over_the_size_limit() -> None:
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in _modules().items()}
    assert {name: lines for name, lines in sizes.items() if lines > MAX_LINES} == {}
    assert len(sizes) > 30  # the test does look at bench/


def test_no_bench_module_imports_itself_back() -> None:
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert _cycles(graph) == []


def test_every_bench_module_says_what_it_is_for() -> None:
    missing = [name for name, path in _modules().items()
               if path.name != "__init__.py" and not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))]
    assert missing == []
