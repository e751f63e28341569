"""`manage.py rundemo`: migrate (which seeds the tiers), create one demo API key per tier and print them,
create an admin login, say which Redis the limiter uses (password masked), then serve the demo in this one
process: on 127.0.0.1:8000, or at `[address:]port` as runserver takes it (`8101`, `0.0.0.0:8101`,
`[::1]:8101`). The links it prints name an address a browser on this machine reaches."""

from __future__ import annotations

import re
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.management.commands.runserver import naiveip_re
from django.db import transaction
from django.db.models import Min

from devtools.embedded import redis_source
from ratelimit_app.conf.settings import ratelimit_settings
from ratelimit_app.models import ApiKey, Tier, TierLimit
from ratelimit_app.service.connection import redacted_url

DEMO_KEY_PREFIX = "demo key for "
ADMIN_USERNAME = "admin"
#: Addresses that mean "every interface": the links name the loopback address of their family instead.
WILDCARDS = {"0": "127.0.0.1", "0.0.0.0": "127.0.0.1", "[::]": "[::1]", "[::0]": "[::1]"}  # noqa: S104 (read, not bound)


def base_url(addrport: str) -> tuple[str, bool]:
    """The http:// address of the demo served at `addrport` (runserver's `[address:]port`) that a browser on
    this machine reaches, and whether it listens on every interface. CommandError when runserver would
    refuse `addrport` too."""
    match = re.match(naiveip_re, addrport)
    if match is None:
        raise CommandError(f"{addrport!r} is not a port number or an address:port pair (8101, 0.0.0.0:8101, "
                           "[::1]:8101).")
    address, port = match.group("addr"), match.group("port")
    host = WILDCARDS.get(address or "", address or "127.0.0.1")
    return f"http://{host}:{port}", address in WILDCARDS


class Command(BaseCommand):
    help = "Prepare and serve the demo site (migrate, demo keys, admin login, then runserver without reloader)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000",
                            help="[address:]port to serve on, as runserver takes it (default 127.0.0.1:8000).")
        parser.add_argument("--no-serve", action="store_true", help="Prepare and print the keys, do not serve.")

    def handle(self, *args: Any, **options: Any) -> None:
        base, everywhere = base_url(options["addrport"])
        call_command("migrate", interactive=False, verbosity=0)
        keys = self.create_demo_keys()
        password = self.reset_admin_password()
        self.stdout.write(f"Redis: {self.redis_description()}")
        self.stdout.write("\nDemo API keys (new on every start; the previous ones are revoked):")
        for slug, key in keys:
            self.stdout.write(f"  {slug:<11} {key}")
        free_key = keys[0][1] if keys else "<key>"
        self.stdout.write(
            f"\nAdmin: {base}/admin/  user {ADMIN_USERNAME!r}, password {password!r}\n"
            f"Try:\n"
            f"  curl -i {base}/api/users -H 'X-API-Key: {free_key}'\n"
            f"  curl -i -X POST {base}/api/data -H 'Authorization: Bearer {free_key}' -d '{{}}'\n"
            f"  curl -i {base}/api/rate-limit/status -H 'X-API-Key: {free_key}'\n"
            f"  curl -i {base}/drf/items/ -H 'X-API-Key: {free_key}'\n"
            f"  curl -i {base}/public/quote\n"
            f"  curl -i {base}/health\n"
        )
        self.write_websockets(base, free_key)
        if everywhere:
            self.stdout.write(f"Listening on every address ({options['addrport']}): other machines reach the "
                              f"demo by this machine's address or name, with the same paths.\n")
        if options["no_serve"]:
            return
        if everywhere:  # other machines name this one by an address or a name the settings cannot know
            settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "*"]
        # --noreload: one process, so an embedded Redis started by the settings is the one served;
        # insecure_serving: the admin's static files without collectstatic (DEBUG is off).
        call_command("runserver", options["addrport"], use_reloader=False, insecure_serving=True)

    def write_websockets(self, base: str, free_key: str) -> None:
        """The tiers' WebSocket limits, and how to try the echo under ASGI (runserver serves no WebSocket)."""
        self.stdout.write("WebSocket limits (docs/websockets.md):")
        for slug, limits in websocket_limits().items():
            self.stdout.write(f"  {slug:<11} {'; '.join(limits)}")
        port = base.rsplit(":", 1)[1]
        socket = base.replace("http://", "ws://", 1)
        self.stdout.write(
            f"Try, serving the demo under ASGI instead (after --no-serve; REDIS_URL: a Redis both workers share):\n"
            f"  .venv/bin/uvicorn project.asgi:application --port {port} --workers 2\n"
            f"  .venv/bin/python -m websockets '{socket}/ws/echo/?key={free_key}'\n"
        )

    def redis_description(self) -> str:
        """The Redis the limiter uses (password masked), where it comes from, and how to pick another."""
        url = ratelimit_settings.REDIS_URL
        if url is None:
            return f"the django-redis cache {ratelimit_settings.CACHE_ALIAS!r} (RATELIMIT['CACHE_ALIAS'])"
        return f"{redacted_url(url)} ({redis_source(url)})"

    def create_demo_keys(self) -> list[tuple[str, str]]:
        """Revoke the previous demo keys and create one per tier: [(tier slug, full key)]."""
        keys = []
        with transaction.atomic():
            for api_key in ApiKey.objects.filter(name__startswith=DEMO_KEY_PREFIX, revoked=False):
                api_key.revoked = True
                api_key.save(update_fields=["revoked"])
            for tier in Tier.objects.annotate(smallest=Min("limits__limit")).order_by("smallest", "slug"):
                _, key = ApiKey.objects.create_key(name=f"{DEMO_KEY_PREFIX}{tier.slug}", tier=tier)
                keys.append((tier.slug, key))
        return keys

    def reset_admin_password(self) -> str:
        """Create the demo superuser, or give it a new random password; return the password."""
        user_model = get_user_model()
        user = user_model._default_manager.filter(**{user_model.USERNAME_FIELD: ADMIN_USERNAME}).first()
        if user is None:
            user = user_model(**{user_model.USERNAME_FIELD: ADMIN_USERNAME}, is_staff=True, is_superuser=True)
        password = secrets.token_urlsafe(12)
        user.set_password(password)
        user.save()
        return password


#: How the demo names the WebSocket scopes' limits (ratelimit_app.channels: the middleware's default scopes).
_SCOPE_WORDS = {"websocket": "per connect", "websocket_message": "per message"}


def websocket_limits() -> dict[str, list[str]]:
    """Each tier's enabled WebSocket limits as the demo prints them: {slug: ["connects: 5/60s per connect", ...]}."""
    found: dict[str, list[str]] = {}
    rows = TierLimit.objects.filter(scope__in=_SCOPE_WORDS, enabled=True).select_related("tier")
    for limit in rows.order_by("tier__slug", "scope", "name"):
        if limit.algorithm == "concurrency":
            text = f"{limit.name}: {limit.limit} at once ({limit.period}s lease, renewed while open)"
        else:
            text = f"{limit.name}: {limit.limit}/{limit.period}s {_SCOPE_WORDS[limit.scope]}"
        found.setdefault(limit.tier.slug, []).append(text)
    return found
