"""The stable import path of the staff dashboard: `path("admin/", include("ratelimit_app.dashboard"))`.

The dashboard lives in ratelimit_app.observability.dashboard; this module re-exports its public names.
"""

from __future__ import annotations

from .observability.dashboard import (
    DEFAULT_HOURS,
    INDEX_TEMPLATE,
    BlockedRow,
    Chart,
    ChartBar,
    ChartTick,
    RedisHealth,
    blocked_rows,
    build_chart,
    dashboard_view,
    install_admin_link,
    redis_health,
    urlpatterns,
)

__all__ = ["DEFAULT_HOURS", "INDEX_TEMPLATE", "BlockedRow", "Chart", "ChartBar", "ChartTick", "RedisHealth",
           "blocked_rows", "build_chart", "dashboard_view", "install_admin_link", "redis_health", "urlpatterns"]
