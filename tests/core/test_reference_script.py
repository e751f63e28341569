"""The benchmark's measuring stick decides what decide.lua decides.

bench/reference_decide.lua is a hand-written script for one call shape (the HTTP benchmark's request:
a per-IP sliding_window_counter policy, then a tier's token_bucket, exact sliding log and fixed_window),
against which bench/script_floor.py measures decide.lua. Here both run on the same Redis, in one EVAL
that gives them the same Redis TIME (each sees its own keys), interleaved over a run of calls with
time moving on: every reply, byte for byte, must be the same (remaining, reset and retry of each
policy), through refusals of each policy, new and returning identities and costs above 1.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis

from ratelimit_app.core.engine import prepare_call
from ratelimit_app.core.policies import Policy
from ratelimit_app.core.scripts import decide_source

REFERENCE = Path(__file__).resolve().parents[2] / "bench" / "reference_decide.lua"

#: Runs decide.lua (on KEYS[1..k]) and the reference (on KEYS[k+1..2k]) at one frozen Redis TIME.
HARNESS = """
local frozen = {ARGV[1], ARGV[2]}
local real = redis
local pinned = setmetatable({call = function(command, ...)
  if command == 'TIME' then return {frozen[1], frozen[2]} end
  return real.call(command, ...)
end}, {__index = real})
local half = #KEYS / 2
local function keys(from) local list = {} for i = 1, half do list[i] = KEYS[from + i] end return list end
local function ours(KEYS, ARGV, redis)
%s
end
local function reference(KEYS, ARGV, redis)
%s
end
return {ours(keys(0), {ARGV[3]}, pinned), reference(keys(half), {ARGV[3]}, pinned)}
"""


def _tier(tb_limit: int, burst: int, log_limit: int, fw_limit: int) -> tuple[Policy, ...]:
    return (Policy("burst", "token_bucket", limit=tb_limit, period=60, burst=burst),
            Policy("minute", "sliding_window", limit=log_limit, period=60),
            Policy("day", "fixed_window", limit=fw_limit, period=86400))


def _run(client: redis.Redis, prefix: str, ip: Policy, tier: Sequence[Policy], steps: int, seed: int,
         keys: int = 3, max_step_ms: int = 1500, max_cost: int = 3) -> tuple[int, set[int]]:
    """`steps` interleaved calls: how many were allowed, and which policies (0-3) refused one. Asserts
    each pair of replies is equal."""
    harness = client.register_script(HARNESS % (decide_source(), REFERENCE.read_text(encoding="utf-8")))
    rng = random.Random(seed)
    # from Redis's own clock on (a frozen time in the past would expire every key written with PXAT),
    # moving faster than it: a key then outlives its state, which both scripts must see through
    seconds, micros = client.time()
    now_us = seconds * 1_000_000 + micros
    allowed, refusing = 0, set[int]()
    for step in range(steps):
        now_us += rng.randrange(max_step_ms * 1000)
        checks = ((f"ip:{rng.randrange(2)}", (ip,)), (f"key:{rng.randrange(keys)}", tuple(tier)))
        cost = 1 if rng.random() < 0.7 else rng.randrange(1, max_cost + 1)
        ours = prepare_call(f"{prefix}:ours", checks, cost, charge=True)
        reference = prepare_call(f"{prefix}:ref", checks, cost, charge=True)
        assert ours.args == reference.args
        mine, theirs = harness(keys=ours.keys + reference.keys,
                               args=[now_us // 1_000_000, now_us % 1_000_000, *ours.args])
        assert mine == theirs, (step, cost, checks[1][0], mine.hex(), theirs.hex())
        refusing.update(i for i in range(4) if mine[24 * i + 16:24 * i + 24] != bytes(8))
        allowed += all(mine[24 * i + 16:24 * i + 24] == bytes(8) for i in range(4))
    return allowed, refusing


def test_the_reference_decides_as_decide_lua_on_the_benchmark_request(redis_client: redis.Redis,
                                                                      key_prefix: str) -> None:
    """The benchmark's exact numbers: the default per-IP limit of the bench and the enterprise tier."""
    ip = Policy.parse("1000000/m", name="ip", algorithm="sliding_window_counter")
    allowed, refusing = _run(redis_client, key_prefix, ip, _tier(2000, 200, 2000, 1_000_000), 300, seed=1,
                             max_step_ms=5)
    assert allowed == 300 and not refusing


#: (per-IP limit, tier (token bucket limit and burst, sliding log limit, fixed window limit), the policy
#: that refuses first): each case makes another policy the tightest; the sliding logs are long (128 or
#: more: a key of their own) and short
REFUSALS = [
    (40, (6000, 100, 5000, 100_000), 0),
    (5000, (60, 5, 5000, 100_000), 1),
    (5000, (6000, 100, 130, 100_000), 2),
    (5000, (6000, 100, 40, 100_000), 2),
    (5000, (6000, 100, 5000, 150), 3),
]


@pytest.mark.parametrize(("ip_limit", "tier", "refusing"), REFUSALS)
def test_the_reference_decides_as_decide_lua_through_refusals(redis_client: redis.Redis, key_prefix: str,
                                                              ip_limit: int, tier: tuple[int, int, int, int],
                                                              refusing: int) -> None:
    ip = Policy("ip", "sliding_window_counter", limit=ip_limit, period=60)
    allowed, refused = _run(redis_client, key_prefix, ip, _tier(*tier), 400, seed=refusing, max_step_ms=150)
    assert allowed > 50 and refusing in refused
