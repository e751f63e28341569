"""ASGI entry point of the demo site (uvicorn project.asgi:application).

Minimal on purpose: native async support is added by another branch (issue 11).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
application = get_asgi_application()
