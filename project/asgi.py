"""ASGI entry point of the demo site: `uvicorn project.asgi:application`.

Under ASGI, RateLimitMiddleware runs as a coroutine and decides on the event loop through the async
limiter service (see docs/usage.md, "ASGI"); `async def` views such as /api/async/users are answered
there too, and sync views run in Django's thread pool as usual.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
application = get_asgi_application()
