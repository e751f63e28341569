"""The lease scripts, sent through a Redis client: cancelling a lease token (lua/cancel.lua) and renewing
its live slots (lua/renew.lua), the sync calls and their async twins.

Both are rare next to decisions (a lost reply; a gateway's request), so they go through the client's own
`eval` (one call per key for a cancellation, one per identity for a renewal: on Redis Cluster every call
stays on one hash slot), not the decision's speed path. Neither takes user input as a key or as source:
the keys are named by ratelimit_app.core.keys from validated identities and policies, and the token is
checked (`engine.check_lease`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import engine
from .exceptions import REDIS_CLIENT_ERRORS
from .keys import cancel_keys, renew_calls
from .policies import Policy
from .scripts import cancel_source, renew_source


def cancel(client: Any, prefix: str, held: Sequence[tuple[str, Policy]], lease: str) -> None:
    """Make sure `lease` holds none of the slots of `held`, now or later (see RateLimiter.cancel). Raises
    BackendError when Redis cannot be asked."""
    engine.check_lease(lease)
    try:
        for key, period_ms in cancel_keys(prefix, held):
            client.eval(cancel_source(), 1, key, lease, period_ms)
    except REDIS_CLIENT_ERRORS as exc:
        raise engine.release_failed(lease, exc) from exc


async def acancel(client: Any, prefix: str, held: Sequence[tuple[str, Policy]], lease: str) -> None:
    """`cancel` through an asyncio client."""
    engine.check_lease(lease)
    try:
        for key, period_ms in cancel_keys(prefix, held):
            await client.eval(cancel_source(), 1, key, lease, period_ms)
    except REDIS_CLIENT_ERRORS as exc:
        raise engine.release_failed(lease, exc) from exc


def _calls(prefix: str, held: Sequence[tuple[str, Policy]], lease: str,
           lease_ms: int | None) -> list[tuple[Any, ...]]:
    engine.check_lease(lease)
    if lease_ms is not None and (type(lease_ms) is not int or lease_ms < 1):
        raise ValueError(f"lease_ms: {lease_ms!r:.40} must be a whole number of milliseconds >= 1, or None")
    return [(renew_source(), len(keys), *keys, lease, *lengths)
            for keys, lengths in renew_calls(prefix, held, lease_ms)]


def renew(client: Any, prefix: str, held: Sequence[tuple[str, Policy]], lease: str, lease_ms: int | None) -> int:
    """Make each live slot of `held` held under `lease` end `lease_ms` from now (at most its policy's
    period), or a full period from now (None); how many were live. A slot given back, cancelled or run
    out is left as it is (never taken again). Raises BackendError when Redis cannot be asked."""
    calls = _calls(prefix, held, lease, lease_ms)
    try:
        return sum(int(client.eval(*call)) for call in calls)
    except REDIS_CLIENT_ERRORS as exc:
        raise engine.release_failed(lease, exc, doing="renew") from exc


async def arenew(client: Any, prefix: str, held: Sequence[tuple[str, Policy]], lease: str,
                 lease_ms: int | None) -> int:
    """`renew` through an asyncio client."""
    calls = _calls(prefix, held, lease, lease_ms)
    try:
        return sum([int(await client.eval(*call)) for call in calls])
    except REDIS_CLIENT_ERRORS as exc:
        raise engine.release_failed(lease, exc, doing="renew") from exc
