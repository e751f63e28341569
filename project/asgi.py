"""ASGI entry point of the demo site: `uvicorn project.asgi:application`.

Under ASGI, RateLimitMiddleware runs as a coroutine and decides on the event loop through the async
limiter service (see docs/usage.md, "ASGI"); `async def` views such as /api/async/users are answered
there too, and sync views run in Django's thread pool as usual.

WebSockets go to Django Channels: `ws://<host>/ws/echo/?key=<key>` echoes each message, within the
WebSocket limits of the key's tier (RateLimitMiddlewareStack: docs/websockets.md).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django_application = get_asgi_application()  # sets Django up before the routes import the consumers

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from project.routing import websocket_urlpatterns  # noqa: E402
from ratelimit_app.channels.middleware import RateLimitMiddlewareStack  # noqa: E402

application = ProtocolTypeRouter({
    "http": django_application,
    "websocket": RateLimitMiddlewareStack(URLRouter(websocket_urlpatterns)),
})
