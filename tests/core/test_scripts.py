"""The Lua scripts cannot drift silently: their hash is pinned, and Redis agrees with it."""

from __future__ import annotations

import re

import redis

from ratelimit_app.core.algorithms import SCRIPTED
from ratelimit_app.core.scripts import (
    ALGORITHM_FILES,
    ALGORITHM_PARAMETERS,
    CANCEL_FILE,
    ENTRY_FILE,
    RENEW_FILE,
    SETTLE_FILE,
    decide_sha,
    decide_source,
    read_lua,
    renew_source,
    settle_sha,
    settle_source,
)
from ratelimit_app.service.fallback_models import MODELS

# Update deliberately when a script changes (and say why in the commit).
PINNED_DECIDE_SHA = "bf64ffd17a4156056535e2b7aef4312fea408233"
PINNED_SETTLE_SHA = "aab7e44f09f01d981be5d5faca9685c5e2a38978"


def test_decide_script_hash_is_pinned(redis_client: redis.Redis) -> None:
    assert redis_client.script_load(decide_source()) == decide_sha() == PINNED_DECIDE_SHA


def test_settle_script_hash_is_pinned_and_documents_its_interface(redis_client: redis.Redis) -> None:
    assert redis_client.script_load(settle_source()) == settle_sha() == PINNED_SETTLE_SHA
    header = read_lua(SETTLE_FILE).split("local numbers", 1)[0]
    for word in ("ARGV[1]", "'>i8i8i8i8i8i8i8Bc0'", "KEYS[1]", "KEYS[1 + i]", "Reply:", "calendar"):
        assert word in header, f"{SETTLE_FILE} header does not document {word}"


def test_every_script_documents_its_interface() -> None:
    """The contract (ARGV, KEYS, the state key, the algorithm functions, the reply) is written once, in
    decide.lua's header; each algorithm file says what its numbers mean and what its state is."""
    header = read_lua(ENTRY_FILE).split("local numbers", 1)[0]
    for word in ("ARGV[1]", "'>i8BBi8'", "'>i8i8i8i8BBc0'", "ARGV[2]", "KEYS[j]", "KEYS[m + k]", "State:",
                 "'>Bc0I6I4'", f"check(code, {ALGORITHM_PARAMETERS[1:]}", "Reply:"):
        assert word in header, f"{ENTRY_FILE} header does not document {word}"
    for name in ALGORITHM_FILES:
        lines = read_lua(name).split("local function", 1)[0].splitlines()
        header = " ".join(line.removeprefix("--").strip() for line in lines)
        for word in ("Numbers: limit = ", "; period = ", "; extra = ", "State:", "TTL"):
            assert word in header, f"{name} header does not document {word!r}"
        # the contract is not repeated
        assert "Returns" not in header and "Called by decide.lua" not in header, name
    header = read_lua(CANCEL_FILE).split("local time", 1)[0]
    for word in ("KEYS[1]", "ARGV[1]", "ARGV[2]", "Returns"):
        assert word in header, f"{CANCEL_FILE} header does not document {word}"
    header = read_lua(RENEW_FILE).split("local time", 1)[0]
    for word in ("KEYS", "hash tag", "ARGV[1]", "ARGV[1 + i]", "Returns", "TIME"):
        assert word in header, f"{RENEW_FILE} header does not document {word}"


def test_every_algorithm_file_ends_with_its_function() -> None:
    """scripts.py makes each algorithm's function a branch of check(), which decide.lua calls."""
    source = decide_source()
    for algorithm in SCRIPTED:
        assert f"code == {algorithm.code} then -- {algorithm.lua_file}" in source
    assert source.count("local function check(") == 1


def test_scripts_read_time_only_from_redis() -> None:
    for source in (decide_source(), renew_source()):
        code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("--"))
        assert code.count("redis.call('TIME')") == 1
        assert "os.time" not in code and "os.clock" not in code


def test_the_engine_and_the_script_agree_on_algorithm_codes() -> None:
    from ratelimit_app.core.engine import ALGORITHM_CODES
    from ratelimit_app.core.policies import ALL_ALGORITHMS

    assert set(ALGORITHM_CODES) == set(ALL_ALGORITHMS)
    header = read_lua(ENTRY_FILE).split("local numbers", 1)[0]
    for name, code in ALGORITHM_CODES.items():
        assert f"{code} {name}" in header


def test_every_registered_algorithm_has_its_lua_function_and_its_fallback_model() -> None:
    """Adding an algorithm is one Lua file, one fallback model and one registry entry: this is what
    ties them together (and nothing is left over in the fallback)."""
    for algorithm in SCRIPTED:
        assert re.search(rf"^local function {algorithm.name}\(", read_lua(algorithm.lua_file), re.M), algorithm.name
    assert set(MODELS) == {algorithm.name for algorithm in SCRIPTED}
    codes = [algorithm.code for algorithm in SCRIPTED]
    letters = [algorithm.letter for algorithm in SCRIPTED]
    assert len(set(codes)) == len(codes) and len(set(letters)) == len(letters)
