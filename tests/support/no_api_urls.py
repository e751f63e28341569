"""A URLconf with no /api/ route: a fresh `startproject` (the admin only)."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
