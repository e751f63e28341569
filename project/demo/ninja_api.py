"""The demo's Django Ninja API, mounted at /ninja/ (outside the middleware's /api/: the throttles and the
decorator decide here; the middleware adds the rate limit headers).

- `GET /ninja/users`            the caller's tier (API key, user, or 401 without one): TierRateThrottle,
                                set for the whole API
- `POST /ninja/data`            the same tier, at cost 5 (`@limit_cost`)
- `GET /ninja/async/users`      /ninja/users as an `async def` operation
- `GET /ninja/public`           anonymous clients, 5 per minute per address: the drop-in for Ninja's
                                AnonRateThrottle (no key needed)
- `GET /ninja/async/public`     the same as an `async def` operation, with the same throttle object: the
                                two count together
- `GET /ninja/quote`            `@ratelimit`: 5 per minute per client IP, no throttle
- `GET /ninja/docs`, `GET /ninja/openapi.json`  Ninja's docs and schema: never limited (Ninja's
                                throttles apply to operations only, and /ninja/ is not under PATH_PREFIXES)
"""

from __future__ import annotations

from django.http import HttpRequest
from ninja import NinjaAPI

from ratelimit_app.decorators import limit_cost, ratelimit
from ratelimit_app.ninja import AnonRateThrottle, TierRateThrottle

from .views import QUOTES, USERS

api = NinjaAPI(title="ratelimit_app demo", urls_namespace="ninja-demo", throttle=TierRateThrottle())
PUBLIC = AnonRateThrottle("5/m")


@api.get("/users")
def users(request: HttpRequest) -> dict[str, list[dict[str, object]]]:
    """A cheap read: cost 1 of the caller's tier."""
    return {"users": USERS}


@api.post("/data")
@limit_cost(5)
def data(request: HttpRequest) -> dict[str, bool]:
    """A write: cost 5 of the caller's tier."""
    return {"stored": True}


@api.get("/async/users")
async def users_async(request: HttpRequest) -> dict[str, list[dict[str, object]]]:
    """/ninja/users as an `async def` operation."""
    return {"users": USERS}


@api.get("/public", throttle=PUBLIC)
def public(request: HttpRequest) -> dict[str, str]:
    """For anonymous clients: 5 per minute per client address."""
    return {"hello": "world"}


@api.get("/async/public", throttle=PUBLIC)
async def public_async(request: HttpRequest) -> dict[str, str]:
    """/ninja/public as an `async def` operation (the same count)."""
    return {"hello": "world"}


@api.get("/quote", throttle=[])
@ratelimit(rate="5/m", key="ip")
def quote(request: HttpRequest) -> dict[str, str]:
    """Limited by the decorator alone: 5 per minute per client IP."""
    return {"quote": QUOTES[len(request.path) % len(QUOTES)]}
