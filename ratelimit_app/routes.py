"""Per-route declarations the middleware reads: what a request to a view costs, and which scope it is in.

    @limit_cost(5)                          # every request to this view costs 5 units
    @limit_cost(5, methods=["POST"])        # POST costs 5, other methods 1
    @limit_cost(1, scope="search")          # adds the tier's limits with scope "search"
    @limit_cost(0)                          # identify and report, consume nothing (status endpoints)

Class-based views may set the same on the class (`@limit_cost(...)` on a View or APIView class); a DRF
view's `throttle_scope` is used as the scope when nothing else is declared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from .policies import MAX_LIMIT

ATTRIBUTE = "ratelimit_route"
_SCOPE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")

ViewT = TypeVar("ViewT", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class RouteLimit:
    """What a route costs (`cost` units; 0 = report only) and its scope ("" = none).

    With `methods`, the cost applies to those HTTP methods only; other methods cost 1.
    """

    cost: int = 1
    scope: str = ""
    methods: frozenset[str] | None = None

    def cost_for(self, method: str | None) -> int:
        """The cost of a request with this HTTP method."""
        if self.methods is None or (method or "").upper() in self.methods:
            return self.cost
        return 1


DEFAULT_ROUTE = RouteLimit()


def validate_scope(scope: str) -> str:
    """Return `scope` if it is a valid scope name (1-30 of letters, digits, '_', '-'), else raise ValueError."""
    if not isinstance(scope, str) or not 1 <= len(scope) <= 30 or not set(scope) <= _SCOPE_CHARS:
        raise ValueError(f"scope: {scope!r} must be 1-30 letters, digits, '_' or '-'")
    return scope


def limit_cost(cost: int = 1, *, scope: str | None = None, methods: Iterable[str] | None = None) -> Callable[
    [ViewT], ViewT
]:
    """Declare the cost and scope of a view (function or class) for RateLimitMiddleware.

    Raises ValueError at import time for a cost outside 0..1e9 or an invalid scope name.
    """
    if isinstance(cost, bool) or not isinstance(cost, int) or not 0 <= cost <= MAX_LIMIT:
        raise ValueError(f"cost: {cost!r} must be an integer from 0 to {MAX_LIMIT}")
    route = RouteLimit(
        cost,
        validate_scope(scope) if scope else "",
        frozenset(m.upper() for m in methods) if methods is not None else None,
    )

    def decorate(view: ViewT) -> ViewT:
        setattr(view, ATTRIBUTE, route)
        return view

    return decorate


def route_for_view(view_func: Any) -> RouteLimit:
    """The RouteLimit declared for a resolved view function (DEFAULT_ROUTE when none is)."""
    route = getattr(view_func, ATTRIBUTE, None)
    if route is not None:
        return route
    view_class = getattr(view_func, "view_class", None) or getattr(view_func, "cls", None)
    if view_class is None:
        return DEFAULT_ROUTE
    route = getattr(view_class, ATTRIBUTE, None)
    if route is not None:
        return route
    scope = getattr(view_class, "throttle_scope", None)
    if isinstance(scope, str) and scope:
        return RouteLimit(1, scope)
    return DEFAULT_ROUTE
