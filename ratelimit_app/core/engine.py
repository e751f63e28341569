"""The rate limiter engine, sans I/O: everything `RateLimiter` and `AsyncRateLimiter` do but the I/O.

One atomic Redis round trip (EVALSHA of decide.lua) decides a request against many policies. This
module never touches a socket: `prepare_call` builds the call (KEYS, ARGV, and the whole EVALSHA
command, packed), `parse_reply` turns the script's reply into decisions, and the `*_steps` functions are
each operation of the limiters (hit, peek, hit_many, reset) as the steps of an exchange with Redis
(NOSCRIPT recovery, the never-resend rule, one call per slot on a cluster) that a transport carries out:
`RateLimiter` (engine_sync.py) with plain calls, `AsyncRateLimiter` (engine_async.py) with awaits.
Arguments are validated and the errors of Redis failures worded here: the two transports decide and fail alike.

Speed matters: this runs on every request. A policy set's packed command is built once and cached (`_plan`,
beside `_Plan`); a call only splices in the identity's digest (cached too: `keys.digest`). `PreparedCall.keys`
and `.args` are the call unpacked, which the reference paths (a pool's connection, a cluster node) send.
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Generator, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from .algorithms import BY_NAME, CALENDAR_WINDOW, REGISTRY
from .decision import Decision, PolicyResult, all_or_nothing
from .exceptions import BackendError, scripts_refused
from .keys import DIGEST_CHARS, digest, is_sent_its_key, release_keys, tag
from .policies import CONCURRENCY, Policy
from .scripts import decide_sha

Check = tuple[str, Sequence[Policy]]
Usage = tuple[tuple[str, int], ...]  # (unit, estimate) pairs: what a usage limit of each unit reserves

#: decide.lua takes every number of a call in one binary argument (see its header): a decimal argument
#: would cost Redis a strtod each, and every argument is parsed and interned as a Lua string.
_CALL_NUMBERS = struct.Struct(">qBBq")  # cost, mode, identities, clock shift in ms (see prepare_call)
MAX_CLOCK_SHIFT_MS = 10 * 366 * 86_400_000  # the largest clock shift of a call, either way: ten years
_POLICY_NUMBERS = struct.Struct(">qqqqBB")  # algorithm code, limit, period, extra, identity, tag length
#: The modes of decide.lua: report only (peek), charge when allowed (hit), forget the states (reset).
PEEK, HIT, RESET = 0, 1, 2
#: The algorithm codes decide.lua dispatches on (ratelimit_app.core.algorithms).
ALGORITHM_CODES = {algorithm.name: algorithm.code for algorithm in REGISTRY}
#: Added to the algorithm code of a shadow policy: decide.lua counts it but never lets it refuse.
SHADOW_FLAG = 64
#: The code of a policy charged apart from the call's cost adds this many times that cost (a usage limit's estimate).
OWN_COST_STEP = 128
#: The code of a calendar quota (a fixed window whose boundaries are calendar days, weeks or months):
#: its period is `Policy.calendar_rule` and its extra number `Policy.clock_shift_ms`.
CALENDAR_CODE = CALENDAR_WINDOW.code
#: A lease token (ARGV[2] of decide.lua): the member a request's concurrency slots are held under.
_LEASE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
#: The script's reply: three numbers per policy (see decide.lua).
_REPLY_NUMBERS = struct.Struct(">qqq")  # remaining, reset in ms, retry in ms


def _numbers(policy: Policy, own_cost: int) -> tuple[int, int, int, int]:
    """The code, limit, period, extra of `policy` in ARGV[1] of decide.lua; `own_cost`: its own (0: the call's)."""
    if policy.calendar:
        code, period, extra = CALENDAR_CODE, policy.calendar_rule, policy.clock_shift_ms
    else:
        algorithm = BY_NAME[policy.algorithm]
        code, period, extra = algorithm.code, policy.period_ms, policy.capacity if algorithm.takes_burst else 0
    return code + (SHADOW_FLAG if policy.shadow else 0) + OWN_COST_STEP * own_cost, policy.limit, period, extra


def _bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


class _Plan:
    """Everything about a call but its identities: the prefix, the policy sets, cost, mode, shift, usage.

    `pieces` is the packed EVALSHA command cut where each key's identity digest goes: the command is
    `pieces[0] + digest(owner 0) + pieces[1] + ... + pieces[-1]`, with `owners[i]` the index of the
    check whose digest fills gap i. Built once per distinct plan (see `_plan`).
    """

    __slots__ = ("args", "key_count", "key_layout", "leases", "named_capacities", "owners", "pieces",
                 "policy_count", "prefix")

    def __init__(self, prefix: str, policy_sets: tuple[tuple[Policy, ...], ...], cost: int, mode: int,
                 shift: int, usage: Usage = ()) -> None:
        self.prefix = prefix
        estimates = dict(usage)
        # KEYS of decide.lua: the state key of each identity ("<prefix>:{<digest>}"), then the key of
        # its own of each policy that is sent one ("<prefix>:{<digest>}<tag>")
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
        current = b"*%d\r\n" % (3 + self.key_count + len(args) + (1 if self.leases else 0)) + _bulk(b"EVALSHA") + \
            _bulk(decide_sha().encode()) + _bulk(b"%d" % self.key_count)
        for owner, pattern in layout:
            head, tail = (prefix + pattern).encode().split(b"%s")
            current += b"$%d\r\n" % (len(head) + DIGEST_CHARS + len(tail)) + head
            pieces.append(current)
            owners.append(owner)
            current = tail + b"\r\n"
        pieces.append(current + b"".join(_bulk(arg) for arg in args))
        self.pieces = tuple(pieces)
        self.owners = tuple(owners)


@lru_cache(maxsize=1024)
def _plan(prefix: str, policy_sets: tuple[tuple[Policy, ...], ...], cost: int, mode: int, shift: int,
          usage: Usage = ()) -> _Plan:
    return _Plan(prefix, policy_sets, cost, mode, shift, usage)


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
        """KEYS of the call: the state key of each identity, "<prefix>:{<digest>}" (the braces are the
        hash tag), which holds every rate policy of that identity, kept short because every byte of a
        key name is paid per identity in Redis memory; then the key of its own of each policy that is
        sent one (`keys.is_sent_its_key`), "<prefix>:{<digest>}<tag>": a concurrency policy's sorted
        set of leases, a sliding log's units (used once its limit makes it long)."""
        digests = [digest.decode() for digest in self.digests]
        return [self.plan.prefix + pattern % digests[owner] for owner, pattern in self.plan.key_layout]

    @property
    def args(self) -> list[bytes]:
        """ARGV of the call: the packed numbers, then the lease token when the call takes slots."""
        return [*self.plan.args, self.lease] if self.lease is not None else list(self.plan.args)

    def command(self) -> tuple[Any, ...]:
        """The call as the arguments of one EVALSHA command, for clients that pack it themselves (the
        reference paths: a pool's connection, a cluster node); `packed` is the same command, packed."""
        return ("EVALSHA", decide_sha(), self.plan.key_count, *self.keys, *self.args)


def check_lease(lease: str | None) -> str:
    """`lease` when it is a valid lease token (1-64 letters, digits, '_.:-'); ValueError otherwise."""
    if lease is None:
        raise ValueError("lease: this call takes a concurrency slot; pass lease=<token> (see new_lease_token), "
                         "the name under which the slot is held and released")
    if type(lease) is not str or not _LEASE.match(lease):
        raise ValueError(f"lease: {lease!r:.80} must be 1-64 characters of letters, digits, '_.:-'")
    return lease


def _with_lease(call: PreparedCall, lease: str | None) -> PreparedCall:
    """`call` with the lease token its concurrency policies are charged under (ARGV[2] of decide.lua)."""
    token = check_lease(lease).encode()
    call.lease = token
    call.packed += _bulk(token)
    return call


def new_lease_token() -> str:
    """A token no other request holds: 128 random bits (unique across every process and server)."""
    return os.urandom(16).hex()


def prepare_call(prefix: str, checks: Sequence[Check], cost: int, *, charge: bool,
                 lease: str | None = None, reset: bool = False, shift: int = 0, usage: Usage = ()) -> PreparedCall:
    """Build the EVALSHA of decide.lua for these checks (see its header for KEYS and ARGV). A call that
    charges a concurrency policy needs `lease`, the token its slots are held under (ValueError without).
    With `reset`, it forgets the checks' states (and reports, as peek does); `shift` ms are added to Redis' time.
    `usage` (unit, estimate) pairs: what each usage limit of that unit reserves (see ratelimit_app.core.usage)."""
    if type(cost) is not int or cost < 1 or type(shift) is not int or abs(shift) > MAX_CLOCK_SHIFT_MS:
        raise ValueError(f"cost: {cost!r} must be an integer >= 1, and clock_shift_ms: {shift!r} an integer "
                         f"within +-{MAX_CLOCK_SHIFT_MS} (ms added to Redis' time, for tests)")
    mode = RESET if reset else HIT if charge else PEEK
    if len(checks) == 1:  # the usual case, kept short: it runs on every request
        identity, policies = checks[0]
        plan = _plan(prefix, (policies if type(policies) is tuple else tuple(policies),), cost, mode, shift, usage)
        hashed = digest(identity)
        call = PreparedCall(plan, [hashed], hashed.join(plan.pieces))
        return _with_lease(call, lease) if plan.leases else call
    policy_sets = tuple(policies if type(policies) is tuple else tuple(policies) for _, policies in checks)
    plan = _plan(prefix, policy_sets, cost, mode, shift, usage)
    digests = [digest(identity) for identity, _ in checks]
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
    triples = _REPLY_NUMBERS.iter_unpack(reply)  # (remaining, reset_ms, retry_ms) per policy, in order
    # retry_ms is 0 exactly when the policy allows. A shadow policy's refusal refuses nothing (decide.lua let
    # the call through): its result goes apart, to Decision.shadow, and does not make the call a refusal
    refusing = False
    decisions = []
    for policies in plan.named_capacities:
        results: list[PolicyResult] = []
        shadow: list[PolicyResult] = []
        for (name, capacity, is_shadow), (remaining, reset_ms, retry_ms) in zip(policies, triples, strict=False):
            if retry_ms:
                refusing = refusing or not is_shadow
                result = PolicyResult(name, False, capacity, remaining if remaining > 0 else 0, reset_ms / 1000,
                                      math.inf if retry_ms < 0 else retry_ms / 1000)
            else:
                result = PolicyResult(name, True, capacity, remaining if remaining > 0 else 0, reset_ms / 1000, None)
            (shadow if is_shadow else results).append(result)
        decisions.append(Decision.from_results(tuple(results), shadow=tuple(shadow)) if shadow else
                         Decision.from_results(tuple(results)))
    return all_or_nothing(decisions) if refusing else decisions


# -- one exchange with Redis, written once for every transport ------------------------------------------
# A transport carries out an operation's steps (sync: plain calls; asyncio: awaits) and returns what they
# return: `call = steps.send(reply)` until StopIteration, where reply is `load_script()` (SCRIPT LOAD, on
# every master of a cluster) when the call is LOAD_SCRIPT, else `send(call)`: Redis' reply to the call's
# EVALSHA, or NOSCRIPT. Both raise BackendError when Redis cannot answer (the errors below), `maybe_applied`
# telling whether the EVALSHA reached Redis before its reply was lost: such a call is never sent again.


class _NoScript:
    """The type of NOSCRIPT."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOSCRIPT"


#: What a transport hands back to the steps when Redis answered an EVALSHA with NOSCRIPT (nothing ran).
NOSCRIPT = _NoScript()
#: What the steps yield for "load the script", in place of a call to send.
LOAD_SCRIPT = None
#: The decision of an identity checked against no policy: allowed, nothing to report.
NO_POLICY_DECISION = Decision(True, 0, 0, 0.0, None, "", ())

T = TypeVar("T")
C = TypeVar("C")
#: The steps of an operation that returns a T: each yields a call to send (or LOAD_SCRIPT), and is sent
#: Redis' reply to it.
Steps = Generator["PreparedCall | None", Any, T]


def check_client(client: C, kinds: tuple[type, ...], names: str) -> C:
    """`client` when it is an instance of one of `kinds` (spelt `names` in the error); TypeError otherwise."""
    if not isinstance(client, kinds):
        raise TypeError(f"client: expected a {names}, got {type(client).__name__}")
    return client


#: How a transport reaches a standalone Redis (or a Sentinel master), in both transports: "own" (the
#: speed path: connections of the limiter's own, one packed write and one read per decision), "pool"
#: (the reference path: a connection of the client's pool and redis-py's send_command), or "auto" (the
#: transport's choice: see engine_sync.resolve_connections; the async transport takes "own").
CONNECTION_MODES = ("auto", "own", "pool")


def check_connections(connections: str) -> str:
    """`connections` when it is one of CONNECTION_MODES; ValueError otherwise."""
    if connections not in CONNECTION_MODES:
        raise ValueError(f"connections: {connections!r} is not one of {', '.join(CONNECTION_MODES)}")
    return connections


def hit_steps(prefix: str, identity: str, policies: Sequence[Policy], cost: int, lease: str | None,
              shift: int = 0) -> Steps[Decision]:
    """`hit`: charge `cost` to every policy if all of them allow it, nothing otherwise."""
    return _first(decision_steps(prefix, ((identity, policies),), cost, charge=True, lease=lease, shift=shift))


def peek_steps(prefix: str, identity: str, policies: Sequence[Policy], cost: int, shift: int = 0) -> Steps[Decision]:
    """`peek`: what `hit` would decide for `cost`, with remaining counted now; charges nothing."""
    return _first(decision_steps(prefix, ((identity, policies),), cost, charge=False, shift=shift))


def hit_many_steps(prefix: str, checks: Sequence[Check], cost: int, lease: str | None,
                   cluster: bool, shift: int = 0, usage: Usage = ()) -> Steps[list[Decision]]:
    """`hit_many`: several identities in one call, all-or-nothing; one call per identity on a `cluster`."""
    return decision_steps(prefix, checks, cost, charge=True, one_slot_per_call=cluster, lease=lease, shift=shift,
                          usage=usage)


def reset_steps(prefix: str, identity: str, policies: Sequence[Policy]) -> Steps[None]:
    """`reset`: forget the state of `identity` for these policies (its other policies keep theirs)."""
    return _first(decision_steps(prefix, ((identity, policies),), 1, charge=False, reset=True), keep=False)


def release_plan(prefix: str, held: Sequence[tuple[str, Policy]], lease: str) -> list[str]:
    """`release`: the keys to remove the lease token `lease` from (one ZREM each) to give back the slots
    `held`, (identity, concurrency policy) pairs; ValueError for a lease that is no token."""
    check_lease(lease)
    return release_keys(prefix, held)


def _first(steps: Steps[list[Decision]], keep: bool = True) -> Steps[Any]:
    decisions = yield from steps
    return decisions[0] if keep else None


def decision_steps(prefix: str, checks: Sequence[Check], cost: int, *, charge: bool, one_slot_per_call: bool = False,
                   lease: str | None = None, reset: bool = False, shift: int = 0,
                   usage: Usage = ()) -> Steps[list[Decision]]:
    """The steps of one decision over `checks`.

    Normally one call decides every check, all-or-nothing. With `one_slot_per_call` (Redis Cluster,
    where the identities live on different slots) each check is its own call, in order, and the
    first denial stops the rest: checks already charged stay charged and the list is shorter than
    `checks`. Every call is built, and every argument validated (ValueError, TypeError), here, before
    anything is sent. `lease`, `reset` and `shift` (the clock shift of every `*_steps`) as in `prepare_call`.
    """
    if one_slot_per_call and len(checks) > 1:
        return _one_by_one([prepare_call(prefix, (check,), cost, charge=charge, lease=lease, reset=reset,
                                         shift=shift, usage=usage) for check in checks])
    return _exchange(prepare_call(prefix, checks, cost, charge=charge, lease=lease, reset=reset, shift=shift,
                                  usage=usage))


def _one_by_one(calls: list[PreparedCall]) -> Steps[list[Decision]]:
    decisions: list[Decision] = []
    for call in calls:
        decision = (yield from _exchange(call))[0]
        decisions.append(decision)
        if not decision.allowed:
            break
    return decisions


def _exchange(call: PreparedCall) -> Steps[list[Decision]]:
    """Send one call, recovering once from NOSCRIPT; its decisions."""
    if not call.plan.policy_count:
        return [NO_POLICY_DECISION] * len(call.digests)
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


# -- the errors of a transport, worded once ------------------------------------------------------------
def unreachable(exc: BaseException) -> BackendError:
    """No connection to Redis (or to a cluster's node): nothing was sent."""
    return BackendError(f"Redis unreachable: {exc}", maybe_applied=False)


def failed(exc: BaseException, sent: bool) -> BackendError:
    """An EVALSHA failed; `sent` when it was written before the failure (Redis may have run it)."""
    return BackendError(f"Redis failed: {exc}", maybe_applied=sent)


def load_failed(exc: BaseException) -> BackendError:
    """SCRIPT LOAD failed (no decision was made): `ScriptsRefused` when the server cannot run Lua scripts."""
    return scripts_refused(exc) or BackendError(f"could not load the decision script: {exc}", maybe_applied=False)


def release_failed(lease: str, exc: BaseException, sent: bool = True, doing: str = "release") -> BackendError:
    """Giving back (or renewing: `doing`) the slots of `lease` failed (they free themselves with their lease)."""
    return BackendError(f"could not {doing} slots of lease {lease!r}: {exc}", maybe_applied=sent)
