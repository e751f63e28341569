"""Django Channels (the [channels] extra): the same tiers and keys limit WebSocket connects, connections
held and messages (docs/websockets.md).

- `RateLimitMiddlewareStack(inner, **options)` and `WebSocketRateLimitMiddleware`: ratelimit_app.channels.middleware;
- `RateLimitedConsumerMixin`: ratelimit_app.channels.consumers.
"""
