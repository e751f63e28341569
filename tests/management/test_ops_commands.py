"""Operator commands against a real Redis and database: status, reset, metrics and the load test."""

from __future__ import annotations

import io
import json
import re
import uuid
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from devtools.embedded import free_port
from ratelimit_app.conf.settings import ratelimit_settings
from ratelimit_app.core.policies import Policy
from ratelimit_app.models import ApiKey, Tier, TierLimit
from ratelimit_app.observability.queries import recent_metrics
from ratelimit_app.observability.recorder import flush, record_decision
from ratelimit_app.service.limiter import get_limiter


def run(*args: Any, stdin: str | None = None, monkeypatch: Any = None) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    if stdin is not None:
        answers = iter(stdin.splitlines())

        def fake_input(prompt: str = "") -> str:
            out.write(prompt)
            try:
                return next(answers)
            except StopIteration:
                raise EOFError from None

        monkeypatch.setattr("builtins.input", fake_input)
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def rows(output: str) -> dict[str, list[str]]:
    """Table rows of `ratelimit_status` keyed by policy name."""
    table = {}
    for line in output.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 6 and cells[0] != "identity":
            # a tier's own per-IP limit ("ip:<address>@<tier>") is keyed "ip@<tier>"
            tier = cells[0].rpartition("@")[2] if "@" in cells[0] else ""
            table[f"{cells[1]}@{tier}" if tier else cells[1]] = cells
    return table


def without_reset(table: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: cells[:5] + cells[6:] for name, cells in table.items()}


@pytest.fixture
def free_key(db: Any) -> tuple[ApiKey, str]:
    return ApiKey.objects.create_key(name="Ops test key", tier=Tier.objects.get(slug="free"))


# -- ratelimit_status ------------------------------------------------------------------------------

def test_status_of_a_key_shows_its_tier_and_each_limit(free_key: tuple[ApiKey, str], client: Client) -> None:
    api_key, key = free_key
    for _ in range(3):
        assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200
    out, _ = run("ratelimit_status", api_key.prefix)
    assert f"API key {api_key.prefix} (Ops test key, active)" in out
    assert "Tier:      free" in out
    table = rows(out)
    assert table["burst"][:5] == [f"key:{api_key.prefix}", "burst", "token_bucket", "20/m burst 10", "7/10"]
    assert table["minute"][4] == "17/20" and table["day"][4] == "997/1000"
    assert table["burst"][-1] == "allowed"
    assert key.partition(".")[2] not in out
    # the same with key:<prefix>, and with the full key pasted (only the prefix is used or shown); the
    # reset column (index 5) counts down between runs, so it is left out of the comparison
    assert without_reset(rows(run("ratelimit_status", f"key:{api_key.prefix}")[0])) == without_reset(table)
    pasted, _ = run("ratelimit_status", key)
    assert without_reset(rows(pasted)) == without_reset(table) and key.partition(".")[2] not in pasted


def test_status_consumes_nothing(free_key: tuple[ApiKey, str]) -> None:
    api_key, _ = free_key
    for _ in range(3):
        run("ratelimit_status", api_key.prefix)
    assert rows(run("ratelimit_status", api_key.prefix)[0])["burst"][4] == "10/10"


def test_status_of_an_exhausted_key_says_when_to_retry(free_key: tuple[ApiKey, str], client: Client) -> None:
    api_key, key = free_key
    statuses = [client.get("/api/users", HTTP_X_API_KEY=key).status_code for _ in range(11)]
    assert statuses[-1] == 429
    burst = rows(run("ratelimit_status", api_key.prefix)[0])["burst"]
    assert burst[4] == "0/10" and burst[-1].startswith("denied, retry in ")


def test_status_of_an_address_shows_the_per_ip_limit(db: Any, settings: Any) -> None:
    algorithm = ratelimit_settings.IP_ALGORITHM
    ip_policy = Policy.parse(ratelimit_settings.IP_RATE, name="ip", algorithm=algorithm)
    for _ in range(4):
        get_limiter().hit("ip:203.0.113.7", [ip_policy])
    table = rows(run("ratelimit_status", "ip:203.0.113.7")[0])
    assert table["ip"][:5] == ["ip:203.0.113.7", "ip", algorithm, "100/m", "96/100"]
    # IPv6 addresses are grouped by RATELIMIT['IPV6_PREFIX'] (/64), as the middleware does
    out, _ = run("ratelimit_status", "ip:2001:db8::1")
    assert "ip:2001:db8::/64" in out


def test_status_of_an_address_includes_the_anonymous_tier(db: Any, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "ANONYMOUS_TIER": "free", "REQUIRE_API_KEY": False}
    out, _ = run("ratelimit_status", "ip:198.51.100.20")
    assert "Tier:      free" in out
    # and each tier's own per-IP limit on the address (the seeded tiers set one)
    assert set(rows(out)) == {"ip", "burst", "minute", "day", "ip@free", "ip@pro", "ip@enterprise",
                              "websocket.connects", "websocket.connections", "websocket_message.messages"}


def test_status_of_a_user_uses_the_default_tier(db: Any, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user(username="carol", password="pw-carol-123")
    out, _ = run("ratelimit_status", f"user:{user.pk}")
    assert f"user {user.pk} (carol)" in out and "Tier:      free" in out
    assert rows(out)["minute"][0] == f"user:{user.pk}"


@pytest.mark.parametrize(
    ("target", "message"),
    [("Zz9Zz9Zz", "no API key with prefix 'Zz9Zz9Zz'"), ("user:424242", "no such user"),
     ("ip:300.1.2.3", "not an IP address"), ("bogus:1", "expected ip:<address>, user:<id>, key:<prefix>"),
     ("short", "not an API key prefix")],
)
def test_status_names_what_is_wrong(db: Any, target: str, message: str) -> None:
    with pytest.raises(CommandError, match=re.escape(message)):
        run("ratelimit_status", target)


def test_status_when_redis_is_down_is_a_clear_error(free_key: tuple[ApiKey, str], settings: Any) -> None:
    api_key, _ = free_key
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    with pytest.raises(CommandError, match="Redis did not answer"):
        run("ratelimit_status", api_key.prefix)


# -- ratelimit_reset -------------------------------------------------------------------------------

def test_reset_with_yes_lets_an_exhausted_key_in_again(free_key: tuple[ApiKey, str], client: Client) -> None:
    api_key, key = free_key
    assert [client.get("/api/users", HTTP_X_API_KEY=key).status_code for _ in range(11)][-1] == 429
    out, _ = run("ratelimit_reset", api_key.prefix, "--yes")
    assert f"key:{api_key.prefix}: tier free: burst, minute, day" in out
    assert "Reset 6 limit(s)" in out  # with the tier's three WebSocket limits
    assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200
    assert rows(run("ratelimit_status", api_key.prefix)[0])["burst"][4] == "9/10"


def test_reset_asks_first_and_no_changes_nothing(free_key: tuple[ApiKey, str], client: Client,
                                                 monkeypatch: Any) -> None:
    api_key, key = free_key
    for _ in range(5):
        client.get("/api/users", HTTP_X_API_KEY=key)
    out, _ = run("ratelimit_reset", api_key.prefix, stdin="no", monkeypatch=monkeypatch)
    assert "Type 'yes' to continue" in out and "Cancelled; nothing was changed." in out
    assert rows(run("ratelimit_status", api_key.prefix)[0])["burst"][4] == "5/10"
    out, _ = run("ratelimit_reset", api_key.prefix, stdin="yes", monkeypatch=monkeypatch)
    assert "Reset 6 limit(s)" in out
    assert rows(run("ratelimit_status", api_key.prefix)[0])["burst"][4] == "10/10"


def test_reset_without_a_terminal_needs_yes(free_key: tuple[ApiKey, str], monkeypatch: Any) -> None:
    api_key, _ = free_key
    with pytest.raises(CommandError, match="pass --yes"):
        run("ratelimit_reset", api_key.prefix, stdin="", monkeypatch=monkeypatch)


def test_reset_of_an_address_clears_the_per_ip_limit(db: Any) -> None:
    ip_policy = Policy("ip", ratelimit_settings.IP_ALGORITHM, limit=100, period=60)
    for _ in range(6):
        get_limiter().hit("ip:192.0.2.77", [ip_policy])
    assert rows(run("ratelimit_status", "ip:192.0.2.77")[0])["ip"][4] == "94/100"
    run("ratelimit_reset", "ip:192.0.2.77", "--yes")
    assert rows(run("ratelimit_status", "ip:192.0.2.77")[0])["ip"][4] == "100/100"


# -- ratelimit_metrics -----------------------------------------------------------------------------

@pytest.mark.django_db  # the names of API keys are read from the database
def test_metrics_table_shows_the_stored_counts() -> None:
    for _ in range(9):
        record_decision(allowed=True, tier="pro", policy=None, degraded=False, identity="key:proKey01")
    for _ in range(3):
        record_decision(allowed=False, tier="pro", policy="minute", degraded=False, identity="key:proKey01")
    record_decision(allowed=True, tier="free", policy=None, degraded=True, identity="ip:192.0.2.8")
    assert flush()
    out, _ = run("ratelimit_metrics", "--hours", "2")
    lines = out.splitlines()
    assert lines[0].startswith("Rate limiting, last 2 hour(s)")
    assert len([line for line in lines if re.match(r"\d{4}-\d\d-\d\d \d\d:00", line)]) == 2
    assert re.search(r"^total\s+13\s+10\s+3\s+23\.1%\s+1$", out, re.M)
    assert re.search(r"^\s+pro\s+9\s+3\s+25\.0%$", out, re.M)
    assert re.search(r"^\s+minute\s+3$", out, re.M)
    assert re.search(r"^\s+key:proKey01\s+3$", out, re.M)
    assert "Degraded decisions (made without Redis): 1, of which refused: 0" in out


def test_metrics_as_json() -> None:
    record_decision(allowed=False, tier="free", policy="burst", degraded=False, identity="ip:192.0.2.9")
    assert flush()
    data = json.loads(run("ratelimit_metrics", "--hours", "3", "--json")[0])
    assert (data["total"], data["blocked"], data["block_rate"]) == (1, 1, 1.0)
    assert len(data["hours"]) == 3 and data["top_blocked"] == [{"identity": "ip:192.0.2.9", "blocked": 1}]


@pytest.mark.parametrize("hours", ["0", "49"])
def test_metrics_hours_are_bounded_by_the_ttl(hours: str) -> None:
    with pytest.raises(CommandError, match=r"--hours: .* must be from 1 to 48 .*METRICS_TTL_HOURS"):
        run("ratelimit_metrics", "--hours", hours)


# -- ratelimit_loadtest ----------------------------------------------------------------------------

@pytest.fixture
def strict_key(transactional_db: Any) -> tuple[str, str]:
    """A key of a fresh tier that admits exactly 7 requests a day (no refill during the test)."""
    tier = Tier.objects.create(slug=f"lt{uuid.uuid4().hex[:8]}", name="Load test")
    TierLimit.objects.create(tier=tier, name="day", algorithm="fixed_window", limit=7, period=86400)
    _, key = ApiKey.objects.create_key(name="load", tier=tier)
    return tier.slug, key


def test_loadtest_reports_allowed_blocked_statuses_and_latency(live_server: Any, strict_key: tuple[str, str]) -> None:
    slug, key = strict_key
    out, err = run("ratelimit_loadtest", f"{live_server.url}/api/users", "--key", key,
                   "--requests", "25", "--concurrency", "5")
    assert f"with key {key.partition('.')[0]}.…" in out and key not in out + err
    assert "Sent 25 of 25 requests" in out
    assert re.search(r"allowed \(2xx\):\s+7$", out, re.M)
    assert re.search(r"blocked \(429\):\s+18$", out, re.M)
    assert re.search(r"errors:\s+0 ", out, re.M)
    assert "Status codes: 200: 7, 429: 18" in out
    assert re.search(r"Latency \(ms\): p50 [\d.]+  p90 [\d.]+  p99 [\d.]+  max [\d.]+", out)
    assert "[" + "#" * 30 + "] 25/25 (100%)" in err
    # what the server counted and flushed adds up to what the client saw
    assert flush()
    stored = recent_metrics(hours=2)
    [tier] = [t for t in stored.tiers if t.tier == slug]
    assert (tier.allowed, tier.blocked) == (7, 18)
    assert [(p.policy, p.blocked) for p in stored.policies] == [("day", 18)]


def test_loadtest_stops_at_the_time_bound(live_server: Any, db: Any) -> None:
    out, _ = run("ratelimit_loadtest", f"{live_server.url}/health", "--key", "whatever", "--requests", "100000",
                 "--concurrency", "4", "--max-seconds", "0.3", "--no-progress")
    sent = int(re.search(r"Sent ([\d,]+) of 100,000", out).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert 0 < sent < 100_000
    assert "Stopped by --max-seconds" in out


def test_loadtest_counts_refused_connections_as_errors(db: Any) -> None:
    out, _ = run("ratelimit_loadtest", f"http://127.0.0.1:{free_port()}/api/users", "--key", "k",
                 "--requests", "6", "--concurrency", "2", "--no-progress")
    assert re.search(r"errors:\s+6 ", out, re.M)
    assert "Status codes: ConnectionRefusedError: 6" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--requests", "0"], "--requests"), (["--requests", "100001"], "--requests"),
     (["--concurrency", "257"], "--concurrency"), (["--max-seconds", "0"], "--max-seconds")],
)
def test_loadtest_bounds_are_enforced(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=re.escape(message)):
        run("ratelimit_loadtest", "http://127.0.0.1:1/", "--key", "k", *args)


def test_loadtest_needs_an_http_url() -> None:
    with pytest.raises(CommandError, match="must be an http:// or https:// URL"):
        run("ratelimit_loadtest", "ftp://example.invalid/", "--key", "k", "--no-progress")
