"""`RateLimitedConsumerMixin`: sets the cost of a Channels consumer's messages and reads its connection's
limits (the middleware does the limiting)."""

from __future__ import annotations

from typing import Any

from .connection import ConnectionLimits
from .middleware import SCOPE_KEY, Receive, Send


class RateLimitedConsumerMixin:
    """Mix into a Channels consumer (before the consumer class) behind RateLimitMiddlewareStack.

    `ratelimit_message_cost(text_data, bytes_data)` is what one received message costs (1 by default;
    by size or type, say); a message of cost 0 is not charged. `ratelimit` is the connection's
    ConnectionLimits (its `outcome`: tier, identity), or None when no limiting middleware ran.
    """

    scope: dict[str, Any]

    def ratelimit_message_cost(self, text_data: str | None, bytes_data: bytes | None) -> int:
        """The units one received message is charged (override to charge by size or type)."""
        return 1

    @property
    def ratelimit(self) -> ConnectionLimits | None:
        """This connection's limits (None without the limiting middleware)."""
        return self.scope.get(SCOPE_KEY)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        limits = scope.get(SCOPE_KEY)
        if isinstance(limits, ConnectionLimits):
            limits.cost_of = self.ratelimit_message_cost
        await super().__call__(scope, receive, send)  # type: ignore[misc]
