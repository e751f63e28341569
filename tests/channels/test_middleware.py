"""The Channels middleware in process, with Channels' WebsocketCommunicator and the test kit's `ratelimit`
fixture: connects refused before accept, connection slots held and given back, messages charged to the
message scope and refused with an error frame, the key never shown to the consumer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from devtools.embedded import free_port
from project.routing import websocket_urlpatterns
from ratelimit_app.channels.middleware import RateLimitMiddlewareStack
from ratelimit_app.channels.refusals import TOO_MANY_REFUSED
from ratelimit_app.observability.queries import recent_metrics
from ratelimit_app.observability.recorder import flush
from ratelimit_app.testing import make_api_key
from tests.support.limits_support import seed_tiers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _tiers() -> None:
    seed_tiers()  # a transactional test starts with the tables flushed

APP = RateLimitMiddlewareStack(URLRouter(websocket_urlpatterns))


def run(scenario: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(scenario())


async def connect(path: str, app: Any = APP, **kwargs: Any) -> tuple[WebsocketCommunicator, bool, Any]:
    ws = WebsocketCommunicator(app, path, **kwargs)
    connected, detail = await ws.connect()
    return ws, connected, detail


def test_the_sixth_connect_within_a_minute_is_refused_before_accept(ratelimit: Any) -> None:
    key = make_api_key("free")

    async def scenario() -> list[Any]:
        details = []
        for _ in range(6):
            ws, connected, detail = await connect(f"/ws/echo/?key={key}")
            details.append(detail if not connected else "accepted")
            if connected:
                await ws.disconnect()
        return details

    assert run(scenario) == ["accepted"] * 5 + [4429]  # no denial extension in the communicator: a close code
    ratelimit.advance(60)
    assert run(scenario)[0] == "accepted"


def test_a_third_connection_waits_for_one_of_two_to_close(ratelimit: Any) -> None:
    key = make_api_key("free")

    async def scenario() -> list[bool]:
        first, ok1, _ = await connect(f"/ws/echo/?key={key}")
        second, ok2, _ = await connect(f"/ws/echo/?key={key}")
        _, ok3, code = await connect(f"/ws/echo/?key={key}")
        await first.disconnect()
        fourth, ok4, _ = await connect(f"/ws/echo/?key={key}")
        await second.disconnect()
        await fourth.disconnect()
        return [ok1, ok2, ok3 or code, ok4]

    assert run(scenario) == [True, True, 4429, True]


def test_twelve_messages_get_ten_echoes_and_two_refusals_naming_the_policy(ratelimit: Any) -> None:
    key = make_api_key("free")

    async def scenario() -> list[Any]:
        ws, connected, _ = await connect(f"/ws/echo/?key={key}")
        assert connected
        answers = []
        for number in range(12):
            await ws.send_to(text_data=f"message {number}")
            answers.append(await ws.receive_from())
        await ws.disconnect()
        return answers

    answers = run(scenario)
    assert answers[:10] == [f"message {number}" for number in range(10)]
    refusals = [json.loads(answer) for answer in answers[10:]]
    for refusal in refusals:
        assert refusal["type"] == "ratelimit.refused" and refusal["error"] == "rate limit exceeded"
        assert refusal["policy"] == "websocket_message.messages" and refusal["tier"] == "free"
        assert 0 < refusal["retry_after"] <= 10


def test_too_many_refused_messages_close_the_connection(ratelimit: Any) -> None:
    key = make_api_key("free")
    app = RateLimitMiddlewareStack(URLRouter(websocket_urlpatterns), max_refusals=2)

    async def scenario() -> Any:
        ws, _, _ = await connect(f"/ws/echo/?key={key}", app)
        for number in range(12):
            await ws.send_to(text_data=str(number))
        answers = [await ws.receive_output() for _ in range(13)]
        await ws.disconnect()
        return answers

    answers = run(scenario)
    assert [a.get("text", "")[:1] for a in answers[:10]] == [str(n) for n in range(10)]
    assert answers[12] == {"type": "websocket.close", "code": TOO_MANY_REFUSED}


def test_without_a_key_the_demo_refuses_the_connect(ratelimit: Any) -> None:
    async def scenario() -> Any:
        _, connected, code = await connect("/ws/echo/?key=not-a-key")
        return connected or code

    assert run(scenario) == 4401  # the demo sets REQUIRE_API_KEY


def test_the_limits_are_off_when_disabled(ratelimit: Any) -> None:
    ratelimit.disable()

    async def scenario() -> Any:
        _, connected, _ = await connect("/ws/echo/")
        return connected

    assert run(scenario) is True


@contextmanager
def redis_down(settings: Any, mode: str) -> Iterator[None]:
    """The limiter's Redis a closed port, under fail mode `mode`, while the block runs (then put back, so the
    test's keys are deleted from the real one)."""
    previous = settings.RATELIMIT
    settings.RATELIMIT = {**previous, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "FAIL_MODE": mode,
                          "SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2, "BUDGET_MS": 500}
    try:
        yield
    finally:
        settings.RATELIMIT = previous


@pytest.mark.parametrize(("mode", "expected"), [("open", ["accepted", "hello"]), ("closed", [4503])])
def test_redis_down_follows_the_fail_mode(ratelimit: Any, settings: Any, mode: str, expected: list[Any]) -> None:
    key = make_api_key("free")

    async def scenario() -> list[Any]:
        ws, connected, code = await connect(f"/ws/echo/?key={key}")
        if not connected:
            return [code]
        await ws.send_to(text_data="hello")
        answer = await ws.receive_from()
        await ws.disconnect()
        return ["accepted", answer]

    assert run(scenario)[0] == "accepted"  # the key and its tier cached while Redis is up
    with redis_down(settings, mode):
        assert run(scenario) == expected


def test_a_message_refused_while_redis_is_down_is_answered_as_unavailable(ratelimit: Any, settings: Any) -> None:
    key = make_api_key("free")

    async def scenario() -> Any:
        ws, connected, _ = await connect(f"/ws/echo/?key={key}")
        assert connected
        with redis_down(settings, "closed"):
            await ws.send_to(text_data="hello")
            answer = json.loads(await ws.receive_from())
            await ws.disconnect()
        return answer

    answer = run(scenario)
    assert answer["type"] == "ratelimit.refused" and answer["error"] == "rate limiter unavailable"


def test_connects_messages_and_refusals_are_counted_in_the_metrics(ratelimit: Any) -> None:
    key = make_api_key("free")
    flush()
    before = recent_metrics(hours=2)

    async def scenario() -> None:
        ws, _, _ = await connect(f"/ws/echo/?key={key}")
        for number in range(11):  # 10 echoed, 1 refused
            await ws.send_to(text_data=str(number))
            await ws.receive_from()
        await ws.disconnect()

    run(scenario)
    assert flush() is True
    after = recent_metrics(hours=2)
    counts = {t.tier: (t.allowed, t.blocked) for t in after.tiers}
    old = {t.tier: (t.allowed, t.blocked) for t in before.tiers}.get("free", (0, 0))
    assert (counts["free"][0] - old[0], counts["free"][1] - old[1]) == (11, 1)  # the connect and 10 messages
    blocked = {p.policy: p.blocked for p in after.policies}
    assert blocked["websocket_message.messages"] - {p.policy: p.blocked for p in before.policies}.get(
        "websocket_message.messages", 0) == 1


def test_the_key_is_taken_out_of_the_servers_own_scope(ratelimit: Any) -> None:
    """The server logs a connection with its scope's query string: the key is gone from it too."""
    key = make_api_key("free")

    async def scenario() -> Any:
        ws, connected, _ = await connect(f"/ws/echo/?room=7&key={key}")
        assert connected
        await ws.disconnect()
        return ws.scope  # the dict the communicator (the server) passed to the application

    scope = run(scenario)
    assert scope["query_string"] == b"room=7" and key not in repr(scope)
