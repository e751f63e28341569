"""The gateway endpoint's URLs for a project served under ASGI (uvicorn, daphne, hypercorn):
`path("ratelimit/", include("ratelimit_app.gateway.async_urls"))` serves the same URLs as
`ratelimit_app.gateway.urls`, with the views' async twins (ratelimit_app.gateway.views_async), so the
decision is awaited on the event loop instead of a thread of Django's.
"""

from __future__ import annotations

from . import views_async
from .urls import patterns

urlpatterns = patterns(views_async)
