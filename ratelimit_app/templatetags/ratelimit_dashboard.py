"""Template filters of the rate-limiting dashboard: counts with thousands separators, rates as percent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import template

register = template.Library()


def _shown(value: Any, format_number: Callable[[Any], str]) -> str:
    try:
        return format_number(value)
    except (TypeError, ValueError):
        return str(value)


@register.filter
def count(value: Any) -> str:
    """12345 -> "12,345" (anything that is not a number is shown as is)."""
    return _shown(value, lambda number: f"{int(number):,}")


@register.filter
def percent(value: Any) -> str:
    """0.1234 -> "12.3%" (a fraction from 0 to 1; anything that is not a number is shown as is)."""
    return _shown(value, lambda number: f"{float(number) * 100:.1f}%")
