"""decide.lua's call and reply as bytes: the packed EVALSHA of a set of policies, built once per plan (the
format is the script's header), and the reply unpacked into decisions."""

from __future__ import annotations

import math
import struct
from functools import lru_cache

from .algorithms import BY_NAME, CALENDAR_WINDOW
from .decision import Decision, PolicyResult, all_or_nothing
from .keys import DIGEST_CHARS, is_sent_its_key, tag
from .policies import CONCURRENCY, Policy
from .scripts import decide_sha

_CALL_NUMBERS = struct.Struct(">qBBq")  # cost, mode, identities, clock shift in ms
_POLICY_NUMBERS = struct.Struct(">qqqqBB")  # algorithm code, limit, period, extra, identity, tag length
_REPLY_NUMBERS = struct.Struct(">qqq")  # remaining, reset in ms, retry in ms
#: The modes of decide.lua: report only (peek), charge when allowed (hit), forget the states (reset).
PEEK, HIT, RESET = 0, 1, 2
#: Added to the algorithm code of a shadow policy: decide.lua counts it but never lets it refuse.
SHADOW_FLAG = 64
#: The code of a policy charged apart from the call's cost adds this many times that cost (a usage limit's estimate).
OWN_COST_STEP = 128
#: (unit, estimate) pairs: what a usage limit of each unit reserves.
Usage = tuple[tuple[str, int], ...]


def _numbers(policy: Policy, own_cost: int) -> tuple[int, int, int, int]:
    """The code, limit, period, extra of `policy` in ARGV[1] of decide.lua; `own_cost`: its own (0: the call's)."""
    if policy.calendar:
        code, period, extra = CALENDAR_WINDOW.code, policy.calendar_rule, policy.clock_shift_ms
    else:
        algorithm = BY_NAME[policy.algorithm]
        code, period, extra = algorithm.code, policy.period_ms, policy.capacity if algorithm.takes_burst else 0
    return code + (SHADOW_FLAG if policy.shadow else 0) + OWN_COST_STEP * own_cost, policy.limit, period, extra


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


class CallPlan:
    """Everything about a call but its identities: the prefix, the policy sets, cost, mode, shift, usage.

    `pieces` is the packed EVALSHA command cut where each key's identity digest goes: the command is
    `pieces[0] + digest(owner 0) + pieces[1] + ... + pieces[-1]`, with `owners[i]` the index of the
    check whose digest fills gap i.
    """

    __slots__ = ("args", "key_count", "key_layout", "leases", "named_capacities", "owners", "pieces",
                 "policy_count", "prefix")

    def __init__(self, prefix: str, policy_sets: tuple[tuple[Policy, ...], ...], cost: int, mode: int,
                 shift: int, usage: Usage = ()) -> None:
        self.prefix = prefix
        estimates = dict(usage)
        # KEYS: the state key of each identity, then the key of its own of each policy sent one
        layout: list[tuple[int, str]] = [(check, ":{%s}") for check in range(len(policy_sets))]
        numbers = [_CALL_NUMBERS.pack(cost, mode, len(policy_sets), shift)]
        for check, policies in enumerate(policy_sets):
            for policy in policies:
                if not isinstance(policy, Policy):
                    raise TypeError(f"policies: expected Policy objects, got {type(policy).__name__}")
            names = [p.name for p in policies]
            if len(set(names)) != len(names):
                raise ValueError(f"policies: names must be unique within one decision, got {names}")
            for p in policies:
                name = tag(p)
                if is_sent_its_key(p):
                    layout.append((check, ":{%s}" + name))
                if p.unit and p.unit not in estimates and mode == HIT:
                    raise ValueError(f"policies: {p.name!r} counts {p.unit}, charged only by reserve(usage=...)")
                numbers.append(_POLICY_NUMBERS.pack(*_numbers(p, estimates.get(p.unit, 0) if p.unit else 0),
                                                    check + 1, len(name)) + name.encode())
        self.policy_count = sum(len(policies) for policies in policy_sets)
        self.key_layout = tuple(layout)
        self.named_capacities = tuple(tuple((p.name, p.capacity, p.shadow) for p in policies)
                                      for policies in policy_sets)
        self.key_count = len(layout)
        # concurrency policies charged by this call: the command then ends with the lease token (ARGV[2])
        self.leases = sum(p.algorithm == CONCURRENCY for policies in policy_sets for p in policies) \
            if mode == HIT else 0
        self.args = args = (b"".join(numbers),)

        pieces: list[bytes] = []
        owners: list[int] = []
        current = b"*%d\r\n" % (3 + self.key_count + len(args) + (1 if self.leases else 0)) + bulk(b"EVALSHA") + \
            bulk(decide_sha().encode()) + bulk(b"%d" % self.key_count)
        for owner, pattern in layout:
            head, tail = (prefix + pattern).encode().split(b"%s")
            current += b"$%d\r\n" % (len(head) + DIGEST_CHARS + len(tail)) + head
            pieces.append(current)
            owners.append(owner)
            current = tail + b"\r\n"
        pieces.append(current + b"".join(bulk(arg) for arg in args))
        self.pieces = tuple(pieces)
        self.owners = tuple(owners)


@lru_cache(maxsize=1024)
def call_plan(prefix: str, policy_sets: tuple[tuple[Policy, ...], ...], cost: int, mode: int, shift: int,
              usage: Usage = ()) -> CallPlan:
    """The plan of a call, built once per distinct one (a call then only splices in its digests)."""
    return CallPlan(prefix, policy_sets, cost, mode, shift, usage)


def decisions(plan: CallPlan, reply: object) -> list[Decision] | None:
    """One Decision per check of `plan` from the script's reply; None for a malformed reply."""
    if type(reply) is not bytes or len(reply) != _REPLY_NUMBERS.size * plan.policy_count:
        return None
    triples = _REPLY_NUMBERS.iter_unpack(reply)  # (remaining, reset_ms, retry_ms) per policy, in order
    # retry_ms is 0 exactly when the policy allows. A shadow policy's refusal refuses nothing (decide.lua let
    # the call through): its result goes apart, to Decision.shadow, and does not make the call a refusal.
    # Each check's Decision follows the rule of `Decision.from_results`, applied in the same pass (this runs
    # on every request): the refusal with the longest wait, else the fewest remaining, then the latest reset.
    refusing = False
    found = []
    for policies in plan.named_capacities:
        results: list[PolicyResult] = []
        shadow: list[PolicyResult] = []
        worst: PolicyResult | None = None
        tightest: PolicyResult | None = None
        longest = 0.0
        for (name, capacity, is_shadow), (remaining, reset_ms, retry_ms) in zip(policies, triples, strict=False):
            remaining = remaining if remaining > 0 else 0
            if retry_ms:
                refusing = refusing or not is_shadow
                retry = math.inf if retry_ms < 0 else retry_ms / 1000
                result = PolicyResult(name, False, capacity, remaining, reset_ms / 1000, retry)
            else:
                result = PolicyResult(name, True, capacity, remaining, reset_ms / 1000, None)
            if is_shadow:
                shadow.append(result)
                continue
            results.append(result)
            if retry_ms:
                if worst is None or retry > longest:
                    worst, longest = result, retry
            elif tightest is None or remaining < tightest.remaining or (
                    remaining == tightest.remaining and result.reset_after > tightest.reset_after):
                tightest = result
        decided = worst or tightest
        if decided is None:  # no policy but shadow ones
            found.append(Decision(True, 0, 0, 0.0, None, "", (), False, tuple(shadow)))
        else:
            found.append(Decision(worst is None, decided.limit, decided.remaining, decided.reset_after,
                                  decided.retry_after, decided.policy, tuple(results), False, tuple(shadow)))
    return all_or_nothing(found) if refusing else found
