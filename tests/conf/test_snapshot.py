"""ratelimit_app.conf.snapshot: one frozen reading of the settings for the request path, cautious readings
included, made again when RATELIMIT or MIDDLEWARE changes; what a part parses from it is kept with it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ratelimit_app.conf.settings import InvalidSetting
from ratelimit_app.conf.snapshot import MIDDLEWARE_PATH, Snapshot, request_settings


def test_one_snapshot_until_settings_change(settings: Any) -> None:
    first = request_settings()
    assert request_settings() is first and first.enabled and first.fail_mode == "open"
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "closed", "HEADERS": "ietf"}
    second = request_settings()
    assert second is not first and (second.fail_mode, second.headers) == ("closed", "ietf")
    with pytest.raises(dataclasses.FrozenInstanceError):
        second.fail_mode = "open"  # type: ignore[misc]


def test_cautious_readings_are_in_it_and_a_setting_without_one_raises_when_read(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "Closed", "ERROR_FORMAT": "xml",
                          "PATH_PREFIXES": 42}
    snapshot = request_settings()
    assert (snapshot.fail_mode, snapshot.error_format) == ("closed", "json")
    with pytest.raises(InvalidSetting, match="PATH_PREFIXES"):
        snapshot.get("PATH_PREFIXES")


def test_middleware_installed_follows_middleware(settings: Any) -> None:
    settings.MIDDLEWARE = [MIDDLEWARE_PATH]
    assert request_settings().middleware_installed
    settings.MIDDLEWARE = []
    assert not request_settings().middleware_installed


def test_what_is_derived_is_made_once_per_snapshot(settings: Any) -> None:
    made: list[Snapshot] = []

    def parse(snapshot: Snapshot) -> str:
        made.append(snapshot)
        return str(snapshot.get("IP_RATE"))

    assert request_settings().derived(parse) == request_settings().derived(parse) == "100/m"
    assert len(made) == 1
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": "5/m"}
    assert request_settings().derived(parse) == "5/m" and len(made) == 2
