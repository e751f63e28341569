"""`RateLimitMiddleware`: limits every request under RATELIMIT['PATH_PREFIXES'] (default `/api/`).

Add it after AuthenticationMiddleware (so session users get their tier):

    MIDDLEWARE = [..., "django.contrib.auth.middleware.AuthenticationMiddleware",
                  "ratelimit_app.middleware.RateLimitMiddleware", ...]

The decision is made in `process_view`, once the view is known, so a view can declare its cost and
scope (`ratelimit_app.routes.limit_cost`). A limited path that resolves to no view (404) or that an
earlier middleware answered is still charged, at cost 1, on the way out. Every limited response carries
the rate limit headers; the outcome is left on `request.ratelimit` for views (the status endpoint).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponseBase

from .headers import apply_headers
from .limiting import ALLOWED, DENIED, UNAUTHORIZED, LimitOutcome, get_config, limit_request
from .responses import limiter_unavailable, too_many_requests, unauthorized
from .routes import route_for_view

#: The request attribute that holds the LimitOutcome (also set by TierRateThrottle).
REQUEST_ATTRIBUTE = "ratelimit"


class RateLimitMiddleware:
    """Identify, limit and annotate API requests (see the module docstring)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        outcome: LimitOutcome | None = request.__dict__.get(REQUEST_ATTRIBUTE)
        if outcome is None:
            config = get_config()
            if not config.enabled or not config.applies(request.path_info):
                return response
            # No view ran process_view (unresolved URL, or an earlier middleware answered): charge now.
            outcome = limit_request(request, cost=1)
            setattr(request, REQUEST_ATTRIBUTE, outcome)
            if outcome.status != ALLOWED:
                return refusal(outcome)
        # Also our own refusals (headers set again, same values) and TierRateThrottle's outcomes.
        add_headers(response, outcome)
        return response

    def process_view(self, request: HttpRequest, view_func: Callable[..., Any], view_args: Any,
                     view_kwargs: Any) -> HttpResponseBase | None:
        config = get_config()
        if not config.enabled or not config.applies(request.path_info):
            return None
        route = route_for_view(view_func)
        outcome = limit_request(request, cost=route.cost_for(request.method), scope=route.scope)
        setattr(request, REQUEST_ATTRIBUTE, outcome)
        if outcome.status == ALLOWED:
            return None
        return refusal(outcome, route.cost_for(request.method))


def add_headers(response: HttpResponseBase, outcome: LimitOutcome) -> None:
    """Add the rate limit headers chosen by RATELIMIT['HEADERS'] for this outcome."""
    if outcome.decision is not None:
        apply_headers(response, outcome.decision, outcome.policies, outcome.tier_slug, get_config().headers)


def refusal(outcome: LimitOutcome, cost: int = 1) -> HttpResponseBase:
    """The 429, 503 or 401 answer to a refused outcome, with the rate limit headers."""
    decision = outcome.decision
    if outcome.status == UNAUTHORIZED:
        response = unauthorized(outcome.message)
    elif outcome.status == DENIED and decision is not None:
        response = too_many_requests(decision, outcome.tier_slug, cost)
    else:
        response = limiter_unavailable(decision, outcome.tier_slug)
    add_headers(response, outcome)
    return response
