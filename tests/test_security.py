"""Security: spoofed client IPs, floods of random keys, oversized headers, keys never stored, echoed or logged,
and no client input in Redis key names."""

from __future__ import annotations

import logging
import re
import socket
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import requests
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ratelimit_app.core.apikeys import generate_key
from ratelimit_app.plans.lookups import get_lookups
from tests.support.limits_support import make_key, seed_tiers, set_ip_rate

ONE_MIB = 1 << 20


def use(settings: Any, **values: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, **values}


def engine_keys(redis_client: redis.Redis, prefix: str) -> list[str]:
    """Every rate-limit state key this test wrote (metrics keys, `<prefix>:{metrics}:...`, aside)."""
    keys = [k.decode() for k in redis_client.scan_iter(match=f"{prefix}:*", count=1000)]
    return [k for k in keys if not k.startswith(f"{prefix}:{{metrics}}")]


#: an identity's key, or a policy's key of its own (a long sliding log's units; concurrency slots)
KEY_NAME = re.compile(r"[A-Za-z0-9_.:-]+:\{[0-9a-f]{24}\}([tsfgcqk][A-Za-z0-9_.-]+)?")


@pytest.mark.django_db(transaction=True)
def test_spoofed_forwarded_for_is_ignored_without_trusted_proxies(live_server: Any, settings: Any) -> None:
    use(settings, IP_RATE="3/m")
    url = f"{live_server.url}/api/users"
    statuses = [requests.get(url, headers={"X-Forwarded-For": f"198.51.100.{i}"}, timeout=10).status_code
                for i in range(5)]
    assert statuses == [401, 401, 401, 429, 429]  # one client, whatever it claims


@pytest.mark.django_db
def test_forwarded_for_is_used_only_behind_trusted_proxies(client: Any, settings: Any) -> None:
    use(settings, IP_RATE="1/m", TRUSTED_PROXIES=["10.0.0.0/8"])
    via_proxy = {"REMOTE_ADDR": "10.0.0.2"}
    assert client.get("/api/users", HTTP_X_FORWARDED_FOR="198.51.100.1", **via_proxy).status_code == 401
    assert client.get("/api/users", HTTP_X_FORWARDED_FOR="198.51.100.1", **via_proxy).status_code == 429
    assert client.get("/api/users", HTTP_X_FORWARDED_FOR="198.51.100.2", **via_proxy).status_code == 401
    # A client that is not a trusted proxy cannot pick an address by sending the header.
    direct = {"REMOTE_ADDR": "203.0.113.9"}
    assert client.get("/api/users", HTTP_X_FORWARDED_FOR="198.51.100.3", **direct).status_code == 401
    assert client.get("/api/users", HTTP_X_FORWARDED_FOR="198.51.100.4", **direct).status_code == 429


@pytest.mark.django_db
@pytest.mark.slow
def test_ten_thousand_random_keys_cause_a_bounded_number_of_queries(client: Any, settings: Any) -> None:
    # The exact per-IP algorithm: the default (sliding_window_counter) may let one more through when the
    # run crosses a minute boundary, and this test counts exactly.
    # An hour's window: on a loaded machine the 10,000 requests may take longer than a minute, and a
    # minute's window would then let more than 100 through.
    use(settings, IP_ALGORITHM="sliding_window", IP_RATE="100/h")
    keys = [generate_key()[1] for _ in range(10_000)]
    get_lookups().client_rules()  # the allow/deny rules: loaded once per CACHE_TTL per process, not per key
    with CaptureQueriesContext(connection) as queries:
        statuses = [client.get("/api/users", HTTP_X_API_KEY=key).status_code for key in keys]
    # The per-IP limit (100/h) is checked before any lookup of a key this process has not seen:
    # one query for each of the 100 keys it lets through, none for the rest.
    assert statuses.count(401) == 100 and statuses.count(429) == 9_900
    assert len(queries) <= 100


@pytest.mark.django_db
def test_repeated_unknown_keys_are_answered_from_the_negative_cache(client: Any, settings: Any,
                                                                    django_assert_max_num_queries: Any) -> None:
    use(settings, IP_RATE=None)
    key = generate_key()[1]
    get_lookups().client_rules()  # the allow/deny rules: loaded once per CACHE_TTL per process, not per key
    with django_assert_max_num_queries(1):
        assert all(client.get("/api/users", HTTP_X_API_KEY=key).status_code == 401 for _ in range(500))


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["HTTP_X_API_KEY", "HTTP_AUTHORIZATION"])
def test_a_one_mib_key_is_refused_without_a_lookup_or_a_large_redis_key(
    client: Any, redis_client: redis.Redis, key_prefix: str, django_assert_num_queries: Any, header: str
) -> None:
    huge = ("Bearer " if header == "HTTP_AUTHORIZATION" else "") + "k" * ONE_MIB
    get_lookups().client_rules()  # the allow/deny rules: loaded once per CACHE_TTL per process, not per key
    with django_assert_num_queries(0):
        response = client.get("/api/users", **{header: huge})
    assert response.status_code == 401 and response.json() == {"error": "malformed API key"}
    assert len(response.content) < 100
    written = engine_keys(redis_client, key_prefix)
    assert written and all(KEY_NAME.fullmatch(k) and len(k) < 100 for k in written)
    assert all((redis_client.memory_usage(k) or 0) < 4096 for k in written)  # only the per-IP counter


@pytest.mark.django_db(transaction=True)
def test_a_one_mib_header_over_http_is_refused_and_writes_nothing(live_server: Any, redis_client: redis.Redis,
                                                                   key_prefix: str) -> None:
    parts = urlsplit(live_server.url)
    request = (f"GET /api/users HTTP/1.1\r\nHost: {parts.netloc}\r\nX-API-Key: ".encode()
               + b"k" * ONE_MIB + b"\r\nConnection: close\r\n\r\n")
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        try:
            sock.sendall(request)
        except OSError:
            pass  # the server may close while we are still sending: that is a refusal too
        reply = sock.recv(200)
    assert reply.startswith(b"HTTP/1.") and reply.split()[1] in (b"400", b"401", b"431")
    assert all((redis_client.memory_usage(k) or 0) < 4096 for k in engine_keys(redis_client, key_prefix))


@pytest.mark.django_db
def test_client_input_never_becomes_a_redis_key_name(client: Any, redis_client: redis.Redis, key_prefix: str,
                                                     settings: Any) -> None:
    seed_tiers()
    use(settings, TRUSTED_PROXIES=1)
    hostile = ["{tag}", "a" * 500, "*", "key\r\nFLUSHALL", "abcdefgh.{" + "x" * 40 + "}"]
    for value in hostile:
        client.get("/api/users", HTTP_X_API_KEY=value, HTTP_X_FORWARDED_FOR=value)
    client.get("/api/users", HTTP_X_API_KEY=make_key("free"), HTTP_X_FORWARDED_FOR="2001:db8::{x}")
    written = engine_keys(redis_client, key_prefix)
    assert written and all(KEY_NAME.fullmatch(k) for k in written)


@pytest.mark.django_db
def test_keys_are_never_stored_echoed_or_logged(client: Any, caplog: Any, settings: Any) -> None:
    seed_tiers()
    set_ip_rate("free", "5/m")
    key = make_key("free")
    secret = key.split(".")[1]
    with caplog.at_level(logging.DEBUG):
        bodies = [client.get("/api/users", HTTP_X_API_KEY=key) for _ in range(6)]  # the 6th is over the IP limit
        bodies.append(client.get("/api/users", HTTP_X_API_KEY=key[:-1] + "A"))
        bodies.append(client.get("/api/users", HTTP_AUTHORIZATION=f"Bearer {key}x"))
    assert [r.status_code for r in bodies[:6]] == [200] * 5 + [429]
    for response in bodies:
        assert secret not in response.content.decode() and secret[:-1] not in str(response.headers)
    assert not any(secret[:-1] in record.getMessage() or secret[:-1] in str(record.__dict__)
                   for record in caplog.records)
    # No column of any table holds the secret.
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")  # noqa: S608 - table names from the db
            assert not any(secret in str(value) for row in cursor.fetchall() for value in row), table
