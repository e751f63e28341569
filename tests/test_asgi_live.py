"""The demo site under a real ASGI server (uvicorn project.asgi:application), over HTTP: the seed
scenario on a sync view and on an `async def` view, and 8 concurrent clients admitted exactly.

The server has its own SQLite database (the seeded tiers, as migrate makes them) and the shared Redis
under the test's key prefix.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from devtools.embedded import free_port
from tests.conftest import delete_prefix
from tests.support.gunicorn_server import prepare_database, start_server, stop_server
from tests.support.limits_support import check_free_burst, race_of_eight_clients

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PATHS = ["/api/users", "/api/async/users"]

#: Keys made once in the server's database by `manage.py shell`: one per test and path.
SETUP = """
import json
from ratelimit_app.models import ApiKey, Tier
free = Tier.objects.get(slug="free")
names = [use + path for use in ("seed", "race", "drf") for path in PATHS]
print(json.dumps({name: ApiKey.objects.create_key(name=name, tier=free)[1] for name in names}))
""".replace("PATHS", repr(PATHS))


@dataclass
class Site:
    url: str
    keys: dict[str, str]


@pytest.fixture(scope="module")
def site(tmp_path_factory: Any, redis_url: str) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("asgi")
    prefix = f"rltest-asgi-{os.urandom(6).hex()}"
    env = {**os.environ, "REDIS_URL": redis_url, "RATELIMIT_TEST_PREFIX": prefix,
           "DJANGO_SETTINGS_MODULE": "tests.support.asgi_server_settings",
           "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}", "RATELIMIT_LOG_LEVEL": "WARNING"}
    keys = prepare_database(env, SETUP)
    port = free_port()
    command = [str(BIN / "uvicorn"), "project.asgi:application", "--port", str(port), "--log-level", "warning"]
    process = start_server(command, port, env, wait=60)
    try:
        yield Site(f"http://127.0.0.1:{port}", keys)
    finally:
        stop_server(process)
        client = redis.Redis.from_url(redis_url)
        delete_prefix(client, prefix)
        client.close()


@pytest.mark.parametrize("path", PATHS)
def test_seed_scenario_under_uvicorn(site: Site, path: str) -> None:
    session = requests.Session()
    anonymous = session.get(f"{site.url}{path}", timeout=10)
    assert anonymous.status_code == 401 and anonymous.json() == {"error": "API key required"}

    session.headers["X-API-Key"] = site.keys[f"seed{path}"]
    responses = [session.get(f"{site.url}{path}", timeout=10) for _ in range(11)]
    check_free_burst(responses)

    # /health is never limited: more requests than the per-IP limit (100/min), no headers
    health = [session.get(f"{site.url}/health", timeout=10) for _ in range(120)]
    assert all(r.status_code == 200 and r.json() == {"status": "ok", "redis": "up"} for r in health)
    assert not any("X-RateLimit-Limit" in r.headers for r in health)


@pytest.mark.parametrize("path", PATHS)
def test_eight_concurrent_clients_sending_fifty_requests_admit_exactly_ten(site: Site, path: str) -> None:
    key = site.keys[f"race{path}"]
    statuses, elapsed = race_of_eight_clients(site.url, path, key)
    assert len(statuses) == 50
    # the bucket holds 10 and gains one token every 3 s: a race longer than that may admit one more
    refills = int(elapsed // 3)
    assert 10 <= statuses.count(200) <= 10 + refills and statuses.count(200) + statuses.count(429) == 50
    status = requests.get(f"{site.url}/api/rate-limit/status", headers={"X-API-Key": key}, timeout=10).json()
    remaining = {limit["name"]: limit["remaining"] for limit in status["limits"]}
    assert remaining["minute"] == 20 - statuses.count(200)  # denied requests consumed nothing


def test_a_drf_view_keeps_its_throttles_under_uvicorn(site: Site) -> None:
    """DRF views are sync: Django runs them in its thread pool, and their throttles (the caller's tier
    and 30/min for the "items" scope) decide there as under WSGI."""
    session = requests.Session()
    session.headers["X-API-Key"] = site.keys["drf/api/users"]
    responses = [session.get(f"{site.url}/drf/items/", timeout=10) for _ in range(11)]
    assert [r.status_code for r in responses] == [200] * 10 + [429]  # the tier's burst of 10 comes first
    assert responses[0].json() == {"items": [{"id": 1, "name": "widget"}, {"id": 2, "name": "gadget"},
                                             {"id": 3, "name": "gizmo"}]}
    assert responses[-1].headers["X-RateLimit-Tier"] == "free" and "Retry-After" in responses[-1].headers
