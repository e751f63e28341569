"""How a NinjaAPI answers a request our throttles refused: the first time one of ours refuses a request
of an API, `answer_refusals` wraps the API's handler of `ninja.errors.Throttled`. A refusal over a rate
keeps the API's answer (ours with RATELIMIT['NINJA_ERROR_FORMAT'] = "ratelimit"), with our headers; a
401, 403 or 503 of the request's own limits gets ours; an estimate that could not be made (`@usage`) its
400; a refusal by another throttle (Ninja's own) keeps the API's answer, untouched.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import Throttled

from ..apply.admission import state_if_any
from ..apply.joint import joint_of
from ..apply.outcome import DENIED
from ..apply.responses import add_headers, refusal
from ..conf.snapshot import request_settings

#: The entry of the request's state holding the 400 of an estimate the request could not give.
BAD_ESTIMATE = "bad_estimate"
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
    """The answer to Ninja's Throttled for `request`; `previous` is the API's handler (None: raise, as Ninja would)."""
    state = state_if_any(request)
    if state is not None and BAD_ESTIMATE in state.entry:
        return state.entry.pop(BAD_ESTIMATE)
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
    # always readable (an invalid one: "ninja")
    return bool(request_settings().get("NINJA_ERROR_FORMAT") == "ratelimit")
