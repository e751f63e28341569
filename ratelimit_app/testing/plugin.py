"""The test kit's pytest plugin (entry point `pytest11`): the `ratelimit` fixture, nothing else."""

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
