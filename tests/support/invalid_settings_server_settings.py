"""Demo settings with an invalid RATELIMIT, for the live test of invalid settings met at run time (a
server started without `manage.py check`): the demo's RATELIMIT under the test's key prefix, with the
settings of RATELIMIT_TEST_INVALID (JSON) on top."""

from __future__ import annotations

import json
import os

from project import settings as demo

globals().update({name: value for name, value in vars(demo).items() if name.isupper()})

PREFIX = os.environ["RATELIMIT_TEST_PREFIX"]
CACHES = {"default": {**demo.CACHES["default"], "KEY_PREFIX": PREFIX}}
RATELIMIT: dict[str, object] = {**demo.RATELIMIT, "KEY_PREFIX": PREFIX,
                                **json.loads(os.environ["RATELIMIT_TEST_INVALID"])}
