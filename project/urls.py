from django.contrib import admin
from django.urls import include, path
from rest_framework.routers import SimpleRouter

from project.demo import llm, views
from project.demo.ninja_api import api as ninja_api

router = SimpleRouter()
router.register("items", views.ItemViewSet, basename="item")

urlpatterns = [
    path("admin/", include("ratelimit_app.observability.dashboard")),  # rate-limit dashboard: before admin.site.urls
    path("admin/", admin.site.urls),
    path("health", views.health, name="health"),
    path("api/users", views.users, name="users"),
    path("api/async/users", views.users_async, name="users-async"),
    path("api/data", views.data, name="data"),
    path("api/rate-limit/status", views.rate_limit_status, name="rate-limit-status"),
    path("api/slow", views.slow, name="slow"),
    path("api/export", views.export, name="export"),
    path("api/checkout", views.checkout, name="checkout"),
    path("api/stream", views.stream, name="stream"),
    path("api/llm/chat", llm.chat, name="llm-chat"),  # usage limits: tokens (project/demo/llm.py)
    path("public/single", views.single, name="single"),
    path("drf/", include(router.urls)),
    path("ninja/", ninja_api.urls),  # a Django Ninja API (project/demo/ninja_api.py)
    path("public/quote", views.quote, name="quote"),
    path("public/async-quote", views.quote_async, name="quote-async"),
    path("ratelimit/", include("ratelimit_app.gateway.urls")),  # the gateway endpoint (docs/gateway.md)
    path("", include("ratelimit_app.urls")),  # GET /metrics (Prometheus)
]
