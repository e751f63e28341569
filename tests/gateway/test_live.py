"""Gateway mode end to end: real nginx and Caddy processes run the first configuration block of their
section in docs/gateway.md (ports changed, nothing else), in front of a counting service that is not
Django, with the demo site under gunicorn as the Django app and the shared Redis.

Skipped when nginx or caddy is not installed, unless RATELIMIT_REQUIRE_GATEWAYS=1 (set by `.ci/run`):
then it fails, CI must run it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from devtools.embedded import free_port
from tests.conftest import delete_prefix
from tests.support.gateway_service import CountingService
from tests.support.gateways import Gateway, doc_block, missing_gateways, start_caddy, start_nginx, with_ports
from tests.support.gunicorn_server import prepare_database, start_server, stop_server
from tests.support.limits_support import check_free_burst, parse_ietf, poll

MISSING = missing_gateways()
REQUIRE_GATEWAYS = os.environ.get("RATELIMIT_REQUIRE_GATEWAYS") == "1"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(MISSING is not None and not REQUIRE_GATEWAYS, reason=f"gateways: {MISSING}")]

#: Made once in the Django app's database by `manage.py shell`: a tier with a global limit and one for the
#: service "orders", 2 slots for the free tier, and the keys the tests use (each test its own, per gateway).
SETUP = """
import json
from ratelimit_app.models import ApiKey, Tier, TierLimit
services = Tier.objects.create(slug="services", name="Services")
TierLimit.objects.create(tier=services, name="minute", algorithm="fixed_window", limit=5, period=60)
TierLimit.objects.create(tier=services, name="minute", algorithm="fixed_window", limit=2, period=60, scope="orders")
# the seeded tiers have no concurrency limit: the free tier's keys here hold 2 slots, as staff would set
TierLimit.objects.create(tier=Tier.objects.get(slug="free"), name="concurrency", algorithm="concurrency", limit=2,
                         period=60)
keys = {}
for gateway in ("nginx", "caddy"):
    for name, tier in [("burst", "free"), ("slots", "free"), ("services", "services")]:
        keys[f"{gateway}-{name}"] = ApiKey.objects.create_key(name=name, tier=Tier.objects.get(slug=tier))[1]
print(json.dumps(keys))
"""


@dataclass
class DjangoApp:
    port: int
    keys: dict[str, str]


@dataclass
class Site:
    """A gateway in front of its own counting service, and the keys of its tests."""

    gateway: Gateway
    service: CountingService
    keys: dict[str, str]

    def get(self, session: requests.Session, path: str, key: str) -> requests.Response:
        return session.get(f"{self.gateway.url}{path}", headers={"X-API-Key": key}, timeout=30)

    def key(self, name: str) -> str:
        return self.keys[f"{self.gateway.kind}-{name}"]


@pytest.fixture(scope="module")
def django_app(tmp_path_factory: Any, redis_url: str) -> Iterator[DjangoApp]:
    if MISSING is not None:
        pytest.fail(f"RATELIMIT_REQUIRE_GATEWAYS=1, but {MISSING}")
    tmp = tmp_path_factory.mktemp("gateway-django")
    prefix = f"rltest-gw-{os.urandom(6).hex()}"
    env = {**os.environ, "REDIS_URL": redis_url, "RATELIMIT_TEST_PREFIX": prefix, "RATELIMIT_LOG_LEVEL": "WARNING",
           "DJANGO_SETTINGS_MODULE": "tests.support.gateway_server_settings",
           "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}"}
    keys = prepare_database(env, SETUP)
    port = free_port()
    command = [str(Path(sys.executable).parent / "gunicorn"), "project.wsgi:application", "--bind",
               f"127.0.0.1:{port}", "--workers", "2", "--threads", "8", "--worker-class", "gthread"]
    process = start_server(command, port, env)
    try:
        yield DjangoApp(port, keys)
    finally:
        stop_server(process)
        client = redis.Redis.from_url(redis_url)
        delete_prefix(client, prefix)
        client.close()


@pytest.fixture(scope="module", params=["nginx", "caddy"])
def site(request: Any, django_app: DjangoApp, tmp_path_factory: Any) -> Iterator[Site]:
    kind = request.param
    # nginx gives the slots back itself (post_action); behind Caddy the service reports the end of a request
    release = f"http://127.0.0.1:{django_app.port}/ratelimit/release" if kind == "caddy" else None
    service = CountingService(release_url=release)
    port = free_port()
    directory = tmp_path_factory.mktemp(f"gateway-{kind}")
    if kind == "nginx":
        block = with_ports(doc_block("nginx"), django=django_app.port, service=service.port, listen=port,
                           listen_pattern="listen {};")
        gateway = start_nginx(block, directory, port)
    else:
        block = with_ports(doc_block("caddyfile"), django=django_app.port, service=service.port, listen=port,
                           listen_pattern=":{} {{")
        gateway = start_caddy(block, directory, port)
    try:
        yield Site(gateway, service, django_app.keys)
    finally:
        gateway.stop()
        service.stop()


def test_a_free_keys_eleventh_request_is_429_and_never_reaches_the_service(site: Site) -> None:
    session = requests.Session()
    responses = [site.get(session, f"/burst/{i}", site.key("burst")) for i in range(11)]
    check_free_burst(responses)  # 10 admitted, the 11th 429 with Retry-After and the rate limit headers
    refused = responses[-1]
    assert refused.headers["Content-Type"] == "application/json"
    assert parse_ietf(refused.headers["RateLimit-Policy"])["burst"] == {"q": 10, "w": 30}
    assert [site.service.received[f"/burst/{i}"] for i in range(11)] == [1] * 10 + [0]
    # every admitted request gave its slot of the free tier back when it ended
    assert parse_ietf(responses[9].headers["RateLimit"])["concurrency"]["r"] == 1
    if site.gateway.kind == "caddy":
        assert (site.service.released, site.service.release_failures) == (10, [])


def test_a_bad_key_is_401(site: Site) -> None:
    session = requests.Session()
    before = site.service.total()
    unknown = site.get(session, "/bad/1", site.key("burst")[:-4] + "AAAA")
    assert unknown.status_code == 401 and unknown.json() == {"error": "unknown API key"}
    assert unknown.headers["WWW-Authenticate"] == 'Bearer realm="api"'
    malformed = site.get(session, "/bad/2", "not-a-key")
    assert malformed.status_code == 401 and malformed.json() == {"error": "malformed API key"}
    missing = session.get(f"{site.gateway.url}/bad/3", timeout=30)
    assert missing.status_code == 401 and missing.json() == {"error": "API key required"}
    assert site.service.total() == before


def test_a_per_service_limit_applies_to_its_service_only(site: Site) -> None:
    session = requests.Session()
    key = site.key("services")
    orders = [site.get(session, f"/orders/{i}", key) for i in range(3)]
    assert [r.status_code for r in orders] == [200, 200, 429]
    assert orders[2].json()["policy"] == "orders.minute"
    assert parse_ietf(orders[0].headers["RateLimit-Policy"]).keys() == {"ip", "minute", "orders.minute"}
    # elsewhere only the global limit applies; the two orders admitted count in it
    search = [site.get(session, f"/search/{i}", key) for i in range(4)]
    assert [r.status_code for r in search] == [200, 200, 200, 429]
    assert parse_ietf(search[0].headers["RateLimit-Policy"]).keys() == {"ip", "minute"}
    assert search[3].json()["policy"] == "minute"
    assert sum(site.service.received[f"/orders/{i}"] for i in range(3)) == 2
    assert sum(site.service.received[f"/search/{i}"] for i in range(4)) == 3


def test_a_slot_is_held_while_a_request_runs_and_comes_back_when_it_ends(site: Site) -> None:
    key = site.key("slots")
    slow = [threading.Thread(target=lambda: site.get(requests.Session(), "/slow?ms=1500", key)) for _ in range(2)]
    for thread in slow:
        thread.start()
    assert poll(lambda: site.service.received["/slow"] == 2, 20), "the slow requests never reached the service"
    third = site.get(requests.Session(), "/fast", key)  # both slots of the free tier are held
    assert third.status_code == 429 and third.json()["policy"] == "concurrency"
    assert third.headers["Retry-After"] and site.service.received["/fast"] == 0
    for thread in slow:
        thread.join(timeout=30)
    # given back at the end of the requests, long before their 60-second lease runs out
    assert poll(lambda: site.get(requests.Session(), "/fast", key).status_code == 200, 20)
