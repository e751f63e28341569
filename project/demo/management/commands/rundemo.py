"""`manage.py rundemo`: migrate, then serve the demo on 127.0.0.1:8000 in this one process."""

from __future__ import annotations

from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Prepare and serve the demo site (migrate, then runserver without the autoreloader)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        # --noreload: one process, so an embedded Redis started by the settings is the one served.
        call_command("runserver", options["addrport"], use_reloader=False)
