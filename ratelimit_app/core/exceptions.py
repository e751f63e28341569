"""The exceptions the engine raises. Catch `RateLimiterError` to handle every limiter failure."""

from __future__ import annotations

from redis.exceptions import RedisClusterException, RedisError


class RateLimiterError(Exception):
    """Base class of the errors raised by ratelimit_app."""


class BackendError(RateLimiterError):
    """Redis could not give a decision: unreachable, timed out, or answered something unexpected.

    `maybe_applied` is True when the command may have run in Redis before the failure (it was sent
    and its reply was lost): such a call is never resent, since Redis may already have charged it.
    The Redis exception, when there was one, is chained as `__cause__`.
    """

    def __init__(self, message: str, *, maybe_applied: bool) -> None:
        super().__init__(message)
        self.maybe_applied = maybe_applied


#: What a redis-py client raises when Redis cannot answer (RedisClusterException, "no node reachable",
#: is not a RedisError). The engine turns these into BackendError.
REDIS_CLIENT_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException, OSError)

#: Everything that means "Redis could not decide": the engine's errors, plus what a client may raise
#: outside the engine (building a cluster client, a cluster topology refresh). The one list every
#: layer above the engine catches.
BACKEND_ERRORS: tuple[type[Exception], ...] = (RateLimiterError, *REDIS_CLIENT_ERRORS)
