"""The demo API that shows ratelimit_app at work."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from redis.exceptions import RedisError

from ratelimit_app.connection import get_redis


def health(request: HttpRequest) -> JsonResponse:
    """Never limited; reports whether Redis answers."""
    try:
        redis_ok = bool(get_redis().ping())
    except (RedisError, OSError):
        redis_ok = False
    return JsonResponse({"status": "ok", "redis": "up" if redis_ok else "down"})
