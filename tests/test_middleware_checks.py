"""ratelimit_app.middleware_checks: RateLimitMiddleware listed once (ratelimit.E022), and PATH_PREFIXES
matching URLs of the site (ratelimit.W021), through `manage.py check` on the demo's URLconf."""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_checks import ratelimit_messages


@pytest.mark.parametrize("prefixes", [[], ["/API/"], ["/api/", "/nowhere/"], ["/api/user"], ["/ap"]])
def test_path_prefixes_that_limit_no_url_of_the_site_are_a_warning(settings: Any, prefixes: list[str]) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "PATH_PREFIXES": prefixes}
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.W021"]
    assert "RATELIMIT['PATH_PREFIXES']" in messages[0].msg
    assert ("limits no path" if not prefixes else f"{prefixes[-1]!r} matches no URL") in messages[0].msg


@pytest.mark.urls("tests.support.no_api_urls")
def test_the_default_prefix_on_a_site_without_an_api_yet_is_no_warning(settings: Any) -> None:
    """The README's quick start on a fresh `startproject`: PATH_PREFIXES left at its default ['/api/'] while
    no view is there yet (a request there is still charged: a 404 is a request). Only prefixes the project
    wrote itself are checked against its URLs."""
    settings.RATELIMIT = {key: value for key, value in settings.RATELIMIT.items() if key != "PATH_PREFIXES"}
    assert ratelimit_messages() == []
    settings.RATELIMIT = {**settings.RATELIMIT, "PATH_PREFIXES": ["/api/"]}  # written: a prefix that limits no view
    assert [m.id for m in ratelimit_messages()] == ["ratelimit.W021"]


def test_path_prefixes_under_a_route_with_converters_or_regexes_are_recognised(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "PATH_PREFIXES": ["/api/", "/drf/items/", "/public/quote", "/api",
                                                                 "/api/users/"]}
    assert ratelimit_messages() == []


def test_the_middleware_listed_twice_is_an_error(settings: Any) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "ratelimit_app.middleware.RateLimitMiddleware"]
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.E022"]
    assert "charged twice" in messages[0].msg


@pytest.mark.parametrize(("name", "value", "said"), [
    ("PATH_PREFIXES", ["/api/", "/v2/?x=1"], "'/v2/?x=1' looks like a typo: paths never hold a query string"),
    ("EXEMPT_PATHS", ["/api/health "], "'/api/health ' looks like a typo: it holds whitespace"),
    ("EXEMPT_PATHS", ["/api//health"], "'/api//health' looks like a typo: it holds '//', '.' or '..': it is "
                                       "matched as '/api/health'"),
    ("EXEMPT_PATHS", ["/api/../health"], "matched as '/health'"),
    ("PATH_PREFIXES", ["/api/", "/caf%C3%A9"], "percent-escape"),
    ("SHED_PRIORITIES", {"/api/reports/./": "low"}, "RATELIMIT['SHED_PRIORITIES'] entry '/api/reports/./'"),
    ("SHED_PRIORITIES", {"/api/reports": "low", "/api/reports/": "critical"},
     "entries '/api/reports' and '/api/reports/' are one prefix"),
])
def test_a_path_prefix_that_looks_like_a_typo_is_a_warning(settings: Any, name: str, value: Any, said: str) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, name: value}
    messages = [m for m in ratelimit_messages() if m.id != "ratelimit.W021"]  # a typo also matches no URL
    assert [m.id for m in messages] == ["ratelimit.W022"] and said in messages[0].msg
    assert "by segment" in (messages[0].hint or "")


def test_prefixes_written_as_paths_are_matched_raise_no_typo_warning(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "PATH_PREFIXES": ["/api", "/public/quote"],
                          "EXEMPT_PATHS": ["/api/health/", "/.well-known/"],
                          "SHED_PRIORITIES": {"/api/export": "low", "/api/export/": "low", "/api/checkout": "critical"}}
    assert ratelimit_messages() == []
