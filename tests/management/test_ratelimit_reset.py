"""`ratelimit_reset` takes effect on every app server within a second, not only in its own process:
another server's local deny cache stops refusing the client once the reset is announced."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from devtools.embedded import free_port
from tests.support.gunicorn_server import ROOT, http_get, start_gunicorn
from tests.support.reset_server_settings import LIMITS


@pytest.fixture
def other_server(tmp_path: Path, redis_url: str, key_prefix: str) -> Iterator[int]:
    """A gunicorn worker in its own process (the demo, limited under this test's key prefix); its port."""
    env = {**os.environ, "REDIS_URL": redis_url, "RATELIMIT_TEST_PREFIX": key_prefix,
           "RATELIMIT_TEST_DB": str(tmp_path / "db.sqlite3"),
           "DJANGO_SETTINGS_MODULE": "tests.support.reset_server_settings"}
    subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True,
                   timeout=120)
    port = free_port()
    server = start_gunicorn(port, env, "--workers", "1")
    try:
        yield port
    finally:
        server.terminate()
        server.communicate(timeout=30)


@pytest.mark.django_db
def test_the_other_server_serves_the_client_again_within_a_second_of_the_reset(
    other_server: int, settings: Any
) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, **LIMITS}  # this process resets what the server limits
    port = other_server
    # an anonymous client on the free tier, 3 requests per minute per IP: the 4th is refused, and the
    # refusals that follow come from the other server's deny cache (for about a minute)
    assert [http_get(port, "/api/users") for _ in range(6)] == [200, 200, 200, 429, 429, 429]

    out = io.StringIO()
    call_command("ratelimit_reset", "ip:127.0.0.1", "--yes", stdout=out)
    reset_at = time.monotonic()
    # the per-IP limit, the free tier's 3 and its 3 WebSocket limits, the seeded tiers' own per-IP limits
    assert "Reset 10 limit(s)" in out.getvalue()
    statuses = []
    while time.monotonic() - reset_at < 5:
        statuses.append(http_get(port, "/api/users"))
        if statuses[-1] == 200:
            break
        time.sleep(0.02)
    served_after = time.monotonic() - reset_at
    assert statuses[-1] == 200, f"still refused 5 s after the reset: {statuses[:5]}..."
    assert served_after < 1.0, f"served again only {served_after:.2f} s after the reset"
    assert set(statuses[:-1]) <= {429}
