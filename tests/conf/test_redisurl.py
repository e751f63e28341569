"""ratelimit_app.conf.redisurl: what a REDIS_URL may be, checked before a client is built, and what is
wrong with one, said without ever quoting it (it can hold a password)."""

from __future__ import annotations

import pytest

from ratelimit_app.conf.redisurl import host_ports, url_problem

PASSWORD = "hunter2hunter2"


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0", f"redis://:{PASSWORD}@cache:6380/15?socket_timeout=0.5&max_connections=20",
    "rediss://cache/0?ssl_cert_reqs=required", "unix:///tmp/redis.sock?db=2", "redis://localhost",
    f"redis+cluster://:{PASSWORD}@a:7000,b:7001", "redis+sentinel://a:26379,b:26380/mymaster/1",
])
def test_urls_redis_py_can_use_pass(url: str) -> None:
    assert url_problem(url) is None


@pytest.mark.parametrize(("url", "problem"), [
    (f"htp://:{PASSWORD}@cache:6379/0", "its scheme is not one of redis, rediss, unix, redis+cluster, redis+sentinel"),
    (f"redis//:{PASSWORD}@cache:6379/0", "its scheme is not one of"),
    (f"redis://:{PASSWORD}@cache:63x9/0", "it is not a URL with a valid host and port"),
    (f"redis://:{PASSWORD}@cache:6379/zero", "its database (the path after the host) is not a number"),
    (f"redis://:{PASSWORD}@cache/0?socket_timeout=soon", "its query parameter 'socket_timeout' is not a number"),
    (f"redis://:{PASSWORD}@cache/0?db=abc", "its query parameter 'db' is not a whole number"),
    (f"rediss://:{PASSWORD}@cache/0?ssl_cert_reqs=maybe", "its query parameter 'ssl_cert_reqs' is not one of"),
    (f"redis+cluster://:{PASSWORD}@a:7000,b", "an address in it is not host:port"),
    (f"redis+sentinel://:{PASSWORD}@a:26379/mymaster/first", "its database (the path after the service name)"),
])
def test_what_is_wrong_is_named_never_quoted(url: str, problem: str) -> None:
    found = url_problem(url)
    assert found is not None and found.startswith(problem) and PASSWORD not in found


def test_host_ports_leave_the_user_info_out() -> None:
    assert host_ports(f":{PASSWORD}@a:7000,[::1]:7001") == [("a", 7000), ("::1", 7001)]
    assert host_ports("a:7000,b") is None and host_ports(f"{PASSWORD}@:1") is None
