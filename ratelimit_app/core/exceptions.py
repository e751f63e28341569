"""The exceptions the engine raises. Catch `RateLimiterError` to handle every limiter failure."""

from __future__ import annotations

from redis.exceptions import OutOfMemoryError, RedisClusterException, RedisError, ResponseError


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


class ScriptsRefused(BackendError):
    """The server answered SCRIPT LOAD of the decision script with a refusal: it cannot run Lua scripts
    as configured (a server without a Lua engine, such as Valkey 9.1+ started without its `lua` module;
    scripting renamed away or denied by an ACL). Every decision fails alike until the server changes."""


#: Answers to SCRIPT LOAD that pass (a script still running, a cluster or a master not ready): an outage,
#: not a server that cannot run scripts.
_PASSING_REFUSALS = ("BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN")


def refuses_scripts(exc: BaseException) -> bool:
    """True when `exc`, raised by SCRIPT LOAD, says the server cannot run Lua scripts (see ScriptsRefused)."""
    return (isinstance(exc, ResponseError) and not isinstance(exc, OutOfMemoryError)
            and not str(exc).startswith(_PASSING_REFUSALS))


def scripts_refused(exc: BaseException) -> ScriptsRefused | None:
    """The ScriptsRefused that `exc`, raised by SCRIPT LOAD, means; None when it is not a refusal."""
    if not refuses_scripts(exc):
        return None
    return ScriptsRefused(f"the server cannot run Lua scripts: SCRIPT LOAD answered {exc}", maybe_applied=False)


#: What a redis-py client raises when Redis cannot answer (RedisClusterException, "no node reachable",
#: is not a RedisError). The engine turns these into BackendError.
REDIS_CLIENT_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException, OSError)

#: Everything that means "Redis could not decide": the engine's errors, plus what a client may raise
#: outside the engine (building a cluster client, a cluster topology refresh). The one list every
#: layer above the engine catches.
BACKEND_ERRORS: tuple[type[Exception], ...] = (RateLimiterError, *REDIS_CLIENT_ERRORS)
