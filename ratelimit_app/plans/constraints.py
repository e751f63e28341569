"""The CheckConstraints of the plan models (ratelimit_app.models): the database refuses what the models
cannot mean, so a row written around the admin (`QuerySet.update`, raw SQL, a data migration) cannot
hold a value the request path would have to guess about."""

from __future__ import annotations

from typing import Any

import django
from django.db import models

from ..core.calendars import CALENDARS
from ..core.policies import ALL_ALGORITHMS, BURST_ALGORITHMS, CONCURRENCY, MAX_LIMIT, MAX_PERIOD_SECONDS


def check_constraint(condition: models.Q, *, name: str, message: str) -> models.CheckConstraint:
    """A CheckConstraint on every supported Django (its `check` argument is `condition` from 5.1 on)."""
    arguments: dict[str, Any] = {"condition" if django.VERSION >= (5, 1) else "check": condition}
    return models.CheckConstraint(**arguments, name=name, violation_error_message=message)


#: A character that no limit name, scope or tier slug may hold (their length is their column's). Searched
#: for, not anchored: "^...$" would let a trailing newline through on SQLite, whose REGEXP is Python's.
_NOT_IN_NAME = r"[^A-Za-z0-9_-]"


def only_safe_characters(field: str, *, blank: bool = False) -> models.Q:
    """`field` holds only letters, digits, '_' and '-', and is not empty unless `blank`."""
    safe = ~models.Q(**{f"{field}__regex": _NOT_IN_NAME})
    return safe if blank else ~models.Q(**{field: ""}) & safe


def override_constraints(owner: str, unique_name: str, model: str) -> list[models.BaseConstraint]:
    """The constraints of a per-client override row (ApiKeyLimit, UserTierLimit): one limit per name and
    scope of its `owner` (the foreign key's field), and `limit_constraints(model)`."""
    return [models.UniqueConstraint(fields=[owner, "scope", "name"], name=unique_name), *limit_constraints(model)]


def limit_constraints(model: str) -> list[models.CheckConstraint]:
    """What the database refuses in a limit row (`model`: tierlimit, apikeylimit, usertierlimit): the
    values its validation refuses, for writes that skip it (`QuerySet.update`, raw SQL, a data migration).
    What only the policy can tell (one too large to count exactly, a calendar quota of a tier whose time
    zone is unknown) is left to `clean()`, `manage.py check` and the compiler, which skips such a row."""
    burst_algorithms = sorted(BURST_ALGORITHMS)
    rules = [
        ("algorithm", models.Q(algorithm__in=ALL_ALGORITHMS), f"The algorithm is one of {', '.join(ALL_ALGORITHMS)}."),
        ("limit", models.Q(limit__gte=1, limit__lte=MAX_LIMIT), f"The limit is from 1 to {MAX_LIMIT}."),
        ("period", models.Q(period__gte=1, period__lte=MAX_PERIOD_SECONDS),
         f"The period is from 1 to {MAX_PERIOD_SECONDS} seconds."),
        ("burst", models.Q(burst__isnull=True) | models.Q(burst__gte=1, burst__lte=MAX_LIMIT,
                                                          algorithm__in=burst_algorithms),
         f"Only {' and '.join(burst_algorithms)} take a burst, from 1 to {MAX_LIMIT}."),
        ("calendar", models.Q(calendar="") | models.Q(calendar__in=CALENDARS, algorithm="fixed_window"),
         f"A calendar quota ({', '.join(CALENDARS)}) uses fixed window."),
        ("name", only_safe_characters("name"), "A limit name is letters, digits, '_' or '-'."),
        ("scope", only_safe_characters("scope", blank=True), "A scope is letters, digits, '_' or '-'."),
        ("unit", models.Q(unit="") | ~models.Q(algorithm=CONCURRENCY) & only_safe_characters("unit"),
         "A unit (tokens) is letters, digits or '_', and requests in flight have none."),
    ]
    return [check_constraint(condition, name=f"ratelimit_{model}_{field}", message=message)
            for field, condition, message in rules]


