"""Demo settings for the live ASGI tests (uvicorn): the demo's own limits, under the test's key prefix
(Redis keys and the shared lookup cache)."""

from __future__ import annotations

import os

from project import settings as demo

globals().update({name: value for name, value in vars(demo).items() if name.isupper()})

PREFIX = os.environ["RATELIMIT_TEST_PREFIX"]
CACHES = {"default": {**demo.CACHES["default"], "KEY_PREFIX": PREFIX}}
RATELIMIT: dict[str, object] = {
    **demo.RATELIMIT,
    "KEY_PREFIX": PREFIX,
    "BUDGET_MS": 5000,  # generous for a loaded CI box: these tests count decisions, they do not time them
    "SOCKET_CONNECT_TIMEOUT": 2.0,
    "SOCKET_TIMEOUT": 5.0,
}
