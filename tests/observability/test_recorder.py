"""Decision metrics against a real Redis: counts add up exactly, survive outages and forks, expire."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from devtools.embedded import free_port, start_redis
from ratelimit_app.core.logs import JsonFormatter, mask_key, safe_identity
from ratelimit_app.observability import pending
from ratelimit_app.observability.queries import MetricsRange, get_metrics, get_metrics_range, recent_metrics
from ratelimit_app.observability.recorder import flush, process_recorder, record_breaker_change, record_decision
from ratelimit_app.observability.schema import hour_key
from ratelimit_app.observability.snapshot import breaker_state, process_metrics
from ratelimit_app.service.breaker import PROBE
from ratelimit_app.service.limiter import get_limiter
from tests.support.gunicorn_server import http_get, start_gunicorn
from tests.support.tcp_proxy import tcp_proxy

UTC = timezone.utc
ROOT = Path(__file__).resolve().parents[2]


def stored() -> MetricsRange:
    """What Redis holds for this hour and the one before (a test may straddle an hour boundary)."""
    return recent_metrics(hours=2)


def send_load(allowed: dict[str, int], blocked: dict[tuple[str, str, str], int], degraded: int = 0) -> None:
    """Record allowed[tier] allowed decisions and blocked[(tier, policy, identity)] denials."""
    for tier, count in allowed.items():
        for _ in range(count):
            record_decision(allowed=True, tier=tier, policy=None, degraded=False, identity="ip:198.51.100.1")
    for (tier, policy, identity), count in blocked.items():
        for _ in range(count):
            record_decision(allowed=False, tier=tier, policy=policy, degraded=False, identity=identity)
    for _ in range(degraded):
        record_decision(allowed=True, tier="free", policy=None, degraded=True, identity="ip:198.51.100.1")


def test_stored_totals_equal_the_load_that_was_served() -> None:
    send_load(
        allowed={"free": 40, "pro": 25},
        blocked={("free", "burst", "key:freeKey1"): 7, ("free", "minute", "key:freeKey2"): 3,
                 ("ip", "ip", "ip:203.0.113.9"): 5},
    )
    assert flush() is True
    result = stored()
    assert (result.total, result.allowed, result.blocked) == (80, 65, 15)
    assert result.block_rate == pytest.approx(15 / 80)
    assert [(t.tier, t.allowed, t.blocked) for t in result.tiers] == [("free", 40, 10), ("pro", 25, 0), ("ip", 0, 5)]
    assert [(p.policy, p.blocked) for p in result.policies] == [("burst", 7), ("ip", 5), ("minute", 3)]
    assert (result.degraded, result.degraded_blocked) == (0, 0)
    assert [(t.identity, t.blocked) for t in result.top_blocked] == [
        ("key:freeKey1", 7), ("ip:203.0.113.9", 5), ("key:freeKey2", 3)]


def test_a_second_flush_adds_only_what_came_after_the_first() -> None:
    send_load(allowed={"free": 10}, blocked={})
    assert flush()
    send_load(allowed={"free": 5}, blocked={("free", "day", "key:abc"): 2})
    assert flush()
    assert flush()  # nothing new: must not count anything twice
    hour = stored()
    assert (hour.allowed, hour.blocked) == (15, 2)


def test_concurrent_recording_while_the_flusher_runs_loses_nothing(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "METRICS_FLUSH_INTERVAL": 0.01}
    threads, per_thread = 16, 2000

    def run(slot: int) -> None:
        for n in range(per_thread):
            record_decision(allowed=n % 4 != 0, tier=f"t{slot % 3}", policy="minute" if n % 4 == 0 else None,
                            degraded=False, identity=f"ip:10.0.0.{slot}")

    workers = [threading.Thread(target=run, args=(slot,)) for slot in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert flush()
    hour = stored()
    assert hour.total == threads * per_thread
    assert hour.blocked == threads * per_thread // 4
    assert sum(t.total for t in hour.tiers) == threads * per_thread
    # several background flushes happened while the threads recorded
    assert process_metrics().flushes >= 2


def test_background_flusher_writes_without_an_explicit_flush(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "METRICS_FLUSH_INTERVAL": 0.1}
    send_load(allowed={"free": 12}, blocked={})
    deadline = time.monotonic() + 10
    # the counts show in Redis a moment before the flusher forgets its copy: wait for both
    while stored().allowed != 12 or process_metrics().pending != 0:
        assert time.monotonic() < deadline, "the flusher did not write the counts within 10 s"
        time.sleep(0.05)
    assert stored().allowed == 12  # written once


def test_hour_and_day_keys_carry_the_configured_ttl(settings: Any, redis_client: redis.Redis, key_prefix: str) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "METRICS_TTL_HOURS": 2}
    send_load(allowed={"free": 1}, blocked={("free", "minute", "ip:192.0.2.50"): 1})
    assert flush()
    keys = sorted(k.decode() for k in redis_client.scan_iter(match=f"{key_prefix}:*"))
    assert [k.split(":")[2] for k in keys] == ["applied", "blocked", "h"]
    for key in keys:
        # the counters live the TTL; this process's applied marker twice that (it outlives any resend)
        lifetime = 2 * 7200 if ":applied:" in key else 7200
        assert lifetime - 200 < redis_client.ttl(key) <= lifetime, key


def test_default_ttl_is_48_hours(redis_client: redis.Redis, key_prefix: str) -> None:
    send_load(allowed={"free": 1}, blocked={})
    assert flush()
    [key] = redis_client.scan_iter(match=f"{key_prefix}:*:h:*")
    assert 47 * 3600 < redis_client.ttl(key) <= 48 * 3600


def test_top_blocked_identities_most_first_limited_and_without_secrets(
    settings: Any, redis_client: redis.Redis, key_prefix: str
) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "TOP_BLOCKED": 3}
    secret = "s3cretPartOfTheKeyThatMustNeverBeStored"
    send_load(
        allowed={},
        blocked={("free", "burst", f"key:abcd1234.{secret}"): 9, ("free", "burst", "ip:203.0.113.5"): 6,
                 ("pro", "minute", "key:zzzz9999"): 4, ("ip", "ip", "ip:2001:db8::/64"): 2,
                 ("free", "day", "user:42"): 1},
    )
    assert flush()
    top = stored().top_blocked
    assert [(t.identity, t.blocked) for t in top] == [("key:abcd1234", 9), ("ip:203.0.113.5", 6), ("key:zzzz9999", 4)]
    [day] = redis_client.scan_iter(match=f"{key_prefix}:*:blocked:*")
    members = redis_client.zrange(day, 0, -1)
    assert len(members) == 5 and not any(secret.encode() in member for member in members)
    for key in redis_client.scan_iter(match=f"{key_prefix}:*"):
        dump = redis_client.dump(key) or b""
        assert secret.encode() not in dump


def test_degraded_decisions_are_counted_separately() -> None:
    send_load(allowed={"free": 3}, blocked={}, degraded=4)
    record_decision(allowed=False, tier="free", policy="minute", degraded=True, identity="ip:192.0.2.3")
    assert flush()
    hour = stored()
    assert (hour.allowed, hour.blocked, hour.degraded, hour.degraded_blocked) == (7, 1, 5, 1)


def test_metrics_disabled_counts_nothing(settings: Any, redis_client: redis.Redis, key_prefix: str) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "METRICS_ENABLED": False}
    before = sum(d.count for d in process_metrics().decisions)
    send_load(allowed={"free": 5}, blocked={("free", "burst", "ip:192.0.2.1"): 5})
    assert flush()
    assert stored().total == 0
    assert sum(d.count for d in process_metrics().decisions) == before
    assert list(redis_client.scan_iter(match=f"{key_prefix}:*")) == []


def test_counts_survive_a_redis_outage_and_land_once_it_is_back(settings: Any, caplog: Any) -> None:
    server = start_redis()
    port = server.port
    try:
        settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": server.url, "METRICS_FLUSH_INTERVAL": 3600.0}
        assert flush()
        server.stop()
        send_load(allowed={"free": 30}, blocked={("free", "minute", "ip:192.0.2.9"): 6})
        caplog.set_level(logging.WARNING, logger="ratelimit_app")
        assert flush() is False
        send_load(allowed={"free": 4}, blocked={})
        assert flush() is False
        # the background flusher keeps failing too, and stays alive
        settings.RATELIMIT = {**settings.RATELIMIT, "METRICS_FLUSH_INTERVAL": 0.05}
        errors_before = process_metrics().flush_errors
        deadline = time.monotonic() + 10
        while process_metrics().flush_errors < errors_before + 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert any(t.name == "ratelimit-metrics-flusher" and t.is_alive() for t in threading.enumerate())
        failures = [r for r in caplog.records if getattr(r, "ratelimit_event", "") == "ratelimit.metrics_flush_failed"]
        assert len(failures) == 1, "an outage is logged once, not once per interval"
        assert process_metrics().pending >= 40

        server = start_redis(port=port)
        deadline = time.monotonic() + 10
        while not flush():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        hour = stored()
        assert (hour.allowed, hour.blocked) == (34, 6)
        assert [t.identity for t in stored().top_blocked] == ["ip:192.0.2.9"]
    finally:
        server.stop()


def test_memory_is_bounded_while_redis_is_down(settings: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(pending, "_MAX_PENDING_IDENTITIES", 5)
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                          "METRICS_FLUSH_INTERVAL": 3600.0}
    dropped_before = process_metrics().dropped
    for n in range(20):
        record_decision(allowed=False, tier="free", policy="minute", degraded=False, identity=f"ip:10.1.0.{n}")
    assert flush() is False
    assert process_metrics().dropped - dropped_before == 15
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": settings.REDIS_URL}
    assert flush()
    hour = stored()
    # totals stay exact; only the per-identity detail beyond the bound is lost
    assert hour.blocked == 20
    assert len(stored().top_blocked) == 5


def test_a_batch_whose_reply_was_lost_is_sent_again_unchanged_and_counted_once(settings: Any, redis_url: str) -> None:
    target = urlsplit(redis_url)
    with tcp_proxy(target.hostname or "127.0.0.1", target.port or 6379) as proxy:
        settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": proxy.url, "METRICS_FLUSH_INTERVAL": 3600.0,
                              "SOCKET_TIMEOUT": 0.3}
        send_load(allowed={"free": 1}, blocked={})
        assert flush()  # loads the script through the proxy
        send_load(allowed={"free": 10}, blocked={("free", "minute", "ip:192.0.2.7"): 3})
        proxy.mode = "drop_replies"  # Redis applies the batch; its reply is lost
        assert flush() is False
        send_load(allowed={"free": 5}, blocked={})  # recorded while the batch is unanswered
        assert flush() is False  # the same batch again (applied again by Redis, adding nothing)
        proxy.mode = "forward"
        assert flush() is True  # the same batch once more, then the 5 recorded since
        hour = stored()
        assert (hour.allowed, hour.blocked) == (16, 3)
        assert [(t.identity, t.blocked) for t in hour.top_blocked] == [("ip:192.0.2.7", 3)]
        assert proxy.commands_seen("EVALSHA") >= 5


def test_a_batch_redis_never_took_is_given_up_after_the_ttl(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                          "METRICS_FLUSH_INTERVAL": 3600.0}
    send_load(allowed={"free": 4}, blocked={})
    assert flush() is False
    dropped = process_metrics().dropped
    [batch] = process_recorder.sealed
    # sealed longer ago than the TTL: its applied marker may have expired, so it is never sent again
    process_recorder.sealed[0] = batch._replace(sealed_at=batch.sealed_at - 48 * 3600 - 1)
    send_load(allowed={"free": 2}, blocked={})
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": settings.REDIS_URL}
    assert flush()
    assert stored().allowed == 2
    assert process_metrics().dropped - dropped == 4 and process_metrics().pending == 0


def test_exit_flushes_in_the_parent_and_in_a_forked_worker(redis_url: str, key_prefix: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url}
    subprocess.run([sys.executable, "-m", "tests.support.metrics_workers", key_prefix, "25", "17"],
                   cwd=ROOT, env=env, check=True, timeout=60)
    hour = stored()
    # 25 recorded before the fork (flushed once, by the parent) + 17 in the child (flushed at its exit)
    assert (hour.allowed, hour.blocked) == (25, 17)
    assert [(t.identity, t.blocked) for t in stored().top_blocked] == [("key:child", 17)]


@pytest.mark.parametrize("preload", [False, True])
def test_gunicorn_workers_flush_their_counts_at_shutdown(redis_url: str, key_prefix: str, preload: bool,
                                                        tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "REDIS_URL": redis_url, "RATELIMIT_TEST_PREFIX": key_prefix,
           "DJANGO_SETTINGS_MODULE": "tests.support.metrics_gunicorn_settings",
           "RATELIMIT_TEST_DB": str(tmp_path / "db.sqlite3")}
    # the server's own database, migrated (the allow/deny rules are read from it on every limited path)
    subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True,
                   timeout=300)
    server = start_gunicorn(port, env, "--workers", "3", "--graceful-timeout", "20",
                            *(["--preload"] if preload else []))
    try:
        # No API key: each request is charged to the per-IP limit (40/h, exact): 401 while it allows, then 429.
        statuses: list[int] = []
        lock = threading.Lock()

        def client() -> None:
            for _ in range(15):
                status = http_get(port, "/api/users")
                with lock:
                    statuses.append(status)

        clients = [threading.Thread(target=client) for _ in range(4)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        assert sorted(set(statuses)) == [401, 429] and statuses.count(401) == 40
        # Nothing was flushed yet (the interval is an hour): the counts live in the workers.
        assert stored().total == 0 and stored().unauthorized == 0
    finally:
        server.terminate()  # SIGTERM: graceful shutdown, each worker exits through atexit
        _, stderr = server.communicate(timeout=60)
    assert server.returncode == 0, stderr.decode()[-2000:]
    result = stored()
    assert (result.allowed, result.blocked, result.unauthorized) == (0, 20, 40)  # a 401 is its own outcome
    assert [(t.tier, t.allowed, t.blocked) for t in result.tiers] == [("ip", 0, 20)]
    assert [(b.identity, b.blocked) for b in result.top_blocked] == [("ip:127.0.0.1", 20)]


def test_range_sums_hours_and_fills_gaps(redis_client: redis.Redis, key_prefix: str) -> None:
    now = int(time.time()) // 3600
    redis_client.hset(hour_key(key_prefix, now - 3), mapping={"allowed": 5, "blocked": 1, "tier:free:allowed": 5,
                                                             "tier:free:blocked": 1, "policy:burst:blocked": 1})
    redis_client.hset(hour_key(key_prefix, now - 1), mapping={"allowed": 2, "tier:pro:allowed": 2})
    end = datetime.fromtimestamp(now * 3600 + 1800, tz=timezone.utc)
    result = get_metrics_range(end - timedelta(hours=3), end)
    assert [h.total for h in result.hours] == [6, 0, 2, 0]
    assert (result.allowed, result.blocked, result.total) == (7, 1, 8)
    assert [(t.tier, t.total) for t in result.tiers] == [("free", 6), ("pro", 2)]
    assert result.hours[0].hour == datetime.fromtimestamp((now - 3) * 3600, tz=timezone.utc)
    assert get_metrics(end - timedelta(hours=3)) == result.hours[0]
    assert recent_metrics(hours=4).total in (8, 2)  # 2 only when the hour turned since `now`


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: get_metrics(datetime(2025, 1, 1, 12)), "naive"),
        (lambda: get_metrics_range(datetime(2025, 1, 2, tzinfo=UTC), datetime(2025, 1, 1, tzinfo=UTC)), "before start"),
        (lambda: get_metrics_range(datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 6, 1, tzinfo=UTC)), "at most"),
        (lambda: recent_metrics(hours=0), "hours"),
    ],
)
def test_bad_query_arguments_are_named(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_denials_are_logged_at_debug_without_the_key(caplog: Any) -> None:
    caplog.set_level(logging.DEBUG, logger="ratelimit_app")
    record_decision(allowed=False, tier="free", policy="burst", degraded=False, identity="key:pfx12345.topsecret")
    record_decision(allowed=True, tier="free", policy=None, degraded=False, identity="key:pfx12345.topsecret")
    denials = [r for r in caplog.records if getattr(r, "ratelimit_event", "") == "ratelimit.denied"]
    assert len(denials) == 1 and denials[0].levelno == logging.DEBUG
    assert "topsecret" not in caplog.text
    line = json.loads(JsonFormatter().format(denials[0]))
    assert line["event"] == "ratelimit.denied" and line["identity"] == "key:pfx12345" and line["tier"] == "free"


def test_breaker_changes_are_logged_once_per_change(caplog: Any, settings: Any) -> None:
    caplog.set_level(logging.INFO, logger="ratelimit_app")
    settings.RATELIMIT = {**settings.RATELIMIT, "BREAKER_FAILURES": 1, "BREAKER_COOLDOWN": 0.05,
                          "BREAKER_MAX_COOLDOWN": 0.05}
    breaker = get_limiter().guard.breaker  # the state is read from the service's own breaker
    before = dict(process_metrics().breaker_transitions)
    breaker.record_failure("Redis down")
    breaker.record_failure("Redis still down")  # already open: no change
    assert breaker_state() == "open"
    time.sleep(breaker.retry_in())
    assert breaker.before_call() == PROBE
    assert breaker_state() == "half_open"
    breaker.record_success(probe=True)
    assert breaker_state() == "closed"
    events = [(r.levelname, r.ratelimit["state"]) for r in caplog.records
              if getattr(r, "ratelimit_event", "") == "ratelimit.breaker"]
    assert events == [("WARNING", "open"), ("INFO", "half_open"), ("INFO", "closed")]
    after = dict(process_metrics().breaker_transitions)
    assert {state: after.get(state, 0) - before.get(state, 0) for state in ("open", "half_open", "closed")} == \
        {"open": 1, "half_open": 1, "closed": 1}
    with pytest.raises(ValueError, match="breaker state"):
        record_breaker_change(previous="closed", state="ajar")


def test_key_masking_helpers() -> None:
    assert mask_key("abcd1234.verysecretpart") == "abcd1234.…"
    assert mask_key("nodotsecret") == "nodo…"
    assert safe_identity("key:abcd1234.verysecretpart") == "key:abcd1234"
    assert safe_identity("ip:2001:db8::/64") == "ip:2001:db8::/64"
