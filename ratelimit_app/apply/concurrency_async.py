"""The async twin of ratelimit_app.apply.concurrency's module functions: `release_after` and
`release_pending_now`, the same names, giving slots back through the async service on the event loop
(`HeldSlots.arelease`)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponseBase

from . import concurrency
from .concurrency import PENDING_ATTRIBUTE, HeldSlots, middleware_installed


async def release_after(request: HttpRequest, result: Any, slots: HeldSlots | None) -> None:
    """`concurrency.release_after` on the event loop."""
    if slots is not None and not isinstance(result, HttpResponseBase) and not middleware_installed():
        await slots.arelease()
    else:
        concurrency.release_after(request, result, slots)


async def release_pending_now(request: HttpRequest) -> None:
    """`concurrency.release_pending_now` on the event loop."""
    for slots in request.__dict__.pop(PENDING_ATTRIBUTE, ()):
        await slots.arelease()
