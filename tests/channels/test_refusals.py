"""How a refused WebSocket is answered: the denial response extension or a close code; the error frame."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ratelimit_app.apply.outcome import DENIED, UNAVAILABLE, LimitOutcome
from ratelimit_app.apply.responses import too_many_requests
from ratelimit_app.channels.refusals import DENIAL_EXTENSION, close_code, deny, error_frame
from ratelimit_app.core.decision import Decision


def denied(retry_after: float | None = 2.5) -> Decision:
    return Decision(False, 10, 0, 5.0, retry_after, "websocket.connects", ())


def sent_by_deny(extensions: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(event: dict[str, Any]) -> None:
        sent.append(event)

    asyncio.run(deny({"type": "websocket", "extensions": extensions}, send, too_many_requests(denied(), "free")))
    return sent


def test_a_server_with_the_denial_extension_gets_the_http_answer() -> None:
    start, body = sent_by_deny({DENIAL_EXTENSION: {}})
    assert start["type"] == "websocket.http.response.start" and start["status"] == 429
    assert (b"retry-after", b"3") in start["headers"]
    assert json.loads(body["body"]) == {"error": "rate limit exceeded", "tier": "free",
                                        "policy": "websocket.connects", "retry_after": 2.5}


def test_a_server_without_it_gets_a_close_with_the_status_in_its_code() -> None:
    assert sent_by_deny({}) == [{"type": "websocket.close", "code": 4429}]
    assert [close_code(status) for status in (401, 403, 503, 500)] == [4401, 4403, 4503, 4000]


def test_the_error_frame_names_the_policy_and_the_wait() -> None:
    frame = json.loads(error_frame(LimitOutcome(DENIED, denied(4.2), (), None, "key:x")))
    assert frame == {"type": "ratelimit.refused", "error": "rate limit exceeded", "tier": None,
                     "policy": "websocket.connects", "retry_after": 4.2}
    down = json.loads(error_frame(LimitOutcome(UNAVAILABLE, denied(float("inf")), (), None, "key:x")))
    assert down["error"] == "rate limiter unavailable" and down["retry_after"] is None
