"""WSGI entry point of the HTTP benchmark (gunicorn bench.httpapp.wsgi:application)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.httpapp.settings")
application = get_wsgi_application()
