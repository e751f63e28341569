"""The request path's one reading of the settings: a frozen `Snapshot`, taken again when they change, with
what each part parses from it (`Snapshot.derived`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .rules import UNREADABLE
from .settings import InvalidSetting, SettingsCached, ratelimit_settings

T = TypeVar("T")
_MISSING: Any = object()
#: RateLimitMiddleware's path in MIDDLEWARE.
MIDDLEWARE_PATH = "ratelimit_app.middleware.RateLimitMiddleware"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The settings as the request path reads them; `headers` is None when RATELIMIT['HEADERS'] has no
    reading (no header is sent), `get(name)` reads any other setting."""

    values: Mapping[str, Any]
    enabled: bool
    fail_mode: str
    headers: str | None
    error_format: str
    header_draft: str
    middleware_installed: bool
    _derived: dict[Callable[[Snapshot], Any], Any] = field(default_factory=dict, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def get(self, name: str) -> Any:
        value = self.values[name]
        if value is UNREADABLE:
            raise InvalidSetting(name)
        return value

    def derived(self, build: Callable[[Snapshot], T]) -> T:
        """`build(self)`, made once per snapshot (a build that raises is not kept: it raises each time)."""
        value = self._derived.get(build, _MISSING)
        if value is not _MISSING:
            return value
        value = build(self)
        with self._lock:
            self._derived.setdefault(build, value)
        return value


def _take() -> Snapshot:
    values = dict(ratelimit_settings.values())
    headers = values["HEADERS"]
    return Snapshot(
        values=values,
        enabled=bool(values["ENABLED"]),
        fail_mode=str(values["FAIL_MODE"]),
        headers=None if headers is UNREADABLE else str(headers),
        error_format=str(values["ERROR_FORMAT"]),
        header_draft=str(values["HEADER_DRAFT"]),
        middleware_installed=MIDDLEWARE_PATH in (getattr(django_settings, "MIDDLEWARE", None) or ()),
    )


_snapshot = SettingsCached(_take)


def request_settings() -> Snapshot:
    """The current snapshot."""
    return _snapshot.get()


@receiver(setting_changed)
def _retake_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting == "MIDDLEWARE":  # RATELIMIT and CACHES changes clear it through `on_reload`
        _snapshot.clear()
