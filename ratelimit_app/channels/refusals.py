"""How a WebSocket is told it was refused (docs/websockets.md, "Refusals"): before accept, an HTTP answer
through the ASGI denial response extension, else a close with code 4000 + status; after accept, an error
frame per refused message, and a close with 4429 once too many were refused."""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

from django.http import HttpResponseBase

from ..apply.outcome import DENIED, FORBIDDEN, UNAUTHORIZED, LimitOutcome

#: Close code after too many refused messages on one connection.
TOO_MANY_REFUSED = 4429
#: The extension a server lists in scope["extensions"] when it can answer a handshake with an HTTP response.
DENIAL_EXTENSION = "websocket.http.response"

Send = Callable[[dict[str, Any]], Awaitable[None]]


def close_code(status: int) -> int:
    """The close code of a connect refused with HTTP `status` (429 -> 4429, 401 -> 4401, 403 -> 4403, 503 -> 4503)."""
    return 4000 + status if status in (401, 403, 429, 503) else 4000


async def deny(scope: dict[str, Any], send: Send, response: HttpResponseBase) -> None:
    """Refuse the handshake of `scope` with `response` (429/401/403/503, its headers and JSON body) where the
    server offers the denial response extension; else close it with `close_code(status)`."""
    if DENIAL_EXTENSION not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": close_code(response.status_code)})
        return
    headers = [(name.lower().encode("latin-1"), str(value).encode("latin-1")) for name, value in response.items()]
    await send({"type": "websocket.http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": bytes(getattr(response, "content", b""))})


def error_frame(outcome: LimitOutcome) -> str:
    """The JSON text frame answering a refused message (its policy and the seconds to wait, never a key)."""
    decision = outcome.decision
    retry_after = decision.retry_after if decision is not None else None
    if outcome.status == DENIED:
        error = "rate limit exceeded"
    elif outcome.status in (UNAUTHORIZED, FORBIDDEN):
        error = outcome.message or "refused"
    else:
        error = "rate limiter unavailable"
    return json.dumps({
        "type": "ratelimit.refused", "error": error, "tier": outcome.tier_slug,
        "policy": decision.policy if decision is not None else "",
        "retry_after": round(retry_after, 3) if retry_after is not None and not math.isinf(retry_after) else None,
    })
