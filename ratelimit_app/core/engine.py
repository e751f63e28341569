"""The rate limiter engine, sans I/O: the call of decide.lua for a set of checks (`prepare_call`) and its
reply (`parse_reply`), each operation as the steps of an exchange with Redis that both transports carry
out (docs/architecture.md, "Sync and async"), and the checks of arguments and the wording of failures,
so that the two transports decide and fail alike."""

from __future__ import annotations

import os
import re
from collections.abc import Generator, Sequence
from typing import Any, TypeVar

from .decision import Decision
from .exceptions import BackendError, scripts_refused
from .keys import digest, release_keys
from .policies import Policy
from .scripts import decide_sha
from .wire import HIT, PEEK, RESET, CallPlan, Usage, bulk, call_plan, decisions

#: An identity and the policies it is checked against.
Check = tuple[str, Sequence[Policy]]
#: The largest clock shift of a call (ms added to Redis' time, for tests), either way: ten years.
MAX_CLOCK_SHIFT_MS = 10 * 366 * 86_400_000
#: A lease token (ARGV[2] of decide.lua): the member a request's concurrency slots are held under.
_LEASE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class PreparedCall:
    """One invocation of the decision script: the packed command, and what `parse_reply` needs.

    `keys` and `args` give the same call as KEYS and ARGV lists, for clients that pack commands
    themselves (Redis Cluster routes by key).
    """

    __slots__ = ("digests", "lease", "packed", "plan")

    def __init__(self, plan: CallPlan, digests: list[bytes], packed: bytes, lease: bytes | None = None) -> None:
        self.plan = plan
        self.digests = digests
        self.packed = packed
        self.lease = lease

    @property
    def keys(self) -> list[str]:
        """KEYS of the call: the state key of each identity, "<prefix>:{<digest>}", then the key of its
        own of each policy that is sent one (`keys.is_sent_its_key`), "<prefix>:{<digest>}<tag>"."""
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
    call.packed += bulk(token)
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
        plan = call_plan(prefix, (policies if type(policies) is tuple else tuple(policies),), cost, mode, shift, usage)
        hashed = digest(identity)
        call = PreparedCall(plan, [hashed], hashed.join(plan.pieces))
        return _with_lease(call, lease) if plan.leases else call
    policy_sets = tuple(policies if type(policies) is tuple else tuple(policies) for _, policies in checks)
    plan = call_plan(prefix, policy_sets, cost, mode, shift, usage)
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
    found = decisions(call.plan, reply)
    if found is None:
        raise BackendError(f"unexpected reply from the decision script: {reply!r:.200}", maybe_applied=True)
    return found


# -- one exchange with Redis, written once for every transport ------------------------------------------
# A transport carries out the steps of an operation like this (the sync one with plain calls, the asyncio
# one with awaits), and returns what the steps return:
#
#     steps, reply = hit_steps(prefix, identity, policies, cost, lease), None
#     try:
#         while True:
#             call = steps.send(reply)
#             reply = load_script() if call is LOAD_SCRIPT else send(call)
#     except StopIteration as done:
#         return done.value
#
# `send(call)` writes the call's EVALSHA and returns Redis' reply, or NOSCRIPT when Redis answered
# that it does not have the script; `load_script()` runs SCRIPT LOAD (on every master of a cluster).
# Both raise BackendError when Redis cannot answer (the errors below), `maybe_applied` telling whether
# the EVALSHA reached Redis before its reply was lost: such a call is never sent again.


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
_NO_POLICY_DECISION = Decision(True, 0, 0, 0.0, None, "", ())

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
    """The steps of one decision over `checks`: one all-or-nothing call, or with `one_slot_per_call` (Redis
    Cluster) one call per check, in order, the first denial stopping the rest. Every call is built, and
    every argument validated (ValueError, TypeError), before anything is sent. `lease`, `reset` and
    `shift` (the clock shift of every `*_steps`) as in `prepare_call`."""
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
        return [_NO_POLICY_DECISION] * len(call.digests)
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
