"""ratelimit_app.core.wire: decide.lua's call as bytes, built once per plan, and its reply unpacked."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from ratelimit_app import Policy
from ratelimit_app.core.algorithms import BY_NAME, CALENDAR_WINDOW
from ratelimit_app.core.engine import prepare_call
from ratelimit_app.core.wire import HIT, SHADOW_FLAG, call_plan, decisions


def small_policy(algorithm: str, limit: int = 5, period: float = 1.0) -> Policy:
    return Policy("p", algorithm, limit=limit, period=period)


@pytest.mark.parametrize("checks", [
    [("k", [small_policy("gcra")])],
    [("ip", [small_policy("fixed_window")]),
     ("key", [small_policy("sliding_window"), Policy("q", "gcra", limit=5, period=1)])],
    [("k", [Policy("p", "sliding_window", limit=500, period=60), Policy("q", "concurrency", limit=2, period=60)])],
])
def test_the_packed_command_is_redis_pys_packing_of_the_same_call(checks: list[Any]) -> None:
    """The speed path writes `packed`, spliced from a cached plan; the reference paths send `command()`
    through redis-py's packing: the same bytes, on the first call of a plan and on a cached one."""
    from redis.connection import Connection

    for identity in ("first", "second"):
        checks = [(f"{name}:{identity}", policies) for name, policies in checks]
        call = prepare_call("rl", checks, 2, charge=True, lease="lease-1")
        assert call.packed == b"".join(Connection().pack_command(*call.command()))
        assert len(call.keys) == len(checks) + sum(p.algorithm in ("sliding_window", "concurrency")
                                                   for _, policies in checks for p in policies)


def test_each_policy_is_sent_with_its_registry_code_plus_the_shadow_flag() -> None:
    policies = (Policy("a", "token_bucket", limit=5, period=1, burst=9), Policy("b", "gcra", limit=5, period=1,
                shadow=True), Policy("c", "fixed_window", limit=5, period=86400, calendar="day"))
    plan = call_plan("rl", (policies,), 1, HIT, 0)
    assert plan is call_plan("rl", (policies,), 1, HIT, 0)  # built once per plan
    numbers = plan.args[0]
    assert struct.unpack_from(">qBBq", numbers) == (1, HIT, 1, 0)
    position, sent = 18, []
    for _ in policies:
        code, limit, _period, extra, identity, length = struct.unpack_from(">qqqqBB", numbers, position)
        sent.append((code, limit, extra, identity))
        position += 34 + length
    assert sent == [(BY_NAME["token_bucket"].code, 5, 9, 1), (BY_NAME["gcra"].code + SHADOW_FLAG, 5, 5, 1),
                    (CALENDAR_WINDOW.code, 5, 0, 1)]


@pytest.mark.parametrize("reply", [None, b"OK", [1, 1, 4], b"\0" * 23, b"\0" * 25])
def test_a_reply_of_the_wrong_shape_is_no_decision(reply: Any) -> None:
    plan = call_plan("rl", ((small_policy("gcra"),),), 1, HIT, 0)
    assert decisions(plan, reply) is None
    [decision] = decisions(plan, struct.pack(">qqq", 4, 1000, 0)) or []
    assert decision.allowed and decision.remaining == 4
