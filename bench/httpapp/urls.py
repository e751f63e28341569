"""GET /api/ping, served by the view of the variant in BENCH_HTTP_VARIANT (and, for the gateway benchmark,
the gateway endpoint under /ratelimit/)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import include, path

from bench.httpapp import views
from bench.httpapp.variants import ASGI_VARIANTS, GATEWAY_VARIANT


def _view(variant: str) -> Any:
    if variant in ("evalsha", GATEWAY_VARIANT):
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


_VARIANT = str(getattr(settings, "VARIANT", "none"))
urlpatterns = [path("api/ping", _view(_VARIANT))]
if _VARIANT == GATEWAY_VARIANT:  # bench/gateway_bench.py: the gateway endpoint, next to the floor at /api/ping
    urlpatterns.append(path("ratelimit/", include("ratelimit_app.gateway.urls")))
