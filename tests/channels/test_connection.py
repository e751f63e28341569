"""One connection's limits: its slot held past its lease while it lives (renewed), given back when it ends;
messages charged to the message scope's own limits alone."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from channels.routing import URLRouter

from project.routing import websocket_urlpatterns
from ratelimit_app.channels.connection import own_policies
from ratelimit_app.channels.middleware import RateLimitMiddlewareStack
from ratelimit_app.plans.lookups import get_lookups
from tests.channels.test_middleware import connect
from tests.support.limits_support import make_key, make_tier, seed_tiers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _tiers() -> None:
    seed_tiers()


def test_own_policies_are_the_scopes_alone() -> None:
    tier = get_lookups().tier("free")
    assert [p.name for p in own_policies(tier, "websocket_message")] == ["websocket_message.messages"]
    assert [p.name for p in own_policies(tier, "websocket")] == ["websocket.connections", "websocket.connects"]
    assert own_policies(tier, "nothing") == () and own_policies(None, "websocket") == ()


def test_a_connection_keeps_its_slot_past_the_lease_and_gives_it_back_when_it_closes(ratelimit: Any) -> None:
    make_tier("brief", [("connections", "concurrency", 1, 1, None, "websocket")])  # a lease of 1 second
    key = make_key("brief")
    app = RateLimitMiddlewareStack(URLRouter(websocket_urlpatterns))

    async def scenario() -> list[Any]:
        first, ok, _ = await connect(f"/ws/echo/?key={key}", app)
        lived = time.monotonic() + 2.5
        while time.monotonic() < lived:  # outlive the lease twice over: the renewals keep the slot
            await first.send_to(text_data="ping")
            assert await first.receive_from() == "ping"
            await asyncio.sleep(0.2)
        _, second, code = await connect(f"/ws/echo/?key={key}", app)
        await first.disconnect()
        third, admitted, _ = await connect(f"/ws/echo/?key={key}", app)
        await third.disconnect()
        return [ok, second or code, admitted]

    assert asyncio.run(scenario()) == [True, 4429, True]


def test_the_seeded_tiers_have_websocket_limits_under_their_per_ip_rates() -> None:
    free = get_lookups().tier("free")
    assert free is not None
    shapes = [(p.name, p.algorithm, p.limit, p.period) for p in own_policies(free, "websocket")]
    assert shapes == [("websocket.connections", "concurrency", 2, 15), ("websocket.connects", "sliding_window", 5, 60)]
    assert [(p.limit, p.period) for p in own_policies(free, "websocket_message")] == [(10, 10)]
    assert [p.name for p in free.policies] == ["burst", "minute", "day"]  # HTTP requests: no slot, one call


def test_an_edit_of_the_tier_reaches_an_open_connection(ratelimit: Any) -> None:
    from asgiref.sync import sync_to_async

    from ratelimit_app.models import TierLimit

    key = make_key("free")

    def lower_the_message_limit() -> None:
        limit = TierLimit.objects.get(tier__slug="free", scope="websocket_message", name="messages")
        limit.limit = 4
        limit.save()  # announced like an edit in the admin: every process plans again

    async def scenario() -> list[str]:
        ws, _, _ = await connect(f"/ws/echo/?key={key}")
        answers = []
        for number in range(6):
            if number == 3:
                await sync_to_async(lower_the_message_limit)()
            await ws.send_to(text_data=str(number))
            answers.append(await ws.receive_from())
        await ws.disconnect()
        return answers

    answers = asyncio.run(scenario())
    assert answers[:4] == ["0", "1", "2", "3"]  # 4 of the new 4 per 10 s
    assert [json.loads(answer)["policy"] for answer in answers[4:]] == ["websocket_message.messages"] * 2
