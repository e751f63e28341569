"""The test kit for a project's own test suite (docs/testing.md). pytest imports the plugin, and so this
package, before Django's settings are configured: each name is imported from its module on first use."""

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
