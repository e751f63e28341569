"""The gateway endpoint's views (docs/gateway.md, "The contract"): `authorize` and `auth_request` decide the
described request through the admission path, as RateLimitMiddleware does (whatever goes wrong in the
limiter follows the fail mode: never a 500); `confirm` holds a request's slots their full lease; `release`
gives them back and settles its usage reservation once. Async twins: views_async.

Under `authorize` (Caddy, Traefik, Envoy: no end-of-request hook) an admitted request's slots are held for
the first lease only, so that a request whose client left before it reached the service frees them soon.
The views are exempt from CSRF: gateways send whatever method the client used, with no token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse

from ..apply.admission import USAGE_ENTRY, admit, state_of
from ..apply.concurrency import HeldSlots
from ..apply.identity import client_ip
from ..apply.outcome import ALLOWED, NOT_LIMITED, LimitOutcome
from ..apply.responses import bad_request
from ..apply.usage import UsageMeter
from ..conf.snapshot import request_settings
from ..core.logs import log_event, log_once
from ..service.limiter import get_limiter
from .answers import answer, under_contract
from .describe import AUTH_REQUEST, AUTHORIZE, BadDescription, GatewayRequest, describe, usage_of
from .guard import refused
from .lease import LEASE_HEADER, BadLease, CarriedUsage, slots_of
from .lease import usage_of as carried_usage_of

ViewT = TypeVar("ViewT", bound=Callable[..., Any])


def csrf_exempt_view(view: ViewT) -> ViewT:
    """Exempt `view` from CSRF (what CsrfViewMiddleware reads), keeping an `async def` view a coroutine
    function (Django 4.2's `csrf_exempt` wraps it in a sync function)."""
    view.csrf_exempt = True  # type: ignore[attr-defined]
    return view


@csrf_exempt_view
def authorize(request: HttpRequest, forwarded: str | None = None) -> HttpResponseBase:
    """Decide the request described by X-Forwarded-Method / X-Forwarded-Uri (Caddy, Traefik), or by the
    path after /authorize and the method (Envoy); answer with its real status."""
    return _decide(request, AUTHORIZE, forwarded)


@csrf_exempt_view
def auth_request(request: HttpRequest) -> HttpResponseBase:
    """Decide the request described by X-Original-Method / X-Original-URI (nginx auth_request); every
    answer but 200 is a 403 that carries the real one (ratelimit_app.gateway.answers)."""
    return _decide(request, AUTH_REQUEST, None)


@csrf_exempt_view
def confirm(request: HttpRequest) -> HttpResponseBase:
    """The service has the request whose lease `X-RateLimit-Lease` names: hold its slots their full lease
    (204); 409 when the first lease had already ended (its slots are given back, never taken again)."""
    slots = lease_of(request)
    if not isinstance(slots, HeldSlots):
        return slots
    return confirmed(slots, slots.renew())


@csrf_exempt_view
def release(request: HttpRequest) -> HttpResponseBase:
    """Give back the slots of the request whose lease `X-RateLimit-Lease` names (none: nothing to do)."""
    slots = lease_of(request)
    if not isinstance(slots, HeldSlots):
        return slots
    if slots.held:
        slots.release()  # never raises
    settling = usage_to_settle(request)
    if isinstance(settling, HttpResponseBase):
        return settling
    if settling is not None and _first_settlement(settling[1]):
        settling[0].settle()  # never raises
    return HttpResponse(status=204)


def _decide(request: HttpRequest, contract: str, forwarded: str | None) -> HttpResponseBase:
    gateway_request = described(request, contract, forwarded)
    if not isinstance(gateway_request, GatewayRequest):
        return gateway_request
    admit(request, cost=gateway_request.cost, scope=gateway_request.service, path=gateway_request.path,
          where="gateway", usage=gateway_request.usage)
    outcome, meter = handed_over(request)
    first = first_lease(outcome, contract)
    if first is not None and outcome.slots is not None:
        outcome.slots.renew(first)  # never raises; Redis not asked: the slots keep their full lease
    return under_contract(answer(outcome, gateway_request.cost, meter.reservation if meter else None), contract)


def handed_over(request: HttpRequest) -> tuple[LimitOutcome, UsageMeter | None]:
    """The outcome `admit` recorded for the gateway's request, and what it reserved, no longer held by the
    request: its slots and its reservation go to the gateway in the lease, and outlive this answer."""
    state = state_of(request)
    state.take_slots()
    state.take_closers()  # (the reservation's settlement: the release's, not this answer's end)
    meter: UsageMeter | None = state.entry.pop(USAGE_ENTRY, None)
    return state.outcome or NOT_LIMITED, meter


def usage_to_settle(request: HttpRequest) -> tuple[UsageMeter, CarriedUsage] | HttpResponseBase | None:
    """The usage reservation the release's lease carries, as a meter of what the service used (its
    `X-RateLimit-Usage`; a unit it leaves out stays charged at its estimate); None when there is
    nothing to settle; the 400 of a usage header that cannot be read."""
    try:
        used = usage_of(request, minimum=0)
        carried = carried_usage_of(request.headers.get(LEASE_HEADER, ""))
    except (BadDescription, BadLease) as exc:
        return bad_request(str(exc))
    if carried is None or not used:
        return None
    meter = UsageMeter(carried.reservation, "gateway")
    for unit, count in used.items():
        meter.report(unit, count)
    return meter, carried


def _first_settlement(carried: CarriedUsage) -> bool:
    """Mark the lease's reservation settled in Redis: True for the first release that does (it settles),
    False for a replay, or when Redis cannot be asked (the estimate then stays charged; logged once)."""
    try:
        return bool(get_limiter().call_redis(lambda client: client.set(carried.marker, 1, nx=True,
                                                                        px=carried.marker_ms)))
    except Exception as exc:
        log_once("ratelimit.settle_failed", logging.WARNING, reason=f"{type(exc).__name__}: {exc}"[:200])
        return False


def first_lease(outcome: LimitOutcome, contract: str) -> float | None:
    """RATELIMIT['GATEWAY_FIRST_LEASE'] for an admitted request holding slots under `authorize`; None
    (their full lease) otherwise: nginx's post_action gives them back itself."""
    if contract != AUTHORIZE or outcome.status != ALLOWED or outcome.slots is None:
        return None
    seconds: float | None = request_settings().get("GATEWAY_FIRST_LEASE")
    return seconds


def confirmed(slots: HeldSlots, renewed: bool | None) -> HttpResponseBase:
    """The answer to a confirmation whose renewal of `slots` gave `renewed` (HeldSlots.renew): 204, or 409
    when a lease had ended, after giving back what is left of it (the slot may be another request's now)."""
    if renewed is not False:
        return HttpResponse(status=204)  # confirmed, or Redis not asked (the slots keep their first lease)
    slots.release()
    response = JsonResponse({"error": "lease ended", "detail": "the request's slots are no longer held (its first "
                             "lease, RATELIMIT['GATEWAY_FIRST_LEASE'], ended before this confirmation, or they were "
                             "given back) and may be another request's: refuse the request"}, status=409)
    response["Cache-Control"] = "no-store"
    return response


def described(request: HttpRequest, contract: str, forwarded: str | None) -> GatewayRequest | HttpResponseBase:
    """The request the gateway describes; or the 403 of a caller that is not a gateway (ratelimit_app.gateway.guard),
    or the 400 when it cannot be read, as its contract carries them."""
    forbidden = refused(request)
    if forbidden is not None:
        return under_contract(forbidden, contract)
    _warn_if_untrusted(request)
    try:
        return describe(request, contract, forwarded)
    except BadDescription as exc:
        return under_contract(bad_request(str(exc)), contract)


def lease_of(request: HttpRequest) -> HeldSlots | HttpResponseBase:
    """The slots `X-RateLimit-Lease` names; else the answer: the 403 of a caller that is not a gateway,
    the 400 for a value not signed here, 204 without a value (nothing to do)."""
    forbidden = refused(request)
    if forbidden is not None:
        return forbidden
    value = request.headers.get(LEASE_HEADER, "")
    if not value:
        return HttpResponse(status=204)
    try:
        return slots_of(value)
    except BadLease as exc:
        return bad_request(str(exc))


_warned = False


def _warn_if_untrusted(request: HttpRequest) -> None:
    """Log once (WARNING `ratelimit.gateway_untrusted`) when a gateway forwards the client's address in
    X-Forwarded-For but RATELIMIT['TRUSTED_PROXIES'] does not trust it: every client is then seen at the
    gateway's own address, and shares its per-IP limit."""
    global _warned
    if _warned or not request.META.get("HTTP_X_FORWARDED_FOR"):
        return
    gateway = str(request.META.get("REMOTE_ADDR") or "")
    if client_ip(request) == gateway:
        _warned = True
        log_event("ratelimit.gateway_untrusted", logging.WARNING, gateway=gateway,
                  hint="add the gateway to RATELIMIT['TRUSTED_PROXIES']")
