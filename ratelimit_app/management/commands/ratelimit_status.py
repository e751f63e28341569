"""`manage.py ratelimit_status TARGET`: the tier, and where the target stands in each effective limit
(a peek: nothing is charged), with any allow or deny rule that names it (docs/observability.md)."""

from __future__ import annotations

import math
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from ratelimit_app.conf.settings import ratelimit_settings
from ratelimit_app.core.clientrules import ALLOW
from ratelimit_app.core.exceptions import RateLimiterError
from ratelimit_app.core.policies import Policy
from ratelimit_app.plans.lookups import get_lookups
from ratelimit_app.service.limiter import get_limiter

from ._targets import resolve


def _seconds(value: float | None) -> str:
    """A duration for a table cell: "-" for None, "never" for infinity, else "12.3s", "4m 05s", "10h 36m"."""
    if value is None:
        return "-"
    if math.isinf(value):
        return "never"
    if value < 60:
        return f"{value:.1f}s"
    whole = int(value)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def _describe(policy: Policy) -> str:
    """A policy as "20/m" with its burst, "1000/calendar-month@Europe/Paris" for a calendar quota (and its
    unit for a usage limit, "2000/m tokens", and "shadow" for a dry-run limit), for a table cell."""
    burst = f" burst {policy.burst}" if policy.burst is not None else ""
    shadow = (f" {policy.unit}" if policy.unit else "") + (" shadow" if policy.shadow else "")
    if policy.calendar:
        return f"{policy.limit}/calendar-{policy.calendar}@{policy.time_zone}{shadow}"
    return f"{policy.rate}{burst}{shadow}"


_ALLOW_LISTED = "allow-listed: never limited"
_DENY_LISTED = "deny-listed: refused with 403 before any limit"


def _listing(identity: str) -> str | None:
    """The allow or deny rule that names this target (an API key, or the network of an address)."""
    rules = get_lookups().client_rules()
    kind, _, value = identity.partition(":")
    if kind == "key":
        if value in rules.deny_keys:
            return _DENY_LISTED
        if value in rules.allow_keys:
            return _ALLOW_LISTED
    elif kind == "ip" and "/" not in value:
        action = rules.for_address(value)
        if action is not None:
            return _ALLOW_LISTED if action == ALLOW else _DENY_LISTED
    return None


class Command(BaseCommand):
    help = "Show the tier of an API key prefix, user:<id> or ip:<address>, and where it stands in each limit."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("target", help="An API key prefix (or key:<prefix>), user:<id> or ip:<address>.")

    def handle(self, *args: Any, **options: Any) -> None:
        target = resolve(options["target"])
        engine = get_limiter().limiter()
        self.stdout.write(f"Target:    {target.description}")
        if target.tier is not None:
            mode = target.tier.fail_mode or f"default ({ratelimit_settings.FAIL_MODE})"
            self.stdout.write(f"Tier:      {target.tier.slug} ({target.tier.name}), fail mode {mode}")
        listed = _listing(target.checks[0].identity) if target.checks else None
        if listed is not None:
            self.stdout.write(f"Rule:      {listed}")
        rows = [("identity", "policy", "algorithm", "limit", "remaining", "full in", "next request")]
        for check in target.checks:
            if not check.policies:
                self.stdout.write(f"{check.identity}: {check.label} has no enabled limits (unlimited)")
                continue
            try:
                decision = engine.peek(check.identity, check.policies)
            except (RateLimiterError, RedisError, OSError) as exc:
                raise CommandError(f"Redis did not answer ({type(exc).__name__}: {exc})") from exc
            by_name = {result.policy: result for result in (*decision.results, *decision.shadow)}
            for policy in check.policies:
                result = by_name[policy.name]
                verdict = "allowed" if result.allowed else (
                    f"{'would deny (shadow)' if policy.shadow else 'denied'}, retry in {_seconds(result.retry_after)}")
                rows.append((check.identity, policy.name, policy.algorithm, _describe(policy),
                             f"{result.remaining}/{result.limit}", _seconds(result.reset_after), verdict))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
