"""The gateway endpoint's URLs under ASGI: those of `urls`, served by the async twins of the views."""

from __future__ import annotations

from . import views_async
from .urls import patterns

urlpatterns = patterns(views_async)
