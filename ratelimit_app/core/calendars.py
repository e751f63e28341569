"""Calendar quotas: N units per calendar day, week (from Monday) or month in a time zone, as the rule each
policy carries to the decision script (the zone's offset now, its next change and the offset after it;
docs/algorithms.md, "Calendar quotas")."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

CALENDARS: tuple[str, ...] = ("day", "week", "month")
#: The `period` of a calendar policy: its longest length in seconds (headers show it as the window).
CALENDAR_PERIODS = {"day": 86_400, "week": 7 * 86_400, "month": 31 * 86_400}
_UNIT_CODES = {"day": 1, "week": 2, "month": 3}
_NO_CHANGE = 2**27 - 1
_SEARCH_DAYS = 400


def is_valid_time_zone(name: str) -> bool:
    """True when `name` is an IANA time zone this server knows ("UTC", "Europe/Paris")."""
    if not isinstance(name, str) or not name:
        return False
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _quarters(offset: timedelta | None) -> int:
    seconds = int(offset.total_seconds()) if offset is not None else 0
    return max(-64, min(63, round(seconds / 900)))


def _offset(zone: ZoneInfo, at: int) -> int:
    return _quarters(datetime.fromtimestamp(at, tz=zone).utcoffset())


@lru_cache(maxsize=256)
def calendar_rule(unit: str, time_zone: str, hour: int) -> int:
    """The rule of a calendar `unit` in `time_zone` as of the start of `hour` (hours since the epoch)."""
    zone = ZoneInfo(time_zone)
    start = hour * 3600
    now = _offset(zone, start)
    change, after = _NO_CHANGE, now
    low = start
    for day in range(1, _SEARCH_DAYS + 1):  # find the first day whose offset differs ...
        high = start + day * 86_400
        if _offset(zone, high) != now:
            while high - low > 60:  # ... then the minute it changes
                middle = (low + high) // 2
                if _offset(zone, middle) == now:
                    low = middle
                else:
                    high = middle
            change, after = -(-high // 60), _offset(zone, high)
            break
        low = high
    return ((_UNIT_CODES[unit] * 128 + now + 64) * 128 + after + 64) * 2**27 + change


def rule_at(unit: str, time_zone: str, at: float) -> int:
    """The rule of a calendar `unit` in `time_zone` for Unix time `at` (see the module docstring)."""
    return calendar_rule(unit, time_zone, int(at) // 3600)


def period_bounds(unit: str, time_zone: str, at: float) -> tuple[datetime, datetime]:
    """The calendar period containing Unix time `at`, as aware datetimes in `time_zone` (for display
    and tests; decisions use the script's own arithmetic on Redis time)."""
    zone = ZoneInfo(time_zone)
    local = datetime.fromtimestamp(at, tz=zone)
    start = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if unit == "week":
        start -= timedelta(days=start.weekday())
        end = start + timedelta(days=7)
    elif unit == "month":
        start = start.replace(day=1)
        end = (start.replace(day=28) + timedelta(days=4)).replace(day=1)
    else:
        end = start + timedelta(days=1)
    # wall-clock arithmetic, then back through UTC so each end carries the offset in force then
    start = start.replace(tzinfo=None).replace(tzinfo=zone).astimezone(timezone.utc).astimezone(zone)
    end = end.replace(tzinfo=None).replace(tzinfo=zone).astimezone(timezone.utc).astimezone(zone)
    return start, end
