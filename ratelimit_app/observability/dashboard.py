"""The staff-only rate-limit dashboard in the Django admin, and its link on the admin index
(docs/observability.md, "The admin dashboard"). Importing this module changes nothing."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.contrib.admin import AdminSite
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from redis.exceptions import RedisError

from ..conf.settings import InvalidSetting, ratelimit_settings
from .queries import MAX_RANGE_HOURS, BlockedIdentity, HourMetrics, MetricsRange, recent_metrics
from .snapshot import process_metrics

#: Hours shown when the request names none.
_DEFAULT_HOURS = 48
_INDEX_TEMPLATE = "ratelimit_app/admin_index.html"


# -- chart ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _ChartBar:
    """One hour of the chart: a green (allowed) bar with a red (blocked) bar stacked on it."""

    hour: str  # ISO 8601 start of the hour, UTC
    label: str  # tooltip text
    allowed: int
    blocked: int
    x: float
    width: float
    allowed_y: float
    allowed_height: float
    blocked_y: float
    blocked_height: float


@dataclass(frozen=True)
class _Chart:
    """Geometry of the allowed-vs-blocked SVG chart, in SVG user units (the template draws it)."""

    width: int
    height: int
    left: int
    right: int  # x of the plot's right edge
    bottom: int  # y of the time axis
    center_x: float  # the plot's middle, for the "no traffic" note
    center_y: float
    max_value: int
    bars: tuple[_ChartBar, ...]
    y_ticks: tuple[tuple[float, str], ...]  # (y, label) of the count axis
    x_ticks: tuple[tuple[float, str], ...]  # (x, label) of the time axis


def _axis_step(peak: int) -> int:
    """A round step (1, 2 or 5 x 10^k) that covers `peak` in about four intervals."""
    raw = max(peak / 4, 1.0)
    magnitude = 10 ** math.floor(math.log10(raw))
    for multiple in (1, 2, 5, 10):
        if multiple * magnitude >= raw:
            return int(multiple * magnitude)
    return int(10 * magnitude)


def _build_chart(hours: Sequence[HourMetrics], *, width: int = 960, height: int = 280) -> _Chart:
    """Lay out one stacked bar per hour, oldest on the left; the count axis starts at 0."""
    left, right_margin, top, bottom_margin = 56, 12, 12, 40
    plot_width, plot_height = width - left - right_margin, height - top - bottom_margin
    bottom = top + plot_height
    peak = max((h.total for h in hours), default=0)
    step = _axis_step(peak)
    max_value = max(step * math.ceil(peak / step), step)
    slot = plot_width / max(len(hours), 1)
    bar_width = max(slot * 0.8, 1.0)
    scale = plot_height / max_value
    bars = []
    x_ticks = []
    for index, hour in enumerate(hours):
        x = left + index * slot + (slot - bar_width) / 2
        allowed_height = hour.allowed * scale
        blocked_height = hour.blocked * scale
        start = hour.hour.strftime("%Y-%m-%d %H:00")
        bars.append(_ChartBar(
            hour=hour.hour.isoformat(),
            label=f"{start} UTC: {hour.allowed} allowed, {hour.blocked} blocked",
            allowed=hour.allowed, blocked=hour.blocked,
            x=round(x, 2), width=round(bar_width, 2),
            allowed_y=round(bottom - allowed_height, 2), allowed_height=round(allowed_height, 2),
            blocked_y=round(bottom - allowed_height - blocked_height, 2), blocked_height=round(blocked_height, 2),
        ))
        if hour.hour.hour % 6 == 0:
            text = hour.hour.strftime("%b %d") if hour.hour.hour == 0 else hour.hour.strftime("%H:00")
            x_ticks.append((round(left + index * slot + slot / 2, 2), text))
    y_ticks = tuple((round(bottom - value * scale, 2), f"{value:,}") for value in range(0, max_value + 1, step))
    return _Chart(width, height, left, left + plot_width, bottom, left + plot_width / 2, top + plot_height / 2,
                  max_value, tuple(bars), y_ticks, tuple(x_ticks))


# -- the other panels ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _RedisHealth:
    """Whether the limiter's Redis answers this app server, and how fast (one PING)."""

    ok: bool
    latency_ms: float | None
    version: str
    error: str


def _redis_health() -> _RedisHealth:
    """PING the limiter's Redis (and read its version); never raises."""
    from ..service.connection import get_redis

    try:
        client = get_redis()
        started = time.perf_counter()
        client.ping()
        latency_ms = (time.perf_counter() - started) * 1000
    except Exception as exc:  # the dashboard reports any failure instead of failing
        return _RedisHealth(False, None, "", f"{type(exc).__name__}: {exc}")
    version = ""
    try:
        info = client.info("server")
        if isinstance(info, dict):
            version = str(info.get("redis_version", ""))
    except (RedisError, OSError):
        pass  # INFO may be disabled on managed Redis; the version is optional
    return _RedisHealth(True, round(latency_ms, 2), version, "")


@dataclass(frozen=True)
class _BlockedRow:
    """A top blocked identity, with the admin page of its API key when it is one that still exists."""

    identity: str
    blocked: int
    url: str | None
    name: str


def _blocked_rows(top: Sequence[BlockedIdentity], user: Any) -> tuple[_BlockedRow, ...]:
    """The top blocked identities as the dashboard lists them to `user`: a "key:<prefix>" identity links to
    its key's admin page while the key exists and `user` may view API keys."""
    from ..models import ApiKey

    pages: dict[str, tuple[str, str]] = {}  # prefix -> (admin change URL, key name)
    prefixes = [item.identity[4:] for item in top if item.identity.startswith("key:")]
    # without the permission the link would answer 403
    if prefixes and (user.has_perm("ratelimit_app.view_apikey") or user.has_perm("ratelimit_app.change_apikey")):
        for pk, prefix, name in ApiKey.objects.filter(prefix__in=prefixes).values_list("pk", "prefix", "name"):
            try:
                pages[prefix] = (reverse("admin:ratelimit_app_apikey_change", args=[pk]), name)
            except NoReverseMatch:
                continue  # ApiKey not registered with this admin site
    rows = []
    for item in top:
        page = pages.get(item.identity[4:]) if item.identity.startswith("key:") else None
        rows.append(_BlockedRow(item.identity, item.blocked, *(page or (None, ""))))
    return tuple(rows)


def _days(summary: MetricsRange) -> str:
    """The UTC days the top lists of `summary` sum: "Jan 01", or "Jan 01 - Jan 03" (an en dash)."""
    first, last = f"{summary.start:%b %d}", f"{summary.end:%b %d}"
    return first if first == last else f"{first} \N{EN DASH} {last}"


def _max_hours() -> int:
    return min(int(ratelimit_settings.METRICS_TTL_HOURS), MAX_RANGE_HOURS)


def _hours_from(request: HttpRequest) -> int | None:
    raw = request.GET.get("hours")
    if raw is None:
        return min(_DEFAULT_HOURS, _max_hours())
    try:
        hours = int(raw)
    except ValueError:
        return None
    return hours if 1 <= hours <= _max_hours() else None


def _page_context(request: HttpRequest) -> dict[str, Any]:
    """What every rendering of the page shows (Redis health, this process), settings aside."""
    site: AdminSite = admin.site
    return {**site.each_context(request), "title": "Rate limiting dashboard", "health": _redis_health(),
            "process": process_metrics(), "hours": _DEFAULT_HOURS, "hour_choices": [], "flush_interval": None,
            "metrics_enabled": True, "error": ""}


def _render(request: HttpRequest) -> HttpResponse:
    context = _page_context(request)
    try:
        hours = _hours_from(request)
        context.update(hour_choices=[h for h in (6, 12, 24, 48) if h <= _max_hours()],
                       flush_interval=ratelimit_settings.METRICS_FLUSH_INTERVAL,
                       metrics_enabled=ratelimit_settings.METRICS_ENABLED)
    except InvalidSetting as exc:  # the page still shows Redis and this process, and what to fix
        context["error"] = f"Metrics are unavailable: {exc}."
        return TemplateResponse(request, "ratelimit_app/dashboard.html", context)
    if hours is None:
        return HttpResponseBadRequest(
            f"hours must be a whole number from 1 to {_max_hours()} (RATELIMIT['METRICS_TTL_HOURS'])",
            content_type="text/plain",
        )
    context["hours"] = hours
    try:
        summary = recent_metrics(hours)
    except (RedisError, OSError) as exc:
        context["error"] = f"Metrics are unavailable: Redis did not answer ({type(exc).__name__}: {exc})."
    except InvalidSetting as exc:
        context["error"] = f"Metrics are unavailable: {exc}."
    else:
        context.update(
            summary=summary,
            chart=_build_chart(summary.hours),
            blocked=_blocked_rows(summary.top_blocked, request.user),
            shadow_blocked=_blocked_rows(summary.top_shadow_blocked, request.user),
            days=_days(summary),
        )
    return TemplateResponse(request, "ratelimit_app/dashboard.html", context)


def _dashboard_view(request: HttpRequest) -> HttpResponse:
    """The dashboard page; active staff only (through `admin.site.admin_view`)."""
    return admin.site.admin_view(_render)(request)


def install_admin_link(site: AdminSite) -> None:
    """Link the dashboard from `site`'s index page, unless the site already has its own index template."""
    if site.index_template is None:
        site.index_template = _INDEX_TEMPLATE


urlpatterns = [
    path("ratelimit_app/dashboard/", _dashboard_view, name="ratelimit_dashboard"),
]
