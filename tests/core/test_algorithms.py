"""ratelimit_app.core.algorithms: the registry everything else reads. Which names a Policy and the admin
accept, which algorithms take a burst, which keep their state in a key of their own (checked in Redis)."""

from __future__ import annotations

import dataclasses
from typing import cast

import pytest
import redis
from django import forms

from ratelimit_app import InvalidPolicy, Policy, RateLimiter, new_lease_token
from ratelimit_app.core.algorithms import BY_NAME, CALENDAR_WINDOW, REGISTRY, SCRIPTED, Algorithm
from ratelimit_app.core.policies import ALL_ALGORITHMS, MAX_LIMIT, MAX_PERIOD_SECONDS
from ratelimit_app.models import AlgorithmField, TierLimit


def test_by_name_indexes_exactly_the_registry_and_leaves_the_calendar_window_out() -> None:
    assert list(BY_NAME) == [algorithm.name for algorithm in REGISTRY]
    assert all(BY_NAME[algorithm.name] is algorithm for algorithm in REGISTRY)
    assert CALENDAR_WINDOW.name not in BY_NAME
    assert SCRIPTED == (*REGISTRY, CALENDAR_WINDOW)


def test_policies_and_the_admin_offer_the_registry_in_its_order_and_nothing_else() -> None:
    field = TierLimit._meta.get_field("algorithm")
    assert isinstance(field, AlgorithmField)
    assert [name for name, _ in field.choices or ()] == [algorithm.name for algorithm in REGISTRY]
    select = field.formfield()
    assert isinstance(select, forms.TypedChoiceField)  # the admin shows a select
    assert [name for name, _ in cast(list, select.choices)[1:]] == [algorithm.name for algorithm in REGISTRY]
    for algorithm in REGISTRY:
        assert Policy("p", algorithm.name, limit=5, period=60).algorithm == algorithm.name
    with pytest.raises(InvalidPolicy, match="algorithm"):
        Policy("p", CALENDAR_WINDOW.name, limit=5, period=60)  # chosen through Policy.calendar, never by name


@pytest.mark.parametrize("algorithm", REGISTRY, ids=lambda a: a.name)
def test_a_burst_is_accepted_exactly_where_the_registry_says(algorithm: Algorithm) -> None:
    if algorithm.takes_burst:
        assert Policy("p", algorithm.name, limit=5, period=60, burst=20).capacity == 20
    else:
        with pytest.raises(InvalidPolicy, match="burst"):
            Policy("p", algorithm.name, limit=5, period=60, burst=20)
    row = TierLimit(name="p", algorithm=algorithm.name, limit=5, period=60, burst=20)
    errors = _clean_errors(row)
    assert ("burst" in errors) is not algorithm.takes_burst


def test_a_new_algorithm_needs_no_migration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The choices are read from the registry, never written into a migration."""
    _, path, args, kwargs = AlgorithmField().deconstruct()
    assert (path, args, kwargs) == ("ratelimit_app.models.AlgorithmField", [], {"max_length": 30})
    monkeypatch.setattr("ratelimit_app.models.ALL_ALGORITHMS", (*ALL_ALGORITHMS, "leaky_bucket"))
    field = AlgorithmField()
    assert field.choices is not None and field.choices[-1] == ("leaky_bucket", "leaky bucket")
    assert field.deconstruct()[1:] == (path, args, kwargs)


@pytest.mark.parametrize("algorithm", REGISTRY, ids=lambda a: a.name)
def test_a_policy_is_refused_exactly_when_its_largest_state_would_not_be_exact_in_lua(algorithm: Algorithm) -> None:
    refused = 0
    for limit, period in ((MAX_LIMIT, MAX_PERIOD_SECONDS), (MAX_LIMIT, 1), (5, 60)):
        if algorithm.largest_state(limit, limit, period * 1000) < 2**53:
            assert Policy("p", algorithm.name, limit=limit, period=period).limit == limit
        else:
            refused += 1
            with pytest.raises(InvalidPolicy, match="too large to count exactly"):
                Policy("p", algorithm.name, limit=limit, period=period)
    assert refused == (1 if algorithm.name == "token_bucket" else 0)  # tokens are counted in ms parts


def _clean_errors(row: TierLimit) -> dict[str, list[str]]:
    from django.core.exceptions import ValidationError

    try:
        row.clean()
    except ValidationError as exc:
        return exc.message_dict
    return {}


def test_exactly_one_algorithm_counts_slots_and_it_keeps_them_in_a_sorted_set_of_its_own(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    [slots] = [algorithm for algorithm in REGISTRY if algorithm.concurrency]
    limiter = RateLimiter(redis_client, prefix=key_prefix)
    rate = Policy("minute", "fixed_window", limit=5, period=60)
    held = Policy("inflight", slots.name, limit=2, period=30)
    lease = new_lease_token()
    assert limiter.hit("client", [rate, held], lease=lease).allowed
    rate_key, slot_key = limiter.keys("client", [rate, held])
    assert rate_key != slot_key and slot_key.endswith(f"{slots.letter}inflight")
    assert redis_client.type(slot_key) == b"zset" and redis_client.zrange(slot_key, 0, -1) == [lease.encode()]


def test_a_sliding_log_moves_to_a_key_of_its_own_from_its_long_state_limit(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    [long_logs] = [algorithm for algorithm in REGISTRY if algorithm.long_state_from]
    assert long_logs.text_state  # a log of timestamps: bytes, never read as an integer
    limiter = RateLimiter(redis_client, prefix=key_prefix)
    short = Policy("short", long_logs.name, limit=long_logs.long_state_from - 1, period=60)
    long = dataclasses.replace(short, name="long", limit=long_logs.long_state_from)
    assert limiter.hit("client", [short, long]).allowed
    shared, own = limiter.keys("client", [short, long])
    assert own != shared and own.endswith(f"{long_logs.letter}long")
    assert redis_client.exists(shared) and redis_client.exists(own)
    others = [algorithm for algorithm in REGISTRY if not algorithm.concurrency and not algorithm.long_state_from]
    for algorithm in others:  # every other rate algorithm shares the identity's key at any limit
        policy = Policy("big", algorithm.name, limit=10**6, period=60)
        assert limiter.keys("client", [policy]) == [shared]
