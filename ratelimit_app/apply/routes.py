"""Per-route declarations the middleware reads: what a request to a view costs (`@limit_cost`), its scope
and its load-shedding priority (docs/usage.md), on a view or a class-based view's class; a DRF view's
`throttle_scope` is its scope when nothing else is declared. A framework registers a `ViewFinder` to say
which handler a request reaches, so its declarations are read, and whether its throttles of ours decide
the request's own limits (`resolve_view`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from django.http import HttpRequest

from ..conf.settings import on_reload
from ..core.policies import MAX_LIMIT

if TYPE_CHECKING:
    from .limitcheck import LimitCheck

ATTRIBUTE = "ratelimit_route"
#: Attribute of a view wrapped by `@ratelimit`: its ViewLimit.
VIEW_LIMIT_ATTRIBUTE = "ratelimit_view_limit"
_SCOPE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")

ViewT = TypeVar("ViewT", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class RouteLimit:
    """What a route costs (`cost` units; 0 = report only: one unit of the per-IP limit, nothing else)
    and its scope ("" = none).

    With `methods`, the cost applies to those HTTP methods only; other methods cost 1. `priority` is
    the load-shedding priority ("critical", "normal", "low"; None: not declared, see shedding).
    """

    cost: int = 1
    scope: str = ""
    methods: frozenset[str] | None = None
    priority: str | None = None

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


def validate_cost(cost: Any, *, minimum: int = 0) -> int:
    """Return `cost` if it is an integer from `minimum` to 1e9, else raise ValueError naming it."""
    if isinstance(cost, bool) or not isinstance(cost, int) or not minimum <= cost <= MAX_LIMIT:
        raise ValueError(f"cost: {cost!r} must be an integer from {minimum} to {MAX_LIMIT}")
    return cost


def view_name(view: Any) -> str:
    """`module.qualname` of a view function or class, for error messages."""
    return f"{getattr(view, '__module__', '?')}.{getattr(view, '__qualname__', type(view).__name__)}"


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


class ViewLimit(Protocol):
    """What `@ratelimit` leaves on the view it wraps, so the middleware decides it with the request's
    own limits (one Redis call) when `joins_request_limits` is True and the route costs `cost`."""

    joins_request_limits: bool
    cost: int

    def check_for(self, request: HttpRequest) -> LimitCheck | None:
        """The check of this view's limit for `request` (None: this request is not limited by it)."""


def view_limit_of(view_func: Any) -> ViewLimit | None:
    """The ViewLimit of a view wrapped by `@ratelimit`, or None."""
    return getattr(view_func, VIEW_LIMIT_ATTRIBUTE, None)


def joined_checks(view_limit: ViewLimit | None, request: HttpRequest, cost: int) -> list[LimitCheck]:
    """The check of a view's own limit for `request` when it is decided with the request's limits at
    `cost` (a limit joins at its own cost, a concurrency limit at any), else []."""
    if view_limit is None or not view_limit.joins_request_limits:
        return []
    if view_limit.cost != cost and not getattr(view_limit, "joins_at_any_cost", False):
        return []
    check = view_limit.check_for(request)
    return [check] if check is not None else []


class ResolvedView(NamedTuple):
    """What a request reaches: `declared`, the function or class whose `@limit_cost`, `@ratelimit` and
    `@limit_concurrency` apply, and `deferred`, True when our throttles on it decide the request's own
    limits (after the framework's authentication) together with theirs."""

    declared: Any
    deferred: bool


#: `finder(view_func, request)`: the ResolvedView of a view of its framework, else None.
ViewFinder = Callable[[Any, HttpRequest], "ResolvedView | None"]
_view_finders: list[ViewFinder] = []


def register_view_finder(finder: ViewFinder) -> None:
    """Let `finder` say what a request to a view of its framework reaches (registered once; ratelimit_app
    registers DRF's and Django Ninja's when their throttles of ours are imported)."""
    if finder not in _view_finders:
        _view_finders.append(finder)
        _routes.clear()


def resolve_view(view_func: Any, request: HttpRequest) -> ResolvedView:
    """What `request` reaches through the resolved `view_func` (the view itself, unless a registered
    finder knows better)."""
    for finder in _view_finders:
        found = finder(view_func, request)
        if found is not None:
            return found
    return ResolvedView(view_func, False)


class ViewRoute(NamedTuple):
    """What a request of one HTTP method reaches through one resolved view: the handler whose declarations
    apply (`declared`), whether our throttles on it decide (`deferred`), its route and the cost of the
    method, and the handler's own limit (`@ratelimit`, `@limit_concurrency`; None: none)."""

    declared: Any
    deferred: bool
    route: RouteLimit
    cost: int
    view_limit: ViewLimit | None


#: (view function, method) -> its ViewRoute: declarations are made when views are defined, so they are
#: read once per view and method (and again after a settings change or a new view finder).
_routes: dict[tuple[Any, str | None], ViewRoute] = {}
#: The most views remembered (a project whose URLconf makes views on the fly never grows it past this).
_MAX_ROUTES = 4096


def route_of(view_func: Any, request: HttpRequest) -> ViewRoute:
    """The ViewRoute of `request` through the resolved `view_func` (a view finder's answer may depend on
    the view and the request's method only)."""
    key = (view_func, request.method)
    try:
        found = _routes.get(key)
    except TypeError:  # a view that cannot be a dict key
        return _read_route(view_func, request)
    if found is None:
        found = _read_route(view_func, request)
        if len(_routes) >= _MAX_ROUTES:
            _routes.clear()
        _routes[key] = found
    return found


def _read_route(view_func: Any, request: HttpRequest) -> ViewRoute:
    resolved = resolve_view(view_func, request)
    route = route_for_view(resolved.declared)
    return ViewRoute(resolved.declared, resolved.deferred, route, route.cost_for(request.method),
                     view_limit_of(resolved.declared))


on_reload(_routes.clear)
