"""`assert_limited` and `assert_not_limited`: was a response refused by the rate limiter, and by which
policy? The policy is read from the body, else from the outcome the limiter left on the request."""

from __future__ import annotations

import json
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from ..apply.admission import outcome_of
from ..apply.outcome import SHED, UNAVAILABLE, LimitOutcome

#: The headers a failed assertion shows (those the limiter sets on its answers).
_SHOWN_HEADERS = ("Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
                 "X-RateLimit-Tier", "RateLimit-Policy", "RateLimit")
#: The `error` of the limiter's own 503 answers (limiter unavailable, load shed).
_LIMITER_503 = ("rate limiter unavailable", "service overloaded: request shed", "Rate limiter unavailable.")
_BODY_SHOWN = 300


def assert_limited(response: Any, policy: str | None = None) -> None:
    """Assert that the rate limiter refused `response` with 429, and, with `policy`, that this policy
    (a tier limit's name, "ip", a decorator's or a throttle scope's name) is among those that refused.
    Raises AssertionError saying what came back otherwise."""
    refusing = _refusing_policies(response)
    if response.status_code == 429 and (policy is None or policy in refusing):
        return
    wanted = "a 429 from the rate limiter" + (f" refused by policy {policy!r}" if policy is not None else "")
    raise AssertionError(_describe(response, f"expected {wanted}", refusing))


def assert_not_limited(response: Any) -> None:
    """Assert that the rate limiter let `response` through: it is not a 429, nor a 503 of the limiter
    (unavailable under the "closed" fail mode, or load shed). Raises AssertionError otherwise."""
    if response.status_code != 429 and not _limiter_503(response):
        return
    raise AssertionError(_describe(response, "expected a response the rate limiter let through",
                                  _refusing_policies(response)))


def _refusing_policies(response: Any) -> list[str]:
    """The names of the policies that refused `response` (empty when none is known)."""
    body = _json(response)
    if isinstance(body, dict):
        if isinstance(body.get("violated-policies"), list):
            return [str(name) for name in body["violated-policies"]]
        if isinstance(body.get("policy"), str) and body["policy"]:
            return [body["policy"]]
    outcome = _outcome(response)
    if outcome is None or outcome.decision is None or outcome.decision.allowed:
        return []
    names = [result.policy for result in outcome.decision.results if not result.allowed]
    return names or ([outcome.decision.policy] if outcome.decision.policy else [])


def _describe(response: Any, expectation: str, refusing: list[str]) -> str:
    """The message of a failed assertion: `expectation`, then what `response` is."""
    status = response.status_code
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    headers = _headers(response)
    shown = [f"{name}: {headers[name]}" for name in _SHOWN_HEADERS if name in headers]
    body = _text(response)
    return "\n".join([
        f"{expectation}, got {status} {reason}".rstrip(),
        f"  policy:  {', '.join(refusing) if refusing else '(none named)'}",
        f"  headers: {'; '.join(shown) if shown else '(no rate limit headers)'}",
        f"  body:    {body[:_BODY_SHOWN]}{'...' if len(body) > _BODY_SHOWN else ''}",
    ])


def _limiter_503(response: Any) -> bool:
    if response.status_code != 503:
        return False
    outcome = _outcome(response)
    if outcome is not None and outcome.status in (UNAVAILABLE, SHED):
        return True
    body = _json(response)
    if not isinstance(body, dict):
        return False
    message = body.get("error", body.get("detail", ""))
    return isinstance(message, str) and (message in _LIMITER_503 or message.startswith("Service overloaded"))


def _outcome(response: Any) -> LimitOutcome | None:
    """What the limiter decided for the request of a test client's response (None when unknown)."""
    for attribute in ("wsgi_request", "asgi_request"):
        request = getattr(response, attribute, None)
        outcome = outcome_of(request) if request is not None else None
        if outcome is not None:
            return outcome
    return None


def _headers(response: Any) -> Mapping[str, str]:
    headers = getattr(response, "headers", None)
    return headers if headers is not None else {}


def _text(response: Any) -> str:
    if getattr(response, "streaming", False):
        return "(a streaming response)"
    content = getattr(response, "content", b"")
    return content.decode("utf-8", "replace") if isinstance(content, bytes) else str(content)


def _json(response: Any) -> Any:
    content_type = str(_headers(response).get("Content-Type", ""))
    if "json" not in content_type:
        return None
    try:
        return json.loads(_text(response))
    except ValueError:
        return None
