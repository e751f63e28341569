"""How a NinjaAPI answers a request our throttles refused.

Ninja asks each throttle `allow_request(request)`, then answers a refusal itself, through the API's
handler of `ninja.errors.Throttled` (a 429 `{"detail": "Too many requests."}` by default, with
`Retry-After` from the throttles' `wait()`). The first time one of our throttles refuses a request of an
API, it registers `_answer` as that API's handler of `Throttled`, around the handler the API had (its
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

from ..apply.joint import joint_of
from ..apply.outcome import DENIED
from ..apply.responses import add_headers, refusal
from ..conf.settings import ratelimit_settings

_answering: weakref.WeakSet[NinjaAPI] = weakref.WeakSet()
_lock = threading.Lock()


def answer_refusals(api: NinjaAPI) -> None:
    """Register `_answer` as `api`'s handler of Throttled, around the one it had (once per API)."""
    if api in _answering:
        return
    with _lock:
        if api in _answering:
            return
        # the handler Ninja would pick for Throttled now (by the exception's classes, as Ninja does)
        previous = api._lookup_exception_handler(Throttled(wait=None))
        api.add_exception_handler(Throttled, functools.partial(_answer, previous))
        _answering.add(api)


def _answer(previous: Any, request: HttpRequest, exc: Exception) -> HttpResponse:
    """The answer to Ninja's Throttled for `request` (see the module docstring); `previous` is the
    handler the API had, None when it had none (Ninja then raises the exception, as it would)."""
    joint = joint_of(request)
    if joint is None or not joint.refused:
        return _delegate(previous, request, exc)
    outcome = joint.outcome
    if outcome.status == DENIED and (outcome.decision is None or not _our_format()):
        response = _delegate(previous, request, exc)
        add_headers(response, outcome)
        return response
    return refusal(outcome, joint.cost)  # type: ignore[return-value]  # a JsonResponse


def _delegate(previous: Any, request: HttpRequest, exc: Exception) -> HttpResponse:
    if previous is None:
        raise exc
    return previous(request, exc)


def _our_format() -> bool:
    return bool(ratelimit_settings.NINJA_ERROR_FORMAT == "ratelimit")  # always readable (an invalid one: "ninja")
