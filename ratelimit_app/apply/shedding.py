"""Priority load shedding: when the fleet (or this process) is full, refuse the least important requests
first. The fleet shedder (RATELIMIT['SHED_CAPACITY']) holds a slot of one fleet-wide count in Redis in each
request's one decision; the process shedder (RATELIMIT['SHED_PROCESS_LIMIT']) counts this process'
requests in flight, with no Redis call. Priorities, thresholds, fail modes, metrics and the episode logs
are in docs/protection.md.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest

from ..conf.paths import PathPrefixes, prefix_form, readings
from ..conf.snapshot import Snapshot, request_settings
from ..core.logs import log_event
from ..core.policies import CONCURRENCY, MAX_LIMIT, Policy
from .limitcheck import LimitCheck

CRITICAL = "critical"
NORMAL = "normal"
LOW = "low"
PRIORITIES: tuple[str, ...] = (CRITICAL, NORMAL, LOW)
#: The identity of the fleet-wide count (one Redis key for the whole fleet).
FLEET_IDENTITY = "shed:fleet"
#: Name of the fleet count's policy (every priority uses the same key, with its own threshold).
FLEET_POLICY = "shed"
#: `LimitCheck.owner` prefix of the fleet check: "shed.<priority>".
OWNER_PREFIX = "shed."
#: Seconds without a shed after which an episode is logged as over.
EPISODE_QUIET = 10.0


def validate_priority(priority: str) -> str:
    """Return `priority` if it is "critical", "normal" or "low", else raise ValueError."""
    if priority not in PRIORITIES:
        raise ValueError(f"priority: {priority!r} must be one of {', '.join(PRIORITIES)}")
    return priority


@dataclass(frozen=True, slots=True)
class ShedConfig:
    """The shedding settings, parsed once per settings change."""

    capacity: int | None
    thresholds: dict[str, Policy]  # priority -> the fleet count's policy at that priority's threshold
    prefixes: PathPrefixes  # SHED_PRIORITIES' prefixes
    priorities: dict[str, str]  # prefix (its prefix_form) -> priority
    process_limit: int | None
    retry_after: float

    def priority_for(self, path: str, declared: str | None) -> str:
        """The priority of a request to `path`: its view's declaration, else that of its longest path
        prefix (normal under none); when `path` read as sent and normalised differ, the lower of theirs."""
        if declared is not None:
            return declared
        found = [self.priorities.get(self.prefixes.longest(reading) or "", NORMAL) for reading in readings(path)]
        return max(found, key=PRIORITIES.index)


def _parse(snapshot: Snapshot) -> ShedConfig:
    """The shedding settings; with RATELIMIT['ENABLED'] False, neither shedder sheds (nor counts)."""
    read = snapshot.get
    if not snapshot.enabled:
        return ShedConfig(None, {}, PathPrefixes.of(()), {}, None, float(read("SHED_RETRY_AFTER")))
    capacity = read("SHED_CAPACITY")
    lease = read("SHED_LEASE")
    thresholds: dict[str, Policy] = {}
    if capacity is not None:
        thresholds = {
            LOW: Policy(FLEET_POLICY, CONCURRENCY, limit=max(1, math.floor(capacity * read("SHED_LOW_AT"))),
                        period=lease),
            NORMAL: Policy(FLEET_POLICY, CONCURRENCY, limit=max(1, math.floor(capacity * read("SHED_NORMAL_AT"))),
                           period=lease),
            CRITICAL: Policy(FLEET_POLICY, CONCURRENCY, limit=MAX_LIMIT, period=lease),  # counted, never refused
        }
    priorities: dict[str, str] = {}
    for prefix, priority in read("SHED_PRIORITIES").items():  # "/api" and "/api/" are one prefix: the lower wins
        form = prefix_form(prefix)
        priorities[form] = max(priority, priorities.get(form, CRITICAL), key=PRIORITIES.index)
    return ShedConfig(capacity, thresholds, PathPrefixes.of(priorities), priorities, read("SHED_PROCESS_LIMIT"),
                      float(read("SHED_RETRY_AFTER")))


def shed_config(snapshot: Snapshot | None = None) -> ShedConfig:
    """The parsed shedding settings (parsed once per settings snapshot)."""
    return (snapshot or request_settings()).derived(_parse)


def fleet_check(request: HttpRequest, declared: Callable[[HttpRequest], str | None],
                path: str | None = None, config: ShedConfig | None = None) -> LimitCheck | None:
    """The fleet count's check for `request` at its priority (None when SHED_CAPACITY is None);
    `declared(request)` gives the priority the view declares, asked only when the shedder is on.
    `path` is the path of the request a gateway describes (its priority is that of its path prefix,
    nothing is declared for it); None: the request's own path. `config`: the shedding settings (default:
    of now)."""
    config = config or shed_config()
    if config.capacity is None:
        return None
    if path is None:
        priority = config.priority_for(request.path_info, declared(request))
    else:
        priority = config.priority_for(path, None)
    return LimitCheck(FLEET_IDENTITY, (config.thresholds[priority],), OWNER_PREFIX + priority)


def priority_of_owner(owner: str) -> str | None:
    """The priority of a fleet check's owner ("shed.low" -> "low"), None for any other owner."""
    return owner[len(OWNER_PREFIX):] if owner.startswith(OWNER_PREFIX) else None


# -- the process shedder ------------------------------------------------------------------------------

class InFlight:
    """Requests in flight in this process (a forked worker counts its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def enter(self) -> int:
        """Count one more request; returns the count, this one included."""
        with self._lock:
            self.count += 1
            return self.count

    def leave(self) -> None:
        with self._lock:
            self.count -= 1


in_flight = InFlight()


class Departure:
    """Leaves `in_flight` once, however many times it is called (response closed, dropped, or raised)."""

    __slots__ = ("__weakref__", "_done", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False

    def __call__(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        in_flight.leave()


def process_sheds(config: ShedConfig, priority: str, count: int) -> bool:
    """True when the process shedder refuses a request of `priority` while `count` requests (this one
    included) are in flight here."""
    return priority == LOW and config.process_limit is not None and count > config.process_limit


# -- episodes ------------------------------------------------------------------------------------------

class _Episode:
    """Logs a shedding episode once when it starts and once when it ends."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._lock = threading.Lock()
        self.active = False
        self.shed = 0
        self.last_shed = 0.0

    def record_shed(self, priority: str, detail: dict[str, Any]) -> None:
        now = time.monotonic()
        with self._lock:
            started = not self.active
            self.active, self.last_shed = True, now
            self.shed += 1
        if started:
            log_event("ratelimit.shed_started", logging.WARNING, shedder=self.kind, priority=priority, **detail)

    def record_admitted(self) -> None:
        if not self.active:
            return
        now = time.monotonic()
        with self._lock:
            if not self.active or now - self.last_shed < EPISODE_QUIET:
                return
            self.active, shed = False, self.shed
            self.shed = 0
        log_event("ratelimit.shed_ended", logging.INFO, shedder=self.kind, shed=shed)


fleet_episode = _Episode("fleet")
process_episode = _Episode("process")
