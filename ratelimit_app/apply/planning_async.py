"""The async twin of ratelimit_app.apply.planning: `plan_request`, the same name, on the event loop without
blocking it, and `request_user`, the user of a request read without blocking it either."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject, empty

from ..conf.snapshot import Snapshot
from ..plans.lookups import NeedsIO, local_only
from . import planning
from .identity import api_key_from_request, authenticated_user
from .outcome import LimitOutcome
from .planning import FROM_REQUEST, RequestPlan


async def plan_request(request: HttpRequest, *, cost: int = 1, scope: str = "", user: Any = FROM_REQUEST,
                       path: str | None = None, settings: Snapshot | None = None) -> RequestPlan | LimitOutcome:
    """`planning.plan_request` on the event loop: right here from this process' warm lookup cache, else (a
    cold cache, a key not seen yet) the whole plan in one `sync_to_async` call."""
    key = api_key_from_request(request)
    if user is FROM_REQUEST and key is None:
        user = await request_user(request)
    try:
        with local_only():
            return planning.plan_with_key(request, key, cost, scope, user, path, settings)
    except NeedsIO:
        return await sync_to_async(planning.plan_with_key)(request, key, cost, scope, user, path, settings)


async def request_user(request: HttpRequest) -> Any:
    """The authenticated user of `request` (None when anonymous), read without blocking the loop: a lazy
    `request.user` whose session must be loaded is read with `request.auser()` (Django 5.0+) or one
    `sync_to_async` call, and set, so key functions and the view read it without I/O."""
    lazy = request.__dict__.get("user")
    if isinstance(lazy, SimpleLazyObject) and lazy._wrapped is empty:
        session = getattr(request, "session", None)
        if getattr(session, "session_key", None) is not None:
            auser = getattr(request, "auser", None)
            if auser is not None:
                request.user = await auser()
            else:  # Django 4.2
                await sync_to_async(authenticated_user)(request)
    return authenticated_user(request)
