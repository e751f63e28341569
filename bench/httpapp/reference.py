"""The lean reference middleware: what the features of ours cost, written plainly, with no speed tricks.

For the HTTP benchmark's request it does exactly what RateLimitMiddleware does, and nothing else:
- who: the API key in X-API-Key (its hash checked against the stored one) -> its tier, read from the
  database the first time a key is seen and kept in a dict (ours caches its lookups too);
- one Redis call: the EVALSHA of our decide.lua with the same KEYS and ARGV as ours (the per-IP limit and
  the tier's limits, packed by `prepare_call` of the engine's core, as ours packs it), written on a
  redis-py connection of its own (one per thread; the async twin takes one from a redis-py pool, as
  requests in flight on one event loop cannot share one) and read back with redis-py's reply parser;
- the six rate limit headers (X-RateLimit-Limit / -Remaining / -Reset / -Tier, RateLimit-Policy,
  RateLimit), read from the script's reply (three numbers per policy, see decide.lua's header);
- a count per request (allowed / blocked, by tier and hour) kept in the process and added to Redis by a
  thread every few seconds, as our recorder batches its metrics.

It handles only that request's shape: no users, scopes, overrides, client rules, fail modes, concurrency
or admin edits. `ReferenceMiddleware` is the sync one (WSGI), `AsyncReferenceMiddleware` its async twin
(ASGI, redis.asyncio). The benchmark reports every variant as a ratio to it.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
from asgiref.sync import markcoroutinefunction, sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse

from ratelimit_app import Policy
from ratelimit_app.core.engine import prepare_call
from ratelimit_app.core.scripts import decide_source
from ratelimit_app.models import ApiKey

#: decide.lua's reply: remaining, reset in ms, retry in ms (0 when allowed), for each policy in order.
REPLY = struct.Struct(">qqq")
#: How often the counts kept in the process are added to Redis (seconds).
FLUSH_EVERY = 5.0


@dataclass(frozen=True)
class Client:
    """A known API key: the hash it must match, its tier, the per-IP limit under that tier and the tier's
    limits. `ip_per_tier`: the tier has a per-IP rate of its own, counted per address and tier."""

    hashed: str
    prefix: str
    tier: str
    ip_policy: Policy
    ip_per_tier: bool
    policies: tuple[Policy, ...]
    all_policies: tuple[Policy, ...]  # the call's, in its order: the per-IP limit, then the tier's
    policy_header: str  # their RateLimit-Policy header, the same for every request


def _load_client(prefix: str, ip_rate: str, ip_algorithm: str) -> Client | None:
    """The active key of `prefix` from the database, or None."""
    key = ApiKey.objects.select_related("tier").filter(prefix=prefix, revoked=False).first()
    if key is None:
        return None
    tier = key.tier
    policies = tuple(Policy(row.name, row.algorithm, limit=row.limit, period=row.period, burst=row.burst)
                     for row in tier.limits.filter(enabled=True, shadow=False, scope="").order_by("pk"))
    ip_policy = Policy.parse(tier.ip_rate or ip_rate, name="ip", algorithm=ip_algorithm)
    every = (ip_policy, *policies)
    header = ", ".join(f'"{p.name}";q={p.capacity};w={_window(p)}' for p in every)
    return Client(key.hashed_key, prefix, tier.slug, ip_policy, bool(tier.ip_rate), policies, every, header)


def _prefix(raw: str | None) -> str | None:
    """The prefix of an API key ("<prefix>.<secret>"), or None when `raw` does not have that shape."""
    if not raw or len(raw) > 128:
        return None
    prefix, dot, secret = raw.partition(".")
    return prefix if dot and prefix.isalnum() and secret else None


def _matches(raw: str, client: Client) -> bool:
    return hmac.compare_digest(hashlib.sha512(raw.encode("ascii", "replace")).hexdigest(), client.hashed)


class Counts:
    """Requests counted per (hour, tier, outcome) in the process; a thread adds them to Redis every
    FLUSH_EVERY seconds with HINCRBY, in one pipeline."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.key = f"{prefix}:reference:metrics"
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._flush_forever, daemon=True).start()

    def add(self, tier: str, allowed: bool) -> None:
        field = f"{int(time.time()) // 3600}:{tier}:{'allowed' if allowed else 'blocked'}"
        with self.lock:
            self.counts[field] = self.counts.get(field, 0) + 1

    def _flush_forever(self) -> None:
        while True:
            time.sleep(FLUSH_EVERY)
            with self.lock:
                counts, self.counts = self.counts, {}
            if counts:
                try:
                    pipe = self.client.pipeline(transaction=False)
                    for field, count in counts.items():
                        pipe.hincrby(self.key, field, count)
                    pipe.execute()
                except redis.RedisError:
                    pass  # a lost batch of counts; the next one is sent as usual


class Reference:
    """What both twins share: the settings, the known keys, the call, the reply and the headers."""

    def __init__(self) -> None:
        conf: dict[str, Any] = settings.RATELIMIT
        self.url = str(conf["REDIS_URL"])
        self.timeouts: dict[str, Any] = {"socket_timeout": float(conf.get("SOCKET_TIMEOUT", 0.05)),
                                         "socket_connect_timeout": float(conf.get("SOCKET_CONNECT_TIMEOUT", 0.05))}
        self.prefix = str(conf.get("KEY_PREFIX", "rl"))
        self.ip_algorithm = str(conf.get("IP_ALGORITHM", "sliding_window_counter"))
        self.ip_rate = str(conf.get("IP_RATE", "100/m"))
        self.paths = tuple(conf.get("PATH_PREFIXES", ("/",)))
        self.clients: dict[str, Client] = {}
        self.counts = Counts(redis.Redis.from_url(self.url, **self.timeouts), self.prefix)

    def load(self, prefix: str) -> Client | None:
        return _load_client(prefix, self.ip_rate, self.ip_algorithm)

    def checks(self, request: HttpRequest, client: Client) -> tuple[tuple[str, tuple[Policy, ...]], ...]:
        """The per-IP limit (the tier's own rate, counted per address and tier, else IP_RATE) and the tier's."""
        address = f"ip:{request.META.get('REMOTE_ADDR', '')}"
        if client.ip_per_tier:
            address += "@" + client.tier
        return (address, (client.ip_policy,)), (f"key:{client.prefix}", client.policies)

    def answer(self, client: Client, reply: bytes) -> tuple[bool, dict[str, str]]:
        """Whether the call allowed, and the headers: the legacy trio of the policy nearest to refusing
        (fewest remaining, then the latest reset; when refused, the longest retry), and one IETF entry
        per policy."""
        rows = [(policy, max(remaining, 0), reset_ms, retry_ms) for policy, (remaining, reset_ms, retry_ms)
                in zip(client.all_policies, REPLY.iter_unpack(reply), strict=True)]
        refused = [row for row in rows if row[3]]
        main = max(refused, key=lambda row: row[3]) if refused else min(rows, key=lambda row: (row[1], -row[2]))
        allowed = not refused
        fields = [f'"{policy.name}";r={remaining};t={_seconds(reset_ms)}' for policy, remaining, reset_ms, _ in rows]
        headers = {"X-RateLimit-Limit": str(main[0].capacity), "X-RateLimit-Remaining": str(main[1]),
                   "X-RateLimit-Reset": str(_seconds(main[2])), "RateLimit-Policy": client.policy_header,
                   "RateLimit": ", ".join(fields)}
        return allowed, headers


def _seconds(milliseconds: int) -> int:
    return max(0, math.ceil(milliseconds / 1000))


def _window(policy: Policy) -> int:
    """The IETF `w` of a policy: its period, or for a bucket the time its burst takes to refill."""
    if policy.algorithm in ("token_bucket", "gcra"):
        return max(1, math.ceil(policy.capacity * policy.period / policy.limit))
    return max(1, math.ceil(policy.period))


def _refusal(status: int, message: str, headers: dict[str, str] | None = None) -> HttpResponse:
    response = JsonResponse({"error": message}, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _finish(response: HttpResponseBase, tier: str, headers: dict[str, str]) -> HttpResponseBase:
    for name, value in headers.items():
        response[name] = value
    response["X-RateLimit-Tier"] = tier
    return response


class ReferenceMiddleware:
    """The sync reference middleware (see the module docstring)."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self.shared = Reference()
        self.redis = redis.Redis.from_url(self.shared.url, **self.shared.timeouts)
        self.sha = self.redis.script_load(decide_source())
        self.local = threading.local()

    def connection(self) -> Any:
        """This thread's connection to Redis, made on its first request (redis-py connects it when used)."""
        connection = getattr(self.local, "connection", None)
        if connection is None:
            pool = self.redis.connection_pool
            connection = self.local.connection = pool.connection_class(**pool.connection_kwargs)
        return connection

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        shared = self.shared
        if not request.path.startswith(shared.paths):
            return self.get_response(request)
        raw = request.headers.get("X-API-Key")
        prefix = _prefix(raw)
        client = shared.clients.get(prefix) if prefix else None
        if prefix and client is None:
            client = shared.load(prefix)
            if client is not None:
                shared.clients[prefix] = client
        if client is None or not _matches(str(raw), client):
            return _refusal(401, "unknown API key")
        checks = shared.checks(request, client)
        call = prepare_call(shared.prefix, checks, 1, charge=True)
        connection = self.connection()
        try:
            connection.send_packed_command((call.packed,))
            reply = connection.read_response()
        except redis.RedisError:
            connection.disconnect()  # connected again by the next request
            return self.get_response(request)  # fail open
        allowed, headers = shared.answer(client, reply)
        shared.counts.add(client.tier, allowed)
        if not allowed:
            return _refusal(429, "rate limit exceeded", {**headers, "X-RateLimit-Tier": client.tier})
        return _finish(self.get_response(request), client.tier, headers)


class AsyncReferenceMiddleware:
    """The async twin: the same work, awaiting redis.asyncio (one client per event loop: uvicorn serves from one)."""

    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]]) -> None:
        self.get_response = get_response
        markcoroutinefunction(self)  # Django calls it as the coroutine it is, on the event loop
        self.shared = Reference()
        self.redis = redis.asyncio.Redis.from_url(self.shared.url, **self.shared.timeouts)
        self.sha: str | None = None
        self.load_client = sync_to_async(self.shared.load)

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        shared = self.shared
        if not request.path.startswith(shared.paths):
            return await self.get_response(request)
        raw = request.headers.get("X-API-Key")
        prefix = _prefix(raw)
        client = shared.clients.get(prefix) if prefix else None
        if prefix and client is None:
            client = await self.load_client(prefix)
            if client is not None:
                shared.clients[prefix] = client
        if client is None or not _matches(str(raw), client):
            return _refusal(401, "unknown API key")
        checks = shared.checks(request, client)
        call = prepare_call(shared.prefix, checks, 1, charge=True)
        if self.sha is None:
            self.sha = str(await self.redis.script_load(decide_source()))
        pool = self.redis.connection_pool
        connection = await pool.get_connection()
        try:
            await connection.send_packed_command((call.packed,))
            reply = await connection.read_response()
        except redis.RedisError:
            await connection.disconnect()
            return await self.get_response(request)  # fail open
        finally:
            await pool.release(connection)
        allowed, headers = shared.answer(client, reply)
        shared.counts.add(client.tier, allowed)
        if not allowed:
            return _refusal(429, "rate limit exceeded", {**headers, "X-RateLimit-Tier": client.tier})
        return _finish(await self.get_response(request), client.tier, headers)
