"""Demo settings for the "other app server" of tests/management/test_ratelimit_reset.py: the test's key prefix, its
SQLite file, a per-IP limit of 3 per minute and anonymous clients on the free tier."""

from __future__ import annotations

import os

from project import settings as demo

globals().update({name: value for name, value in vars(demo).items() if name.isupper()})

# (read with defaults: the test imports LIMITS from here)
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("RATELIMIT_TEST_DB", "")}}

#: Shared with the test, whose `ratelimit_reset` must clear the same policies.
LIMITS: dict[str, object] = {"IP_RATE": "3/m", "ANONYMOUS_TIER": "free", "REQUIRE_API_KEY": False}

RATELIMIT: dict[str, object] = {**demo.RATELIMIT, "KEY_PREFIX": os.environ.get("RATELIMIT_TEST_PREFIX", "rl"), **LIMITS}
