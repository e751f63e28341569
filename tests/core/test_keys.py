"""ratelimit_app.core.keys: what Redis keys an identity's state lives under (never a name a user chose: a
validated prefix, a fixed-length digest, a policy's tag, one hash slot per identity) and `state_entries`,
the entries of an identity's key read back after real decisions."""

from __future__ import annotations

import time

import pytest
import redis
from redis.crc import key_slot

from ratelimit_app import Policy, RateLimiter, new_lease_token
from ratelimit_app.core.keys import (
    DIGEST_CHARS,
    check_prefix,
    digest,
    has_own_key,
    identity_digest,
    is_sent_its_key,
    release_keys,
    state_entries,
    state_keys,
    tag,
)

MINUTE = Policy("minute", "fixed_window", limit=10, period=60)
LOG = Policy("log", "sliding_window", limit=5, period=60)
LONG_LOG = Policy("longlog", "sliding_window", limit=1000, period=60)
SLOT = Policy("inflight", "concurrency", limit=2, period=30)
MONTH = Policy("month", "fixed_window", limit=100, period=2678400, calendar="month")


@pytest.mark.parametrize("prefix", ["rl", "app:rl", "a.b_c-d", "x" * 64])
def test_valid_prefixes(prefix: str) -> None:
    assert check_prefix(prefix) == prefix


@pytest.mark.parametrize("prefix", ["", "x" * 65, "has space", "{tag}", "new\nline", None, 5])
def test_invalid_prefixes_name_the_rule(prefix: object) -> None:
    with pytest.raises(ValueError, match="prefix: .* must be 1-64 characters of letters, digits, '_.:-'"):
        check_prefix(prefix)  # type: ignore[arg-type]


def test_an_identity_becomes_a_fixed_length_hex_digest() -> None:
    hostile = ["}{", "a" * 10_000, "key:\r\n*1", "\udcff", "ü"]
    digests = [identity_digest(identity) for identity in hostile]
    assert all(len(d) == DIGEST_CHARS and set(d) <= set("0123456789abcdef") for d in digests)
    assert len(set(digests)) == len(hostile)
    assert digest("ip:192.0.2.1") == identity_digest("ip:192.0.2.1").encode() == digest("ip:192.0.2.1")
    for bad in ("", None, b"bytes", 5):
        with pytest.raises(ValueError, match="identity: expected a non-empty string"):
            digest(bad)  # type: ignore[arg-type]


def test_a_tag_is_the_algorithms_letter_and_the_policys_name() -> None:
    assert [tag(p) for p in (MINUTE, LOG, SLOT, MONTH)] == ["fminute", "slog", "qinflight", "kmonth"]


def test_which_policies_keep_a_key_of_their_own_and_which_are_sent_one() -> None:
    assert [has_own_key(p) for p in (MINUTE, LOG, LONG_LOG, SLOT)] == [False, False, True, True]
    # a short sliding log is sent its key too: after its limit was lowered it reads its units back from there
    assert [is_sent_its_key(p) for p in (MINUTE, LOG, LONG_LOG, SLOT)] == [False, True, True, True]


def test_an_identitys_keys_share_one_hash_slot_and_rate_policies_share_one_key() -> None:
    minute, log, longlog, slot = state_keys("rl", "key:abcd1234", (MINUTE, LOG, LONG_LOG, SLOT))
    assert minute == log == f"rl:{{{identity_digest('key:abcd1234')}}}"
    assert (longlog, slot) == (minute + "slonglog", minute + "qinflight")
    assert len({key_slot(key.encode()) for key in (minute, longlog, slot)}) == 1
    assert state_keys("rl", "key:abcd1234", ()) == []
    assert release_keys("rl", [("key:abcd1234", SLOT), ("ip:192.0.2.1", SLOT)]) == \
        [slot, state_keys("rl", "ip:192.0.2.1", (SLOT,))[0]]


def test_state_entries_reads_back_what_decisions_wrote(redis_client: redis.Redis, key_prefix: str) -> None:
    limiter = RateLimiter(redis_client, prefix=key_prefix)
    assert limiter.hit("k", (MINUTE, LOG, SLOT), lease=new_lease_token()).allowed
    [key] = set(state_keys(key_prefix, "k", (MINUTE, LOG)))
    value = redis_client.get(key)
    assert isinstance(value, bytes)
    entries = state_entries(value)
    assert set(entries) == {"fminute", "slog"}  # the slot lives in its own key, not here
    now_ms = time.time() * 1000
    for expiry_ms, state in entries.values():
        assert now_ms < expiry_ms <= now_ms + 61_000 and state
    assert state_entries(b"") == {}
