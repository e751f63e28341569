"""The engine against a real Redis: exact admission, recovery, atomicity, TTLs and script recovery."""

from __future__ import annotations

import math
import multiprocessing
import random
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from devtools.embedded import RedisProcess
from ratelimit_app import Decision, Policy, RateLimiter
from ratelimit_app.core.algorithms import BY_NAME
from ratelimit_app.core.engine import (
    LOAD_SCRIPT,
    MAX_CLOCK_SHIFT_MS,
    NOSCRIPT,
    decision_steps,
    parse_reply,
    prepare_call,
)
from ratelimit_app.core.exceptions import BackendError
from ratelimit_app.core.keys import KEY_LETTERS, state_entries
from ratelimit_app.core.policies import ALGORITHMS
from tests.support.engine_workers import hammer
from tests.support.tcp_proxy import tcp_proxy

EXACT = ["fixed_window", "sliding_window", "token_bucket", "gcra"]


def small_policy(algorithm: str, limit: int = 5, period: float = 1.0) -> Policy:
    return Policy("p", algorithm, limit=limit, period=period)


def wait_out_fixed_window(limiter: RateLimiter, identity: str, policies: list[Policy], margin: float) -> None:
    """Fixed windows are aligned to the epoch: start a test well inside one, per Redis' own clock."""
    fixed = [p for p in policies if p.algorithm == "fixed_window"]
    if fixed:
        decision = limiter.peek(identity, fixed)
        if decision.reset_after < margin:
            time.sleep(decision.reset_after + 0.01)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_admits_exactly_the_limit_then_recovers(limiter: RateLimiter, algorithm: str) -> None:
    policies = [small_policy(algorithm, limit=5, period=2.0)]
    wait_out_fixed_window(limiter, "client", policies, margin=1.0)
    decisions = [limiter.hit("client", policies) for _ in range(7)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 2
    assert [d.remaining for d in decisions[:5]] == [4, 3, 2, 1, 0]
    denied = decisions[-1]
    assert denied.retry_after is not None and 0 < denied.retry_after <= policies[0].state_ttl
    assert denied.policy == "p" and denied.limit == 5
    # Waiting exactly what the limiter said is enough for the same request.
    time.sleep(denied.retry_after)
    assert limiter.hit("client", policies).allowed


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reset_after_names_the_full_recovery(limiter: RateLimiter, algorithm: str) -> None:
    policies = [small_policy(algorithm, limit=3, period=1.0)]
    wait_out_fixed_window(limiter, "client", policies, margin=0.8)
    last = None
    for _ in range(3):
        last = limiter.hit("client", policies)
    assert last is not None and last.allowed and last.remaining == 0
    peeked = limiter.peek("client", policies)
    assert peeked.remaining == 0 and last.reset_after - 0.25 <= peeked.reset_after <= last.reset_after
    time.sleep(last.reset_after)
    assert limiter.peek("client", policies).remaining == 3


def test_allowed_decision_reports_the_tightest_policy(limiter: RateLimiter) -> None:
    policies = [
        Policy("burst", "token_bucket", limit=20, period=60, burst=10),
        Policy("minute", "sliding_window", limit=20, period=60),
        Policy("day", "fixed_window", limit=1000, period=86400),
    ]
    decision = limiter.hit("apikey:42", policies)
    assert decision.allowed and decision.retry_after is None
    assert (decision.policy, decision.limit, decision.remaining) == ("burst", 10, 9)
    assert [(r.policy, r.remaining) for r in decision.results] == [("burst", 9), ("minute", 19), ("day", 999)]


def test_denied_request_charges_no_policy(limiter: RateLimiter) -> None:
    policies = [
        Policy("burst", "token_bucket", limit=20, period=3600, burst=3),
        Policy("minute", "sliding_window", limit=20, period=60),
        Policy("day", "fixed_window", limit=1000, period=86400),
    ]
    wait_out_fixed_window(limiter, "k", policies, margin=5)
    for _ in range(3):
        assert limiter.hit("k", policies).allowed
    for _ in range(5):
        denied = limiter.hit("k", policies)
        assert not denied.allowed and denied.policy == "burst"
    after = {r.policy: r.remaining for r in limiter.peek("k", policies).results}
    assert after == {"burst": 0, "minute": 17, "day": 997}


def test_denial_by_a_later_policy_leaves_earlier_ones_untouched(limiter: RateLimiter) -> None:
    policies = [
        Policy("minute", "sliding_window", limit=20, period=60),
        Policy("day", "gcra", limit=2, period=86400),
    ]
    assert limiter.hit("k", policies).allowed
    assert limiter.hit("k", policies).allowed
    denied = limiter.hit("k", policies)
    assert not denied.allowed and denied.policy == "day"
    # the policy that allowed reports where it stands: 18 left, full again a minute after the last hit
    minute = denied.results[0]
    assert minute.allowed and minute.remaining == 18 and 55 < minute.reset_after <= 60
    assert limiter.peek("k", policies).results[0].remaining == 18


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_cost_larger_than_capacity_is_denied_without_charge(limiter: RateLimiter, algorithm: str) -> None:
    policies = [small_policy(algorithm, limit=5, period=60)]
    decision = limiter.hit("k", policies, cost=6)
    assert not decision.allowed and decision.retry_after == math.inf
    assert limiter.peek("k", policies).remaining == 5
    assert limiter.hit("k", policies, cost=5).allowed


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_cost_is_charged_in_full(limiter: RateLimiter, algorithm: str) -> None:
    policies = [small_policy(algorithm, limit=10, period=60)]
    wait_out_fixed_window(limiter, "k", policies, margin=5)
    assert limiter.hit("k", policies, cost=4).remaining == 6
    assert limiter.hit("k", policies, cost=6).remaining == 0
    assert not limiter.hit("k", policies, cost=1).allowed


def test_peek_reports_current_state_and_charges_nothing(limiter: RateLimiter) -> None:
    policies = [small_policy("sliding_window", limit=3, period=60)]
    for _ in range(5):
        peeked = limiter.peek("k", policies)
        assert peeked.allowed and peeked.remaining == 3
    limiter.hit("k", policies)
    assert limiter.peek("k", policies).remaining == 2


def test_reset_forgets_the_identity(limiter: RateLimiter, redis_client: redis.Redis) -> None:
    policies = [small_policy(a, limit=2, period=60).__class__(f"p{i}", a, limit=2, period=60)
                for i, a in enumerate(ALGORITHMS)]
    limiter.hit("k", policies)
    limiter.hit("k", policies)
    assert not limiter.hit("k", policies).allowed
    limiter.reset("k", policies)
    assert redis_client.exists(*limiter.keys("k", policies)) == 0
    assert limiter.hit("k", policies).allowed


def test_identities_are_isolated_and_keys_are_safe(limiter: RateLimiter) -> None:
    policies = [small_policy("gcra", limit=1, period=60)]
    hostile = ["{tag}", "a" * 100_000, "x}:{y", "ünïcødé\x00", "\ud800"]
    for identity in hostile:
        assert limiter.hit(identity, policies).allowed
        assert not limiter.hit(identity, policies).allowed
        [key] = limiter.keys(identity, policies)
        assert len(key) < 100 and key.count("{") == 1 and key.count("}") == 1
    assert len({limiter.keys(i, policies)[0] for i in hostile}) == len(hostile)
    with pytest.raises(ValueError, match="identity"):
        limiter.hit("", policies)


def test_all_keys_of_a_decision_share_one_hash_tag(limiter: RateLimiter) -> None:
    policies = [Policy(f"p{i}", a, limit=3, period=60) for i, a in enumerate(ALGORITHMS)]
    tags = {key[key.index("{"):key.index("}") + 1] for key in limiter.keys("apikey:1", policies)}
    assert len(tags) == 1


def test_bad_arguments_raise_clear_errors(limiter: RateLimiter) -> None:
    policies = [small_policy("gcra")]
    for cost in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="cost"):
            limiter.hit("k", policies, cost=cost)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="client"):
        RateLimiter(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Policy"):
        limiter.hit("k", ["20/m"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="unique"):
        limiter.hit("k", [small_policy("gcra"), small_policy("fixed_window")])
    with pytest.raises(ValueError, match="prefix"):
        RateLimiter(limiter.client, prefix="a{b}")
    with pytest.raises(ValueError, match="connections"):
        RateLimiter(limiter.client, connections="threads")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_clock_shift_decides_as_if_redis_time_were_that_much_later(limiter: RateLimiter, algorithm: str) -> None:
    policy = Policy("p", algorithm, limit=2, period=3600)
    assert [limiter.hit("c", [policy]).allowed for _ in range(3)] == [True, True, False]
    refused = limiter.peek("c", [policy])
    # a fixed window ends on the hour: in a run at 02:59:22 only 37.5 s of it were left
    assert refused.retry_after is not None and refused.retry_after > 0
    shift = math.ceil(refused.retry_after * 1000)
    assert not limiter.peek("c", [policy], clock_shift_ms=shift // 2).allowed  # not yet
    assert limiter.peek("c", [policy], clock_shift_ms=shift).allowed
    assert not limiter.hit("c", [policy]).allowed  # Redis' own clock: still refused, nothing was charged
    assert limiter.hit("c", [policy], clock_shift_ms=shift).allowed
    fresh = limiter.hit("d", [policy], clock_shift_ms=10 * 86_400_000)  # an identity first seen in ten days
    assert fresh.allowed and fresh.remaining == 1


def test_a_clock_shift_is_an_integer_of_milliseconds_within_ten_years(limiter: RateLimiter) -> None:
    policies = [small_policy("gcra")]
    for shift in (1.5, True, "1", MAX_CLOCK_SHIFT_MS + 1, -MAX_CLOCK_SHIFT_MS - 1):
        with pytest.raises(ValueError, match="clock_shift_ms"):
            limiter.hit("k", policies, clock_shift_ms=shift)  # type: ignore[arg-type]
    assert limiter.peek("k", policies, clock_shift_ms=-MAX_CLOCK_SHIFT_MS).allowed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_written_key_expires_within_its_state_lifetime(
    limiter: RateLimiter, redis_client: redis.Redis, key_prefix: str, seed: int
) -> None:
    rng = random.Random(seed)
    policy_sets = []
    for n in range(6):
        policies = []
        for i in range(rng.randint(1, 3)):
            algorithm = rng.choice(ALGORITHMS)
            burst = rng.randint(1, 30) if algorithm in ("token_bucket", "gcra") else None
            policies.append(Policy(f"p{i}", algorithm, limit=rng.randint(1, 20),
                                   period=rng.choice([0.5, 2, 60, 3600]), burst=burst))
        policy_sets.append((f"id{n}", policies))
    for _ in range(400):
        identity, policies = rng.choice(policy_sets)
        action = rng.random()
        if action < 0.8:
            limiter.hit(identity, policies, cost=rng.randint(1, 4))
        elif action < 0.95:
            limiter.peek(identity, policies)
        else:
            limiter.reset(identity, policies)
    lifetime: dict[str, float] = {}
    for identity, policies in policy_sets:
        for key, policy in zip(limiter.keys(identity, policies), policies, strict=True):
            lifetime[key] = max(lifetime.get(key, 0.0), policy.state_ttl)  # rate policies share their key
    written = [k.decode() for k in redis_client.scan_iter(match=f"{key_prefix}:*")]
    assert written, "the random run wrote nothing"
    for key in written:
        ttl_ms = redis_client.pttl(key)
        if ttl_ms == -2:
            continue  # expired between SCAN and PTTL: it had a TTL (-1 would mean none)
        # 0: under a millisecond left (policies of 0.5 s keep states for as little as 0.15 s)
        assert 0 <= ttl_ms <= lifetime[key] * 1000 + 50, (key, ttl_ms, lifetime[key])


def test_one_identity_twice_in_a_call_keeps_both_checks(limiter: RateLimiter) -> None:
    """Its per-IP limit and its tier, say: both live in the identity's one key, and both are charged."""
    ip = [Policy("ip", "sliding_window_counter", limit=3, period=60)]
    tier = [Policy("minute", "gcra", limit=5, period=60)]
    allowed = [all(d.allowed for d in limiter.hit_many([("k", ip), ("k", tier)])) for _ in range(4)]
    assert allowed == [True] * 3 + [False]
    assert limiter.peek("k", ip).remaining == 0 and limiter.peek("k", tier).remaining == 2


def test_script_flush_is_recovered_and_charges_once(server: RedisProcess, key_prefix: str, connections: str) -> None:
    """On a Redis of the test's own: SCRIPT FLUSH empties the script cache of every app using a server."""
    client: redis.Redis = redis.Redis.from_url(server.url, socket_timeout=10)
    limiter = RateLimiter(client, prefix=key_prefix, connections=connections)
    policies = [small_policy("sliding_window", limit=10, period=60), Policy("day", "gcra", limit=10, period=86400)]
    assert limiter.hit("k", policies).remaining == 9
    client.script_flush()
    decision = limiter.hit("k", policies)
    assert decision.allowed
    assert [r.remaining for r in limiter.peek("k", policies).results] == [8, 8]
    client.close()


def test_client_retries_never_replay_a_decision(redis_url: str, key_prefix: str, connections: str) -> None:
    """A reply lost after sending is never resent, even by a client configured to retry 5 times."""
    from urllib.parse import urlsplit

    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from redis.retry import Retry

    target = urlsplit(redis_url)
    with tcp_proxy(target.hostname or "127.0.0.1", target.port or 6379) as proxy:
        client: redis.Redis = redis.Redis.from_url(
            proxy.url, socket_timeout=0.2, retry=Retry(NoBackoff(), 5),
            retry_on_error=[RedisTimeoutError, RedisConnectionError],
        )
        limiter = RateLimiter(client, prefix=key_prefix, connections=connections)
        policies = [small_policy("sliding_window", limit=10, period=60)]
        limiter.hit("k", policies)  # loads the script, warms the connection
        proxy.mode = "drop_replies"  # the EVALSHA reaches Redis and is charged; its reply is lost
        with pytest.raises(BackendError) as raised:
            limiter.hit("k", policies)
        assert raised.value.maybe_applied and isinstance(raised.value.__cause__, RedisTimeoutError)
        proxy.mode = "forward"
        assert limiter.peek("k", policies).remaining == 8  # charged once: 1 before + 1 lost reply
        client.close()


def run_concurrently(limiter: RateLimiter, redis_url: str, key_prefix: str, policies: list[Policy],
                     threads: int, processes: int, hits: int) -> int:
    """Hit one identity from `threads` threads here and `processes` processes of 4 threads; return admitted."""
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    results = context.Queue()
    children = [context.Process(target=hammer, args=(redis_url, key_prefix, "apikey:hot", policies, 4, hits,
                                                     start, results, limiter.connections))
                for _ in range(processes)]
    for child in children:
        child.start()
    barrier = threading.Barrier(threads)

    def one_thread(_: int) -> int:
        barrier.wait()
        start.set()
        return sum(limiter.hit("apikey:hot", policies).allowed for _ in range(hits))

    with ThreadPoolExecutor(threads) as executor:
        admitted = sum(executor.map(one_thread, range(threads)))
    admitted += sum(results.get(timeout=120) for _ in children)
    for child in children:
        child.join(timeout=30)
        assert child.exitcode == 0
    return admitted


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", EXACT)
def test_concurrent_clients_admit_exactly_the_tightest_limit(
    redis_client: redis.Redis, redis_url: str, key_prefix: str, algorithm: str, connections: str
) -> None:
    # 32 threads here plus 4 processes of 4 threads, 6 hits each: 288 hits at a tier whose tightest
    # policy allows 40. Long periods keep refills out of the count.
    client: redis.Redis = redis.Redis.from_url(redis_url, socket_timeout=30, max_connections=40)
    limiter = RateLimiter(client, prefix=key_prefix, connections=connections)
    policies = [
        Policy("tight", algorithm, limit=40, period=86400),
        Policy("minute", "sliding_window", limit=100, period=60),
        Policy("day", "fixed_window", limit=1000, period=86400),
    ]
    wait_out_fixed_window(limiter, "apikey:hot", policies, margin=60)
    admitted = run_concurrently(limiter, redis_url, key_prefix, policies, threads=32, processes=4, hits=6)
    assert admitted == 40
    peeked = limiter.peek("apikey:hot", policies)
    assert [r.remaining for r in peeked.results] == [0, 60, 960]
    client.close()


def test_decision_summary_rules() -> None:
    from ratelimit_app import PolicyResult

    a = PolicyResult("a", False, 10, 0, 5.0, 2.0)
    b = PolicyResult("b", False, 10, 0, 9.0, 7.0)
    c = PolicyResult("c", True, 100, 50, 1.0, None)
    denied = Decision.from_results((a, b, c))
    assert (denied.allowed, denied.policy, denied.retry_after) == (False, "b", 7.0)
    allowed = Decision.from_results((c, PolicyResult("d", True, 10, 3, 1.0, None)))
    assert (allowed.allowed, allowed.policy, allowed.remaining, allowed.retry_after) == (True, "d", 3, None)


@pytest.mark.parametrize("reply", [None, b"OK", [1, 1, 4], [1, 1, 4, 1000, b"x"], [1, 1, 4, 1000, 0, 9]])
def test_malformed_reply_raises_one_documented_error(reply: Any) -> None:
    call = prepare_call("rl", [("k", [small_policy("gcra")])], 1, charge=True)
    with pytest.raises(BackendError, match="unexpected reply"):
        parse_reply(call, reply)


def test_unreachable_redis_raises_backend_error(key_prefix: str, connections: str) -> None:
    from devtools.embedded import free_port

    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    with pytest.raises(BackendError) as raised:
        RateLimiter(client, prefix=key_prefix, connections=connections).hit("k", [small_policy("gcra")])
    assert not raised.value.maybe_applied


def test_a_three_policy_hit_is_one_redis_command(connections: str) -> None:
    """Counted with MONITOR on a private server: commands sent by clients, not those run inside the script."""
    from devtools.embedded import start_redis

    server = start_redis()
    try:
        client = redis.Redis.from_url(server.url)
        private = RateLimiter(client, prefix="rl", connections=connections)
        policies = [
            Policy("burst", "token_bucket", limit=20, period=60, burst=10),
            Policy("minute", "sliding_window", limit=20, period=60),
            Policy("day", "fixed_window", limit=1000, period=86400),
        ]
        private.hit("warm", policies)  # the first call also loads the script
        seen: list[str] = []
        with redis.Redis.from_url(server.url).monitor() as monitor:
            private.hit("apikey:42", policies)
            client.execute_command("ECHO", "end-of-test")
            for event in monitor.listen():
                if event["command"] == "ECHO end-of-test":
                    break
                if event["client_type"] != "lua":
                    seen.append(event["command"].split()[0])
        assert seen == ["EVALSHA"]
        client.close()
    finally:
        server.stop()


def test_a_hundred_units_in_one_millisecond_count_as_a_hundred(
    limiter: RateLimiter, redis_client: redis.Redis
) -> None:
    # (a short log: its entry in the identity's key; tests/core/test_long_log.py has the long ones)
    limit = BY_NAME["sliding_window"].long_state_from - 1
    policies = [Policy("minute", "sliding_window", limit=limit, period=60)]
    decision = limiter.hit("k", policies, cost=100)
    assert decision.allowed and decision.remaining == limit - 100
    [key] = limiter.keys("k", policies)
    assert len(stored_state(redis_client, key, "sminute")) == 7 * 100  # one 7-byte admission time per unit
    # and many separate hits within the same milliseconds all count
    pipe_limiter_hits = [limiter.hit("k", policies) for _ in range(20)]
    assert pipe_limiter_hits[-1].remaining == limit - 120
    assert len(stored_state(redis_client, key, "sminute")) == 7 * 120


def _log(*admitted_us: int) -> bytes:
    """A sliding-window log as decide.lua stores it: 7-byte big-endian admission times, oldest first."""
    return b"".join(t.to_bytes(7, "big") for t in admitted_us)


def entry(tag: str, expiry_ms: int, state: bytes | int) -> bytes:
    """One entry of an identity's state key, as decide.lua writes it (an integer state in 7 bytes)."""
    if isinstance(state, int):
        state = state.to_bytes(7, "big")
    return struct.pack(">B", len(tag)) + tag.encode() + struct.pack(">QI", expiry_ms, len(state))[2:] + state


def stored_state(client: redis.Redis, key: str, tag: str) -> bytes:
    """The state of the policy with this tag (its algorithm's letter and its name) in an identity's key."""
    value = client.get(key)
    assert isinstance(value, bytes), (key, value)
    return state_entries(value)[tag][1]


def test_the_sliding_log_drops_units_that_left_the_window_when_it_is_charged(
    limiter: RateLimiter, redis_client: redis.Redis
) -> None:
    policies = [Policy("minute", "sliding_window", limit=5, period=60)]
    [key] = limiter.keys("k", policies)
    seconds, micros = redis_client.time()
    now = seconds * 1_000_000 + micros
    stale = now - 120_000_000  # two periods ago: outside the window
    expiry_ms = now // 1000 + 60_000
    # a log holding only units that left the window counts as empty, and the charge drops them
    redis_client.set(key, entry("sminute", expiry_ms, _log(stale, stale)), px=60_000)
    assert limiter.hit("k", policies).remaining == 4
    assert len(stored_state(redis_client, key, "sminute")) == 7
    # a charge drops every unit that left the window and keeps the live ones: memory stays within the limit
    live = now - 30_000_000
    redis_client.set(key, entry("sminute", expiry_ms, _log(stale, live, live)), px=60_000)
    assert limiter.hit("k", policies).remaining == 2
    log = stored_state(redis_client, key, "sminute")
    assert len(log) == 3 * 7 and log.startswith(_log(live, live))


def test_states_too_large_for_an_integer_are_stored_as_short_strings_and_decide_the_same(
    limiter: RateLimiter, redis_client: redis.Redis
) -> None:
    # an emptied daily bucket of 1,000: its missing units times the time span pass 2^47
    bucket = [Policy("day", "token_bucket", limit=1000, period=86400)]
    assert limiter.hit("k", bucket, cost=1000).allowed
    [key] = limiter.keys("k", bucket)
    assert len(stored_state(redis_client, key, "tday")) == 12
    denied = limiter.hit("k", bucket)
    assert not denied.allowed and denied.remaining == 0 and 86 <= (denied.retry_after or 0) <= 86.4
    # counts of 2^26 and more in a sliding window counter
    counter = [Policy("minute", "sliding_window_counter", limit=10**8, period=60)]
    assert limiter.hit("k", counter, cost=7 * 10**7).allowed
    [key] = limiter.keys("k", counter)
    assert len(stored_state(redis_client, key, "cminute")) == 9
    assert limiter.peek("k", counter).remaining == 3 * 10**7
    assert limiter.hit("k", counter, cost=3 * 10**7).allowed and not limiter.hit("k", counter).allowed


def test_small_states_are_integers(limiter: RateLimiter, redis_client: redis.Redis) -> None:
    """An O(1) state is one integer, 7 bytes in its entry of the identity's key."""
    for algorithm in ("fixed_window", "sliding_window_counter", "token_bucket", "gcra"):
        policies = [Policy("minute", algorithm, limit=20, period=60)]
        assert limiter.hit("k", policies, cost=5).allowed
        [key] = limiter.keys("k", policies)
        state = stored_state(redis_client, key, KEY_LETTERS[algorithm] + "minute")
        assert len(state) == 7 and int.from_bytes(state, "big") > 0, algorithm
        assert limiter.peek("k", policies).remaining == 15, algorithm


def test_a_bucket_refills_from_its_stored_time_and_never_from_a_clock_that_stepped_back(
    limiter: RateLimiter, redis_client: redis.Redis
) -> None:
    # 1 token a minute (one unit a millisecond), bucket of 2, one token missing; the stored refill time
    # is kept modulo a span of 2^17 ms (the key's TTL of 60 s, doubled, rounded up to a power of two)
    policies = [Policy("minute", "token_bucket", limit=1, period=60, burst=2)]
    [key] = limiter.keys("k", policies)
    seconds, micros = redis_client.time()
    now_ms = seconds * 1000 + micros // 1000

    def stored(stamp_ms: int) -> int:
        return (60_000 * 2**17 + stamp_ms % 2**17) * 64 + 17

    # refilled 5 s ago: 5,000 units since
    redis_client.set(key, entry("tminute", now_ms + 60_000, stored(now_ms - 5_000)), px=60_000)
    assert 54.9 <= limiter.peek("k", policies).reset_after <= 55.0
    # a refill "in the future": nothing since
    redis_client.set(key, entry("tminute", now_ms + 60_000, stored(now_ms + 5_000)), px=60_000)
    assert limiter.peek("k", policies).reset_after == 60.0


def test_noscript_is_recovered_once_and_a_second_one_is_an_error() -> None:
    """The exchange every transport carries out (ratelimit_app.core.engine.decision_steps), stepped by hand."""
    policies = [small_policy("gcra")]
    steps = decision_steps("rl", [("k", policies)], 1, charge=True, one_slot_per_call=False)
    call = steps.send(None)
    assert call is not None and call.keys == prepare_call("rl", [("k", policies)], 1, charge=True).keys
    assert steps.send(NOSCRIPT) is LOAD_SCRIPT  # nothing ran: load the script ...
    assert steps.send(None) is call  # ... and send the same call once more
    with pytest.raises(BackendError, match="NOSCRIPT again") as raised:
        steps.send(NOSCRIPT)
    assert not raised.value.maybe_applied


def test_one_call_per_slot_validates_every_check_before_sending_and_stops_at_the_first_denial() -> None:
    ip, key = [small_policy("gcra")], [Policy("burst", "gcra", limit=2, period=60)]
    with pytest.raises(ValueError, match="identity"):
        decision_steps("rl", [("ip:1", ip), ("", key)], 1, charge=True, one_slot_per_call=True)
    steps = decision_steps("rl", [("ip:1", ip), ("key:1", key), ("key:2", key)], 1, charge=True, one_slot_per_call=True)
    first = steps.send(None)
    assert first is not None and first.digests == prepare_call("rl", [("ip:1", ip)], 1, charge=True).digests
    denied = struct.pack(">qqq", 0, 1000, 5000)  # the script's reply: 0 left, full in 1 s, retry in 5 s
    with pytest.raises(StopIteration) as done:
        steps.send(denied)
    [decision] = done.value.value
    assert not decision.allowed and decision.retry_after == 5.0
