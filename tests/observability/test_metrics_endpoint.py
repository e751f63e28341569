"""GET /metrics is not public: staff sessions, a bearer token or allowed client IPs only; and including
ratelimit_app.urls without prometheus-client is a check error and a 501, never a traceback."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import pytest
from django.core import checks
from django.test import Client

TOKEN = "s3cret-metrics-token-0123456789"


def use(settings: Any, **values: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "METRICS_TOKEN": None, "METRICS_ALLOWED_IPS": [], **values}


def check_ids() -> list[str]:
    messages = checks.run_checks(tags=["ratelimit"], databases=[])  # no database check (Django 6.1 default)
    return [m.id or "" for m in messages if (m.id or "").startswith("ratelimit.")]


def test_without_access_settings_it_is_403_with_a_clear_message_and_a_check_warning(
    client: Client, settings: Any
) -> None:
    use(settings)
    response = client.get("/metrics")
    assert response.status_code == 403
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["error"] == "forbidden"
    assert "RATELIMIT['METRICS_TOKEN']" in body["detail"] and "RATELIMIT['METRICS_ALLOWED_IPS']" in body["detail"]
    assert "only staff sessions may read it" in body["detail"]
    assert b"ratelimit_breaker_state" not in response.content
    assert check_ids() == ["ratelimit.W002"]


@pytest.mark.django_db
def test_staff_sessions_may_read_it_other_users_may_not(client: Client, settings: Any, django_user_model: Any) -> None:
    use(settings)
    user = django_user_model.objects.create_user(username="someone", password="pw-someone-123")
    client.force_login(user)
    assert client.get("/metrics").status_code == 403
    staff = django_user_model.objects.create_user(username="ops", password="pw-ops-123", is_staff=True)
    client.force_login(staff)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert b"ratelimit_breaker_state" in response.content


def test_the_bearer_token_opens_it(client: Client, settings: Any) -> None:
    use(settings, METRICS_TOKEN=TOKEN)
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"bearer {TOKEN}").status_code == 200
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN[:-1]}").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}x").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 403
    assert check_ids() == []


def test_allowed_client_ips_open_it_and_x_forwarded_for_is_trusted_only_from_proxies(
    client: Client, settings: Any
) -> None:
    use(settings, METRICS_ALLOWED_IPS=["10.0.0.0/8", "2001:db8::1"])
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="2001:db8::1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 403
    # a client cannot claim an allowed address ...
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7", HTTP_X_FORWARDED_FOR="10.0.0.1").status_code == 403
    # ... but behind a trusted proxy, the address the proxy saw is the client's
    use(settings, METRICS_ALLOWED_IPS=["10.0.0.0/8"], TRUSTED_PROXIES=["192.0.2.0/24"])
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7", HTTP_X_FORWARDED_FOR="10.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7", HTTP_X_FORWARDED_FOR="198.51.100.1").status_code == 403
    assert check_ids() == []


def test_the_demo_lets_a_local_prometheus_scrape(client: Client) -> None:
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 403


@pytest.mark.parametrize(("name", "value"), [("METRICS_TOKEN", "short"), ("METRICS_TOKEN", "has a space in it ok"),
                                             ("METRICS_ALLOWED_IPS", ["10.0.0.0/33"]),
                                             ("METRICS_ALLOWED_IPS", "10.0.0.0/8")])
def test_invalid_access_settings_are_check_errors(settings: Any, name: str, value: Any) -> None:
    use(settings, **{name: value})
    messages = [m for m in checks.run_checks(tags=["ratelimit"], databases=[]) if m.id == "ratelimit.E001"]
    assert len(messages) == 1 and f"RATELIMIT['{name}']" in messages[0].msg


@pytest.fixture
def without_prometheus_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if prometheus-client were not installed: importing it raises ImportError."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    for name in ("ratelimit_app.observability.prometheus", "ratelimit_app.urls"):
        monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.mark.usefixtures("without_prometheus_client")
def test_without_prometheus_client_the_urls_import_and_check_reports_it(client: Client, settings: Any) -> None:
    use(settings, METRICS_TOKEN=TOKEN)
    urls = importlib.import_module("ratelimit_app.urls")  # no traceback at import
    assert [p.name for p in urls.urlpatterns] == ["ratelimit_metrics"]
    messages = [m for m in checks.run_checks(tags=["ratelimit"], databases=[]) if m.id == "ratelimit.E004"]
    assert len(messages) == 1
    assert "prometheus-client" in messages[0].msg and "ratelimit_app.urls" in messages[0].msg
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 501
    assert "pip install" in response.json()["detail"]
    assert client.get("/metrics").status_code == 403  # and it says nothing more to others


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "value"), [("IP_RATE", "lots"), ("KEY_PREFIX", ""), ("METRICS_TTL_HOURS", 0)])
def test_an_invalid_setting_elsewhere_in_ratelimit_does_not_break_metrics(client: Client, settings: Any,
                                                                          name: str, value: Any) -> None:
    use(settings, METRICS_TOKEN=TOKEN, **{name: value})
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200 and b"ratelimit_breaker_state" in response.content


@pytest.mark.django_db
def test_an_invalid_token_setting_is_a_clear_503_for_bearers_while_staff_and_allowed_ips_still_read(
        client: Client, settings: Any, django_user_model: Any) -> None:
    use(settings, METRICS_TOKEN="short", METRICS_ALLOWED_IPS=["192.0.2.0/24"])
    refused = client.get("/metrics", HTTP_AUTHORIZATION="Bearer short", REMOTE_ADDR="198.51.100.1")
    assert refused.status_code == 503 and refused["Content-Type"] == "application/json"
    detail = refused.json()["detail"]
    assert "RATELIMIT['METRICS_TOKEN'] is invalid" in detail and "short" not in detail
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.9").status_code == 200
    client.force_login(django_user_model.objects.create_user(username="ops", password="pw-ops-123", is_staff=True))
    assert client.get("/metrics", REMOTE_ADDR="198.51.100.1").status_code == 200
