"""Cached lookups: warm lookups make no query, unknown keys are cached negatively (bounded), and a change
saved through the ORM reaches this process at once and every other app server within CACHE_TTL."""

from __future__ import annotations

import math
import signal
import threading
import time
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from devtools.embedded import RedisProcess
from ratelimit_app import Policy
from ratelimit_app.core.apikeys import generate_key
from ratelimit_app.models import ApiKey, Tier, TierLimit, UserTier
from ratelimit_app.plans.lookups import KeyInfo, build_lookups, get_lookups, invalidate
from ratelimit_app.service.bounded import bounded_calls
from tests.support.limits_support import make_key, make_tier, poll, seed_tiers

pytestmark = pytest.mark.django_db




def test_tier_policies_are_compiled_once_and_scoped_limits_add_to_the_base() -> None:
    make_tier("t", [
        ("burst", "token_bucket", 20, 60, 10, ""),
        ("minute", "sliding_window", 20, 60, None, ""),
        ("minute", "sliding_window", 3, 60, None, "write"),
    ])
    tier = get_lookups().tier("t")
    assert tier is not None and tier.fail_mode is None
    assert tier.policies == (Policy("burst", "token_bucket", 20, 60, 10), Policy("minute", "sliding_window", 20, 60))
    assert [p.name for p in tier.policies_for("write")] == ["burst", "minute", "write.minute"]
    assert tier.policies_for("unknown-scope") == tier.policies_for("") == tier.policies
    assert get_lookups().tier("t") is tier  # the same compiled object while cached


def test_disabled_limits_are_not_enforced() -> None:
    tier = make_tier("t", [("minute", "sliding_window", 20, 60, None, ""), ("day", "fixed_window", 9, 86400, None, "")])
    TierLimit.objects.filter(tier=tier, name="day").update(enabled=False)
    invalidate()  # update() bypasses signals
    info = get_lookups().tier("t")
    assert info is not None and [p.name for p in info.policies] == ["minute"]


def test_warm_lookups_make_no_query(django_assert_num_queries: Any) -> None:
    seed_tiers()
    key = make_key("free")
    prefix = key.split(".")[0]
    lookups = get_lookups()
    info = lookups.key(prefix)
    assert isinstance(info, KeyInfo) and info.tier_slug == "free" and info.refusal(time.time()) is None
    assert lookups.tier("free") is not None
    with django_assert_num_queries(0):
        for _ in range(100):
            assert lookups.key(prefix) is info
            assert lookups.tier("free") is not None


def test_a_second_server_is_served_by_the_shared_cache(django_assert_num_queries: Any) -> None:
    seed_tiers()
    prefix = make_key("free").split(".")[0]
    get_lookups().key(prefix)
    get_lookups().tier("free")
    other_server = build_lookups()  # its own empty process cache, the same Django cache
    with django_assert_num_queries(0):
        assert other_server.key(prefix) == get_lookups().key(prefix)
        assert other_server.tier("free") == get_lookups().tier("free")


def test_unknown_keys_are_cached_negatively_and_bounded(settings: Any, django_assert_num_queries: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "NEGATIVE_CACHE_SIZE": 50}
    lookups = get_lookups()
    prefix = generate_key()[0]
    with django_assert_num_queries(1):
        for _ in range(1000):
            assert lookups.key(prefix) is None
    with CaptureQueriesContext(connection) as queries:
        prefixes = [generate_key()[0] for _ in range(200)]
        for unknown in prefixes:
            lookups.key(unknown)
    assert len(queries) == 200
    assert len(lookups.negative) == 50  # bounded; the newest are kept
    with django_assert_num_queries(0):
        for unknown in prefixes[-50:]:
            assert lookups.key(unknown) is None


def test_process_cache_is_bounded(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "LOCAL_CACHE_SIZE": 5}
    seed_tiers()
    prefixes = [make_key("free").split(".")[0] for _ in range(12)]
    lookups = get_lookups()
    for prefix in prefixes:
        assert lookups.key(prefix) is not None
    assert len(lookups.local) == 5


def test_saving_a_limit_applies_at_once_here() -> None:
    seed_tiers()
    before = get_lookups().tier("free")
    assert before is not None and before.policies[0].capacity == 10
    limit = TierLimit.objects.get(tier__slug="free", name="burst")
    limit.burst = 3
    limit.save()
    after = get_lookups().tier("free")
    assert after is not None and after.policies[0].capacity == 3


def test_deleting_a_limit_or_key_applies_at_once_here() -> None:
    seed_tiers()
    key = make_key("free")
    prefix = key.split(".")[0]
    assert get_lookups().key(prefix) is not None
    TierLimit.objects.get(tier__slug="free", name="day").delete()
    info = get_lookups().tier("free")
    assert info is not None and [p.name for p in info.policies] == ["burst", "minute"]
    ApiKey.objects.get(prefix=prefix).delete()
    assert get_lookups().key(prefix) is None


def test_other_servers_apply_a_change_within_cache_ttl(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "CACHE_TTL": 0.5}
    seed_tiers()
    key = make_key("free")
    prefix = key.split(".")[0]
    other_server = build_lookups()
    assert other_server.key(prefix).revoked is False  # type: ignore[union-attr]
    assert other_server.tier("free").policies[0].capacity == 10  # type: ignore[union-attr]

    api_key = ApiKey.objects.get(prefix=prefix)
    api_key.revoked = True
    api_key.save()
    limit = TierLimit.objects.get(tier__slug="free", name="burst")
    limit.burst = 4
    limit.save()
    # The signals cleared this process's cache at once; the other server holds its copy until it
    # expires, CACHE_TTL after it was loaded, or reads the edit's announcement (tests/plans/test_edits.py),
    # whichever comes first (the deadline adds slack for a loaded machine).
    assert get_lookups().key(prefix).revoked is True  # type: ignore[union-attr]
    within = 0.5 + 1.0
    assert poll(lambda: other_server.key(prefix).revoked is True, deadline=within)  # type: ignore[union-attr]
    assert poll(lambda: other_server.tier("free").policies[0].capacity == 4, deadline=within)  # type: ignore[union-attr]


def test_user_tier_assignment(django_user_model: Any) -> None:
    seed_tiers()
    user = django_user_model.objects.create_user("u", password="x")
    lookups = get_lookups()
    assert lookups.user_plan(user.pk)[0] is None
    UserTier.objects.create(user=user, tier=Tier.objects.get(slug="pro"))
    assert lookups.user_plan(user.pk)[0] == "pro"


def test_unknown_tier_is_none_and_cached() -> None:
    lookups = get_lookups()
    assert lookups.tier("nope") is None
    Tier.objects.create(slug="nope", name="Nope")  # the signal invalidates the negative entry too
    assert lookups.tier("nope") is not None


def test_lookups_work_without_the_shared_cache(settings: Any, django_assert_num_queries: Any) -> None:
    from devtools.embedded import free_port

    settings.CACHES = {**settings.CACHES, "down": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2},
    }}
    settings.RATELIMIT = {**settings.RATELIMIT, "CACHE_ALIAS": "down"}
    seed_tiers()
    prefix = make_key("free").split(".")[0]  # saving invalidates: the cache outage must not break it
    lookups = get_lookups()
    assert lookups.key(prefix) is not None and lookups.tier("free") is not None
    with django_assert_num_queries(0):
        assert lookups.key(prefix) is not None


@pytest.mark.django_db(transaction=True)  # the lookups run in threads of their own, which see committed rows
def test_a_hung_shared_cache_costs_a_lookup_no_more_than_the_budget(settings: Any, server: RedisProcess) -> None:
    # django-redis with its default options: no socket timeout, a read waits as long as the server does
    settings.CACHES = {**settings.CACHES, "hung": {"BACKEND": "django_redis.cache.RedisCache",
                                                   "LOCATION": server.url}}
    settings.RATELIMIT = {**settings.RATELIMIT, "CACHE_ALIAS": "hung", "BUDGET_MS": 100}
    seed_tiers()
    prefix = make_key("free").split(".")[0]
    lookups = get_lookups()
    assert lookups.tier("free") is not None  # shared while the cache answers
    lookups.clear_local()
    server.process.send_signal(signal.SIGSTOP)
    try:
        timings = [timed_lookup(lambda: lookups.tier("free")), timed_lookup(lambda: lookups.key(prefix)),
                   timed_lookup(lambda: lookups.client_rules())]
    finally:
        server.process.send_signal(signal.SIGCONT)
    assert all(found is not None for found, _ in timings)  # read from the database
    # the first waits out the budget; while its call is still unanswered the others skip the cache
    first, *others = [took for _, took in timings]
    assert 0.1 <= first < 0.6 and all(took < 0.3 for took in others), timings
    assert poll(lambda: bounded_calls.overdue == 0, deadline=10)  # the hung call ended with the pause
    lookups.clear_local()
    assert lookups.tier("free") is not None and bounded_calls.overdue == 0


def timed_lookup(lookup: Any) -> tuple[Any, float]:
    """`lookup()` and how long it took, or (None, inf) when it has not returned within 10 s (it hung)."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(lookup())
        finally:
            connections.close_all()  # this thread's own database connection

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    return (result[0], time.monotonic() - started) if result else (None, math.inf)
