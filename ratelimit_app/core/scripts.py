"""The Lua scripts shipped in lua/: the decision script assembled from the registry of algorithms (each
algorithm's function a branch of one `check`, which decide.lua calls), the settling script, and the lease
scripts."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from .algorithms import SCRIPTED, Algorithm

#: Algorithm files, each ending with the function of its algorithm.
ALGORITHM_FILES: tuple[str, ...] = tuple(algorithm.lua_file for algorithm in SCRIPTED)
ENTRY_FILE = "decide.lua"
#: The script that cancels a lease token whose decision's reply was lost (run with EVAL: it is rare).
CANCEL_FILE = "cancel.lua"
#: The script that sets when a lease token's live slots end (run with EVAL: a gateway's request only).
RENEW_FILE = "renew.lua"
#: The script that settles a reservation's real usage (run with EVALSHA, loaded on NOSCRIPT).
SETTLE_FILE = "settle.lua"
#: Locals the decision and settling scripts share; it comes first.
_PRELUDE_FILE = "prelude.lua"
#: The parameters of every algorithm function, in this order (see "The algorithms" in decide.lua).
ALGORITHM_PARAMETERS = "(stored, key, now_us, cost, limit, period, extra)"


def read_lua(name: str) -> str:
    """Return the text of one shipped Lua file."""
    return (resources.files("ratelimit_app.core") / "lua" / name).read_text(encoding="utf-8")


def _the(kind: str) -> Algorithm:
    """The one scripted algorithm of a kind decide.lua treats apart (an attribute of Algorithm that is set)."""
    (algorithm,) = (algorithm for algorithm in SCRIPTED if getattr(algorithm, kind))
    return algorithm


def _check_function() -> str:
    """Every algorithm as one branch of one function, check(code, ...), which decide.lua calls.

    Each algorithm file ends with `local function <its name>(stored, key, ...)`; what precedes that
    stays as it is, and the function's body becomes the branch of its code. Redis runs the whole script
    for every call, making each function it defines anew: one function is made, where seven were.
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


@cache
def decide_source() -> str:
    """The complete decision script: the prelude, the kinds of policy decide.lua treats apart (named by
    the registry), the algorithms as one function, the charge of a slot, then decide.lua."""
    slots, log = _the("concurrency"), _the("long_state_from")
    kinds = (f"local SLOTS_CODE, LOG_CODE, LONG_LOG_UNITS = {slots.code}, {log.code}, {log.long_state_from}\n"
             f"local TEXT_STATE_CODE = {_the('text_state').code}\n")
    return "\n".join((read_lua(_PRELUDE_FILE), kinds, _check_function(),
                      f"local slots_charge = {slots.name}_charge\n", read_lua(ENTRY_FILE)))


@cache
def settle_source() -> str:
    """The settling script: the prelude, the codes of the algorithms it settles, then lua/settle.lua."""
    codes, log = {algorithm.name: algorithm.code for algorithm in SCRIPTED}, _the("long_state_from")
    constants = (f"local FIXED_CODE, LOG_CODE, COUNTER_CODE = {codes['fixed_window']}, {log.code}, "
                 f"{codes['sliding_window_counter']}\n"
                 f"local BUCKET_CODE, GCRA_CODE, LONG_LOG_UNITS = {codes['token_bucket']}, {codes['gcra']}, "
                 f"{log.long_state_from}\n")
    return "\n".join((read_lua(_PRELUDE_FILE), constants, read_lua(SETTLE_FILE)))


def _sha(source: str) -> str:
    return hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()


@cache
def decide_sha() -> str:
    """SHA1 of the decision script, as Redis names it in EVALSHA and SCRIPT LOAD."""
    return _sha(decide_source())


@cache
def settle_sha() -> str:
    """SHA1 of the settling script."""
    return _sha(settle_source())


@cache
def cancel_source() -> str:
    """The lease-cancelling script (lua/cancel.lua)."""
    return read_lua(CANCEL_FILE)


@cache
def renew_source() -> str:
    """The lease-renewing script (lua/renew.lua)."""
    return read_lua(RENEW_FILE)
