"""The Lua scripts cannot drift silently: their hash is pinned, and Redis agrees with it."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import redis

import ratelimit_app.core
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

#: The SHA1 of each Lua file that is not an algorithm's (an algorithm's is its registry entry's `sha1`).
#: Update deliberately when a script changes (and say why in the commit).
PINNED = {
    "prelude.lua": "2983a8b34cf4da887dcb9242790ab3420bc8e20a",
    "decide.lua": "36f6c1af85adec5d1ece76aa4be790b372f18680",
    "cancel.lua": "ae0100ce411fc4ef714929e7c5680034b76431d1",
    "settle.lua": "c27ae7b6712863c2d98c174a9620bda238107bec",
    "renew.lua": "c4fe159073bceea098516e9d6247d6455f48c9ef",
}


def test_every_lua_file_is_pinned_by_the_registry_or_here() -> None:
    """A script cannot change unnoticed: each file's digest is pinned, an algorithm's in its registry entry
    (so a new algorithm is its Lua file, its model and its entry, nothing else)."""
    pins = {**PINNED, **{algorithm.lua_file: algorithm.sha1 for algorithm in SCRIPTED}}
    shipped = sorted(path.name for path in (Path(ratelimit_app.core.__file__).parent / "lua").glob("*.lua"))
    assert shipped == sorted(pins), "every file in core/lua is an algorithm of the registry or pinned in PINNED"
    for name, pinned in pins.items():
        found = hashlib.sha1(read_lua(name).encode("utf-8"), usedforsecurity=False).hexdigest()
        where = "its entry in core/algorithms.py" if name not in PINNED else "PINNED in this test"
        assert found == pinned, f"{name} changed: if deliberately, set sha1 = {found!r} in {where}"


def test_redis_names_the_decision_script_as_the_engine_does(redis_client: redis.Redis) -> None:
    assert redis_client.script_load(decide_source()) == decide_sha()


def test_settle_script_hash_is_pinned_and_documents_its_interface(redis_client: redis.Redis) -> None:
    assert redis_client.script_load(settle_source()) == settle_sha()
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


def test_the_entry_script_names_no_algorithm() -> None:
    """decide.lua dispatches through check(), which scripts.py makes from the registry: adding an algorithm
    leaves it as it is."""
    entry = read_lua(ENTRY_FILE)
    code = "\n".join(line for line in entry.splitlines() if not line.lstrip().startswith("--"))
    for algorithm in SCRIPTED:
        assert algorithm.name not in code and f"{algorithm.code} {algorithm.name}" not in entry, algorithm.name
    assert not re.search(r"code [=~]= \d", code)


def test_every_registered_algorithm_has_its_lua_function_and_its_fallback_model() -> None:
    """Adding an algorithm is one Lua file, one fallback model and one registry entry: this is what
    ties them together (and nothing is left over in the fallback)."""
    for algorithm in SCRIPTED:
        assert re.search(rf"^local function {algorithm.name}\(", read_lua(algorithm.lua_file), re.M), \
            f"core/lua/{algorithm.lua_file} must end with local function {algorithm.name}{ALGORITHM_PARAMETERS}"
        assert algorithm.name in MODELS, \
            f"service/fallback_models.py has no model of {algorithm.name}: add a function {algorithm.name} to MODELS"
    assert set(MODELS) <= {algorithm.name for algorithm in SCRIPTED}, "a fallback model of no registered algorithm"
    codes = [algorithm.code for algorithm in SCRIPTED]
    letters = [algorithm.letter for algorithm in SCRIPTED]
    assert len(set(codes)) == len(codes) and len(set(letters)) == len(letters), "codes and letters are unique"
    assert all(0 < code < 64 for code in codes), "a code is below the shadow flag (64)"
