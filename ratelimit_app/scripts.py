"""The Lua sources shipped in ratelimit_app/lua, assembled once into the decision script."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

#: Algorithm files, each defining one local function that decide.lua dispatches to.
ALGORITHM_FILES: tuple[str, ...] = (
    "fixed_window.lua",
    "sliding_window.lua",
    "sliding_window_counter.lua",
    "token_bucket.lua",
    "gcra.lua",
    "calendar_window.lua",
    "concurrency.lua",
)
ENTRY_FILE = "decide.lua"
#: Locals every other file uses; it comes first.
PRELUDE_FILE = "prelude.lua"


def read_lua(name: str) -> str:
    """Return the text of one shipped Lua file."""
    return (resources.files("ratelimit_app") / "lua" / name).read_text(encoding="utf-8")


@cache
def decide_source() -> str:
    """The complete decision script: the prelude, the algorithm functions, then decide.lua."""
    return "\n".join(read_lua(name) for name in (PRELUDE_FILE, *ALGORITHM_FILES, ENTRY_FILE))


@cache
def decide_sha() -> str:
    """SHA1 of the decision script, as Redis names it in EVALSHA and SCRIPT LOAD."""
    return hashlib.sha1(decide_source().encode("utf-8"), usedforsecurity=False).hexdigest()
