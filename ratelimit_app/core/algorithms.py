"""The registry of algorithms: everything the rest of the code knows about each one, in one place.

An algorithm is its Lua file (lua/<name>.lua), its Python model (service/fallback_models.py) and its
entry here; docs/architecture.md says what each holds and what reads the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def _units(capacity: int, limit: int, period_ms: int) -> int:
    """A state of at most `capacity` units."""
    return capacity


def _tokens(capacity: int, limit: int, period_ms: int) -> int:
    """A bucket's tokens, counted in period_ms parts of a unit."""
    return capacity * period_ms


def _arrival_time(capacity: int, limit: int, period_ms: int) -> int:
    """A theoretical arrival time: now (about 2**51 us) plus up to `capacity` emission intervals."""
    return 2**51 + capacity * -(-period_ms * 1000 // limit)


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: its `name` (Policy.algorithm; its Lua file is lua/<name>.lua), the `code` decide.lua
    dispatches on, the `letter` of its state in a key, and `sha1`, the digest of its Lua file, pinned so
    that the script cannot change unnoticed (tests/core/test_scripts.py). `takes_burst`: a policy of it
    may have a capacity above its limit. `concurrency`: it counts requests in flight (slots, in a key of
    their own, charged by its Lua `<name>_charge`) rather than requests over time. `text_state`: its
    state is bytes, never an integer. `long_state_from` (0: never): the limit from which a policy of it
    keeps its state in a key of its own (a sliding log grows with its limit). `largest_state(capacity,
    limit, period_ms)`: the largest number its Lua state reaches, which must stay exact in a double."""

    name: str
    code: int
    letter: str
    sha1: str
    takes_burst: bool = False
    concurrency: bool = False
    text_state: bool = False
    long_state_from: int = 0
    largest_state: Callable[[int, int, int], int] = _units

    @property
    def lua_file(self) -> str:
        """The file in lua/ that ends with this algorithm's function."""
        return f"{self.name}.lua"


#: The algorithms a Policy may use, in the order they are listed to users.
REGISTRY: tuple[Algorithm, ...] = (
    Algorithm("fixed_window", 3, "f", "e8456d423afd1006f23f0e615b2cfc2870bf6b47"),
    Algorithm("sliding_window", 2, "s", "22ea529c731650fc5ba5714e5a1e9b48b96a1851", text_state=True,
              long_state_from=128),
    Algorithm("sliding_window_counter", 5, "c", "720cb774d1b5dceaaf7f4d92ff00c4a756dbe311"),
    Algorithm("token_bucket", 1, "t", "e2bd56518d4fe03b6a6693a5e850076d017677cc", takes_burst=True,
              largest_state=_tokens),
    Algorithm("gcra", 4, "g", "50e70a85a54a2beff63396750014399b7420ec0a", takes_burst=True,
              largest_state=_arrival_time),
    Algorithm("concurrency", 6, "q", "9b204623195707ab5e9ed7858263dbb642217bac", concurrency=True),
)
#: A calendar quota: a fixed_window policy whose windows are calendar days, weeks or months. Users do not
#: choose it by name (Policy.calendar selects it), but it has a Lua file, a code and a letter.
CALENDAR_WINDOW = Algorithm("calendar_window", 32, "k", "4ead8a19f2410a94551fd6f73de7523a0c2d27e6")
#: Every algorithm of the decision script, the calendar window included.
SCRIPTED: tuple[Algorithm, ...] = (*REGISTRY, CALENDAR_WINDOW)

BY_NAME: dict[str, Algorithm] = {algorithm.name: algorithm for algorithm in REGISTRY}
