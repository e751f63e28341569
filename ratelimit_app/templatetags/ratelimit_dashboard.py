"""Template filters of the rate-limiting dashboard: counts with thousands separators, rates as percent."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.filter
def count(value: Any) -> str:
    """12345 -> "12,345" (anything that is not a number is shown as is)."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)


@register.filter
def percent(value: Any) -> str:
    """0.1234 -> "12.3%" (a fraction from 0 to 1)."""
    try:
        return f"{float(value) * 100:.1f}%"
    except (TypeError, ValueError):
        return str(value)
