"""URLs of the gateway endpoint: `path("ratelimit/", include("ratelimit_app.gateway.urls"))` serves

    /ratelimit/authorize            Caddy forward_auth, Traefik ForwardAuth (X-Forwarded-Method/-Uri)
    /ratelimit/authorize/<path>     Envoy ext_authz (path_prefix "/ratelimit/authorize")
    /ratelimit/auth-request         nginx auth_request (X-Original-Method/-URI)
    /ratelimit/confirm              the service has the request: its slots held their full lease
    /ratelimit/release              gives back the concurrency slots an X-RateLimit-Lease names

Keep them out of RATELIMIT['PATH_PREFIXES'] (the endpoint is not limited itself); every view answers
only calls that pass RATELIMIT['GATEWAY_SECRET'] / RATELIMIT['GATEWAY_NETWORKS'] (ratelimit_app.gateway.guard).
"""

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
