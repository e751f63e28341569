"""`manage.py ratelimit_reset TARGET [--yes]`: clear a target's counters in Redis and in this process, and
announce the reset to the other app servers' deny caches (docs/observability.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from ratelimit_app.core.exceptions import RateLimiterError
from ratelimit_app.core.logs import log_event
from ratelimit_app.service.limiter import get_limiter

from ._targets import resolve


class Command(BaseCommand):
    help = "Clear the rate-limit counters of an API key prefix, user:<id> or ip:<address>."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("target", help="An API key prefix (or key:<prefix>), user:<id> or ip:<address>.")
        parser.add_argument("--yes", action="store_true", help="Do not ask for confirmation.")

    def handle(self, *args: Any, **options: Any) -> None:
        target = resolve(options["target"])
        self.stdout.write(f"Target: {target.description}")
        for check in target.checks:
            names = ", ".join(p.name for p in check.policies) or "no limits"
            self.stdout.write(f"  {check.identity}: {check.label}: {names}")
        if not options["yes"]:
            try:
                answer = input("Clear these counters? Type 'yes' to continue: ")
            except EOFError as exc:
                raise CommandError("no confirmation (stdin is closed); pass --yes to reset without asking") from exc
            if answer.strip().lower() not in ("yes", "y"):
                self.stdout.write("Cancelled; nothing was changed.")
                return
        service = get_limiter()
        try:
            for check in target.checks:
                if check.policies:
                    service.reset(check.identity, check.policies)
        except (RateLimiterError, RedisError, OSError) as exc:
            raise CommandError(f"Redis did not answer ({type(exc).__name__}: {exc}); the counters may not have "
                               "been reset: run the command again") from exc
        for check in target.checks:
            log_event("ratelimit.reset", identity=check.identity, policies=",".join(p.name for p in check.policies))
        self.stdout.write(self.style.SUCCESS(f"Reset {sum(len(c.policies) for c in target.checks)} limit(s) of "
                                             f"{target.description}."))
