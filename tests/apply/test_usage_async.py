"""The async twin of request handling with usage limits: the demo's chat endpoint through the middleware's
ASGI path (Django's AsyncClient), the pro tier's 2,000 tokens a minute against real Redis."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from django.test import AsyncClient

from tests.support.limits_support import make_key, seed_tiers

pytestmark = pytest.mark.django_db(transaction=True)


async def chat(client: AsyncClient, key: str, max_tokens: int, use: int) -> Any:
    response = await client.post("/api/llm/chat", json.dumps({"max_tokens": max_tokens, "use": use}),
                                 content_type="application/json", headers={"X-API-Key": key})
    if response.streaming:
        async for _ in response.streaming_content:  # type: ignore[attr-defined]
            pass
    return response


def test_reservations_are_settled_on_the_event_loop_path() -> None:
    seed_tiers()
    key = make_key("pro")

    async def main() -> tuple[list[int], Any]:
        client = AsyncClient()
        statuses = []
        for _ in range(5):
            statuses.append((await chat(client, key, 1900, 50)).status_code)
        status = await client.get("/api/rate-limit/status", headers={"X-API-Key": key})
        return statuses, status.json()

    statuses, status = asyncio.run(main())
    # 50 used per request, 1,900 reserved: 50 x 2 + 1,900 = 2,000, a fourth would need 1,900 of 1,850
    assert statuses == [200, 200, 200, 429, 429]
    assert [row["remaining"] for row in status["limits"] if row["name"] == "llm.tokens"] == [1850]


def test_concurrent_streams_admit_exactly_what_their_estimates_allow() -> None:
    seed_tiers()
    key = make_key("pro")

    async def main() -> list[int]:
        client = AsyncClient()
        responses = await asyncio.gather(*(chat(client, key, 500, 20) for _ in range(12)))
        return [response.status_code for response in responses]

    assert asyncio.run(main()).count(200) == 4
