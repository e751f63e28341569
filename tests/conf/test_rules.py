"""ratelimit_app.conf.rules: a rule for every setting, messages that never show a secret, the
width of trusted and metrics networks, exempt paths that would exempt everything, and the cautious
reading of each invalid setting that has one (what service/test_conf.py checks through the settings)."""

from __future__ import annotations

from typing import Any

import pytest

from ratelimit_app.conf.rules import (
    READINGS,
    RULES,
    SECRET_SETTINGS,
    UNREADABLE,
    exempting_everything,
    shown,
)
from ratelimit_app.conf.settings import DEFAULTS


def test_every_setting_has_a_rule_and_every_reading_a_setting() -> None:
    assert set(RULES) | {"IP_RATE"} == set(DEFAULTS)  # IP_RATE is parsed as the middleware parses it
    assert set(READINGS) <= set(DEFAULTS)
    assert SECRET_SETTINGS == {"REDIS_URL", "METRICS_TOKEN", "GATEWAY_SECRET"}


@pytest.mark.parametrize("name", sorted(SECRET_SETTINGS))
def test_a_secret_setting_is_never_shown(name: str) -> None:
    secret = "hunter2hunter2hunter2"
    assert secret not in shown(name, secret) and f"RATELIMIT['{name}'] is invalid" in shown(name, secret)
    assert shown("KEY_PREFIX", "x y") == "RATELIMIT['KEY_PREFIX'] is 'x y'"


@pytest.mark.parametrize(("networks", "valid"), [
    (["10.0.0.0/8", "192.0.2.7", "2001:db8::/16"], True),
    (["10.0.0.0/7"], False), (["0.0.0.0/0"], False), (["::/0"], False), (["2001::/15"], False),
    (["10.0.0.0/33"], False), ("10.0.0.0/8", False), ([7], False),
])
def test_no_trusted_proxy_or_metrics_network_is_wider_than_8_or_16(networks: Any, valid: bool) -> None:
    assert RULES["TRUSTED_PROXIES"][0](networks) is valid
    assert RULES["METRICS_ALLOWED_IPS"][0](networks) is valid


@pytest.mark.parametrize(("prefixes", "exempt", "entry"), [
    (["/api/"], ["/"], "'/'"), (["/api/"], ["/api"], "'/api'"), (["/api/", "/v2/"], ["/v2/"], "'/v2/'"),
    (["/api/"], ["/api/health"], None), (["/api/"], [], None), ("/api/", ["/"], None),  # (an invalid list aside)
    (["/api"], ["/api/"], "'/api/'"), (["/api/v1/"], ["/api"], "'/api'"), (["/api/"], ["/api/./"], "'/api/./'"),
    (["/api/"], ["/ap"], None), (["/apiv2/"], ["/api"], None),  # by segment: "/ap" is not "/api"
])
def test_an_exempt_path_covering_a_whole_limited_prefix(prefixes: Any, exempt: list[str], entry: str | None) -> None:
    problem = exempting_everything({"PATH_PREFIXES": prefixes, "EXEMPT_PATHS": exempt})
    assert (problem is None) if entry is None else (f"entry {entry} exempts every path" in str(problem))


def read(name: str, value: Any, **others: Any) -> Any:
    return READINGS[name](value, {**DEFAULTS, **others})


@pytest.mark.parametrize(("name", "written", "reading"), [
    ("FAIL_MODE", "CLOSED", "closed"), ("FAIL_MODE", "ajar", "closed"), ("FAIL_MODE", None, "closed"),
    ("CONNECTIONS", " Pool ", "pool"), ("CONNECTIONS", "greenlet", UNREADABLE),
    ("IP_ALGORITHM", "leaky", UNREADABLE), ("NINJA_ERROR_FORMAT", "RateLimit", "ratelimit"),
    ("PATH_PREFIXES", None, UNREADABLE), ("PATH_PREFIXES", ("api/",), ["/api/"]),
    ("EXEMPT_PATHS", None, []), ("TRUSTED_PROXIES", -1, UNREADABLE),
    ("TRUSTED_PROXIES", "10.1.0.0/16", ["10.1.0.0/16"]),
    ("METRICS_ALLOWED_IPS", 3, []), ("CACHE_TTL", 0, UNREADABLE), ("CACHE_TTL", 7200.5, 3600),
    ("REQUIRE_API_KEY", " False ", False), ("REQUIRE_API_KEY", "true", True), ("REQUIRE_API_KEY", 0, False),
    ("REQUIRE_API_KEY", "yes", UNREADABLE), ("REQUIRE_API_KEY", None, UNREADABLE),
])
def test_the_cautious_reading_of_an_invalid_value(name: str, written: Any, reading: Any) -> None:
    assert read(name, written) == reading if reading is not UNREADABLE else read(name, written) is UNREADABLE


def test_readings_that_depend_on_another_setting() -> None:
    assert read("EXEMPT_PATHS", ["/api", "/api/health"], PATH_PREFIXES=["/api/"]) == ["/api/health"]
    assert read("EXEMPT_PATHS", ["/api/", "/ap", 3], PATH_PREFIXES=["/api/v1"]) == ["/ap"]  # by segment
    # an unreadable PATH_PREFIXES limits every path: only what exempts all of "/" is dropped
    assert read("EXEMPT_PATHS", ["/", "/health"], PATH_PREFIXES=UNREADABLE) == ["/health"]
    assert read("BREAKER_MAX_COOLDOWN", 0.5, BREAKER_COOLDOWN=2.0) == 2.0
    assert read("BREAKER_MAX_COOLDOWN", 0.5, BREAKER_COOLDOWN="x") is UNREADABLE
    assert read("SHED_LOW_AT", 0.99, SHED_NORMAL_AT=0.9) == 0.9
    # True beside an ANONYMOUS_TIER (an error): the clients that tier would serve are refused, as written
    assert read("REQUIRE_API_KEY", True, ANONYMOUS_TIER="free") is True
