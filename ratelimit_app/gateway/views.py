"""The gateway endpoint's views: decide the request a gateway describes, and give back its slots.

`authorize` (Caddy forward_auth, Traefik ForwardAuth, Envoy ext_authz) and `auth_request` (nginx) make
one decision through the same code as RateLimitMiddleware (`ratelimit_app.apply.limiting`): the client
identified from the authorization request (API key header, address through TRUSTED_PROXIES), the
tier's limits for the described service's scope at the described cost, the per-IP limit, allow and
deny rules, shadow limits, the load shedder, fail modes and the time budget, one Redis round trip,
counted in the metrics. Whatever goes wrong inside the limiter follows the fail mode (`safely`): the
endpoint never answers 500 for it.

`release` gives back the concurrency slots named by an `X-RateLimit-Lease` value (one Redis round
trip); it answers 204 whatever Redis does (a slot not given back frees itself with its lease).

The views are exempt from CSRF (gateways send whatever method the client used, with no token) and are
not limited themselves: keep their path out of RATELIMIT['PATH_PREFIXES'] (check: ratelimit.W003).
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from ..apply.identity import client_ip
from ..apply.limiting import limit_request, safely
from ..apply.responses import bad_request
from ..service.logs import log_event
from .answers import answer, under_contract
from .describe import AUTH_REQUEST, AUTHORIZE, BadDescription, describe
from .lease import LEASE_HEADER, BadLease, slots_of


@csrf_exempt
def authorize(request: HttpRequest, forwarded: str | None = None) -> HttpResponseBase:
    """Decide the request described by X-Forwarded-Method / X-Forwarded-Uri (Caddy, Traefik), or by the
    path after /authorize and the method (Envoy); answer with its real status."""
    return _decide(request, AUTHORIZE, forwarded)


@csrf_exempt
def auth_request(request: HttpRequest) -> HttpResponseBase:
    """Decide the request described by X-Original-Method / X-Original-URI (nginx auth_request); every
    answer but 200 is a 403 that carries the real one (ratelimit_app.gateway.answers)."""
    return _decide(request, AUTH_REQUEST, None)


def _decide(request: HttpRequest, contract: str, forwarded: str | None) -> HttpResponseBase:
    _warn_if_untrusted(request)
    try:
        described = describe(request, contract, forwarded)
    except BadDescription as exc:
        return under_contract(bad_request(str(exc)), contract)
    outcome = safely(lambda: limit_request(request, cost=described.cost, scope=described.service,
                                           path=described.path), where="gateway")
    return under_contract(answer(outcome, described.cost), contract)


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


@csrf_exempt
def release(request: HttpRequest) -> HttpResponseBase:
    """Give back the slots of the request whose lease `X-RateLimit-Lease` names (none: nothing to do)."""
    value = request.headers.get(LEASE_HEADER, "")
    if value:
        try:
            slots = slots_of(value)
        except BadLease as exc:
            return bad_request(str(exc))
        slots.release()  # never raises
    return HttpResponse(status=204)
