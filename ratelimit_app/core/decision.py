"""The answer to one rate-limit question: allowed or not, and where the caller stands. NamedTuples, not
frozen dataclasses: a request builds several, and a NamedTuple costs about a third of the instructions."""

from __future__ import annotations

from typing import NamedTuple


class PolicyResult(NamedTuple):
    """Where one policy stands after a decision. `limit`: the most units it can grant at once (its limit,
    or burst). `remaining`: what is left after this request when charged, else now. `reset_after`: seconds
    until its full allowance is back. `retry_after`: None when it allows, else seconds until the same
    request would be allowed (math.inf when the request costs more than the policy can ever grant)."""

    policy: str
    allowed: bool
    limit: int
    remaining: int
    reset_after: float
    retry_after: float | None


class Decision(NamedTuple):
    """The outcome of `RateLimiter.hit` or `peek` over several policies. The scalar fields describe the
    policy that matters most: when denied, the one with the longest wait; when allowed, the one with the
    fewest remaining. `results` holds every policy; `degraded` is True when decided without Redis (a fail
    mode); `shadow` holds the results of dry-run policies, which never refuse (allowed=False there: a
    request the policy would have refused)."""

    allowed: bool
    limit: int
    remaining: int
    reset_after: float
    retry_after: float | None
    policy: str
    results: tuple[PolicyResult, ...]
    degraded: bool = False
    shadow: tuple[PolicyResult, ...] = ()

    @property
    def would_block(self) -> tuple[str, ...]:
        """The shadow policies that would have refused this request."""
        return tuple(result.policy for result in self.shadow if not result.allowed)

    @classmethod
    def from_results(cls, results: tuple[PolicyResult, ...], *, degraded: bool = False,
                     shadow: tuple[PolicyResult, ...] = ()) -> Decision:
        """Summarise per-policy results into one decision (see the class docstring for the rule)."""
        if not results:
            return cls(True, 0, 0, 0.0, None, "", (), degraded, shadow)
        # One pass, no lambdas: this runs on every request.
        worst: PolicyResult | None = None
        tightest = results[0]
        for result in results:
            if not result.allowed:
                if worst is None or (result.retry_after or 0.0) > (worst.retry_after or 0.0):
                    worst = result
            elif result.remaining < tightest.remaining or (
                result.remaining == tightest.remaining and result.reset_after > tightest.reset_after
            ):
                tightest = result
        if worst is not None:
            return Decision(False, worst.limit, worst.remaining, worst.reset_after, worst.retry_after,
                            worst.policy, results, degraded, shadow)
        return Decision(True, tightest.limit, tightest.remaining, tightest.reset_after, None,
                        tightest.policy, results, degraded, shadow)

    def refused(self) -> Decision:
        """This decision turned into a refusal that charged nothing: the identity's own policies allowed,
        but another identity decided in the same all-or-nothing call denied."""
        return Decision(False, self.limit, self.remaining, self.reset_after, self.retry_after, self.policy,
                        self.results, self.degraded, self.shadow)


def all_or_nothing(decisions: list[Decision]) -> list[Decision]:
    """The decisions of one all-or-nothing call: when any of them denied, each one that allowed becomes a
    refusal that charged nothing (`Decision.refused`), since nothing was charged to anyone."""
    if all(decision.allowed for decision in decisions):
        return decisions
    return [decision.refused() if decision.allowed else decision for decision in decisions]


def degraded_decision(allowed: bool, retry_after: float | None = None, policy: str = "") -> Decision:
    """A decision made without Redis that knows nothing of the limits: what a fail mode answers.

    Allowed ("open") or refused ("closed": come back after `retry_after` seconds, default 1).
    """
    if allowed:
        return Decision(True, 0, 0, 0.0, None, policy, (), True)
    return Decision(False, 0, 0, 0.0, 1.0 if retry_after is None else retry_after, policy, (), True)
