"""The demo's WebSocket consumer: /ws/echo/ sends back each message it receives (project/asgi.py routes it
behind RateLimitMiddlewareStack)."""

from __future__ import annotations

from channels.generic.websocket import AsyncWebsocketConsumer

from ratelimit_app.channels.consumers import RateLimitedConsumerMixin


class EchoConsumer(RateLimitedConsumerMixin, AsyncWebsocketConsumer):
    """Echoes text and binary messages; each costs one unit of the tier's message limits."""

    async def connect(self) -> None:
        await self.accept()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.send(text_data=text_data, bytes_data=bytes_data)
