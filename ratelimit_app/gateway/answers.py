"""What the endpoint answers a gateway: 200 with the rate limit headers and the lease, or the middleware's
refusal; under nginx's `auth-request` contract (only 2xx, 401 and 403 pass, never a body) every other
answer is a 403 carrying its status and body in headers (docs/gateway.md, "The contract")."""

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
