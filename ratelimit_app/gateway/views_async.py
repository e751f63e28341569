"""The async twins of the gateway views (ratelimit_app.gateway.views), served by `async_urls`: the decision
awaited on the event loop, slots and usage given back through the async service."""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, HttpResponseBase

from ..apply.admission_async import aadmit
from ..apply.concurrency import HeldSlots
from ..core.logs import log_once
from ..service.limiter_async import get_async_limiter
from .answers import answer, under_contract
from .describe import AUTH_REQUEST, AUTHORIZE, GatewayRequest
from .lease import CarriedUsage
from .views import confirmed, csrf_exempt_view, described, first_lease, handed_over, lease_of, usage_to_settle


@csrf_exempt_view
async def authorize(request: HttpRequest, forwarded: str | None = None) -> HttpResponseBase:
    """`views.authorize`, the decision awaited on the event loop."""
    return await _decide(request, AUTHORIZE, forwarded)


@csrf_exempt_view
async def auth_request(request: HttpRequest) -> HttpResponseBase:
    """`views.auth_request`, the decision awaited on the event loop."""
    return await _decide(request, AUTH_REQUEST, None)


@csrf_exempt_view
async def confirm(request: HttpRequest) -> HttpResponseBase:
    """`views.confirm` through the async service."""
    slots = lease_of(request)
    if not isinstance(slots, HeldSlots):
        return slots
    renewed = await slots.arenew()
    if renewed is False:
        await slots.arelease()  # what is left of the lease (views.confirmed then answers 409)
    return confirmed(slots, renewed)


@csrf_exempt_view
async def release(request: HttpRequest) -> HttpResponseBase:
    """`views.release` through the async service."""
    slots = lease_of(request)
    if not isinstance(slots, HeldSlots):
        return slots
    if slots.held:
        await slots.arelease()  # never raises
    settling = usage_to_settle(request)
    if isinstance(settling, HttpResponseBase):
        return settling
    if settling is not None and await _first_settlement(settling[1]):
        await settling[0].asettle()  # never raises
    return HttpResponse(status=204)


async def _first_settlement(carried: CarriedUsage) -> bool:
    """`views._first_settlement` through the async service."""
    try:
        return bool(await get_async_limiter().call_redis(lambda client: client.set(carried.marker, 1, nx=True,
                                                                                    px=carried.marker_ms)))
    except Exception as exc:
        log_once("ratelimit.settle_failed", logging.WARNING, reason=f"{type(exc).__name__}: {exc}"[:200])
        return False


async def _decide(request: HttpRequest, contract: str, forwarded: str | None) -> HttpResponseBase:
    gateway_request = described(request, contract, forwarded)
    if not isinstance(gateway_request, GatewayRequest):
        return gateway_request
    await aadmit(request, cost=gateway_request.cost, scope=gateway_request.service, path=gateway_request.path,
                 where="gateway", usage=gateway_request.usage)
    outcome, meter = handed_over(request)
    first = first_lease(outcome, contract)
    if first is not None and outcome.slots is not None:
        await outcome.slots.arenew(first)  # never raises
    return under_contract(answer(outcome, gateway_request.cost, meter.reservation if meter else None), contract)
