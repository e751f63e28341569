"""The rate limiter engine: one atomic Redis round trip decides a request against many policies.

This module is the sans-IO core: it never touches a socket. `prepare_call` builds keys and
arguments (and the whole EVALSHA command, packed), `parse_reply` turns the script's reply into
decisions, and `decide` is the whole exchange with Redis (NOSCRIPT recovery, the never-resend rule,
one call per slot on a cluster) as steps that a transport carries out. The transports only do the
I/O: `ratelimit_app.engine_sync.RateLimiter` over a synchronous client.

Speed matters here: this runs on every request. The packed command of a policy set is built once and
cached (`_plan`); a call only splices in the identity's digest.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import struct
from binascii import hexlify
from collections.abc import Generator, Sequence
from functools import lru_cache
from typing import Any

from .decision import Decision, PolicyResult
from .exceptions import BackendError
from .policies import CONCURRENCY, Policy
from .scripts import decide_sha

Check = tuple[str, Sequence[Policy]]

#: What a key prefix may be (RATELIMIT['KEY_PREFIX'] is validated against it too).
PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
#: Length of an identity digest in hex characters (blake2b, 12 bytes).
DIGEST_CHARS = 24
#: decide.lua takes every number of a call in one binary argument (see its header): a decimal argument
#: would cost Redis a strtod each, and every argument is parsed and interned as a Lua string.
_CALL_NUMBERS = struct.Struct(">qq")  # cost, charge
_POLICY_NUMBERS = struct.Struct(">qqqq")  # algorithm code, limit, period in ms, capacity
#: The algorithm codes decide.lua dispatches on.
ALGORITHM_CODES = {"token_bucket": 1, "sliding_window": 2, "fixed_window": 3, "gcra": 4, "sliding_window_counter": 5,
                   CONCURRENCY: 6}
#: Added to the algorithm code of a shadow policy: decide.lua counts it but never lets it refuse.
SHADOW_FLAG = 64
#: The code of a calendar quota (a fixed window whose boundaries are calendar days, weeks or months):
#: its period slot carries `Policy.calendar_rule` and its capacity slot `Policy.clock_shift_ms`.
CALENDAR_CODE = 32
#: The letter that stands for the algorithm in a state key (see PreparedCall.keys).
KEY_LETTERS = {"token_bucket": "t", "sliding_window": "s", "fixed_window": "f", "gcra": "g",
               "sliding_window_counter": "c", CONCURRENCY: "q"}
#: The letter of a calendar quota's state key (its algorithm is fixed_window, its state is not; "q" is
#: the concurrency policies').
CALENDAR_KEY_LETTER = "k"
#: A lease token (ARGV[2] of decide.lua): the member a request's concurrency slots are held under.
_LEASE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
#: Also send each policy's key in the previous release's layout ("<prefix>:{<digest>}:<policy>:<algorithm>"),
#: so that state written before an upgrade is carried over (see decide.lua). Such keys expire within the
#: longest TTL of the policies (docs/algorithms.md); after that, setting this to False before the first
#: decision saves Redis 9-11% of a new identity's decision. A later release will stop sending them.
#: A concurrency policy's previous-layout key is sent too (the keys are all or none) but never read:
#: the previous release had no concurrency policy.
LEGACY_KEYS = True
#: The script's reply: three numbers per policy (see decide.lua).
_REPLY_NUMBERS = struct.Struct(">qqq")  # remaining, reset in ms, retry in ms


def _bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


class _Plan:
    """Everything about a call that depends only on the prefix, the policy sets, the cost and the mode.

    `pieces` is the packed EVALSHA command cut where each key's identity digest goes: the command is
    `pieces[0] + digest(owner 0) + pieces[1] + ... + pieces[-1]`, with `owners[i]` the index of the
    check whose digest fills gap i. Built once per distinct plan (see `_plan`).
    """

    __slots__ = ("args", "key_count", "leases", "named_capacities", "owners", "pieces", "policy_count", "prefix",
                 "shadows",
                 "suffixes")

    def __init__(self, prefix: str, policy_sets: tuple[tuple[Policy, ...], ...], cost: int, charge: bool) -> None:
        self.prefix = prefix
        suffixes: list[tuple[str, ...]] = []
        legacy: list[tuple[str, ...]] = []
        numbers = [_CALL_NUMBERS.pack(cost, 1 if charge else 0)]
        for policies in policy_sets:
            for policy in policies:
                if not isinstance(policy, Policy):
                    raise TypeError(f"policies: expected Policy objects, got {type(policy).__name__}")
            names = [p.name for p in policies]
            if len(set(names)) != len(names):
                raise ValueError(f"policies: names must be unique within one decision, got {names}")
            suffixes.append(tuple((CALENDAR_KEY_LETTER if p.calendar else KEY_LETTERS[p.algorithm]) + p.name
                                  for p in policies))
            legacy.append(tuple(f":{p.name}:{p.algorithm}" for p in policies))
            numbers += [_POLICY_NUMBERS.pack(ALGORITHM_CODES[p.algorithm] + (SHADOW_FLAG if p.shadow else 0),
                                             p.limit, p.period_ms, p.capacity) if not p.calendar else
                        _POLICY_NUMBERS.pack(CALENDAR_CODE + (SHADOW_FLAG if p.shadow else 0), p.limit,
                                             p.calendar_rule, p.clock_shift_ms)
                        for p in policies]
        self.policy_count = sum(len(s) for s in suffixes)
        if LEGACY_KEYS and self.policy_count:
            suffixes += legacy  # KEYS[n + i] of decide.lua: policy i's key in the previous layout
        self.suffixes = tuple(suffixes)
        self.named_capacities = tuple(tuple((p.name, p.capacity, p.shadow) for p in policies)
                                      for policies in policy_sets)
        #: per policy of the call, whether it is a shadow policy; empty when none is
        shadows = tuple(p.shadow for policies in policy_sets for p in policies)
        self.shadows = shadows if any(shadows) else ()
        self.key_count = sum(len(s) for s in suffixes)
        # concurrency policies charged by this call: the command then ends with the lease token (ARGV[2])
        self.leases = sum(p.algorithm == CONCURRENCY for policies in policy_sets for p in policies) if charge else 0
        args = [b"".join(numbers)]
        self.args = tuple(args)

        head = prefix.encode() + b":{"
        pieces: list[bytes] = []
        owners: list[int] = []
        current = b"*%d\r\n" % (3 + self.key_count + len(args) + (1 if self.leases else 0)) + _bulk(b"EVALSHA") + \
            _bulk(decide_sha().encode()) + _bulk(b"%d" % self.key_count)
        for owner, set_suffixes in enumerate(suffixes):
            owner %= len(policy_sets)  # the legacy keys of a check follow every check's state keys
            for suffix in set_suffixes:
                tail = b"}" + suffix.encode()
                current += b"$%d\r\n" % (len(head) + DIGEST_CHARS + len(tail)) + head
                pieces.append(current)
                owners.append(owner)
                current = tail + b"\r\n"
        pieces.append(current + b"".join(_bulk(arg) for arg in args))
        self.pieces = tuple(pieces)
        self.owners = tuple(owners)


@lru_cache(maxsize=1024)
def _plan(prefix: str, policy_sets: tuple[tuple[Policy, ...], ...], cost: int, charge: bool) -> _Plan:
    return _Plan(prefix, policy_sets, cost, charge)


def _digest(identity: str) -> bytes:
    if type(identity) is not str or not identity:
        raise ValueError(f"identity: expected a non-empty string, got {identity!r:.80}")
    return hexlify(hashlib.blake2b(identity.encode("utf-8", "surrogatepass"), digest_size=12).digest())


def identity_digest(identity: str) -> str:
    """A fixed-length, hash-tag-safe digest of an identity: users never choose Redis key names."""
    return _digest(identity).decode()


class PreparedCall:
    """One invocation of the decision script: the packed command, and what `parse_reply` needs.

    `keys` and `args` give the same call as KEYS and ARGV lists, for clients that pack commands
    themselves (Redis Cluster routes by key).
    """

    __slots__ = ("digests", "lease", "packed", "plan")

    def __init__(self, plan: _Plan, digests: list[bytes], packed: bytes, lease: bytes | None = None) -> None:
        self.plan = plan
        self.digests = digests
        self.packed = packed
        self.lease = lease

    @property
    def keys(self) -> list[str]:
        """KEYS of the call: one state key per policy, "<prefix>:{<digest>}<letter><policy>" (the braces
        are the hash tag; the letter is the algorithm's, KEY_LETTERS), kept short because every byte of
        a key name is paid per identity in Redis memory. With LEGACY_KEYS they are followed by the
        same policies' keys in the previous layout, "<prefix>:{<digest>}:<policy>:<algorithm>"."""
        keys = []
        digests = self.digests
        for owner, suffixes in enumerate(self.plan.suffixes):
            base = f"{self.plan.prefix}:{{{digests[owner % len(digests)].decode()}}}"
            keys += [base + suffix for suffix in suffixes]
        return keys

    @property
    def args(self) -> list[bytes]:
        """ARGV of the call: the packed numbers, then the lease token when the call takes slots."""
        return [*self.plan.args, self.lease] if self.lease is not None else list(self.plan.args)


def _with_lease(call: PreparedCall, lease: str | None) -> PreparedCall:
    """`call` with the lease token its concurrency policies are charged under (ARGV[2] of decide.lua)."""
    if lease is None:
        raise ValueError("lease: this call takes a concurrency slot; pass lease=<token> (see new_lease_token), "
                         "the name under which the slot is held and released")
    if type(lease) is not str or not _LEASE.match(lease):
        raise ValueError(f"lease: {lease!r:.80} must be 1-64 characters of letters, digits, '_.:-'")
    token = lease.encode()
    call.lease = token
    call.packed += _bulk(token)
    return call


def new_lease_token() -> str:
    """A token no other request holds: 128 random bits (unique across every process and server)."""
    return os.urandom(16).hex()


def prepare_call(prefix: str, checks: Sequence[Check], cost: int, *, charge: bool,
                 lease: str | None = None) -> PreparedCall:
    """Build the EVALSHA of decide.lua for these checks (see its header for KEYS and ARGV). A call that
    charges a concurrency policy needs `lease`, the token its slots are held under (ValueError without)."""
    if type(cost) is not int or cost < 1:
        raise ValueError(f"cost: {cost!r} must be an integer >= 1")
    if len(checks) == 1:  # the usual case, kept short: it runs on every request
        identity, policies = checks[0]
        plan = _plan(prefix, (policies if type(policies) is tuple else tuple(policies),), cost, charge)
        digest = _digest(identity)
        call = PreparedCall(plan, [digest], digest.join(plan.pieces))
        return _with_lease(call, lease) if plan.leases else call
    policy_sets = tuple(policies if type(policies) is tuple else tuple(policies) for _, policies in checks)
    plan = _plan(prefix, policy_sets, cost, charge)
    digests = [_digest(identity) for identity, _ in checks]
    pieces = plan.pieces
    parts = [pieces[0]]
    for gap, owner in enumerate(plan.owners, 1):
        parts.append(digests[owner])
        parts.append(pieces[gap])
    call = PreparedCall(plan, digests, b"".join(parts))
    return _with_lease(call, lease) if plan.leases else call


def parse_reply(call: PreparedCall, reply: Any) -> list[Decision]:
    """Turn the script's reply into one Decision per check; a malformed reply raises BackendError."""
    plan = call.plan
    if type(reply) is not bytes or len(reply) != _REPLY_NUMBERS.size * plan.policy_count:
        raise BackendError(f"unexpected reply from the decision script: {reply!r:.200}", maybe_applied=True)
    values = _REPLY_NUMBERS.iter_unpack(reply)
    # (remaining, reset_ms, retry_ms) per policy; retry_ms is 0 exactly when the policy allows. A shadow
    # policy's refusal refuses nothing (decide.lua let the call through): its result goes apart, to
    # Decision.shadow, and it is left out of all_allowed
    triples = list(values)
    if plan.shadows:
        all_allowed = not any(retry_ms for shadow, (_, _, retry_ms) in zip(plan.shadows, triples, strict=False)
                              if not shadow)
    else:
        all_allowed = not any(retry_ms for _, _, retry_ms in triples)
    decisions = []
    triple = iter(triples)
    for policies in plan.named_capacities:
        results: list[PolicyResult] = []
        shadow: list[PolicyResult] = []
        for (name, capacity, is_shadow), (remaining, reset_ms, retry_ms) in zip(policies, triple, strict=False):
            if not retry_ms:
                retry_after = None
            elif retry_ms < 0:
                retry_after = math.inf
            else:
                retry_after = retry_ms / 1000
            (shadow if is_shadow else results).append(PolicyResult(
                name, not retry_ms, capacity, remaining if remaining > 0 else 0, reset_ms / 1000, retry_after))
        decision = Decision.from_results(tuple(results), shadow=tuple(shadow)) if shadow else \
            Decision.from_results(tuple(results))
        if decision.allowed and not all_allowed:
            # all-or-nothing: this identity's own policies allowed, but another identity in the same
            # call denied, so nothing was charged and the request is refused
            decision = decision.refused()
        decisions.append(decision)
    return decisions


# -- one exchange with Redis, written once for every transport ------------------------------------------
# A transport drives `decide` like this (the sync one with plain calls, the asyncio one with awaits):
#
#     steps = decide(prefix, checks, cost, charge=True, one_slot_per_call=is_cluster)
#     reply = None
#     try:
#         while True:
#             call = steps.send(reply)
#             reply = load_script() if call is None else send(call)
#     except StopIteration as done:
#         decisions = done.value
#
# `send(call)` writes the call's EVALSHA and returns Redis' reply, or NOSCRIPT when Redis answered
# that it does not have the script; `load_script()` runs SCRIPT LOAD (on every master of a cluster).
# Both raise BackendError when Redis cannot answer, `maybe_applied` telling whether the EVALSHA
# reached Redis before its reply was lost: such a call is never sent again.


class _NoScript:
    """The type of NOSCRIPT."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOSCRIPT"


#: What a transport hands back to `decide` when Redis answered an EVALSHA with NOSCRIPT (nothing ran).
NOSCRIPT = _NoScript()
#: What `decide` yields for "load the script", in place of a call to send.
LOAD_SCRIPT = None
#: The decision of an identity checked against no policy: allowed, nothing to report.
NO_POLICY = Decision(True, 0, 0, 0.0, None, "", ())

Steps = Generator["PreparedCall | None", Any, "list[Decision]"]


def check_prefix(prefix: str) -> str:
    """`prefix` when it is a valid key prefix (1-64 letters, digits, '_.:-'); ValueError otherwise."""
    if not isinstance(prefix, str) or not PREFIX_PATTERN.match(prefix):
        raise ValueError(f"prefix: {prefix!r} must be 1-64 characters of letters, digits, '_.:-'")
    return prefix


def decide(prefix: str, checks: Sequence[Check], cost: int, *, charge: bool, one_slot_per_call: bool,
           lease: str | None = None) -> Steps:
    """The steps of one decision over `checks` (see above for how a transport runs them).

    Normally one call decides every check, all-or-nothing. With `one_slot_per_call` (Redis Cluster,
    where the identities live on different slots) each check is its own call, in order, and the
    first denial stops the rest: checks already charged stay charged and the list is shorter than
    `checks`. Every call is built, and every argument validated (ValueError, TypeError), here, before
    anything is sent. `lease` is the token concurrency slots are taken under (see `prepare_call`).
    """
    if one_slot_per_call and len(checks) > 1:
        return _one_by_one([prepare_call(prefix, (check,), cost, charge=charge, lease=lease) for check in checks])
    return _exchange(prepare_call(prefix, checks, cost, charge=charge, lease=lease))


def _one_by_one(calls: list[PreparedCall]) -> Steps:
    decisions: list[Decision] = []
    for call in calls:
        decision = (yield from _exchange(call))[0]
        decisions.append(decision)
        if not decision.allowed:
            break
    return decisions


def _exchange(call: PreparedCall) -> Steps:
    """Send one call, recovering once from NOSCRIPT; its decisions."""
    if not call.plan.policy_count:
        return [NO_POLICY] * len(call.digests)
    reply = yield call
    if reply is NOSCRIPT:
        # Redis lost its script cache (restart, failover, SCRIPT FLUSH). NOSCRIPT means nothing ran,
        # so loading the script and sending once more cannot charge twice.
        yield LOAD_SCRIPT
        reply = yield call
        if reply is NOSCRIPT:
            raise BackendError("Redis answered NOSCRIPT again right after loading the decision script",
                               maybe_applied=False)
    return parse_reply(call, reply)


def reset_keys(prefix: str, identity: str, policies: Sequence[Policy]) -> list[str]:
    """The Redis keys that hold the state of `identity` under these policies (what a reset deletes),
    the previous release's layout included while LEGACY_KEYS is on."""
    return prepare_call(prefix, ((identity, policies),), 1, charge=False).keys


def state_keys(prefix: str, identity: str, policies: Sequence[Policy]) -> list[str]:
    """The Redis keys that hold the state of `identity` under these policies (without the previous
    release's layout, which `reset_keys` also names while LEGACY_KEYS is on)."""
    call = prepare_call(prefix, ((identity, policies),), 1, charge=False)
    return call.keys[:call.plan.policy_count]


def release_keys(prefix: str, held: Sequence[tuple[str, Policy]]) -> list[str]:
    """The state keys of the concurrency slots `held` ((identity, concurrency policy) pairs): what a
    release removes the lease token from (one ZREM per key)."""
    keys: list[str] = []
    for identity, policy in held:
        keys += state_keys(prefix, identity, (policy,))
    return keys
