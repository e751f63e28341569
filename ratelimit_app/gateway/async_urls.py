"""The gateway endpoint's URLs for a project served under ASGI (uvicorn, daphne, hypercorn):
`path("ratelimit/", include("ratelimit_app.gateway.async_urls"))` serves the same URLs as
`ratelimit_app.gateway.urls`, with the views' async twins (ratelimit_app.gateway.views_async), so the
decision is awaited on the event loop instead of a thread of Django's.
"""

from __future__ import annotations

from django.urls import path, re_path

from . import views_async

urlpatterns = [
    path("authorize", views_async.authorize, name="ratelimit-gateway-authorize"),
    re_path(r"^authorize(?P<forwarded>/.*)$", views_async.authorize, name="ratelimit-gateway-authorize-path"),
    path("auth-request", views_async.auth_request, name="ratelimit-gateway-auth-request"),
    path("confirm", views_async.confirm, name="ratelimit-gateway-confirm"),
    path("release", views_async.release, name="ratelimit-gateway-release"),
]
