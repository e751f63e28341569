from django.apps import AppConfig


class RateLimitConfig(AppConfig):
    name = "ratelimit_app"
    verbose_name = "Rate limiting"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, plan_checks  # noqa: F401  (registers the system checks)
        from .lookups import connect_signals

        connect_signals()  # saving or deleting tiers, limits, keys or user tiers invalidates the caches
