"""Edits announced through the limiter's Redis: another app server applies a revocation or a tier edit
within two seconds whatever CACHES is (Django's per-process LocMemCache here), reads the announcement at
most once a second in a thread of its own (no lookup waits for it), and falls back to CACHE_TTL when Redis
does not answer.
The last two tests run two real app servers (gunicorn) and revoke keys from a third process and from
the admin of one of them, with Redis and without."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from django.db import transaction

from devtools.embedded import RedisProcess, free_port
from ratelimit_app.models import ApiKey, TierLimit
from ratelimit_app.plans.edits import EDITS_CHECK_INTERVAL, UNSEEN, edits_key
from ratelimit_app.plans.lookups import build_lookups, get_lookups, invalidate, local_only
from ratelimit_app.service.limiter import get_limiter
from tests.support.gunicorn_server import ROOT, prepare_database, start_gunicorn, stop_server
from tests.support.limits_support import make_key, seed_tiers
from tests.support.topology import command_calls

#: Django's default cache, one per process (what `startproject` leaves in settings.py).
PER_PROCESS = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


def per_process_cache(settings: Any, **ratelimit: Any) -> None:
    settings.CACHES = PER_PROCESS
    settings.RATELIMIT = {**settings.RATELIMIT, **ratelimit}


def prefix_of(key: str) -> str:
    return key.split(".")[0]


def seconds_until(condition: Any, deadline: float) -> float | None:
    """Seconds until `condition()` held, asked every 20 ms; None when it did not within `deadline`."""
    started = time.monotonic()
    while time.monotonic() - started < deadline:
        if condition():
            return time.monotonic() - started
        time.sleep(0.02)
    return None


@pytest.mark.django_db(transaction=True)
def test_a_revocation_reaches_another_app_server_within_two_seconds_on_a_per_process_cache(settings: Any) -> None:
    per_process_cache(settings, CACHE_TTL=300)  # only the announcement can make the other server reload
    seed_tiers()
    prefix = prefix_of(make_key("free"))
    other_server = build_lookups()
    assert other_server.key(prefix).revoked is False  # type: ignore[union-attr]
    assert other_server.tier("free").policies[0].capacity == 10  # type: ignore[union-attr]

    api_key = ApiKey.objects.get(prefix=prefix)
    api_key.revoked = True
    api_key.save()
    took = seconds_until(lambda: other_server.key(prefix).revoked, deadline=2.0)  # type: ignore[union-attr]
    assert took is not None, "the other server still serves the revoked key 2 s later"
    assert get_lookups().key(prefix).revoked is True  # type: ignore[union-attr]

    limit = TierLimit.objects.get(tier__slug="free", name="burst")
    limit.burst = 4
    limit.save()
    assert seconds_until(lambda: other_server.tier("free").policies[0].capacity == 4,  # type: ignore[union-attr]
                         deadline=2.0) is not None


@pytest.mark.django_db(transaction=True)
def test_an_update_reaches_other_servers_through_invalidate_after_the_commit(
        settings: Any, redis_client: redis.Redis, key_prefix: str) -> None:
    per_process_cache(settings, CACHE_TTL=300)
    seed_tiers()
    prefix = prefix_of(make_key("free"))
    other_server = build_lookups()
    assert other_server.key(prefix).revoked is False  # type: ignore[union-attr]
    epoch = redis_client.get(edits_key(key_prefix))
    with transaction.atomic():
        ApiKey.objects.filter(prefix=prefix).update(revoked=True)  # no signals
        invalidate()
        assert get_lookups().key(prefix).revoked is True  # type: ignore[union-attr]  # this process at once
        assert redis_client.get(edits_key(key_prefix)) == epoch  # the others only once it is committed
    assert redis_client.get(edits_key(key_prefix)) != epoch
    assert seconds_until(lambda: other_server.key(prefix).revoked, deadline=2.0) is not None  # type: ignore[union-attr]


@pytest.mark.django_db(transaction=True)
def test_without_redis_other_servers_apply_edits_within_cache_ttl(
        settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    per_process_cache(settings, CACHE_TTL=0.5, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    seed_tiers()
    prefix = prefix_of(make_key("free"))
    other_server = build_lookups()
    assert other_server.key(prefix).revoked is False  # type: ignore[union-attr]
    with caplog.at_level(logging.WARNING, logger="ratelimit_app"):
        api_key = ApiKey.objects.get(prefix=prefix)
        api_key.revoked = True
        api_key.save()  # the announcement fails; the save does not
    assert "could not announce an edit" in caplog.text
    # the cached key expires CACHE_TTL after it was loaded (the deadline adds slack for a loaded machine);
    # the per-process Django cache is no shared layer that would hand the old row back
    assert seconds_until(lambda: other_server.key(prefix).revoked, deadline=0.5 + 1.5) is not None  # type: ignore[union-attr]


@pytest.mark.django_db
def test_the_epoch_is_read_once_a_second_by_a_thread_never_per_lookup(settings: Any, server: RedisProcess) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": server.url}
    seed_tiers()
    admin = redis.Redis.from_url(server.url)
    lookups = get_lookups()
    lookups.tier("free")
    gets, started, lookups_made = command_calls(admin, "get"), time.monotonic(), 0
    while time.monotonic() - started < 2.5:
        assert lookups.tier("free") is not None
        lookups_made += 1
    elapsed = time.monotonic() - started
    reads = command_calls(admin, "get") - gets
    assert 2 <= reads <= elapsed / EDITS_CHECK_INTERVAL + 1, (reads, elapsed)
    assert lookups_made > 100 * reads
    admin.close()


@pytest.mark.django_db
def test_nothing_is_read_while_the_breaker_is_open(settings: Any, server: RedisProcess) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": server.url}
    seed_tiers()
    admin = redis.Redis.from_url(server.url)
    breaker = get_limiter().guard.breaker
    for _ in range(breaker.failures):
        breaker.record_failure(ConnectionError("down"))
    assert breaker.state != "closed"
    gets = command_calls(admin, "get")
    lookups = build_lookups()
    assert lookups.tier("free") is not None
    assert lookups.edits.check() is False
    assert command_calls(admin, "get") == gets
    admin.close()


@pytest.mark.django_db
def test_no_lookup_waits_for_the_epoch(settings: Any, server: RedisProcess) -> None:
    """The epoch is read by a thread of its own: with Redis hung (SIGSTOP) for longer than the reading
    interval, warm lookups answer at once, on an event loop too (no NeedsIO: no thread hop)."""
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": server.url, "BUDGET_MS": 2000}
    seed_tiers()
    lookups = get_lookups()
    assert lookups.tier("free") is not None and lookups.edits.seen != UNSEEN  # the first lookup read the epoch
    assert lookups.client_rules() is not None
    server.process.send_signal(signal.SIGSTOP)
    started, slowest = time.monotonic(), 0.0
    while time.monotonic() - started < 2.5 * EDITS_CHECK_INTERVAL:
        before = time.monotonic()
        with local_only():
            assert lookups.tier("free") is not None and lookups.client_rules() is not None
        slowest = max(slowest, time.monotonic() - before)
    # a lookup that waited for the hung read would take the budget, 2 s (the margin is for a loaded machine)
    assert slowest < 0.5, f"a warm lookup took {slowest * 1000:.0f} ms"


# -- two real app servers -------------------------------------------------------------------------

SETUP = """
import json
from django.contrib.auth import get_user_model
from ratelimit_app.models import ApiKey, Tier, TierLimit
tier = Tier.objects.create(slug="roomy", name="Roomy")
TierLimit.objects.create(tier=tier, name="minute", algorithm="fixed_window", limit=100000, period=60)
keys = {name: ApiKey.objects.create_key(name=name, tier=tier)[1] for name in ("saved", "updated", "admin", "kept")}
get_user_model().objects.create_superuser("staff", "staff@example.com", "staff-password")
print(json.dumps(keys))
"""


@dataclass
class Servers:
    """Two app servers of the demo (gunicorn, one worker each) on one database, and their keys."""

    urls: tuple[str, str]
    keys: dict[str, str]
    env: dict[str, str]

    def status(self, url: str, key: str) -> int:
        return requests.get(f"{url}/api/users", headers={"X-API-Key": key}, timeout=10).status_code

    def refused_everywhere_within(self, key: str, deadline: float) -> float | None:
        """Seconds until both servers answered 401 for `key`, or None after `deadline` seconds."""
        return seconds_until(lambda: all(self.status(url, key) == 401 for url in self.urls), deadline)

    def orm(self, code: str) -> None:
        """Run `code` in `manage.py shell`: a third process, which neither server hears from directly."""
        subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=self.env, check=True,
                       timeout=120, capture_output=True)


@contextlib.contextmanager
def running_servers(tmp_path: Path, **env: str) -> Iterator[Servers]:
    """Two app servers with the settings of tests.support.edits_server_settings and `env`."""
    env = {**os.environ, "RATELIMIT_TEST_DB": str(tmp_path / "db.sqlite3"),
           "DJANGO_SETTINGS_MODULE": "tests.support.edits_server_settings", **env}
    keys = prepare_database(env, SETUP)
    ports = free_port(), free_port()
    first = start_gunicorn(ports[0], env, "--workers", "1")
    try:
        second = start_gunicorn(ports[1], env, "--workers", "1")
        try:
            yield Servers((f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}"), keys, env)
        finally:
            stop_server(second)
    finally:
        stop_server(first)


def admin_revoke(url: str, prefix: str) -> None:
    """Log in to the admin of `url` as staff and run "Revoke selected API keys" on the key `prefix`."""
    session = requests.Session()
    session.get(f"{url}/admin/login/", timeout=10)
    login = session.post(f"{url}/admin/login/?next=/admin/", timeout=10, data={
        "username": "staff", "password": "staff-password", "csrfmiddlewaretoken": session.cookies["csrftoken"]})
    assert login.url.endswith("/admin/"), "the admin login failed"
    changelist = session.get(f"{url}/admin/ratelimit_app/apikey/?q={prefix}", timeout=10)
    pk = changelist.text.split('name="_selected_action" value="')[1].split('"')[0]
    done = session.post(f"{url}/admin/ratelimit_app/apikey/", timeout=10, data={
        "action": "revoke_keys", "_selected_action": pk, "index": "0",
        "csrfmiddlewaretoken": session.cookies["csrftoken"]})
    assert "Revoked 1 API key(s)." in done.text


@pytest.mark.slow
def test_two_app_servers_refuse_a_revoked_key_within_two_seconds(
        tmp_path: Path, redis_url: str, key_prefix: str) -> None:
    with running_servers(tmp_path, REDIS_URL=redis_url, RATELIMIT_TEST_PREFIX=key_prefix) as servers:
        check_revocations(servers)


def check_revocations(servers: Servers) -> None:
    keys = servers.keys
    for url in servers.urls:  # both servers hold every key in their per-process cache (for 300 s)
        assert [servers.status(url, key) for key in keys.values()] == [200] * len(keys)

    saved = prefix_of(keys["saved"])
    servers.orm(f"from ratelimit_app.models import ApiKey\nk = ApiKey.objects.get(prefix={saved!r})\n"
                "k.revoked = True\nk.save()")
    took = servers.refused_everywhere_within(keys["saved"], deadline=2.0)
    assert took is not None, "a key revoked through the ORM was still served 2 s later"

    updated = prefix_of(keys["updated"])
    servers.orm("from ratelimit_app.models import ApiKey\nfrom ratelimit_app.plans.lookups import invalidate\n"
                f"ApiKey.objects.filter(prefix={updated!r}).update(revoked=True)\ninvalidate()")
    assert servers.refused_everywhere_within(keys["updated"], deadline=2.0) is not None

    admin_revoke(servers.urls[0], prefix_of(keys["admin"]))  # in the admin of the first server
    assert servers.refused_everywhere_within(keys["admin"], deadline=2.0) is not None

    assert [servers.status(url, keys["kept"]) for url in servers.urls] == [200, 200]


@pytest.mark.slow
def test_without_redis_two_app_servers_refuse_a_revoked_key_within_cache_ttl(
        tmp_path: Path, key_prefix: str) -> None:
    # No Redis: requests follow the fail mode (open), edits cannot be announced, and each server
    # reloads a key CACHE_TTL (1 s) after it loaded it: from the database, not from its LocMemCache.
    with running_servers(tmp_path, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", RATELIMIT_TEST_PREFIX=key_prefix,
                         RATELIMIT_TEST_CACHE_TTL="1") as servers:
        key = servers.keys["saved"]
        assert [servers.status(url, key) for url in servers.urls] == [200, 200]
        servers.orm("from ratelimit_app.models import ApiKey\n"
                    f"k = ApiKey.objects.get(prefix={prefix_of(key)!r})\nk.revoked = True\nk.save()")
        assert servers.refused_everywhere_within(key, deadline=1 + 2.0) is not None
