"""The registry of algorithms: everything the rest of the code knows about each one, in one place.

An algorithm is one Lua file (lua/<name>.lua: the function decide.lua calls, with the contract its
header states), one model of it in Python for the "local" fail mode (fallback_models.py, registered
with `@model("<name>")`), and one entry here. Policies (which names are valid, which take a
burst), the admin's choices, the decision script and its codes, the state keys' letters and the
fallback all read this registry; tests/core/test_scripts.py checks that every entry has its Lua function
and its fallback model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: its `name` (Policy.algorithm), the `code` decide.lua dispatches on, the `letter`
    of its state in a key, its Lua file, and whether a policy of it may have a burst (a capacity
    above its limit). `concurrency` is True for the one that counts requests in flight (slots) rather
    than requests over time: its state is a key of its own, charged by its Lua `<name>_charge`.
    `text_state` is True when its state is bytes that are never an integer (decide.lua then never
    reads a 7-byte state of it as one). `long_state_from` (0: never) is the limit from which a policy
    of it keeps its state in a key of its own, where a hit appends to it rather than rewriting it with
    the identity's other entries (a sliding log grows with its limit: lua/sliding_window.lua)."""

    name: str
    code: int
    letter: str
    lua_file: str
    takes_burst: bool = False
    concurrency: bool = False
    text_state: bool = False
    long_state_from: int = 0


#: The algorithms a Policy may use, in the order they are listed to users.
REGISTRY: tuple[Algorithm, ...] = (
    Algorithm("fixed_window", 3, "f", "fixed_window.lua"),
    Algorithm("sliding_window", 2, "s", "sliding_window.lua", text_state=True, long_state_from=128),
    Algorithm("sliding_window_counter", 5, "c", "sliding_window_counter.lua"),
    Algorithm("token_bucket", 1, "t", "token_bucket.lua", takes_burst=True),
    Algorithm("gcra", 4, "g", "gcra.lua", takes_burst=True),
    Algorithm("concurrency", 6, "q", "concurrency.lua", concurrency=True),
)
#: A calendar quota: a fixed_window policy whose windows are calendar days, weeks or months. It is not
#: an algorithm users choose (Policy.calendar selects it), but it has a Lua file, a code and a letter.
CALENDAR_WINDOW = Algorithm("calendar_window", 32, "k", "calendar_window.lua")
#: Every algorithm of the decision script, the calendar window included.
SCRIPTED: tuple[Algorithm, ...] = (*REGISTRY, CALENDAR_WINDOW)

BY_NAME: dict[str, Algorithm] = {algorithm.name: algorithm for algorithm in REGISTRY}
