"""The Django-free core of ratelimit_app: policies, decisions, the algorithms and their Lua scripts,
the sans-IO engine and its two transports (sync and asyncio), and the in-process fallback limiter.

Nothing here imports Django (tests/test_architecture.py checks it): the engine can be used from any
Python code with a redis-py client (`ratelimit_app.RateLimiter`, `ratelimit_app.AsyncRateLimiter`).
"""
