"""The Django-free core of ratelimit_app: policies, decisions, the algorithms and their Lua scripts, the
sans-IO engine and its two transports (sync and asyncio), and the formats the models build on (API keys,
allow/deny rules). Nothing here imports Django (tests/test_architecture.py checks it)."""
