"""`manage.py ratelimit_metrics [--hours N] [--json]`: the dashboard's numbers in the terminal."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError
from redis.exceptions import RedisError

from ratelimit_app.conf.settings import ratelimit_settings
from ratelimit_app.models import ApiKey
from ratelimit_app.observability.queries import MAX_RANGE_HOURS, BlockedIdentity, MetricsRange, recent_metrics


def _table(rows: list[tuple[str, ...]], numeric_from: int = 1) -> list[str]:
    """Rows as aligned text lines; columns from `numeric_from` on are right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if i >= numeric_from else cell.ljust(w)
                      for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip() for row in rows]


def _identity_rows(top: tuple[BlockedIdentity, ...]) -> list[tuple[str, ...]]:
    """(identity, count) rows; an API key ("key:<prefix>") that still exists is followed by its name."""
    prefixes = [item.identity[4:] for item in top if item.identity.startswith("key:")]
    try:
        names = dict(ApiKey.objects.filter(prefix__in=prefixes).values_list("prefix", "name")) if prefixes else {}
    except DatabaseError:
        names = {}  # no database to ask (not migrated yet): the prefixes alone
    return [(f"{item.identity} ({names[item.identity[4:]]})" if item.identity[4:] in names
             and item.identity.startswith("key:") else item.identity, f"{item.blocked:,}") for item in top]


def _section(out: Any, title: str, empty_title: str, header: tuple[str, ...], rows: list[tuple[str, ...]],
             numeric_from: int = 1) -> None:
    """Write one titled table to `out` (a command's stdout), or only `empty_title` when it has no rows."""
    out.write(title if rows else empty_title)
    for line in _table([header, *rows], numeric_from) if rows else ():
        out.write("  " + line)


def _rate(blocked: int, total: int) -> str:
    return f"{blocked / total * 100:.1f}%" if total else "-"


class Command(BaseCommand):
    help = "Print allowed / blocked requests per hour, per tier and per policy, and the top blocked identities."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--hours", type=int, default=48, help="Hours to show, the current one included "
                            "(default 48, at most RATELIMIT['METRICS_TTL_HOURS']).")
        parser.add_argument("--json", action="store_true", help="Print the numbers as JSON instead.")

    def handle(self, *args: Any, **options: Any) -> None:
        limit = min(int(ratelimit_settings.METRICS_TTL_HOURS), MAX_RANGE_HOURS)
        hours = options["hours"]
        if not 1 <= hours <= limit:
            raise CommandError(f"--hours: {hours} must be from 1 to {limit} (metrics are kept "
                               f"RATELIMIT['METRICS_TTL_HOURS'] = {ratelimit_settings.METRICS_TTL_HOURS} hours)")
        try:
            summary = recent_metrics(hours)
        except (RedisError, OSError) as exc:
            raise CommandError(f"Redis did not answer ({type(exc).__name__}: {exc})") from exc
        if options["json"]:
            payload = asdict(summary)
            payload.update(total=summary.total, block_rate=summary.block_rate)
            self.stdout.write(json.dumps(payload, default=str, indent=2))
            return
        self.write_report(summary, hours)

    def write_report(self, summary: MetricsRange, hours: int) -> None:
        out = self.stdout
        out.write(f"Rate limiting, last {hours} hour(s): {summary.start:%Y-%m-%d %H:00} to "
                  f"{summary.end:%Y-%m-%d %H:00} UTC")
        rows: list[tuple[str, ...]] = [("hour (UTC)", "total", "allowed", "blocked", "block rate", "degraded")]
        for h in summary.hours:
            rows.append((f"{h.hour:%Y-%m-%d %H:00}", f"{h.total:,}", f"{h.allowed:,}", f"{h.blocked:,}",
                         _rate(h.blocked, h.total), f"{h.degraded:,}"))
        rows.append(("total", f"{summary.total:,}", f"{summary.allowed:,}", f"{summary.blocked:,}",
                     _rate(summary.blocked, summary.total), f"{summary.degraded:,}"))
        for line in _table(rows):
            out.write(line)
        out.write("")
        _section(out, "Per tier:", "Per tier: no traffic", ("tier", "allowed", "blocked", "block rate"),
                [(t.tier, f"{t.allowed:,}", f"{t.blocked:,}", _rate(t.blocked, t.total)) for t in summary.tiers])
        _section(out, "Blocked by policy:", "Blocked by policy: nothing blocked", ("policy", "blocked"),
                [(p.policy, f"{p.blocked:,}") for p in summary.policies])
        _section(out, "Top blocked (UTC days of the range):", "Top blocked: nothing blocked", ("identity", "blocked"),
                _identity_rows(summary.top_blocked))
        if summary.degraded:
            out.write(f"Degraded decisions (made without Redis): {summary.degraded:,}, "
                      f"of which refused: {summary.degraded_blocked:,}")
        if summary.shadow:
            _section(out, "Shadow limits would have blocked:", "", ("tier", "policy", "requests"),
                     [(item.tier, item.policy, f"{item.count:,}") for item in summary.shadow], numeric_from=2)
            _section(out, "Top would-be-blocked (UTC days of the range):", "Top would-be-blocked: none",
                     ("identity", "requests"), _identity_rows(summary.top_shadow_blocked))
        if summary.allowed_by_list or summary.denied_by_list:
            out.write(f"Allow/deny rules: {summary.allowed_by_list:,} allowed without limits, "
                      f"{summary.denied_by_list:,} refused (403)")
