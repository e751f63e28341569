"""The test kit: test a project's own views and limits against ratelimit_app (docs/testing.md).

- pytest: the `ratelimit` fixture (the plugin ratelimit_app.testing.plugin, which the package registers);
- unittest and Django's TestCase: `RateLimitTestMixin` (`self.ratelimit`), or `IsolatedRateLimit` as a
  context manager;
- `assert_limited(response, policy=None)`, `assert_not_limited(response)`;
- `make_api_key(tier="free") -> str`.

pytest imports the plugin, and so this package, before Django's settings are configured: each name is
imported from its module when first used (`from ratelimit_app.testing import make_api_key`), never here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .assertions import assert_limited, assert_not_limited
    from .keys import make_api_key
    from .state import IsolatedRateLimit
    from .testcases import RateLimitTestMixin

#: Each public name and the module that defines it.
_HOMES = {"assert_limited": "assertions", "assert_not_limited": "assertions", "make_api_key": "keys",
          "IsolatedRateLimit": "state", "RateLimitTestMixin": "testcases"}

__all__ = ["IsolatedRateLimit", "RateLimitTestMixin", "assert_limited", "assert_not_limited", "make_api_key"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{home}", __name__), name)
