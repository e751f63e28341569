"""The trivial views the HTTP benchmark serves, one per variant (see variants.py): plain views for
gunicorn, `async def` ones for uvicorn."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from bench.limiters import INCR_SCRIPT

BODY = {"ok": True}
_sha: str | None = None


def ping(request: HttpRequest) -> HttpResponse:
    """The view itself: no limiter."""
    return JsonResponse(BODY)


def ping_evalsha(request: HttpRequest) -> HttpResponse:
    """The floor of any Redis-backed limiter: one bare EVALSHA per request, then the view."""
    global _sha
    from ratelimit_app.service.connection import get_redis

    client: Any = get_redis()
    if _sha is None:
        _sha = str(client.script_load(INCR_SCRIPT))
    client.evalsha(_sha, 1, "floor:" + str(request.META.get("REMOTE_ADDR", "")))
    return JsonResponse(BODY)


async def aping(request: HttpRequest) -> HttpResponse:
    """The async view itself: no limiter."""
    return JsonResponse(BODY)


#: The async floor's redis.asyncio client and script hash, made on the first request: a client belongs
#: to the event loop it is first used on, and uvicorn serves from one.
_async_floor: tuple[Any, str] | None = None


async def aping_evalsha(request: HttpRequest) -> HttpResponse:
    """The async floor: one bare EVALSHA per request over a redis.asyncio client, then the async view."""
    global _async_floor
    if _async_floor is None:
        from ratelimit_app.service.connection import get_async_redis

        client: Any = get_async_redis()
        _async_floor = (client, str(await client.script_load(INCR_SCRIPT)))
    client, sha = _async_floor
    await client.evalsha(sha, 1, "floor:" + str(request.META.get("REMOTE_ADDR", "")))
    return JsonResponse(BODY)


def drf_view(throttled: bool) -> Any:
    """A DRF APIView returning the same body, with or without a throttle per API key."""
    from rest_framework.response import Response
    from rest_framework.throttling import SimpleRateThrottle
    from rest_framework.views import APIView

    class ApiKeyRateThrottle(SimpleRateThrottle):
        """DRF's documented way to throttle by something else than the user: its own cache key."""

        scope = "apikey"

        def get_cache_key(self, request: Any, view: Any) -> str | None:
            key = request.headers.get("X-API-Key")
            return self.cache_format % {"scope": self.scope, "ident": key} if key else None

    class Ping(APIView):
        throttle_classes = [ApiKeyRateThrottle] if throttled else []

        def get(self, request: Any) -> Response:
            return Response(BODY)

    return Ping.as_view()


def django_ratelimit_view() -> Any:
    """The plain view under django-ratelimit's decorator, per API key."""
    from django_ratelimit.decorators import ratelimit

    from bench.httpapp.variants import PEER_RATE

    return ratelimit(key="header:x-api-key", rate=PEER_RATE, block=True)(ping)


def smart_view() -> Any:
    """The plain view under django-smart-ratelimit's decorator, per API key."""
    from django_smart_ratelimit import rate_limit

    from bench.httpapp.variants import PEER_RATE

    return rate_limit(key="header:X-API-Key", rate=PEER_RATE)(ping)
