"""How a NinjaAPI answers a request our throttles refused.

Ninja asks each throttle `allow_request(request)`, then answers a refusal itself, through the API's
handler of `ninja.errors.Throttled` (a 429 `{"detail": "Too many requests."}` by default, with
`Retry-After` from the throttles' `wait()`). The first time one of our throttles refuses a request of an
API, it registers `answer` as that API's handler of `Throttled`, around the handler the API had (its
own, if the project registered one), so:

- a request refused over a rate gets the API's answer (Ninja's error format) with our rate limit
  headers, or our 429 body when RATELIMIT['NINJA_ERROR_FORMAT'] is "ratelimit"
  (RATELIMIT['ERROR_FORMAT'] then chooses JSON or problem details);
- a request refused for another reason by the throttle that carries the request's own limits gets our
  answer: 401 (no usable API key), 403 (a deny rule), 503 (the limiter unavailable, or the load shed);
- a refusal by any other throttle (Ninja's own) gets the API's answer, untouched.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import Throttled

from ..apply.admission import state_if_any, state_of
from ..apply.outcome import DENIED, LimitOutcome
from ..apply.responses import add_headers, refusal
from ..conf.snapshot import request_settings

#: The request state's entry holding (the outcome, the request's cost) of a refusal by our throttles.
_REFUSAL_ENTRY = "ninja.refusal"

_answering: weakref.WeakSet[NinjaAPI] = weakref.WeakSet()
_lock = threading.Lock()


def leave_refusal(request: HttpRequest, outcome: LimitOutcome, cost: int, api: NinjaAPI | None) -> None:
    """Remember that our throttles refused `request` with `outcome`, and make sure `api` answers it."""
    state_of(request).entry[_REFUSAL_ENTRY] = (outcome, cost)
    if api is not None:
        answer_refusals(api)


def answer_refusals(api: NinjaAPI) -> None:
    """Register `answer` as `api`'s handler of Throttled, around the one it had (once per API)."""
    if api in _answering:
        return
    with _lock:
        if api in _answering:
            return
        # the handler Ninja would pick for Throttled now (by the exception's classes, as Ninja does)
        previous = api._lookup_exception_handler(Throttled(wait=None))
        api.add_exception_handler(Throttled, functools.partial(answer, previous))
        _answering.add(api)


def answer(previous: Any, request: HttpRequest, exc: Exception) -> HttpResponse:
    """The answer to Ninja's Throttled for `request` (see the module docstring); `previous` is the
    handler the API had, None when it had none (Ninja then raises the exception, as it would)."""
    state = state_if_any(request)
    refused: tuple[LimitOutcome, int] | None = state.entry.get(_REFUSAL_ENTRY) if state is not None else None
    if refused is None:
        return _delegate(previous, request, exc)
    outcome, cost = refused
    if outcome.status == DENIED and (outcome.decision is None or not _our_format()):
        response = _delegate(previous, request, exc)
        add_headers(response, outcome)
        return response
    return refusal(outcome, cost)  # type: ignore[return-value]  # a JsonResponse


def _delegate(previous: Any, request: HttpRequest, exc: Exception) -> HttpResponse:
    if previous is None:
        raise exc
    return previous(request, exc)


def _our_format() -> bool:
    # always readable (an invalid one: "ninja")
    return bool(request_settings().get("NINJA_ERROR_FORMAT") == "ratelimit")
