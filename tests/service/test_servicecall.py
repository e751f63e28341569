"""ratelimit_app.service.servicecall: `request_key` (what makes two requests the same for the deny cache),
and `ServiceStats` (the service's counters)."""

from __future__ import annotations

from ratelimit_app import Policy
from ratelimit_app.service.breaker import CLOSED, BreakerState
from ratelimit_app.service.servicecall import ServiceStats, request_key

MINUTE = Policy("minute", "fixed_window", limit=5, period=60)
DAY = Policy("day", "fixed_window", limit=50, period=86400)


def test_one_request_has_one_key_whatever_sequence_holds_its_policies() -> None:
    assert request_key([("a", [MINUTE, DAY])], 1) == request_key((("a", (MINUTE, DAY)),), 1)
    assert request_key([("a", [MINUTE]), ("b", [DAY])], 2) == request_key((("a", (MINUTE,)), ("b", (DAY,))), 2)
    assert hash(request_key([("a", [MINUTE]), ("b", [DAY])], 2)) == hash(request_key([("a", (MINUTE,)),
                                                                                       ("b", [DAY])], 2))


def test_the_key_tells_apart_cost_identity_policies_and_their_order() -> None:
    base = request_key([("a", [MINUTE]), ("b", [DAY])], 1)
    different = [
        request_key([("a", [MINUTE]), ("b", [DAY])], 2),  # cost
        request_key([("b", [DAY]), ("a", [MINUTE])], 1),  # order of the identities
        request_key([("a", [MINUTE]), ("c", [DAY])], 1),  # an identity
        request_key([("a", [DAY]), ("b", [MINUTE])], 1),  # which policies belong to whom
        request_key([("a", [MINUTE, DAY]), ("b", [DAY])], 1),  # a policy more
        request_key([("a", [MINUTE])], 1),  # one check fewer
    ]
    assert len({base, *different}) == len(different) + 1
    # a policy that differs only by its limit is another request too
    assert request_key([("a", [Policy("minute", "fixed_window", limit=6, period=60)])], 1) != \
        request_key([("a", [MINUTE])], 1)


def test_degraded_counts_every_decision_made_without_redis() -> None:
    breaker = BreakerState(CLOSED, 0, 1.0, 0.0, 0)
    stats = ServiceStats(breaker, redis_failures=9, degraded_open=1, degraded_closed=2, local_allowed=3,
                         local_denied=4, deny_cache_hits=100, deny_cache_size=5, local_states=6)
    assert stats.degraded == 10  # not the failures, nor the deny cache's answers (Redis decided those)
