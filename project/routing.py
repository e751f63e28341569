"""The demo's WebSocket routes (served under ASGI: project/asgi.py)."""

from django.urls import path

from project.demo.consumers import EchoConsumer

websocket_urlpatterns = [
    path("ws/echo/", EchoConsumer.as_asgi()),
]
