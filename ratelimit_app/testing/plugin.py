"""The test kit's pytest plugin. The package registers it (entry point `pytest11`, name `ratelimit_app`), so
pytest loads it in every project that installs ratelimit_app; it only defines the `ratelimit` fixture,
and changes nothing until a test asks for it.

    def test_the_burst_refuses_the_eleventh_request(client, db, ratelimit):
        key = make_api_key("free")
        for _ in range(10):
            assert_not_limited(client.get("/api/items", HTTP_X_API_KEY=key))
        assert_limited(client.get("/api/items", HTTP_X_API_KEY=key), policy="burst")
        ratelimit.advance(60)
        assert_not_limited(client.get("/api/items", HTTP_X_API_KEY=key))
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .state import IsolatedRateLimit


@pytest.fixture
def ratelimit() -> Iterator[IsolatedRateLimit]:
    """Limiter state of this test's own (ratelimit_app.testing.IsolatedRateLimit), removed afterwards:
    `advance(seconds)`, `reset()`, `disable()`, `enable()`, `prefix`."""
    from .state import IsolatedRateLimit

    with IsolatedRateLimit() as state:
        yield state
