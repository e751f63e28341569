"""The DRF exceptions our throttles raise when the request's own limits refuse it for a reason other
than a rate (401, 403, 503), or its usage cannot be estimated (400); DRF's exception handler answers them."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import APIException

from ..apply.headers import retry_after_seconds
from ..apply.shedding import shed_config


class _Refusal(APIException):
    """An APIException whose subclass states its status, code and default detail in its class line."""

    def __init_subclass__(cls, *, status: int, code: str, detail: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.status_code, cls.default_code, cls.default_detail = status, code, detail


class BadEstimate(_Refusal, status=400, code="bad_estimate", detail="The request's usage could not be estimated."):
    """400: the view's usage estimate (`@usage`) could not be made from the request."""


class InvalidApiKey(_Refusal, status=401, code="invalid_api_key", detail="A valid API key is required."):
    """401: the request's API key is missing (where one is required), malformed, unknown, revoked or expired."""

    auth_header = 'Bearer realm="api"'


class ClientRefused(_Refusal, status=403, code="client_refused", detail="Refused by an access rule."):
    """403: a deny rule (ClientRule) refuses the client's network or API key."""


class LimiterUnavailable(_Refusal, status=503, code="rate_limiter_unavailable", detail="Rate limiter unavailable."):
    """503: the limiter cannot decide and the fail mode refuses; `wait` becomes `Retry-After`."""

    def __init__(self, wait: int = 1) -> None:
        super().__init__()
        self.wait = wait


class Overloaded(_Refusal, status=503, code="overloaded", detail="Service overloaded: request shed."):
    """503: the load shedder refused the request (too many requests in flight for its priority)."""

    def __init__(self, priority: str) -> None:
        super().__init__(f"Service overloaded: {priority}-priority request shed.")
        self.wait = retry_after_seconds(shed_config().retry_after)
