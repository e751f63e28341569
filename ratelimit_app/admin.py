"""The admin of tiers, API keys and user tiers (their limits inline, their effective limits shown) and
allow/deny rules; a new API key is shown once, in the message after it is created (docs/plans.md)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from .apply.planning import limit_config
from .conf.settings import IP_POLICY_NAME, InvalidSetting
from .core import apikeys
from .core.policies import CONCURRENCY, Policy
from .models import ApiKey, ApiKeyLimit, ClientRule, Tier, TierLimit, UserTier, UserTierLimit
from .plans.checks import row_problem
from .plans.compile import OVERRIDE_FIELDS, TierInfo, apply_overrides
from .plans.lookups import get_lookups

_LIMIT_FIELDS = ("name", "algorithm", "limit", "unit", "period", "burst", "calendar", "scope", "enabled", "shadow")

#: The calendar choices as a limit row shows them (the column's help text says the rest), short enough
#: for a tier's rows to fit a 1,366 px window (a week starts on Monday); the model's own labels are unchanged.
_ROW_CALENDARS = [("", "no"), ("day", "day"), ("week", "week"), ("month", "month")]


class _LimitRowForm(forms.ModelForm):
    """A limit row (sized by templates/admin/ratelimit_app/change_form.html)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        calendar = self.fields.get("calendar")
        if isinstance(calendar, forms.ChoiceField):
            calendar.choices = _ROW_CALENDARS


def _enforcement(row: Any) -> str:
    """"not enforced: <why>" for a stored limit that cannot become a policy (requests skip it), else ""."""
    problem = row_problem(row) if row.pk is not None else None
    return f"not enforced: {problem}" if problem else ""


class _LimitInline(admin.TabularInline):
    form = _LimitRowForm
    extra = 0
    fields = _LIMIT_FIELDS


class _LimitsAdmin(admin.ModelAdmin):
    """An object with limits: its effective limits, and a warning for each stored limit not enforced."""

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> Any:
        obj = self.get_object(request, object_id) if request.method == "GET" else None
        rows = obj.limits.all() if obj is not None else ()  # Tier, ApiKey and UserTier each have .limits
        for row in rows:
            problem = _enforcement(row)
            if problem:
                messages.warning(request, f"Limit {row.policy_name!r}: {problem}")
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="effective limits")
    def effective_limits(self, obj: Tier | ApiKey | UserTier) -> str:
        if obj.pk is None:
            return "-"
        if isinstance(obj, Tier):
            return _effective_limits_table(obj.slug)
        return _effective_limits_table(obj.tier.slug, obj.limits.all())


class _TierLimitInline(_LimitInline):
    model = TierLimit


class _ApiKeyLimitInline(_LimitInline):
    model = ApiKeyLimit
    verbose_name = "limit override"
    verbose_name_plural = "Limit overrides (a tier limit's name replaces it for this key; other names add a limit)"


class _UserTierLimitInline(_LimitInline):
    model = UserTierLimit
    verbose_name = "limit override"
    verbose_name_plural = "Limit overrides (a tier limit's name replaces it for this user; other names add a limit)"


def _describe(policy: Policy, source: str) -> tuple[str, str, str, str, str]:
    if policy.algorithm == CONCURRENCY:  # a number of requests in flight, each slot leased for the period
        rate = f"{policy.limit} at once ({policy.period:g} s lease)"
    elif policy.calendar:
        rate = f"{policy.limit} per calendar {policy.calendar} ({policy.time_zone})"
    else:
        rate = policy.rate + (f" burst {policy.burst}" if policy.burst is not None else "")
    return (policy.name, rate, policy.algorithm, "shadow (dry run)" if policy.shadow else "enforced", source)


def _effective_limits_table(tier_slug: str, overrides: QuerySet[Any] | None = None) -> str:
    """An HTML table of the limits a client gets: its tier's with `overrides` applied, and its per-IP limit
    (or why it cannot be shown: the page never depends on RATELIMIT being valid)."""
    try:
        tier = get_lookups().tier(tier_slug)
        default_ip = limit_config().ip_policies
    except InvalidSetting as exc:
        return f"(unavailable: {exc})"
    if tier is None:
        return "(the tier does not exist)"
    rows = tuple(overrides.order_by("scope", "period", "id").values_list(*OVERRIDE_FIELDS)) if overrides else ()
    merged = apply_overrides(tier, rows)
    own = {f"{row[5]}.{row[0]}" if row[5] else row[0] for row in rows if row[6]}
    seen = {policy.name: policy for policy in merged.every_policy()}
    described = [_describe(p, "override" if p.name in own else f"tier {tier.slug}") for p in seen.values()]
    described.append(_per_ip_row(merged, default_ip))
    body = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", described)
    unlimited = format_html("<p>{}</p>", "unlimited: no limit of its own") if not seen else ""
    return format_html('{}<table class="rl-effective-limits"><thead><tr><th>policy</th><th>rate</th>'
                       "<th>algorithm</th><th>mode</th><th>from</th></tr></thead><tbody>{}</tbody></table>",
                       unlimited, body)


def _per_ip_row(tier: TierInfo, default: tuple[Policy, ...]) -> tuple[str, str, str, str, str]:
    """The row of the per-IP limit a client of `tier` (its overrides applied) is counted on."""
    if tier.ip_policies == ():
        return (IP_POLICY_NAME, "none", "-", "-", "override: its own limits replace its tier's, no per-IP limit")
    if tier.ip_policies is not None:
        return _describe(tier.ip_policies[0], f"tier {tier.slug}: per client address, its keys and users together")
    if default:
        return _describe(default[0], "RATELIMIT['IP_RATE']: per client address, with requests without a key "
                                     "and the other tiers that set no per-IP rate")
    return (IP_POLICY_NAME, "none", "-", "-", "RATELIMIT['IP_RATE'] is None and the tier sets no per-IP rate")


@admin.register(Tier)
class TierAdmin(_LimitsAdmin):
    list_display = ("slug", "name", "fail_mode", "time_zone", "limits_summary")
    search_fields = ("slug", "name")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [_TierLimitInline]
    readonly_fields = ("effective_limits",)

    @admin.display(description="limits")
    def limits_summary(self, obj: Tier) -> str:
        return "; ".join(" ".join(filter(None, (str(limit), _enforcement(limit))))
                         for limit in obj.limits.all() if limit.enabled) or "unlimited"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tier]:
        return super().get_queryset(request).prefetch_related("limits")


@admin.register(ApiKey)
class ApiKeyAdmin(_LimitsAdmin):
    list_display = ("name", "prefix", "tier", "owner", "created", "expires", "status")
    list_filter = ("tier", "revoked")
    search_fields = ("name", "prefix")
    raw_id_fields = ("owner",)
    actions = ["revoke_keys"]

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        if obj is None:
            return ("name", "tier", "owner", "expires")
        return ("name", "prefix", "tier", "owner", "created", "expires", "revoked", "effective_limits")

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        if obj is None:
            return ()
        return ("prefix", "created", "revoked", "effective_limits") if obj.revoked else (
            "prefix", "created", "effective_limits")

    def get_inlines(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        return [_ApiKeyLimitInline] if obj is not None else []  # overrides once the key exists

    @admin.display(description="status", ordering="revoked")
    def status(self, obj: ApiKey) -> str:
        if obj.revoked:
            return "Revoked"
        return "Expired" if obj.is_expired else "Active"

    def save_model(self, request: HttpRequest, obj: ApiKey, form: ModelForm[ApiKey], change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        prefix, key = apikeys.generate_key()
        obj.prefix, obj.hashed_key = prefix, apikeys.hash_key(key)
        super().save_model(request, obj, form, change)
        # The only time the key exists outside the client's hands: shown once, never stored or logged.
        messages.warning(
            request,
            f"The API key for “{obj.name}” is {key} — copy it now: it is stored hashed and will not be shown again.",
        )

    @admin.action(description="Revoke selected API keys (cannot be undone)")
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = 0
        for api_key in queryset.filter(revoked=False):
            api_key.revoked = True
            api_key.save(update_fields=["revoked"])  # save(), not update(): the signals invalidate caches
            count += 1
        self.message_user(request, f"Revoked {count} API key(s).", messages.SUCCESS)


@admin.register(UserTier)
class UserTierAdmin(_LimitsAdmin):
    list_display = ("user", "tier")
    list_filter = ("tier",)
    raw_id_fields = ("user",)
    readonly_fields = ("effective_limits",)

    def get_inlines(self, request: HttpRequest, obj: UserTier | None = None) -> Any:
        return [_UserTierLimitInline] if obj is not None else []  # overrides once the assignment exists


@admin.register(ClientRule)
class ClientRuleAdmin(admin.ModelAdmin):
    list_display = ("action", "network", "api_key", "note", "enabled", "created")
    list_filter = ("action", "enabled")
    search_fields = ("network", "note", "api_key__prefix", "api_key__name")
    raw_id_fields = ("api_key",)
    fields = ("action", "network", "api_key", "note", "enabled")
