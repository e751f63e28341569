"""Django Channels (the [channels] extra): the same tiers and keys limit WebSocket connects, connections
held and messages (docs/websockets.md)."""
