"""Calendar quotas: N units per calendar day, week (from Monday) or month, in a time zone.

The boundaries are computed inside the decision script from Redis time, like every other decision.
The script cannot read the time zone database, so each calendar policy carries a *rule*: the zone's
UTC offset now, the moment of its next change (a DST transition) and the offset after it. The script
takes Redis time, picks the offset that applies at that time, finds the local day, week or month it
falls in, and when the next one starts (in UTC, with the offset in force then). The rule is derived
from the zone database when the policy is built (tiers are rebuilt every RATELIMIT['CACHE_TTL']); the
app server's clock only chooses which transition is "next", never where a period starts or ends. One
offset change between now and the next boundary is accounted for (DST: two transitions a year, months
apart).

The rule is one integer below 2**53 (exact in a Lua number):

    rule = ((unit * 128 + offset_now_q + 64) * 128 + offset_next_q + 64) * 2**27 + change_minute

`unit` 1 day, 2 week, 3 month; offsets in quarter hours (-64..63, every real zone qualifies); and
`change_minute` the minute since the epoch of the next change (2**27 - 1: none within 400 days).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

CALENDARS: tuple[str, ...] = ("day", "week", "month")
#: The `period` of a calendar policy: its longest length in seconds (headers show it as the window).
CALENDAR_PERIODS = {"day": 86_400, "week": 7 * 86_400, "month": 31 * 86_400}
UNIT_CODES = {"day": 1, "week": 2, "month": 3}
NO_CHANGE = 2**27 - 1
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
    change, after = NO_CHANGE, now
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
    return ((UNIT_CODES[unit] * 128 + now + 64) * 128 + after + 64) * 2**27 + change


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
    elif unit == "month":
        start = start.replace(day=1)
    if unit == "day":
        end = start + timedelta(days=1)
    elif unit == "week":
        end = start + timedelta(days=7)
    else:
        end = (start.replace(day=28) + timedelta(days=4)).replace(day=1)
    # wall-clock arithmetic, then back through UTC so each end carries the offset in force then
    start = start.replace(tzinfo=None).replace(tzinfo=zone).astimezone(timezone.utc).astimezone(zone)
    end = end.replace(tzinfo=None).replace(tzinfo=zone).astimezone(timezone.utc).astimezone(zone)
    return start, end
