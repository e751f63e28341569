"""The embedded Redis that the demo and the suite start on machines without one."""

from __future__ import annotations

import redis

from devtools.embedded import answers, resolve_redis_url, start_redis


def test_start_redis_serves_and_stops() -> None:
    server = start_redis()
    try:
        assert redis.Redis.from_url(server.url).ping()
    finally:
        server.stop()
    assert server.process.poll() is not None
    assert not answers("127.0.0.1", server.port)


def test_resolve_prefers_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://10.9.8.7:6390/3")
    assert resolve_redis_url() == "redis://10.9.8.7:6390/3"
