"""The suite never empties the Redis it is given: FLUSHALL, FLUSHDB and SCRIPT FLUSH run only on a Redis a
test started itself (REDIS_URL may name a developer's own Redis, shared with other apps).

Two guards: in the test process, a client of the suite's Redis refuses those commands (the session fixture
`_never_flush_the_suites_redis` of tests/conftest.py); and in the sources, every call of one of them is in
a test that takes a fixture starting a Redis of its own."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import redis

from devtools.embedded import RedisProcess

ROOT = Path(__file__).resolve().parents[1]
DESTRUCTIVE = {"flushall", "flushdb", "script_flush"}
#: Fixtures that start a Redis of the test's own (tests/conftest.py `server`, tests/core/test_cluster.py).
OWN_REDIS_FIXTURES = {"server", "cluster"}


class NeverSent(Exception):
    pass


def unsendable_client(url: str) -> redis.Redis:
    """A client of `url` that raises NeverSent instead of taking a connection: nothing reaches Redis."""
    pool = redis.ConnectionPool.from_url(url)

    def no_connection(*args: Any, **kwargs: Any) -> Any:
        raise NeverSent

    pool.get_connection = no_connection  # type: ignore[method-assign]
    return redis.Redis(connection_pool=pool)


@pytest.mark.parametrize("command", sorted(DESTRUCTIVE))
def test_a_client_of_the_suites_redis_refuses_to_empty_it(redis_url: str, command: str) -> None:
    with pytest.raises(AssertionError, match=f"{command} on the Redis the suite was given"):
        getattr(unsendable_client(redis_url), command)()


def test_a_redis_of_the_tests_own_may_be_emptied(server: RedisProcess) -> None:
    client = redis.Redis.from_url(server.url)
    client.set("k", 1)
    client.script_load("return 1")
    assert client.script_flush() and client.flushdb() and client.flushall()
    assert client.dbsize() == 0
    client.close()


def _calls_outside_own_redis(path: Path) -> list[str]:
    """Calls of a destructive command in `path` that are not in a function taking OWN_REDIS_FIXTURES."""
    found: list[str] = []

    def visit(node: ast.AST, owned: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            owned = owned or bool(OWN_REDIS_FIXTURES & {arg.arg for arg in node.args.args})
        if isinstance(node, ast.Call) and not owned and _is_destructive(node):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        for child in ast.iter_child_nodes(node):
            visit(child, owned)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def _is_destructive(call: ast.Call) -> bool:
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    if name in DESTRUCTIVE:
        return True
    if name == "execute_command" and call.args and isinstance(call.args[0], ast.Constant):
        words = str(call.args[0].value).upper().split()
        return words[:1] in (["FLUSHALL"], ["FLUSHDB"]) or words[:2] == ["SCRIPT", "FLUSH"]
    return False


def test_every_flush_in_the_sources_is_on_a_redis_the_test_started() -> None:
    sources = [p for folder in ("tests", "devtools") for p in (ROOT / folder).rglob("*.py")
               if p != Path(__file__).resolve()]
    assert len(sources) > 100  # the test does look at the suite
    found = [call for path in sources for call in _calls_outside_own_redis(path)]
    assert found == []
