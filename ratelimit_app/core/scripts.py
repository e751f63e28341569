"""The Lua scripts shipped in lua/: the decision script assembled from the registry of algorithms (each
algorithm's function a branch of one `check`, which decide.lua calls), and the lease scripts."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from .algorithms import SCRIPTED

#: Algorithm files, each ending with the function of its algorithm.
ALGORITHM_FILES: tuple[str, ...] = tuple(algorithm.lua_file for algorithm in SCRIPTED)
ENTRY_FILE = "decide.lua"
#: The script that cancels a lease token whose decision's reply was lost (run with EVAL: it is rare).
CANCEL_FILE = "cancel.lua"
#: The script that sets when a lease token's live slots end (run with EVAL: a gateway's request only).
RENEW_FILE = "renew.lua"
#: Locals every other file uses; it comes first.
_PRELUDE_FILE = "prelude.lua"
#: The parameters of every algorithm function, in this order (see "The algorithms" in decide.lua).
ALGORITHM_PARAMETERS = "(stored, key, now_us, cost, limit, period, extra)"


def read_lua(name: str) -> str:
    """Return the text of one shipped Lua file."""
    return (resources.files("ratelimit_app.core") / "lua" / name).read_text(encoding="utf-8")


def _check_function() -> str:
    """Every algorithm as one branch of one function, check(code, ...), which decide.lua calls.

    Each algorithm file ends with `local function <its name>(stored, key, ...)`; what precedes that
    (its header, its helpers) stays as it is, and the function's body becomes the branch of its code.
    Redis runs the whole script for every call, and each function it defines is a closure made anew:
    one function for all the algorithms is made once, where seven were made on every request.
    """
    preambles: list[str] = []
    branches: list[str] = []
    for algorithm in SCRIPTED:
        name, code = algorithm.lua_file, algorithm.code
        text = read_lua(name).rstrip("\n")
        start = text.rindex("\nlocal function ")
        signature, _, body = text[start + 1:].partition("\n")
        if signature != f"local function {algorithm.name}{ALGORITHM_PARAMETERS}" or \
                not body.endswith("\nend"):
            raise ValueError(f"{name}: the file must end with its function {ALGORITHM_PARAMETERS} ... end")
        preambles.append(text[:start])
        keyword = "if" if not branches else "elseif"
        branches.append(f"  {keyword} code == {code} then -- {name}\n{body.removesuffix('end')}")
    return "\n".join(preambles) + \
        f"\nlocal function check(code, {ALGORITHM_PARAMETERS[1:]}\n" + "".join(branches) + "  end\nend\n"


def _kinds() -> str:
    """The kinds of policy decide.lua treats apart, named by the registry rather than by decide.lua:
    the algorithm whose state is only a key of its own (requests in flight), the one whose state moves
    to a key of its own from a limit on (a sliding log) and the one whose state is never an integer."""
    (slots,) = (algorithm for algorithm in SCRIPTED if algorithm.concurrency)
    (log,) = (algorithm for algorithm in SCRIPTED if algorithm.long_state_from)
    (text,) = (algorithm for algorithm in SCRIPTED if algorithm.text_state)
    return (f"local SLOTS_CODE, LOG_CODE, LONG_LOG_UNITS = {slots.code}, {log.code}, {log.long_state_from}\n"
            f"local TEXT_STATE_CODE = {text.code}\n")


def _slots_charge() -> str:
    """The charge of a slot (the `<name>_charge` function of the algorithm of requests in flight)."""
    (slots,) = (algorithm for algorithm in SCRIPTED if algorithm.concurrency)
    return f"local slots_charge = {slots.name}_charge\n"


@cache
def decide_source() -> str:
    """The complete decision script: the prelude, the kinds of policy, the algorithms as one function,
    then decide.lua."""
    return "\n".join((read_lua(_PRELUDE_FILE), _kinds(), _check_function(), _slots_charge(), read_lua(ENTRY_FILE)))


@cache
def decide_sha() -> str:
    """SHA1 of the decision script, as Redis names it in EVALSHA and SCRIPT LOAD."""
    return hashlib.sha1(decide_source().encode("utf-8"), usedforsecurity=False).hexdigest()


@cache
def cancel_source() -> str:
    """The lease-cancelling script (lua/cancel.lua): KEYS[1] a concurrency policy's sorted set of leases,
    ARGV the token and the lease period in ms."""
    return read_lua(CANCEL_FILE)


@cache
def renew_source() -> str:
    """The lease-renewing script (lua/renew.lua): KEYS one identity's sorted sets of leases, ARGV the
    token and each key's new lease length in ms."""
    return read_lua(RENEW_FILE)


#: The script that settles a reservation's real usage (run with EVALSHA, loaded on NOSCRIPT).
SETTLE_FILE = "settle.lua"


@cache
def settle_source() -> str:
    """The settling script: the prelude, the codes of the algorithms it settles (from the registry), then
    lua/settle.lua."""
    codes = {algorithm.name: algorithm.code for algorithm in SCRIPTED}
    (log,) = (algorithm for algorithm in SCRIPTED if algorithm.long_state_from)
    return "\n".join((read_lua(_PRELUDE_FILE), (
        f"local FIXED_CODE, LOG_CODE, COUNTER_CODE = {codes['fixed_window']}, {log.code}, "
        f"{codes['sliding_window_counter']}\n"
        f"local BUCKET_CODE, GCRA_CODE, LONG_LOG_UNITS = {codes['token_bucket']}, {codes['gcra']}, "
        f"{log.long_state_from}\n"), read_lua(SETTLE_FILE)))


@cache
def settle_sha() -> str:
    """SHA1 of the settling script."""
    return hashlib.sha1(settle_source().encode("utf-8"), usedforsecurity=False).hexdigest()
