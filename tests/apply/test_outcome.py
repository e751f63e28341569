"""ratelimit_app.apply.outcome: `LimitOutcome` (what a throttle or decorator reads of its own part with
`owns` and `decision_for`) and `summarize` (one decision over several identities' decisions), over
decisions a real RateLimiter made."""

from __future__ import annotations

import pytest
import redis

from ratelimit_app import Decision, Policy, PolicyResult, RateLimiter
from ratelimit_app.apply.limitcheck import REQUEST_LIMITS, LimitCheck
from ratelimit_app.apply.outcome import ALLOWED, DENIED, IP_ONLY_TIER, LimitOutcome, summarize
from ratelimit_app.plans.compile import TierInfo

IP = (Policy("ip", "fixed_window", limit=10, period=60),)
TIER = (Policy("minute", "fixed_window", limit=3, period=60),)
THROTTLE = (Policy("throttle", "fixed_window", limit=1, period=60),)


@pytest.fixture
def engine(redis_client: redis.Redis, key_prefix: str) -> RateLimiter:
    return RateLimiter(redis_client, prefix=key_prefix)


def outcome(checks: list[LimitCheck], decisions: list[Decision | None], status: str = ALLOWED) -> LimitOutcome:
    decided = [d for d in decisions if d is not None]
    return LimitOutcome(status, summarize(decided, len(checks)), (), None, "ip:192.0.2.1",
                        checks=tuple(checks), decisions=tuple(decisions))


def test_status_and_tier_as_a_caller_reads_them() -> None:
    tier = TierInfo("pro", "Pro", None, TIER)
    assert LimitOutcome(ALLOWED, None, (), tier, "key:abcd1234").allowed
    assert LimitOutcome(ALLOWED, None, (), tier, "key:abcd1234").tier_slug == "pro"
    refused = LimitOutcome(DENIED, None, (), None, "ip:192.0.2.1")
    assert not refused.allowed and refused.tier_slug is None and refused.charged
    assert IP_ONLY_TIER == "ip"


def test_each_owner_reads_its_own_part_of_a_joint_decision(engine: RateLimiter) -> None:
    checks = [LimitCheck("ip:1", IP), LimitCheck("key:a", TIER), LimitCheck("throttle:a", THROTTLE, "mine")]
    first = outcome(checks, list(engine.hit_many([(c.identity, c.policies) for c in checks])))
    assert first.owns("mine") and first.owns(REQUEST_LIMITS) and not first.owns("someone else")
    assert first.decision_for("someone else") is None
    mine = first.decision_for("mine")
    assert mine is not None and mine.allowed and [r.policy for r in mine.results] == ["throttle"]
    request = first.decision_for(REQUEST_LIMITS)
    assert request is not None and [r.policy for r in request.results] == ["ip", "minute"]
    # the throttle's limit refuses the next request: the request's own limits would have allowed it
    second = outcome(checks, list(engine.hit_many([(c.identity, c.policies) for c in checks])), DENIED)
    own, theirs = second.decision_for(REQUEST_LIMITS), second.decision_for("mine")
    assert theirs is not None and not theirs.allowed and theirs.policy == "throttle"
    assert own is not None and own.allowed and own.remaining == 2  # as they stand: nothing was charged


def test_a_part_redis_cluster_never_decided_reads_as_the_whole_outcome() -> None:
    refusal = Decision.from_results((PolicyResult("ip", False, 10, 0, 5.0, 5.0),))
    checks = [LimitCheck("ip:1", IP), LimitCheck("throttle:a", THROTTLE, "mine")]
    stopped = outcome(checks, [refusal, None], DENIED)  # the cluster stopped at the first denial
    assert stopped.decision_for("mine") is stopped.decision
    assert stopped.decision is not None and not stopped.decision.allowed


def test_summarize_hands_back_one_plain_decision_as_it_is(engine: RateLimiter) -> None:
    decision = engine.hit("k", TIER)
    assert summarize([decision], 1) is decision
    degraded = decision._replace(degraded=True)
    assert summarize([degraded], 1) == degraded and summarize([degraded], 1) is not degraded


def test_summarize_allows_when_all_allow_and_describes_the_tightest(engine: RateLimiter) -> None:
    roomy, tight = engine.hit("a", IP), engine.hit("b", TIER)
    both = summarize([roomy, tight], 2)
    assert both.allowed and both.policy == "minute" and both.remaining == 2
    assert [r.policy for r in both.results] == ["ip", "minute"]


def test_summarize_denies_with_the_longest_wait_and_keeps_every_result() -> None:
    short = Decision.from_results((PolicyResult("minute", False, 3, 0, 10.0, 10.0),))
    long = Decision.from_results((PolicyResult("day", False, 5, 0, 3600.0, 3600.0),))
    ok = Decision.from_results((PolicyResult("ip", True, 10, 9, 60.0, None),),
                               shadow=(PolicyResult("dry", False, 1, 0, 5.0, 5.0),))
    summary = summarize([short, ok, long], 3)
    assert not summary.allowed and (summary.policy, summary.retry_after) == ("day", 3600.0)
    assert [r.policy for r in summary.results] == ["minute", "ip", "day"] and summary.would_block == ("dry",)


def test_summarize_denies_when_decisions_are_missing_and_carries_degraded() -> None:
    ok = Decision.from_results((PolicyResult("ip", True, 10, 9, 60.0, None),), degraded=True)
    missing = summarize([ok], 2)  # Redis Cluster stopped before the second identity
    assert not missing.allowed and missing.degraded and missing.retry_after is None
    assert missing.results == ok.results
