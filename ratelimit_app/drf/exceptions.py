"""The DRF exceptions our throttles raise when the request's own limits refuse it for a reason other
than a rate (401, 403, 503), or its usage cannot be estimated (400); DRF's exception handler answers them."""

from __future__ import annotations

from rest_framework.exceptions import APIException

from ..apply.headers import retry_after_seconds
from ..apply.shedding import shed_config


class BadEstimate(APIException):
    """400: the view's usage estimate (`@usage`) could not be made from the request."""

    status_code = 400
    default_detail = "The request's usage could not be estimated."
    default_code = "bad_estimate"


class InvalidApiKey(APIException):
    """401: the request's API key is missing (where one is required), malformed, unknown, revoked or expired."""

    status_code = 401
    default_detail = "A valid API key is required."
    default_code = "invalid_api_key"
    auth_header = 'Bearer realm="api"'


class ClientRefused(APIException):
    """403: a deny rule (ClientRule) refuses the client's network or API key."""

    status_code = 403
    default_detail = "Refused by an access rule."
    default_code = "client_refused"


class LimiterUnavailable(APIException):
    """503: the limiter cannot decide and the fail mode refuses; `wait` becomes `Retry-After`."""

    status_code = 503
    default_detail = "Rate limiter unavailable."
    default_code = "rate_limiter_unavailable"

    def __init__(self, wait: int = 1) -> None:
        super().__init__()
        self.wait = wait


class Overloaded(APIException):
    """503: the load shedder refused the request (too many requests in flight for its priority)."""

    status_code = 503
    default_detail = "Service overloaded: request shed."
    default_code = "overloaded"

    def __init__(self, priority: str) -> None:
        super().__init__(f"Service overloaded: {priority}-priority request shed.")
        self.wait = retry_after_seconds(shed_config().retry_after)
