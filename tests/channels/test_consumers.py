"""RateLimitedConsumerMixin: a consumer sets what its messages cost and reads its connection's limits; the
key never reaches it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.routing import URLRouter
from django.urls import path

from ratelimit_app.channels.consumers import RateLimitedConsumerMixin
from ratelimit_app.channels.middleware import RateLimitMiddlewareStack
from ratelimit_app.testing import make_api_key
from tests.channels.test_middleware import connect, run
from tests.support.limits_support import seed_tiers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _tiers() -> None:
    seed_tiers()


class KeyReader(RateLimitedConsumerMixin, AsyncWebsocketConsumer):
    """Says what it sees of the handshake; a message of type "free" costs nothing, any other costs 4."""

    async def connect(self) -> None:
        await self.accept(subprotocol=(self.scope["subprotocols"] or [None])[0])
        headers = {name.decode(): value.decode() for name, value in self.scope["headers"]}
        await self.send(text_data=json.dumps({"query": self.scope["query_string"].decode(),
                                              "protocols": self.scope["subprotocols"], "headers": headers,
                                              "tier": self.ratelimit.outcome.tier_slug
                                              if self.ratelimit and self.ratelimit.outcome else None}))

    def ratelimit_message_cost(self, text_data: str | None, bytes_data: bytes | None) -> int:
        return 0 if text_data == "free" else 4

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.send(text_data=text_data)


READER = RateLimitMiddlewareStack(URLRouter([path("ws/reader/", KeyReader.as_asgi())]))


def test_the_key_never_reaches_the_consumer(ratelimit: Any) -> None:
    key = make_api_key("pro")

    async def scenario() -> tuple[Any, Any]:
        ws, _, _ = await connect(f"/ws/reader/?a=1&key={key}", READER)
        from_query = json.loads(await ws.receive_from())
        await ws.disconnect()
        ws, _, _ = await connect("/ws/reader/", READER, subprotocols=["chat", key],
                                headers=[(b"sec-websocket-protocol", f"chat, {key}".encode())])
        from_protocol = json.loads(await ws.receive_from())
        await ws.disconnect()
        return from_query, from_protocol

    from_query, from_protocol = run(scenario)
    assert from_query["query"] == "a=1" and from_query["tier"] == "pro"
    assert from_protocol["protocols"] == ["chat"] and from_protocol["tier"] == "pro"
    assert from_protocol["headers"]["sec-websocket-protocol"] == "chat"
    assert key not in json.dumps([from_query, from_protocol])


def test_the_consumer_sets_what_a_message_costs(ratelimit: Any) -> None:
    key = make_api_key("free")

    async def scenario() -> list[str]:
        ws, _, _ = await connect(f"/ws/reader/?key={key}", READER)
        await ws.receive_from()
        answers = []
        for text in ["free"] * 12 + ["paid"] * 3:
            await ws.send_to(text_data=text)
            answers.append(await ws.receive_from())
        await ws.disconnect()
        return answers

    answers = run(scenario)
    assert answers[:14] == ["free"] * 12 + ["paid"] * 2  # 10 per 10 s: two messages of 4
    assert json.loads(answers[14])["policy"] == "websocket_message.messages"


def test_a_signed_in_user_without_a_key_gets_their_tier(ratelimit: Any) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from ratelimit_app.models import Tier, UserTier

    user = get_user_model().objects.create_user("carol", password="secret-password")
    UserTier.objects.create(user=user, tier=Tier.objects.get(slug="pro"))
    browser = Client()
    browser.force_login(user)
    cookie = f"sessionid={browser.cookies['sessionid'].value}".encode()

    async def scenario() -> tuple[Any, Any]:
        ws, connected, _ = await connect("/ws/reader/", READER, headers=[(b"cookie", cookie)])
        assert connected
        seen = json.loads(await ws.receive_from())
        await ws.disconnect()
        _, anonymous, code = await connect("/ws/reader/", READER)
        return seen["tier"], anonymous or code

    assert run(scenario) == ("pro", 4401)  # without a session or a key: the demo requires a key
