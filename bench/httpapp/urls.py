"""GET /api/ping, served by the view of the variant in BENCH_HTTP_VARIANT."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import path

from bench.httpapp import views
from bench.httpapp.variants import ASGI_VARIANTS


def _view(variant: str) -> Any:
    if variant == "evalsha":
        return views.ping_evalsha
    if variant == "async-evalsha":
        return views.aping_evalsha
    if variant in ASGI_VARIANTS:
        return views.aping
    if variant in ("drf", "drf-none"):
        return views.drf_view(throttled=variant == "drf")
    if variant == "django-ratelimit":
        return views.django_ratelimit_view()
    if variant == "smart":
        return views.smart_view()
    return views.ping


urlpatterns = [path("api/ping", _view(str(getattr(settings, "VARIANT", "none"))))]
