"""`manage.py create_api_key NAME --tier SLUG [--expires WHEN] [--owner USERNAME]`: the key is printed once,
alone on the last line; the database keeps its prefix and hash only."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from ratelimit_app.models import ApiKey, Tier

_RELATIVE = re.compile(r"^(\d+)([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def _parse_expiry(text: str) -> datetime:
    """An expiry from "30d" / "12h" / "90m" / "2w" (from now), an ISO date (midnight UTC) or datetime."""
    value = text.strip()
    match = _RELATIVE.match(value.lower())
    if match:
        return timezone.now() + timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    moment = parse_datetime(value)
    if moment is None:
        day = parse_date(value)
        if day is not None:
            moment = datetime(day.year, day.month, day.day)
    if moment is None:
        raise CommandError(
            f"--expires: {text!r} is not a duration such as 30d, 12h, 90m, 2w, nor an ISO date or datetime"
        )
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_default_timezone())
    if moment <= timezone.now():
        raise CommandError(f"--expires: {text!r} is in the past")
    return moment


class Command(BaseCommand):
    help = "Create an API key for a tier; the full key is printed alone on the last line, and only once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Who or what uses the key.")
        parser.add_argument("--tier", required=True, help="Slug of the key's tier, for example free.")
        parser.add_argument("--expires", help="When the key stops working: 30d, 12h, 2w, or an ISO date/datetime.")
        parser.add_argument("--owner", help="Username of the key's owner.")

    def handle(self, *args: Any, **options: Any) -> None:
        tier = Tier.objects.filter(slug=options["tier"]).first()
        if tier is None:
            known = ", ".join(Tier.objects.values_list("slug", flat=True)) or "none (run migrate)"
            raise CommandError(f"--tier: no tier {options['tier']!r}; known tiers: {known}")
        expires = _parse_expiry(options["expires"]) if options["expires"] else None
        owner = None
        if options["owner"]:
            user_model = get_user_model()
            owner = user_model._default_manager.filter(**{user_model.USERNAME_FIELD: options["owner"]}).first()
            if owner is None:
                raise CommandError(f"--owner: no user {options['owner']!r}")
        api_key, key = ApiKey.objects.create_key(name=options["name"], tier=tier, owner=owner, expires=expires)
        self.stdout.write(f"Created API key {api_key.prefix} ({api_key.name}) for tier {tier.slug}"
                          + (f", expires {expires.isoformat()}" if expires else "")
                          + ". It is shown once; store it now:")
        self.stdout.write(key)
