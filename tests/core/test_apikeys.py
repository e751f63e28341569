"""API keys: random `<prefix>.<secret>`, stored as a SHA-512 hash, shape checked before any lookup."""

from __future__ import annotations

import hashlib
import re

import pytest

from ratelimit_app.core import apikeys


def test_generated_keys_are_prefix_dot_secret_and_unique() -> None:
    keys = [apikeys.generate_key() for _ in range(2000)]
    for prefix, key in keys[:50]:
        assert re.fullmatch(r"[A-Za-z0-9]{8}\.[A-Za-z0-9_-]{43}", key)
        assert key.startswith(prefix + ".")
        assert apikeys.parse_key(key) == prefix
    assert len({key for _, key in keys}) == 2000
    assert len({prefix for prefix, _ in keys}) == 2000


def test_hash_is_sha512_of_the_whole_key_and_matches_in_constant_time() -> None:
    _, key = apikeys.generate_key()
    stored = apikeys.hash_key(key)
    assert stored == hashlib.sha512(key.encode()).hexdigest() and len(stored) == 128
    assert key not in stored
    assert apikeys.key_matches(key, stored)
    other_secret = key[:-1] + ("A" if key[-1] != "A" else "B")
    assert not apikeys.key_matches(other_secret, stored)


@pytest.mark.parametrize("raw", [
    None, "", "abc", "abcdefgh", "abcdefgh.", "abcdefg.0123456789012345678901234567890123456789012",
    "abcdefghi.0123456789012345678901234567890123456789012",   # prefix too long
    "abcd{fgh.0123456789012345678901234567890123456789012",     # hash-tag characters
    "abcdefgh.0123456789012345678901234567890",                 # secret too short
    "abcdefgh.0123456789012345678901234567890123456789012 ",    # trailing space
    "abcdefgh.012345678901234567890123456789012345678901\n",
    "abcdefgh/0123456789012345678901234567890123456789012",
    "x" * (1 << 20),                                           # 1 MiB
])
def test_wrong_shapes_are_rejected(raw: str | None) -> None:
    assert apikeys.parse_key(raw) is None


def test_the_length_cap_admits_every_accepted_shape() -> None:
    longest = "abcdefgh." + "a" * 86
    assert apikeys.parse_key(longest) == "abcdefgh"
    assert len(longest) <= apikeys.MAX_KEY_LENGTH
    assert apikeys.parse_key(longest + "a") is None
