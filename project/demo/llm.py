"""`POST /api/llm/chat`: a streamed answer that costs the tokens it used, as an LLM API's does.

The body is JSON, `{"max_tokens": N, "use": M}`: the answer streams M tokens, one line every 10 ms, and
reports each as used. The estimate reserved at admission is `max_tokens` (`@usage`), against the tier's
`tokens` limits of the scope "llm" (the seeded pro tier: 2,000 a minute); when the stream ends, or the
client cuts it off, the reservation is settled at the tokens sent. A real endpoint would estimate the
prompt's tokens plus `max_tokens` (docs/usage.md, "Usage limits").
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from ratelimit_app.decorators import limit_cost, usage

#: The most tokens one request may ask for (and use).
MAX_TOKENS = 4096
#: Seconds between two tokens of the stream.
TOKEN_INTERVAL = 0.01


def _number(body: dict[str, Any], name: str, default: int | None, low: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_TOKENS:
        raise ValueError(f"{name} must be a whole number from {low} to {MAX_TOKENS}")
    return value


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ValueError("body must be a JSON object such as {\"max_tokens\": 500, \"use\": 100}") from None
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object such as {\"max_tokens\": 500, \"use\": 100}")
    return body


def max_tokens(request: HttpRequest) -> int:
    """The estimate: the most tokens the answer may use (the prompt's would be added in a real API)."""
    return _number(_body(request), "max_tokens", None, 1)


@csrf_exempt
@require_POST
@limit_cost(scope="llm")
@usage(tokens=max_tokens)
def chat(request: HttpRequest) -> StreamingHttpResponse | JsonResponse:
    """Stream `use` tokens (default `max_tokens`), one every TOKEN_INTERVAL, each reported as used."""
    try:
        body = _body(request)
        use = _number(body, "use", _number(body, "max_tokens", None, 1), 0)
    except ValueError as exc:
        return JsonResponse({"detail": str(exc)}, status=400)
    state = getattr(request, "ratelimit", None)

    def report(count: int) -> None:
        if state is not None:
            state.report_usage("tokens", count)

    report(0)  # cut off before its first token, the request used none

    def tokens() -> Iterator[bytes]:
        for number in range(use):
            time.sleep(TOKEN_INTERVAL)
            report(1)
            yield b"token %d\n" % number

    async def async_tokens() -> AsyncIterator[bytes]:
        for number in range(use):
            await asyncio.sleep(TOKEN_INTERVAL)
            report(1)
            yield b"token %d\n" % number

    # Django buffers a whole iterator of the other kind before sending it: under ASGI, stream an async one
    stream = async_tokens() if isinstance(request, ASGIRequest) else tokens()
    return StreamingHttpResponse(stream, content_type="text/plain")
