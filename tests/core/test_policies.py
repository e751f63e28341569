from __future__ import annotations

import pytest

from ratelimit_app import InvalidPolicy, Policy, parse_rate


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        ("20/m", (20, 60)),
        ("5/10m", (5, 600)),
        ("1000/d", (1000, 86400)),
        ("3/30s", (3, 30)),
        ("100/h", (100, 3600)),
        (" 7 / 2h ", (7, 7200)),
        ("10/minute", (10, 60)),
    ],
)
def test_parse_rate(rate: str, expected: tuple[int, int]) -> None:
    assert parse_rate(rate) == expected


@pytest.mark.parametrize("rate", ["", "20", "20/", "/m", "x/m", "20/0m", "20/w", "-1/m", "20/m/s"])
def test_parse_rate_rejects_garbage(rate: str) -> None:
    with pytest.raises(InvalidPolicy, match="rate|period"):
        parse_rate(rate)


def test_policy_parse_builds_the_policy() -> None:
    policy = Policy.parse("5/10m", name="burst", algorithm="gcra")
    assert policy == Policy("burst", "gcra", limit=5, period=600)
    assert policy.capacity == 5
    assert Policy("b", "token_bucket", limit=20, period=60, burst=10).capacity == 10


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "", "algorithm": "gcra", "limit": 1, "period": 1}, "name"),
        ({"name": "a{b}", "algorithm": "gcra", "limit": 1, "period": 1}, "name"),
        ({"name": "a", "algorithm": "leaky", "limit": 1, "period": 1}, "algorithm"),
        ({"name": "a", "algorithm": "gcra", "limit": 0, "period": 1}, "limit"),
        ({"name": "a", "algorithm": "gcra", "limit": 2.5, "period": 1}, "limit"),
        ({"name": "a", "algorithm": "gcra", "limit": 1, "period": 0}, "period"),
        ({"name": "a", "algorithm": "gcra", "limit": 1, "period": "60"}, "period"),
        ({"name": "a", "algorithm": "fixed_window", "limit": 1, "period": 1, "burst": 5}, "burst"),
        ({"name": "a", "algorithm": "token_bucket", "limit": 1, "period": 1, "burst": 0}, "burst"),
    ],
)
def test_invalid_policy_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidPolicy, match=f"^{field}:"):
        Policy(**kwargs)


def test_state_ttl_covers_each_algorithm() -> None:
    assert Policy("a", "fixed_window", limit=5, period=60).state_ttl == 60
    assert Policy("a", "sliding_window_counter", limit=5, period=60).state_ttl == 120
    assert Policy("a", "token_bucket", limit=20, period=60, burst=10).state_ttl == 30
    assert Policy("a", "gcra", limit=20, period=60, burst=40).state_ttl == 120


@pytest.mark.parametrize(
    ("rate", "expected"),
    [("100/hr", (100, 3600)), ("10/mins", (10, 60)), ("5/secs", (5, 1)), ("0/day", (0, 86400)),
     ("3/500ms", (3, 0.5)), ("2/hrs", (2, 3600))],
)
def test_parse_rate_reads_drf_spellings_and_milliseconds(rate: str, expected: tuple[int, float]) -> None:
    assert parse_rate(rate) == expected


@pytest.mark.parametrize(
    ("period", "printed"),
    [(60, "20/m"), (600, "20/10m"), (30 * 86400, "20/30d"), (3600, "20/h"), (90, "20/90s"), (1.5, "20/1500ms"),
     (0.001, "20/ms")],
)
def test_policy_rate_prints_a_rate_that_parses_back(period: float, printed: str) -> None:
    policy = Policy("p", "fixed_window", limit=20, period=period)
    assert policy.rate == printed
    assert Policy.parse(policy.rate, name="p", algorithm="fixed_window") == policy
