"""`@ratelimit` for plain Django views: one limit, counted per client, decided atomically in Redis.

    from ratelimit_app.decorators import ratelimit

    @ratelimit(rate="10/m", key="ip")
    def quote(request): ...

    @ratelimit(rate="5/10m", key="header:x-device-id", algorithm="gcra", burst=3, block=False)
    def upload(request):
        if request.limited: ...

`key` counts the limit per: "ip" (client IP, trusted proxies only), "user" (the authenticated user,
else the IP), "header:<name>" (the value of that request header; requests without it share one
counter), or a callable `key(request) -> str | None` (None: do not limit this request). Each
decorated view has its own counters; views given the same `group` (and the same rate and algorithm)
share them. The policy is named `name`, else after the group, else after the view.

Denied with `block=True` (default): 429 JSON `{"error", "tier", "policy", "retry_after"}` with
`Retry-After`; when Redis is unavailable and RATELIMIT['FAIL_MODE'] refuses: 503. With `block=False`
the view always runs and `request.limited` says whether the request was over the limit. Responses
carry the rate limit headers (RATELIMIT['HEADERS']). The rate is parsed when the module is imported,
so a bad rate fails at startup, naming the view.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.http import HttpRequest, HttpResponseBase

from . import metrics
from .decision import Decision
from .headers import apply_headers
from .identity import authenticated_user, request_ip_identity, user_identity
from .limiting import LIMITER_ERRORS, get_config
from .policies import InvalidPolicy, Policy
from .responses import limiter_unavailable, too_many_requests
from .service import get_limiter

ViewT = TypeVar("ViewT", bound=Callable[..., HttpResponseBase])
KeyFunction = Callable[[HttpRequest], "str | None"]

#: `tier` label of the decorator's decisions in the metrics.
DECORATOR_TIER = "decorator"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _key_function(key: str | KeyFunction) -> KeyFunction:
    if callable(key):
        return key
    if key == "ip":
        return request_ip_identity
    if key == "user":
        def by_user(request: HttpRequest) -> str:
            user = authenticated_user(request)
            return user_identity(user.pk) if user is not None else request_ip_identity(request)
        return by_user
    if isinstance(key, str) and key.lower().startswith("header:") and len(key) > len("header:"):
        header = key[len("header:"):].strip()
        meta = "HTTP_" + header.upper().replace("-", "_")

        def by_header(request: HttpRequest) -> str:
            # The value is user input: the engine hashes identities, so it never becomes a key name.
            return f"header:{header.lower()}:{request.META.get(meta, '')}"
        return by_header
    raise ValueError(f"key: {key!r} must be 'ip', 'user', 'header:<name>' or a callable")


def _plain_label(client: str) -> str:
    return client


def _digest_label(client: str) -> str:
    return "hash:" + hashlib.blake2b(client.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()


def ratelimit(rate: str, key: str | KeyFunction = "ip", *, algorithm: str = "sliding_window",
              burst: int | None = None, block: bool = True, cost: int = 1, name: str | None = None,
              group: str | None = None) -> Callable[[ViewT], ViewT]:
    """Limit a view to `rate` per `key` (see the module docstring). Raises InvalidPolicy for a bad
    rate or algorithm and ValueError for a bad key, when the decorator is applied."""
    key_function = _key_function(key)
    # Header values and callable results are user data (a header could even carry an API key): the
    # metrics see a digest of them, never the value.
    label_of: Callable[[str], str] = (
        _plain_label if key in ("ip", "user") else _digest_label
    )

    def decorate(view: ViewT) -> ViewT:
        policy_name = name or _UNSAFE.sub("_", str(group or getattr(view, "__name__", "view")))[:64] or "view"
        try:
            policy = Policy.parse(rate, name=policy_name, algorithm=algorithm, burst=burst)
        except InvalidPolicy as exc:
            raise InvalidPolicy(f"@ratelimit on {view.__module__}.{view.__qualname__}: {exc}") from exc
        policies = (policy,)
        namespace = group or f"{view.__module__}.{view.__qualname__}"

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            client = key_function(request)
            if client is None:
                request.limited = False  # type: ignore[attr-defined]
                return view(request, *args, **kwargs)
            identity = f"view:{namespace}|{client}"
            try:
                decision = get_limiter().hit(identity, policies, cost)
            except LIMITER_ERRORS:
                allowed = get_config().fail_mode == "open"
                decision = Decision(allowed, 0, 0, 0.0, None if allowed else 1.0, policy.name, (), degraded=True)
            metrics.record_decision(allowed=decision.allowed, tier=DECORATOR_TIER,
                                    policy=None if decision.allowed else decision.policy,
                                    degraded=decision.degraded, identity=label_of(client))
            request.limited = not decision.allowed  # type: ignore[attr-defined]
            if decision.allowed or not block:
                response = view(request, *args, **kwargs)
            elif decision.degraded:
                response = limiter_unavailable(decision, None)
            else:
                response = too_many_requests(decision, None, cost)
            apply_headers(response, decision, policies, None, get_config().headers)
            return response

        return cast(ViewT, wrapper)

    return decorate
