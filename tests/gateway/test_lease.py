"""The lease of a gateway request's concurrency slots: one signed header value, read back into the slots."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.core import signing

from ratelimit_app.apply.concurrency import HeldSlots
from ratelimit_app.core.policies import Policy
from ratelimit_app.core.usage import Reservation
from ratelimit_app.gateway.lease import MAX_LEASE, BadLease, lease_value, slots_of, usage_of


def test_a_lease_names_its_slots_and_their_token() -> None:
    held = ((("key:abcd1234"), Policy("concurrency", "concurrency", limit=2, period=60)),
            ("shed:fleet", Policy("shed", "concurrency", limit=9, period=0.5)))
    value = lease_value(HeldSlots("f00d", held, local=False))
    assert value.isascii() and " " not in value and "abcd1234" not in value  # base64: header-safe
    slots = slots_of(value)
    assert (slots.token, slots.held, slots.local, slots.released) == ("f00d", held, False, False)
    assert slots_of(lease_value(HeldSlots("t", held[:1], local=True))).local is True


def test_a_lease_signed_elsewhere_is_refused(settings: Any) -> None:
    value = lease_value(HeldSlots("f00d", (("ip:203.0.113.7", Policy("c", "concurrency", limit=1, period=5)),), False))
    settings.SECRET_KEY = "another-site-entirely-" + "x" * 40
    with pytest.raises(BadLease, match="not signed by this site"):
        slots_of(value)


@pytest.mark.parametrize("payload", [{"t": "a"}, {"t": "a", "l": False, "h": [["key:x", "c", 0, 5]]}, [1, 2]])
def test_a_signed_value_that_names_no_slots_is_refused(payload: Any) -> None:
    with pytest.raises(BadLease, match="does not name slots"):
        slots_of(signing.dumps(payload, salt="ratelimit_app.gateway.lease"))


def test_an_oversized_value_is_refused_before_it_is_read() -> None:
    with pytest.raises(BadLease, match=f"longer than {MAX_LEASE}"):
        slots_of("a" * (MAX_LEASE + 1))


def test_a_lease_carries_a_usage_reservation_to_the_process_that_settles_it() -> None:
    tokens = Policy("llm.tokens", "sliding_window", limit=2000, period=60, unit="tokens")
    daily = Policy("day", "fixed_window", limit=10**6, period=86400, calendar="day", time_zone="Europe/Paris",
                   unit="tokens")
    reserved = Reservation("rl", (("key:abc", (tokens, daily)),), (("tokens", 500),), time.monotonic() - 2.0, 7)
    value = lease_value(None, reserved)
    assert slots_of(value).held == ()  # no slot taken: nothing to give back
    carried = usage_of(value)
    assert carried is not None
    got = carried.reservation
    assert (got.prefix, got.held, got.estimates, got.shift) == ("rl", reserved.held, reserved.estimates, 7)
    assert abs(got.started - reserved.started) < 0.5  # its age, through wall-clock time
    # settled once: marked by a key of its own for the longest period, another lease's mark another key
    assert carried.marker.startswith("rl:settled:") and carried.marker_ms == 86_400_000
    assert usage_of(lease_value(None, reserved)).marker != carried.marker  # type: ignore[union-attr]
    assert usage_of(lease_value(HeldSlots("t", (), False))) is None
    with pytest.raises(BadLease, match="does not name a reservation"):
        usage_of(signing.dumps({"t": "", "l": False, "h": [], "u": [1]}, salt="ratelimit_app.gateway.lease"))
