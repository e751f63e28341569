"""ratelimit_app.management.commands.ratelimit_loadtest: `_LoadTestResult.percentile`, `_run_load_test`
(every request sent and answered once, progress reported to the end, statuses in order), and the
command's checks of its arguments, its header and method options and its warnings, against a live
demo server."""

from __future__ import annotations

import io
import math
import re
import uuid
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from devtools.embedded import free_port
from ratelimit_app.management.commands.ratelimit_loadtest import _LoadTestResult, _run_load_test
from ratelimit_app.models import ApiKey, Tier, TierLimit


def loadtest(*args: str) -> str:
    out = io.StringIO()
    call_command("ratelimit_loadtest", *args, "--no-progress", stdout=out, stderr=io.StringIO())
    return out.getvalue()


def result(latencies: tuple[float, ...]) -> _LoadTestResult:
    return _LoadTestResult(len(latencies), len(latencies), 1.0, len(latencies), 0, 0, (), latencies, False)


def test_percentiles_are_nearest_ranks_of_the_answered_requests() -> None:
    ten = result(tuple(float(n) for n in (10, 1, 9, 2, 8, 3, 7, 4, 6, 5)))
    assert [ten.percentile(f) for f in (0.0, 0.1, 0.5, 0.9, 0.91, 1.0)] == [1.0, 1.0, 5.0, 9.0, 10.0, 10.0]
    assert result((42.0,)).percentile(0.99) == 42.0
    assert math.isnan(result(()).percentile(0.5))


@pytest.fixture
def key(transactional_db: Any) -> str:
    """A key of a fresh tier of 4 requests a day (nothing refills during the test)."""
    tier = Tier.objects.create(slug=f"lt{uuid.uuid4().hex[:8]}", name="Load test")
    TierLimit.objects.create(tier=tier, name="day", algorithm="fixed_window", limit=4, period=86400)
    return ApiKey.objects.create_key(name="load", tier=tier)[1]


def test_every_request_is_sent_once_and_progress_is_reported_to_the_end(live_server: Any, key: str) -> None:
    progress: list[tuple[int, int]] = []
    seen = _run_load_test(f"{live_server.url}/api/users?page=1", key=key, header="X-API-Key", requests=9,
                         concurrency=3, max_seconds=60, timeout=10,
                         progress=lambda done, total: progress.append((done, total)))
    assert (seen.sent, seen.requested, seen.allowed, seen.blocked, seen.errors) == (9, 9, 4, 5, 0)
    assert seen.statuses == (("200", 4), ("429", 5)) and len(seen.latencies_ms) == 9
    assert not seen.stopped_by_time and seen.seconds > 0
    assert progress[-1] == (9, 9) and all(total == 9 for _, total in progress)
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)


def test_the_key_goes_in_the_header_given_and_a_refused_key_is_pointed_out(live_server: Any, key: str) -> None:
    out = loadtest(f"{live_server.url}/api/users", "--key", key, "--header", "X-Something-Else",
                   "--requests", "3", "--concurrency", "5")
    assert "(X-Something-Else), 3 connection(s)" in out  # never more connections than requests
    assert "Status codes: 401: 3" in out
    assert "401: the server refused the key (unknown, revoked or expired?)." in out


def test_post_requests_cost_what_the_route_declares(live_server: Any, key: str) -> None:
    # /api/data costs 5 per POST: more than the tier's 4 a day, so every POST is refused
    out = loadtest(f"{live_server.url}/api/data", "--key", key, "--method", "POST", "--requests", "2",
                   "--concurrency", "1")
    assert "POST " in out and "Status codes: 429: 2" in out


def test_a_limiter_refusing_for_want_of_redis_is_pointed_out(live_server: Any, key: str, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                          "FAIL_MODE": "closed"}
    out = loadtest(f"{live_server.url}/api/users", "--key", key, "--requests", "2", "--concurrency", "1")
    assert "Status codes: 503: 2" in out
    assert "503: the limiter was unavailable and its fail mode refused requests." in out


def test_errors_are_counted_by_name_after_the_status_codes(db: Any) -> None:
    seen = _run_load_test(f"http://127.0.0.1:{free_port()}/", key="k", header="X-API-Key", requests=3,
                         concurrency=1, max_seconds=60, timeout=5)
    assert seen.statuses == (("ConnectionRefusedError", 3),) and seen.errors == 3 and seen.latencies_ms == ()
    assert math.isnan(seen.percentile(0.5))


@pytest.mark.parametrize(("args", "message"), [
    (["--timeout", "0"], "--timeout: 0 must be more than 0 and at most 300"),
    (["--timeout", "301"], "--timeout: 301 must be more than 0"),
    (["--max-seconds", "3601"], "--max-seconds: 3601 must be more than 0 and at most 3600"),
    (["--concurrency", "0"], "--concurrency: 0 must be from 1 to 256"),
])
def test_bounds_are_named(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=re.escape(message)):
        loadtest("http://127.0.0.1:1/", "--key", "k", *args)


@pytest.mark.parametrize("bad_key", ["", "line\r\nX-Injected: 1", "two\nlines"])
def test_a_key_must_be_one_line(bad_key: str) -> None:
    with pytest.raises(CommandError, match="--key: expected an API key on one line"):
        loadtest("http://127.0.0.1:1/", "--key", bad_key)
