"""`create_api_key` and the demo's `rundemo`: keys printed once, last line alone, and they work."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from ratelimit_app.core.apikeys import hash_key
from ratelimit_app.models import ApiKey
from ratelimit_app.service.connection import redacted_url
from tests.support.limits_support import seed_tiers

pytestmark = pytest.mark.django_db

KEY = re.compile(r"[A-Za-z0-9]{8}\.[A-Za-z0-9_-]{43}")


def create(*args: str) -> list[str]:
    out = StringIO()
    call_command("create_api_key", *args, stdout=out)
    return out.getvalue().rstrip("\n").split("\n")


def test_prints_the_key_alone_on_the_last_line_and_stores_only_its_hash(client: Any) -> None:
    seed_tiers()
    lines = create("mobile app", "--tier", "pro")
    key = lines[-1]
    assert KEY.fullmatch(key)
    assert all(key not in line for line in lines[:-1])
    api_key = ApiKey.objects.get(name="mobile app")
    assert (api_key.tier.slug, api_key.prefix, api_key.hashed_key) == ("pro", key.split(".")[0], hash_key(key))
    assert api_key.expires is None and api_key.owner is None
    response = client.get("/api/users", HTTP_X_API_KEY=key)
    assert response.status_code == 200 and response["X-RateLimit-Tier"] == "pro"


@pytest.mark.parametrize(("expires", "delta"), [("30d", timedelta(days=30)), ("12h", timedelta(hours=12)),
                                                ("90m", timedelta(minutes=90)), ("2w", timedelta(weeks=2))])
def test_relative_expiry(expires: str, delta: timedelta) -> None:
    seed_tiers()
    before = timezone.now()
    create("k", "--tier", "free", "--expires", expires)
    stored = ApiKey.objects.get(name="k").expires
    assert stored is not None and before + delta <= stored <= timezone.now() + delta


def test_absolute_expiry_and_owner(django_user_model: Any) -> None:
    seed_tiers()
    owner = django_user_model.objects.create_user("carol", password="pw")
    create("k", "--tier", "free", "--expires", "2099-01-02", "--owner", "carol")
    api_key = ApiKey.objects.get(name="k")
    assert api_key.owner == owner and api_key.expires is not None and api_key.expires.year == 2099


@pytest.mark.parametrize(("args", "message"), [
    (["k", "--tier", "gold"], "no tier 'gold'; known tiers: enterprise, free, pro"),
    (["k", "--tier", "free", "--expires", "soon"], "--expires: 'soon' is not a duration"),
    (["k", "--tier", "free", "--expires", "2001-01-01"], "is in the past"),
    (["k", "--tier", "free", "--owner", "nobody"], "no user 'nobody'"),
])
def test_bad_arguments_name_what_is_wrong(args: list[str], message: str) -> None:
    seed_tiers()
    with pytest.raises(CommandError, match=re.escape(message)):
        create(*args)
    assert not ApiKey.objects.exists()


def test_rundemo_prints_one_working_key_per_tier(client: Any) -> None:
    seed_tiers()
    out = StringIO()
    call_command("rundemo", "--no-serve", stdout=out)
    printed = dict(re.findall(r"^  (\w+)\s+(" + KEY.pattern + r")$", out.getvalue(), re.MULTILINE))
    assert set(printed) == {"free", "pro", "enterprise"}
    for slug, key in printed.items():
        assert client.get("/api/users", HTTP_X_API_KEY=key)["X-RateLimit-Tier"] == slug
    # Running it again revokes the previous demo keys.
    call_command("rundemo", "--no-serve", stdout=StringIO())
    assert client.get("/api/users", HTTP_X_API_KEY=printed["free"]).status_code == 401


def test_rundemo_says_which_redis_it_uses_with_the_password_masked(settings: Any, monkeypatch: Any) -> None:
    seed_tiers()
    url = "redis://:s3cret-pw@127.0.0.1:6379/0"
    monkeypatch.setenv("REDIS_URL", url)
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": url}
    out = StringIO()
    call_command("rundemo", "--no-serve", stdout=out)
    assert "Redis: redis://:***@127.0.0.1:6379/0 (from the REDIS_URL environment variable)" in out.getvalue()
    assert "s3cret-pw" not in out.getvalue()


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis://:pw@host:6380/1", "redis://:***@host:6380/1"),
    ("rediss://user:p%40ss@host/0", "rediss://user:***@host/0"),
    ("redis+sentinel://:pw@s1:26379,s2:26379/mymaster/0", "redis+sentinel://:***@s1:26379,s2:26379/mymaster/0"),
    ("unix:///run/redis.sock?db=0&password=pw", "unix:///run/redis.sock?db=0&password=***"),
])
def test_redacted_url_masks_any_password(url: str, shown: str) -> None:
    assert redacted_url(url) == shown
