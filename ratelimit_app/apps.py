import importlib.util

from django.apps import AppConfig, apps


class RateLimitConfig(AppConfig):
    name = "ratelimit_app"
    verbose_name = "Rate limiting"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, middleware_checks  # noqa: F401  (register the system checks)
        from .gateway import checks as gateway_checks  # noqa: F401  (registers the gateway endpoint's check)
        from .observability import recorder
        from .plans import checks as plan_checks  # noqa: F401  (registers the checks of stored plans)
        from .plans.lookups import connect_signals
        from .service import events

        events.install(recorder)  # the limiter's reports reach the metrics recorder
        connect_signals()  # saving or deleting tiers, limits, keys or user tiers invalidates the caches
        if importlib.util.find_spec("rest_framework") is not None:
            from . import throttling_checks  # noqa: F401  (registers the DRF throttles' checks)
        if importlib.util.find_spec("channels") is not None:
            from .channels import checks as channels_checks  # noqa: F401  (registers the Channels middleware's checks)
        if importlib.util.find_spec("ninja") is not None:
            # the middleware reads the declarations of the Django Ninja operation a request reaches
            from . import ninja  # noqa: F401
        if apps.is_installed("django.contrib.admin"):
            from django.contrib import admin

            from .observability.dashboard import install_admin_link

            install_admin_link(admin.site)  # the dashboard's box on the admin index page
