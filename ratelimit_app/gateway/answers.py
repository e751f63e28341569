"""What the endpoint answers a gateway, under each contract.

Allowed: 200 with an empty body and every rate limit header the middleware would add (for the gateway
to copy onto the service's response), and `X-RateLimit-Lease`: the concurrency slots the request took
and the usage it reserved (ratelimit_app.gateway.lease), empty when it took and reserved none.
Refused: the very answer the middleware gives (`ratelimit_app.apply.responses.refusal`: 429, 503, 401
or 403, its JSON or problem+json body, Retry-After and the rate limit headers), which Caddy, Traefik and
Envoy pass to the client as it is.

nginx's auth_request passes only 2xx, 401 and 403 (anything else becomes a 500), and never the body.
Under the `auth-request` contract every answer other than 200 is therefore a 403 that carries the real
one: `X-RateLimit-Status` (its status) and `X-RateLimit-Body` (its body, one line of JSON), next to its
own headers. nginx's `error_page 403 = @ratelimit_refused` location then answers the client with that
status, body and headers (docs/gateway.md).
"""

from __future__ import annotations

from django.http import HttpResponse, HttpResponseBase

from ..apply.outcome import ALLOWED, LimitOutcome
from ..apply.responses import add_headers, refusal
from ..core.usage import Reservation
from .describe import AUTH_REQUEST
from .lease import LEASE_HEADER, lease_value

STATUS_HEADER = "X-RateLimit-Status"
BODY_HEADER = "X-RateLimit-Body"


def answer(outcome: LimitOutcome, cost: int, reservation: Reservation | None = None) -> HttpResponseBase:
    """The answer to a decided request: 200 with the rate limit headers (and the lease of its slots and
    of the usage `reservation`), or the middleware's refusal."""
    if outcome.status != ALLOWED:
        return refusal(outcome, cost)
    response = HttpResponse(status=200)
    add_headers(response, outcome)
    # always there, empty when no slot was taken: a gateway that copies it never copies a missing header
    held = outcome.slots is not None or (reservation is not None and reservation.held)
    response[LEASE_HEADER] = lease_value(outcome.slots, reservation) if held else ""
    return response


def under_contract(response: HttpResponseBase, contract: str) -> HttpResponseBase:
    """`response` as the gateway of `contract` needs it: as it is, or for nginx's auth_request, a 403
    carrying its status and body (every answer but 200)."""
    if contract != AUTH_REQUEST or response.status_code == 200:
        return response
    carried = HttpResponse(status=403, content_type=response["Content-Type"])
    for name, value in response.items():
        if name != "Content-Type":
            carried[name] = value
    carried[STATUS_HEADER] = str(response.status_code)
    carried[BODY_HEADER] = response.content.decode("ascii", "replace") if isinstance(response, HttpResponse) else ""
    return carried
