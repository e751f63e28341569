"""The layout holds (docs/architecture.md): folders are layers and imports run one way, down; no cycles;
every public name has one home; the core imports no Django; modules and functions stay readable."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ratelimit_app"

#: Lowest first. A module may import from its own layer and the layers below it, never above.
LAYERS = ("core", "conf", "service", "plans", "apply", "entry")
#: Root modules that belong to a lower layer than the entry points around them (Django finds models.py there).
ROOT_MODULES_IN_LAYERS = {"ratelimit_app": "core", "ratelimit_app.models": "plans"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
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
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                found.add(submodule if submodule in modules else module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def layer_of(module: str) -> str:
    if module in ROOT_MODULES_IN_LAYERS:
        return ROOT_MODULES_IN_LAYERS[module]
    part = module.split(".")[1]
    return part if part in LAYERS else "entry"


def test_imports_run_down_the_layers() -> None:
    climbs = sorted((name, target) for name, targets in _graph().items() for target in targets
                    if LAYERS.index(layer_of(target)) > LAYERS.index(layer_of(name)))
    assert climbs == []


def test_every_layer_is_populated() -> None:
    """The layer table is not vacuous: each layer holds modules (a renamed folder would empty one)."""
    counts = {layer: 0 for layer in LAYERS}
    for name in _modules():
        counts[layer_of(name)] += 1
    assert all(count >= 3 for count in counts.values()), counts


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append([*trail[trail.index(target):], target])
            elif target not in state:
                visit(target, [*trail, target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return cycles


def test_no_module_imports_itself_back() -> None:
    assert _cycles(_graph()) == []


def _part(module: str) -> str:
    """A folder of the package, or a module at its root (models.py is a part of its own: plans/ reads it)."""
    parts = module.split(".")
    if len(parts) > 2 or (PACKAGE / parts[-1]).is_dir():
        return ".".join(parts[:2])
    return module


def _parts() -> dict[str, set[str]]:
    parts: dict[str, set[str]] = {}
    for name, targets in _graph().items():
        parts.setdefault(_part(name), set()).update(_part(t) for t in targets if _part(t) != _part(name))
    return parts


def test_no_cycle_between_parts() -> None:
    assert _cycles(_parts()) == []


def test_the_models_sit_below_the_plans_that_read_them() -> None:
    """plans/ reads models.py, and models.py imports nothing of plans/ (what both need sits below them)."""
    parts = _parts()
    assert "ratelimit_app.models" in parts["ratelimit_app.plans"]
    assert "ratelimit_app.plans" not in parts["ratelimit_app.models"]


def test_the_core_imports_no_django() -> None:
    modules = sorted(name for name in _modules() if layer_of(name) == "core" and name != "ratelimit_app")
    code = (f"import sys\nfor name in {modules!r}:\n    __import__(name)\n"
            "print(sorted(m for m in sys.modules if m == 'django' or m.startswith(('django.', 'rest_framework'))))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=PACKAGE.parent)
    assert found.stdout.strip() == "[]"
    assert len(modules) >= 8  # the test does look at the core


def _defines_something(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else []
        if any(not (isinstance(t, ast.Name) and t.id == "__all__") for t in targets):
            return True
    return False


def test_no_module_only_re_exports() -> None:
    """Every module holds code of its own; only a package's __init__ may just list names."""
    hollow = [name for name, path in _modules().items()
              if path.name != "__init__.py" and path.read_text().strip()
              and not _defines_something(ast.parse(path.read_text()))]
    assert hollow == []


def test_the_roles_users_import_hold_their_code() -> None:
    """MIDDLEWARE, DEFAULT_THROTTLE_CLASSES and the decorators name the module that defines them."""
    from ratelimit_app import decorators, middleware, throttling

    assert middleware.RateLimitMiddleware.__module__ == "ratelimit_app.middleware"
    for name in ("AnonRateThrottle", "UserRateThrottle", "ScopedRateThrottle", "TierRateThrottle"):
        assert getattr(throttling, name).__module__ == "ratelimit_app.throttling", name
    for name in ("ratelimit", "limit_concurrency", "limit_cost"):
        assert getattr(decorators, name).__module__ == "ratelimit_app.decorators", name


def test_modules_and_functions_stay_readable() -> None:
    """No module over 400 lines, no function over 50."""
    long_modules, long_functions = [], []
    for name, path in _modules().items():
        source = path.read_text()
        if len(source.splitlines()) > 400:
            long_modules.append(name)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None \
                    and node.end_lineno - node.lineno + 1 > 50:
                long_functions.append(f"{name}.{node.name}")
    assert long_modules == []
    assert long_functions == []


def test_tests_mirror_the_package() -> None:
    """Each folder of the package has its folder of tests, and the suite's helpers live in tests/support."""
    tests = PACKAGE.parent / "tests"
    for folder in ("core", "conf", "service", "plans", "apply", "observability", "gateway"):
        assert list((tests / folder).glob("test_*.py")), folder
    loose = [p.name for p in tests.glob("*.py") if not p.name.startswith(("test_", "conftest", "__init__"))]
    assert loose == []


#: Statements and expressions that make a function take one path or another.
_BRANCHES = (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match, ast.BoolOp, ast.comprehension)


def _mirrored_test(path: Path) -> Path:
    """tests/<folder>/test_<module>.py for a module in a folder of the package (a module of a subfolder, such
    as management/commands/, is tested in its top folder's tests; a leading "_" is dropped), and
    tests/test_<module>.py for a module at its root."""
    relative = path.relative_to(PACKAGE)
    name = f"test_{path.stem.lstrip('_')}.py"
    tests = PACKAGE.parent / "tests"
    return tests / name if len(relative.parts) == 1 else tests / relative.parts[0] / name


def _has_logic(path: Path) -> bool:
    """False for a module under 40 lines none of whose functions branches (declarations: names, dataclasses,
    exceptions, URL patterns)."""
    source = path.read_text()
    if len(source.splitlines()) >= 40:
        return True
    functions = [node for node in ast.walk(ast.parse(source))
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    return any(isinstance(inner, _BRANCHES) for function in functions for inner in ast.walk(function))


def test_every_module_with_logic_has_its_test_file() -> None:
    """Tests mirror the package: each module (migrations and __init__.py aside) has its own test file at
    `_mirrored_test`, unless it is under 40 lines and defines no function with a branch."""
    modules = [p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts and p.name != "__init__.py"]
    missing = sorted(str(p.relative_to(PACKAGE)) for p in modules if _has_logic(p) and not _mirrored_test(p).exists())
    assert missing == []
    assert len(modules) > 60  # the test does look at the package


#: The modules a request passes through (apply/ and these): they read settings through the snapshot
#: (conf/snapshot.py) only.
_REQUEST_PATH = ("ratelimit_app.middleware", "ratelimit_app.viewlimits",
                 "ratelimit_app.decorators", "ratelimit_app.throttling", "ratelimit_app.ninja.throttles",
                 "ratelimit_app.ninja.refusals", "ratelimit_app.ninja.operations", "ratelimit_app.gateway.views",
                 "ratelimit_app.gateway.views_async", "ratelimit_app.gateway.answers", "ratelimit_app.gateway.guard",
                 "ratelimit_app.gateway.describe", "ratelimit_app.gateway.lease")


def _imported_names(path: Path) -> set[str]:
    """Every `module` and `module.name` that `path` imports (relative imports as written: `..conf.settings`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_request_path_reads_settings_through_the_snapshot_only() -> None:
    """No module of the request path reads RATELIMIT (`ratelimit_settings`) or Django's settings itself:
    what it needs is in the one snapshot, rebuilt when settings change."""
    request_path = {name: path for name, path in _modules().items()
                    if name in _REQUEST_PATH or name.startswith("ratelimit_app.apply.")}
    readers = sorted(name for name, path in request_path.items() for imported in _imported_names(path)
                     if imported.endswith(("settings.ratelimit_settings", "django.conf.settings")))
    assert readers == []
    assert len(request_path) > 25  # the test does look


def test_the_shared_layer_imports_no_framework_but_django() -> None:
    """apply/ is what every entry point shares: DRF, Django Ninja and Channels code lives in their rooms."""
    frameworks = ("rest_framework", "ninja", "channels", "adrf")
    found = sorted(f"{name}: {imported}" for name, path in _modules().items() if name.startswith("ratelimit_app.apply.")
                   for imported in _imported_names(path) if imported.split(".")[0] in frameworks)
    assert found == []


#: The rooms of DRF's and Django Ninja's code: no other module of ours imports them.
_DRF_ROOM = ("ratelimit_app.throttling", "ratelimit_app.throttling_checks", "ratelimit_app.drf")
_FRAMEWORK_ROOMS = {"rest_framework": _DRF_ROOM, "adrf": _DRF_ROOM, "ninja": ("ratelimit_app.ninja",)}


def test_drf_and_ninja_code_stays_in_their_rooms() -> None:
    outside = sorted(f"{name}: {imported}" for name, path in _modules().items() for imported in _imported_names(path)
                     if imported.split(".")[0] in _FRAMEWORK_ROOMS
                     and not any(name == room or name.startswith(f"{room}.")
                                 for room in _FRAMEWORK_ROOMS[imported.split(".")[0]]))
    assert outside == []
    assert {"ratelimit_app.drf.joint", "ratelimit_app.ninja.throttles"} <= set(_modules())  # the rooms exist


def test_one_request_attribute_of_ours() -> None:
    """Only the admission path writes on a request (its one `request.ratelimit`); no private attribute of
    ours is named anywhere in the package (`request.limited` is `@ratelimit(block=False)`'s answer)."""
    private, writers = [], []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_ratelimit"):
                private.append(f"{name}: {node.value}")
            if _writes_on_a_request(node):
                writers.append(name)
    assert private == []
    assert sorted(set(writers)) == ["ratelimit_app.apply.admission"]


def _writes_on_a_request(node: ast.AST) -> bool:
    """True for `<request>.__dict__[...] = ...`, `<request>.__dict__.setdefault(...)`, `setattr(<request>, ...)`
    and `<request>.<name> = ...` (but `limited`, and Django's `user` resolved), where <request> is a name
    holding "request"."""
    def is_request(target: ast.AST) -> bool:
        return isinstance(target, ast.Name) and "request" in target.id

    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
        value = node.value
        return isinstance(value, ast.Attribute) and value.attr == "__dict__" and is_request(value.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("setdefault", "update"):
        owner = node.func.value
        return isinstance(owner, ast.Attribute) and owner.attr == "__dict__" and is_request(owner.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
        return is_request(node.args[0])
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        return is_request(node.value) and node.attr not in ("limited", "user")
    return False
