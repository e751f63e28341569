"""The gateway endpoint's URLs: `path("ratelimit/", include("ratelimit_app.gateway.urls"))` (docs/gateway.md).
Keep them out of RATELIMIT['PATH_PREFIXES']: the endpoint is not limited itself."""

from __future__ import annotations

from types import ModuleType

from django.urls import URLPattern, path, re_path

from . import views


def patterns(module: ModuleType) -> list[URLPattern]:
    """The endpoint's URLs served by the views of `module` (ratelimit_app.gateway.views or its async twin)."""
    return [
        path("authorize", module.authorize, name="ratelimit-gateway-authorize"),
        re_path(r"^authorize(?P<forwarded>/.*)$", module.authorize, name="ratelimit-gateway-authorize-path"),
        path("auth-request", module.auth_request, name="ratelimit-gateway-auth-request"),
        path("confirm", module.confirm, name="ratelimit-gateway-confirm"),
        path("release", module.release, name="ratelimit-gateway-release"),
    ]


urlpatterns = patterns(views)
