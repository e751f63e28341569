"""Django system checks (`manage.py check`) for the RATELIMIT settings and the Redis connection.

Ids are stable: ratelimit.E001 invalid settings, ratelimit.E002 no usable Redis configuration,
ratelimit.W001 Redis does not answer (a warning: the fail mode covers outages at run time).
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .conf import ratelimit_settings
from .exceptions import REDIS_CLIENT_ERRORS


@checks.register("ratelimit")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Validate RATELIMIT and that the Redis it names is configured and reachable."""
    try:
        ratelimit_settings.reload()
        ratelimit_settings.as_dict()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), hint="Fix settings.RATELIMIT; see docs/settings.md.", id="ratelimit.E001")]
    from .connection import get_redis

    messages: list[checks.CheckMessage] = []
    try:
        get_redis().ping()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), hint="Set RATELIMIT['REDIS_URL'].", id="ratelimit.E002")]
    except REDIS_CLIENT_ERRORS as exc:
        # building a cluster client already talks to a node, so it can fail here as well as the PING
        messages.append(checks.Warning(
            f"Redis for rate limiting does not answer: {exc}",
            hint=f"Requests follow RATELIMIT['FAIL_MODE'] = {ratelimit_settings.FAIL_MODE!r} until it does.",
            id="ratelimit.W001",
        ))
    return messages
