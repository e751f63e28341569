"""ratelimit_app.conf.paths: the one normalisation of a path, its readings, segment-by-segment prefix
matching (a trailing slash changes nothing) and the prefixes that look like typos."""

from __future__ import annotations

import pytest

from ratelimit_app.conf.paths import PathPrefixes, limited, normalize, prefix_form, readings, typo


@pytest.mark.parametrize(("path", "normal"), [
    ("/api/users", "/api/users"),
    ("/api/users/", "/api/users/"),
    ("/checkout/../export/report", "/export/report"),
    ("/a/./b/", "/a/b/"),
    ("/a/b/.", "/a/b/"),
    ("/a/b/..", "/a/"),
    ("/../../etc", "/etc"),  # never above the root
    ("/..", "/"),
    ("//api///users", "/api/users"),
    ("/api//", "/api/"),
    ("//", "/"),
    ("/checkout//../export", "/export"),  # slashes merged first, as nginx does
    ("/.well-known/x", "/.well-known/x"),
    ("/a/...b/..c", "/a/...b/..c"),  # only "." and ".." are dot segments
    ("*", "*"),
])
def test_normalize_merges_slashes_and_resolves_dot_segments(path: str, normal: str) -> None:
    assert normalize(path) == normal


def test_a_path_is_read_as_sent_and_normalised_when_they_differ() -> None:
    assert readings("/api/users") == ("/api/users",)
    assert readings("/api/x/../users") == ("/api/x/../users", "/api/users")


def test_prefixes_match_by_segment_and_a_trailing_slash_changes_nothing() -> None:
    health = PathPrefixes.of(["/api/health"])
    assert [health.match(p) for p in ("/api/health", "/api/health/", "/api/health/db")] == [True] * 3
    assert [health.match(p) for p in ("/api/healthcare", "/api/healthz/x", "/api", "/api/")] == [False] * 4
    api = PathPrefixes.of(["/api/"])
    assert prefix_form("/api/") == prefix_form("/api") == prefix_form("/api//") == "/api/"
    assert [api.match(p) for p in ("/api", "/api/", "/api/users")] == [True] * 3
    assert [api.match(p) for p in ("/apis", "/apix/users", "/")] == [False] * 3
    everything = PathPrefixes.of(["/"])
    assert everything.match("/") and everything.match("/anything/at/all")
    assert not PathPrefixes.of([]).match("/api")


@pytest.mark.parametrize(("path", "expected"), [
    ("/api/users", True), ("/api/health", False), ("/api/health/db", False), ("/api/healthcare", True),
    ("/api/health/../users", True), ("/api/users/../health", True),  # limited as sent
    ("/health/../api/users", True), ("//api/users", True),  # limited normalised
    ("/health/x", False), ("/apis", False), ("/api//health", True),  # as sent, "/api//health" is not exempt
])
def test_a_path_is_limited_when_either_reading_is(path: str, expected: bool) -> None:
    assert limited(path, PathPrefixes.of(["/api/"]), PathPrefixes.of(["/api/health", "/health"])) is expected


def test_the_longest_prefix_is_found_whatever_the_order_written() -> None:
    prefixes = PathPrefixes.of(["/api", "/api/checkout/preview", "/api/checkout/"])
    assert prefixes.longest("/api/checkout/pay") == "/api/checkout/"
    assert prefixes.longest("/api/checkout/preview/1") == "/api/checkout/preview"
    assert prefixes.longest("/api/checkoutx") == "/api"
    assert prefixes.longest("/other") is None


@pytest.mark.parametrize(("prefix", "why"), [
    ("/api/?v=1", "query string"),
    ("/api#top", "fragment"),
    ("/api/ ", "whitespace"),
    ("/api\t/x", "whitespace"),
    ("/caf%C3%A9", "percent-escape"),
    ("/api//v1", "matched as '/api/v1'"),
    ("/api/../admin", "matched as '/admin'"),
    ("/api/./v1", "matched as '/api/v1'"),
])
def test_a_prefix_that_looks_like_a_typo_says_why(prefix: str, why: str) -> None:
    reason = typo(prefix)
    assert reason is not None and why in reason


def test_ordinary_prefixes_are_not_typos() -> None:
    assert [typo(p) for p in ("/", "/api/", "/api", "/.well-known/", "/café", "/api/v1.2/")] == [None] * 6
