"""Admin for tiers (with their limits inline), API keys and user tiers.

Every save or delete here invalidates the lookup caches (signals in `lookups`), so a change is enforced
on every app server within RATELIMIT['CACHE_TTL'] seconds. A new API key is shown exactly once, in the
message after it is created; only its prefix and hash are stored. Revocation cannot be undone.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest

from . import apikeys
from .models import ApiKey, Tier, TierLimit, UserTier


class TierLimitInline(admin.TabularInline):
    model = TierLimit
    extra = 0
    fields = ("name", "algorithm", "limit", "period", "burst", "scope", "enabled")


@admin.register(Tier)
class TierAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "fail_mode", "limits_summary")
    search_fields = ("slug", "name")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [TierLimitInline]

    @admin.display(description="limits")
    def limits_summary(self, obj: Tier) -> str:
        return "; ".join(str(limit) for limit in obj.limits.all() if limit.enabled) or "unlimited"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tier]:
        return super().get_queryset(request).prefetch_related("limits")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "tier", "owner", "created", "expires", "revoked")
    list_filter = ("tier", "revoked")
    search_fields = ("name", "prefix")
    raw_id_fields = ("owner",)
    actions = ["revoke_keys"]

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        if obj is None:
            return ("name", "tier", "owner", "expires")
        return ("name", "prefix", "tier", "owner", "created", "expires", "revoked")

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        if obj is None:
            return ()
        return ("prefix", "created", "revoked") if obj.revoked else ("prefix", "created")

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
class UserTierAdmin(admin.ModelAdmin):
    list_display = ("user", "tier")
    list_filter = ("tier",)
    raw_id_fields = ("user",)
