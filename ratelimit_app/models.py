"""Plans ("tiers"), their limits, API keys, per-user tiers and allow/deny rules, as staff edit them in the
admin. Request handling reads them through `ratelimit_app.plans.lookups`, never directly."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import django
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from .conf.settings import IP_POLICY_NAME, ip_rate_problem
from .core import apikeys
from .core.calendars import CALENDAR_PERIODS, CALENDARS, is_valid_time_zone
from .core.clientrules import ALLOW, DENY, parse_network
from .core.policies import (
    ALL_ALGORITHMS,
    BURST_ALGORITHMS,
    CONCURRENCY,
    MAX_LIMIT,
    MAX_PERIOD_SECONDS,
    InvalidPolicy,
    Policy,
)

FAIL_MODE_CHOICES = [("", "Default (RATELIMIT['FAIL_MODE'])"), ("open", "Open: allow, marked degraded"),
                     ("closed", "Closed: refuse with 503"), ("local", "Local: in-process fallback limiter")]
CALENDAR_CHOICES = [("", "No: a rolling or epoch-aligned period"), ("day", "Calendar day"),
                    ("week", "Calendar week (from Monday)"), ("month", "Calendar month")]
_name_validator = RegexValidator(r"^[A-Za-z0-9_-]{1,30}$", "Use 1-30 letters, digits, '_' or '-'.", code="invalid_name")
_unit_validator = RegexValidator(r"^[a-z][a-z0-9_]{0,31}$", "Use lowercase letters, digits or '_', such as tokens.",
                                 code="invalid_unit")
_NOT_IN_NAME = r"[^A-Za-z0-9_-]"  # searched for in a name, scope or slug ("^...$" lets a trailing newline in)


def _check(condition: models.Q, name: str, message: str) -> models.CheckConstraint:
    """A CheckConstraint on every supported Django (its `check` argument is `condition` from 5.1 on)."""
    arguments: dict[str, Any] = {"condition" if django.VERSION >= (5, 1) else "check": condition}
    return models.CheckConstraint(**arguments, name=name, violation_error_message=message)


def _safe(field: str, *, blank: bool = False) -> models.Q:
    """`field` holds only letters, digits, '_' and '-', and is not empty unless `blank`."""
    safe = ~models.Q(**{f"{field}__regex": _NOT_IN_NAME})
    return safe if blank else ~models.Q(**{field: ""}) & safe


def _limit_constraints(model: str, owner: str, unique: str) -> list[models.BaseConstraint]:
    """What the database refuses in a limit row (`model`), one limit per name and scope of its `owner` included.
    Not the algorithm: a constraint naming the registry's algorithms would need a migration per algorithm."""
    rules = [
        ("limit", models.Q(limit__gte=1, limit__lte=MAX_LIMIT), f"The limit is from 1 to {MAX_LIMIT}."),
        ("period", models.Q(period__gte=1, period__lte=MAX_PERIOD_SECONDS),
         f"The period is from 1 to {MAX_PERIOD_SECONDS} seconds."),
        ("burst", models.Q(burst__isnull=True) | models.Q(burst__gte=1, burst__lte=MAX_LIMIT),
         f"A burst is from 1 to {MAX_LIMIT}."),
        ("calendar", models.Q(calendar="") | models.Q(calendar__in=CALENDARS, algorithm="fixed_window"),
         f"A calendar quota ({', '.join(CALENDARS)}) uses fixed window."),
        ("name", _safe("name"), "A limit name is letters, digits, '_' or '-'."),
        ("scope", _safe("scope", blank=True), "A scope is letters, digits, '_' or '-'."),
        ("unit", models.Q(unit="") | ~models.Q(algorithm=CONCURRENCY) & _safe("unit"),
         "A unit (tokens) is letters, digits or '_', and requests in flight have none."),
    ]
    return [models.UniqueConstraint(fields=[owner, "scope", "name"], name=unique),
            *(_check(condition, f"ratelimit_{model}_{field}", message) for field, condition, message in rules)]


class AlgorithmField(models.CharField):
    """A limit's algorithm, offered as the registry's choices. The choices are left out of migrations
    (`deconstruct`), so that a new algorithm needs none."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 30)
        kwargs["choices"] = [(name, name.replace("_", " ")) for name in ALL_ALGORITHMS]
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        del kwargs["choices"]
        return name, path, args, kwargs


class Tier(models.Model):
    """A plan such as free, pro or enterprise: a named set of limits, and what to do when Redis is down."""

    slug = models.SlugField(max_length=50, unique=True, help_text="Stable identifier used in settings and headers.")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    fail_mode = models.CharField(max_length=10, blank=True, default="", choices=FAIL_MODE_CHOICES,
                                 help_text="What requests of this tier get when Redis is unavailable.")
    time_zone = models.CharField(max_length=64, default="UTC", help_text="IANA time zone of this tier's calendar "
                                 "quotas (Europe/Paris): where a day, week or month starts.")
    ip_rate = models.CharField("per-IP rate", max_length=20, blank=True, default="",
                               help_text="What one client address may send under this tier, its keys and users "
                                         "together, such as 1000/m (docs/plans.md). Empty: RATELIMIT['IP_RATE'], "
                                         "counted with requests without a key.")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            _check(models.Q(fail_mode__in=[value for value, _ in FAIL_MODE_CHOICES]), "ratelimit_tier_fail_mode",
                   "Not one of the fail modes."),
            # the slug travels in response headers: no CR, LF or anything else a SlugField refuses
            _check(_safe("slug"), "ratelimit_tier_slug", "A slug is letters, digits, '_' or '-'."),
        ]

    def __str__(self) -> str:
        return self.name or self.slug

    def clean(self) -> None:
        """Refuse an unknown time zone, and a per-IP rate the per-IP limit cannot count."""
        super().clean()
        errors: dict[str, str] = {}
        if not is_valid_time_zone(self.time_zone):
            errors["time_zone"] = "Not a known IANA time zone (for example UTC or Europe/Paris)."
        problem = ip_rate_problem(self.ip_rate) if self.ip_rate else None
        if problem is not None:
            errors["ip_rate"] = f"{problem.removeprefix('rate: ')}; expected a rate such as 1000/m, or empty."
        if errors:
            raise ValidationError(errors)


class LimitShape(models.Model):
    """The fields a tier limit and a client's override limit share: how much, per how long, how."""

    algorithm = AlgorithmField()
    limit = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    period = models.PositiveIntegerField(validators=[MinValueValidator(1)], help_text="Seconds.")
    burst = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)],
                                        help_text="Bucket size for token bucket and GCRA; empty means the limit.")
    scope = models.CharField(max_length=30, blank=True, default="", validators=[_name_validator],
                             help_text="Empty: every route. Otherwise only views that declare this scope.")
    unit = models.CharField(max_length=32, blank=True, default="", validators=[_unit_validator], help_text=(
        "Empty: requests. A unit of usage (tokens): charged only by what requests report using."))

    class Meta:
        abstract = True


class TierLimit(LimitShape):
    """One limit of a tier: `limit` units per `period` seconds under `algorithm` (docs/plans.md). Its policy
    is named `name`, or `scope.name` for a limit of the views that declare `scope`."""

    tier = models.ForeignKey(Tier, on_delete=models.CASCADE, related_name="limits")
    name = models.CharField(max_length=30, validators=[_name_validator], help_text="For example burst, minute, day.")
    enabled = models.BooleanField(default=True)
    shadow = models.BooleanField(default=False, help_text="Dry run: counted as if enforced, never refuses; "
                                                          "requests it would refuse show in the dashboard.")
    calendar = models.CharField(max_length=5, blank=True, default="", choices=CALENDAR_CHOICES,
                                help_text="A calendar quota (fixed window only): resets at 00:00 in the tier's time "
                                          "zone each day, Monday or 1st; the period is then set from the calendar.")

    class Meta:
        ordering = ["scope", "period", "id"]
        constraints = [
            *_limit_constraints("tierlimit", "tier", "ratelimit_unique_limit_name"),
            _check(~models.Q(name=IP_POLICY_NAME, scope=""), "ratelimit_limit_name_not_ip",  # the form's rule too
                   f"'{IP_POLICY_NAME}' is reserved for the per-IP limit."),
        ]

    def __str__(self) -> str:
        burst = f" burst {self.burst}" if self.burst else ""
        scope = f" [{self.scope}]" if self.scope else ""
        shadow = " (shadow)" if self.shadow else ""
        if self.calendar:
            return f"{self.name}: {self.limit} per calendar {self.calendar}{scope}{shadow}"
        if self.algorithm == CONCURRENCY:  # requests in flight; the period is each slot's lease
            return f"{self.name}: {self.limit} at once, {self.period}s lease{scope}{shadow}"
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.name}: {self.limit}{unit}/{self.period}s {self.algorithm}{burst}{scope}{shadow}"

    @property
    def policy_name(self) -> str:
        """The name this limit carries in decisions, headers and Redis keys."""
        return f"{self.scope}.{self.name}" if self.scope else self.name

    def to_policy(self, time_zone: str | None = None) -> Policy:
        """The engine policy for this limit (InvalidPolicy when it cannot be enforced); `time_zone` (the tier's
        when None) matters only for calendar quotas, whose period is their calendar's."""
        calendar: dict[str, Any] = {}
        if self.calendar:
            calendar = {"calendar": self.calendar, "time_zone": time_zone or (
                self.tier.time_zone if self.tier_id is not None else "UTC")}
        return Policy(self.policy_name, self.algorithm, limit=self.limit, burst=self.burst, shadow=bool(self.shadow),
                      unit=self.unit, period=CALENDAR_PERIODS.get(self.calendar, self.period), **calendar)

    def clean(self) -> None:
        """Refuse values the engine cannot enforce, naming the field at fault."""
        super().clean()
        errors: dict[str, str] = {}
        if self.calendar:
            if self.algorithm != "fixed_window":
                errors["algorithm"] = "A calendar quota uses fixed window."
            elif self.calendar in CALENDAR_PERIODS:
                self.period = CALENDAR_PERIODS[self.calendar]
        if self.name == IP_POLICY_NAME and not self.scope:
            errors["name"] = f"'{IP_POLICY_NAME}' is reserved for the per-IP limit."
        if self.burst is not None and self.algorithm not in BURST_ALGORITHMS:
            errors["burst"] = f"Only {' and '.join(sorted(BURST_ALGORITHMS))} take a burst; leave it empty."
        if self.limit is not None and self.limit > MAX_LIMIT:
            errors["limit"] = f"At most {MAX_LIMIT}."
        if self.period is not None and self.period > MAX_PERIOD_SECONDS:
            errors["period"] = f"At most {MAX_PERIOD_SECONDS} seconds (366 days)."
        if errors:
            raise ValidationError(errors)
        if None in (self.name, self.algorithm, self.limit, self.period):
            return  # field validation reports the missing values
        try:
            self.to_policy()
        except InvalidPolicy as exc:
            field, _, message = str(exc).partition(": ")
            field = field if field in ("limit", "period", "burst", "unit") else "__all__"
            raise ValidationError({field: message}) from exc


class ApiKeyManager(models.Manager["ApiKey"]):
    def create_key(self, *, name: str, tier: Tier, owner: Any = None,
                   expires: datetime | None = None) -> tuple[ApiKey, str]:
        """Create a key and return `(api_key, full_key)`. The full key exists only in this return value."""
        for _ in range(5):
            prefix, key = apikeys.generate_key()
            try:
                with transaction.atomic():
                    obj = self.create(name=name, tier=tier, owner=owner, expires=expires, prefix=prefix,
                                      hashed_key=apikeys.hash_key(key))
            except IntegrityError:
                if self.filter(prefix=prefix).exists():
                    continue  # a prefix collision (1 in 2e14): draw again
                raise
            return obj, key
        raise RuntimeError("could not draw an unused API key prefix in 5 attempts")


class ApiKey(models.Model):
    """A client's API key. Only its prefix and a SHA-512 hash are stored; revocation cannot be undone."""

    name = models.CharField(max_length=100, help_text="Who or what uses this key.")
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="api_keys")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True,
                              related_name="api_keys")
    prefix = models.CharField(max_length=apikeys.PREFIX_LENGTH, unique=True, editable=False)
    hashed_key = models.CharField(max_length=128, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")
    revoked = models.BooleanField(default=False, help_text="A revoked key is refused; this cannot be undone.")

    objects = ApiKeyManager()

    class Meta:
        ordering = ["-created"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix})"

    @property
    def is_expired(self) -> bool:
        """True once the expiry time has passed."""
        return self.expires is not None and self.expires <= timezone.now()

    def _unrevokes(self) -> bool:
        """True when this save would restore a key that is revoked in the database."""
        return (not self.revoked and self.pk is not None
                and type(self)._default_manager.filter(pk=self.pk, revoked=True).exists())

    def clean(self) -> None:
        """Refuse to restore a revoked key."""
        super().clean()
        if self._unrevokes():
            raise ValidationError({"revoked": "A revoked key cannot be restored; create a new key."})

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self.prefix or not self.hashed_key:
            raise ValidationError("Create API keys with ApiKey.objects.create_key(), which returns the key.")
        if self._unrevokes():
            raise ValidationError("A revoked API key cannot be restored; create a new key.")
        super().save(*args, **kwargs)


class UserTier(models.Model):
    """The tier of an authenticated user who calls without an API key (else RATELIMIT['DEFAULT_USER_TIER'])."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ratelimit_tier")
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="users")

    class Meta:
        verbose_name = "user tier"

    def __str__(self) -> str:
        return f"{self.user} -> {self.tier.slug}"


class OverrideLimit(LimitShape):
    """A limit of one API key or one user on top of its tier, validated as a TierLimit: it replaces the tier
    limit of its name and scope for that client (disabled: removes it), or adds one."""

    name = models.CharField(max_length=30, validators=[_name_validator],
                            help_text="The name of a tier limit replaces it; another name adds a limit.")
    enabled = models.BooleanField(default=True, help_text="Off: the tier limit of this name does not apply.")
    shadow = models.BooleanField(default=False, help_text="Dry run: counted as if enforced, never refuses.")
    calendar = models.CharField(max_length=5, blank=True, default="", choices=CALENDAR_CHOICES,
                                help_text="A calendar quota, in the tier's time zone (fixed window only).")

    class Meta:
        abstract = True
        ordering = ["scope", "period", "id"]

    def __str__(self) -> str:
        return str(self.as_tier_limit())

    def as_tier_limit(self) -> TierLimit:
        """This override as an unsaved TierLimit (the same validation and policy)."""
        return TierLimit(name=self.name, algorithm=self.algorithm, limit=self.limit, period=self.period,
                         burst=self.burst, scope=self.scope, enabled=self.enabled, shadow=self.shadow,
                         calendar=self.calendar, unit=self.unit)

    @property
    def policy_name(self) -> str:
        """The name this limit carries in decisions, headers and Redis keys."""
        return self.as_tier_limit().policy_name

    def to_policy(self) -> Policy:
        """The engine policy for this limit (raises InvalidPolicy when the values cannot be enforced)."""
        return self.as_tier_limit().to_policy()

    def clean(self) -> None:
        """Refuse values the engine cannot enforce, as TierLimit.clean does."""
        super().clean()
        row = self.as_tier_limit()
        row.clean()
        self.period = row.period  # a calendar quota's period comes from the calendar


class ApiKeyLimit(OverrideLimit):
    """A limit of one API key: replaces the tier limit of the same name and scope, or adds one."""

    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="limits")

    class Meta(OverrideLimit.Meta):
        verbose_name = "API key limit override"
        constraints = _limit_constraints("apikeylimit", "api_key", "ratelimit_unique_key_limit_name")


class UserTierLimit(OverrideLimit):
    """A limit of one user (through the user's tier assignment): replaces or adds, like ApiKeyLimit."""

    user_tier = models.ForeignKey(UserTier, on_delete=models.CASCADE, related_name="limits")

    class Meta(OverrideLimit.Meta):
        verbose_name = "user limit override"
        constraints = _limit_constraints("usertierlimit", "user_tier", "ratelimit_unique_user_limit_name")


class ClientRule(models.Model):
    """An allow or deny rule for a client network (CIDR) or an API key, applied before any Redis call: allow
    is never limited (nothing is charged), deny is refused with 403; deny wins when both match."""

    ACTION_CHOICES = [(ALLOW, "Allow: never limited"), (DENY, "Deny: always refused (403)")]

    action = models.CharField(max_length=5, choices=ACTION_CHOICES)
    network = models.CharField(max_length=49, blank=True, default="",
                               help_text="A client network in CIDR notation (10.0.0.0/8, 2001:db8::/48) or one "
                                         "address; empty when the rule names an API key.")
    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, null=True, blank=True,
                                related_name="client_rules", help_text="Empty when the rule names a network.")
    note = models.CharField(max_length=200, blank=True, help_text="Why this rule exists.")
    enabled = models.BooleanField(default=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["action", "network", "id"]
        verbose_name = "client allow/deny rule"
        constraints = [
            _check(models.Q(action__in=[ALLOW, DENY]), "ratelimit_clientrule_action", "The action is allow or deny."),
            _check(models.Q(network="", api_key__isnull=False) | ~models.Q(network="") & models.Q(api_key__isnull=True),
                   "ratelimit_clientrule_target", "Give either a network or an API key (exactly one)."),
        ]

    def __str__(self) -> str:
        target = self.network or (f"API key {self.api_key.prefix}" if self.api_key_id and self.api_key else "?")
        return f"{self.action} {target}"

    def clean(self) -> None:
        """Exactly one of network and api_key; a network is stored in its canonical CIDR form (an
        IPv4-mapped IPv6 network as the IPv4 network it maps, which is how clients are matched)."""
        super().clean()
        network = (self.network or "").strip()
        if bool(network) == bool(self.api_key_id):
            raise ValidationError("Give either a network or an API key (exactly one).")
        if network:
            try:
                self.network = str(parse_network(network))
            except ValueError as exc:
                raise ValidationError({"network": f"Not a network in CIDR notation: {exc}"}) from exc
