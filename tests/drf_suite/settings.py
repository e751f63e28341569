"""Settings of DRF's own throttling suite: the demo's, with DRF's defaults (no REST_FRAMEWORK), as
DRF's own tests run (DRF binds some defaults into class attributes at import, so they must hold from
the start), and a local-memory default cache, so the suite's `cache.clear()` never touches Redis."""

from project.settings import *  # noqa: F403

del REST_FRAMEWORK  # noqa: F821
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
