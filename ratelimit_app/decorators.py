"""The view decorators: `@ratelimit`, `@limit_concurrency`, `@limit_cost` and `@usage` (docs/usage.md,
sections 4 and 7; docs/plans.md). Each checks its arguments when applied, naming the view; how a
decorated view decides is in ratelimit_app.viewlimits.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from django.http import HttpRequest

from .apply.routes import ATTRIBUTE, RouteLimit, ViewT, validate_cost, validate_scope, view_name
from .apply.shedding import validate_priority
from .apply.usage import declare as declare_usage
from .core.policies import CONCURRENCY, InvalidPolicy, Policy
from .viewlimits import (
    ConcurrencyLimit,
    CountIf,
    DecoratorLimit,
    KeyFunction,
    digest_label,
    key_function_for,
    plain_label,
    wrap_view,
)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _policy_name(view: Any, block: Any, name: Any, group: Any) -> str:
    """Check the arguments both decorators share; the policy's name: `name`, else the group's, else
    the view's (made safe for a policy name)."""
    if not isinstance(block, bool):
        raise TypeError(f"block: {block!r} must be True or False")
    for label, value in (("name", name), ("group", group)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{label}: {value!r} must be a non-empty string")
    return str(name or _UNSAFE.sub("_", str(group or getattr(view, "__name__", "view")))[:64] or "view")


def _label_of(key: str | KeyFunction) -> Callable[[str], str]:
    # Header values and callable results are user data (a header could even carry an API key): the
    # metrics see a digest of them, never the value.
    return plain_label if isinstance(key, str) and key in ("ip", "user") else digest_label


def ratelimit(rate: str, key: str | KeyFunction = "ip", *, algorithm: str = "sliding_window",
              burst: int | None = None, block: bool = True, cost: int = 1, name: str | None = None,
              group: str | None = None, shadow: bool = False,
              count_if: CountIf | None = None) -> Callable[[ViewT], ViewT]:
    """Limit a view to `rate` per `key` (docs/usage.md, section 7). `shadow=True`: a dry run.
    `count_if(response) -> bool`: count only responses that match (docs/plans.md). A bad argument raises
    InvalidPolicy / ValueError / TypeError naming the view when the decorator is applied."""

    def decorate(view: ViewT) -> ViewT:
        where = f"@ratelimit on {view_name(view)}"
        try:
            key_function = key_function_for(key)
            validate_cost(cost, minimum=1)
            if count_if is not None and not callable(count_if):
                raise TypeError(f"count_if: {count_if!r} must be a callable taking the response")
            policy_name = _policy_name(view, block, name, group)
            parsed = Policy.parse(rate, name=policy_name, algorithm=algorithm, burst=burst)
            policy = Policy(parsed.name, parsed.algorithm, limit=parsed.limit, period=parsed.period,
                            burst=parsed.burst, shadow=shadow)
        except InvalidPolicy as exc:
            raise InvalidPolicy(f"{where}: {exc}") from exc
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{where}: {exc}") from exc
        return wrap_view(view, DecoratorLimit(policy, group or view_name(view), key_function, _label_of(key), block,
                                              cost, count_if))

    return decorate


def limit_concurrency(slots: int, key: str | KeyFunction = "user", *, lease: float = 60, block: bool = True,
                      name: str | None = None, group: str | None = None) -> Callable[[ViewT], ViewT]:
    """Allow at most `slots` requests per `key` in the view at once (docs/usage.md, section 7): a slot is
    held until the response is closed, `lease` seconds at most if the worker dies. A bad argument raises
    InvalidPolicy / ValueError / TypeError naming the view when the decorator is applied."""

    def decorate(view: ViewT) -> ViewT:
        where = f"@limit_concurrency on {view_name(view)}"
        try:
            key_function = key_function_for(key)
            policy_name = _policy_name(view, block, name, group)
            if isinstance(lease, bool) or not isinstance(lease, (int, float)):
                raise InvalidPolicy(f"lease: {lease!r} must be a number of seconds")
            policy = Policy(policy_name, CONCURRENCY, limit=slots, period=lease)
        except InvalidPolicy as exc:
            raise InvalidPolicy(f"{where}: {str(exc).replace('limit: ', 'slots: ').replace('period: ', 'lease: ')}"
                                ) from exc
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{where}: {exc}") from exc
        return wrap_view(view, ConcurrencyLimit(policy, group or view_name(view), key_function, _label_of(key), block,
                                                1))

    return decorate


def limit_cost(cost: int = 1, *, scope: str | None = None, methods: Iterable[str] | None = None,
               priority: str | None = None) -> Callable[[ViewT], ViewT]:
    """Declare the cost, scope and load-shedding priority of a view (function or class) for
    RateLimitMiddleware. ValueError naming the view for a cost outside 0..1e9, an invalid scope, methods
    that are not HTTP method names, or a priority other than "critical", "normal" and "low"."""

    def decorate(view: ViewT) -> ViewT:
        try:
            route = RouteLimit(validate_cost(cost), validate_scope(scope) if scope else "", _methods(methods),
                               validate_priority(priority) if priority is not None else None)
        except ValueError as exc:
            raise ValueError(f"@limit_cost on {view_name(view)}: {exc}") from exc
        setattr(view, ATTRIBUTE, route)
        return view

    return decorate


def _methods(methods: Iterable[str] | None) -> frozenset[str] | None:
    if methods is None:
        return None
    if isinstance(methods, str) or not all(isinstance(m, str) and m.isalpha() for m in methods):
        raise ValueError(f"methods: {methods!r} must be a list of HTTP method names such as ['POST']")
    return frozenset(m.upper() for m in methods)


def usage(**estimators: Callable[[HttpRequest], int]) -> Callable[[ViewT], ViewT]:
    """Declare that a view (a DRF view: its class, or above @api_view; a Ninja operation: under @api.post)
    reserves usage: each keyword is a unit ("tokens") and a function of the request giving its estimate (a
    whole number >= 1), reserved against that unit's usage limits in the view's scope in the request's one
    decision, and settled at what the view reports (`request.ratelimit.report_usage(unit, count)`) when the
    response ends. An estimator raising ValueError answers 400. ValueError when applied for a bad unit.

        @limit_cost(scope="llm")
        @usage(tokens=lambda request: json.loads(request.body)["max_tokens"])
        def chat(request): ...
    """

    def decorate(view: ViewT) -> ViewT:
        try:
            return declare_usage(view, estimators)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"@usage on {view_name(view)}: {exc}") from exc

    return decorate
