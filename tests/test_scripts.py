"""The Lua scripts cannot drift silently: their hash is pinned, and Redis agrees with it."""

from __future__ import annotations

import redis

from ratelimit_app.scripts import ALGORITHM_FILES, ENTRY_FILE, decide_sha, decide_source, read_lua

# Update deliberately when a script changes (and say why in the commit).
PINNED_DECIDE_SHA = "9f7076d329b495234ea2298b8e6922492fa1b834"


def test_decide_script_hash_is_pinned(redis_client: redis.Redis) -> None:
    assert redis_client.script_load(decide_source()) == decide_sha() == PINNED_DECIDE_SHA


def test_every_script_documents_its_interface() -> None:
    for name in ALGORITHM_FILES:
        header = read_lua(name).split("local function", 1)[0]
        for word in ("KEYS[i]", "now_us", "limit", "period_ms", "capacity", "cost", "Returns", "TTL"):
            assert word in header, f"{name} header does not document {word}"
    header = read_lua(ENTRY_FILE).split("local cost", 1)[0]
    for word in ("KEYS[i]", "ARGV[1]", "ARGV[2]", "ARGV[1 + 2i]", "ARGV[2 + 2i]", "'>i8i8i8'", "Reply"):
        assert word in header, f"{ENTRY_FILE} header does not document {word}"


def test_scripts_read_time_only_from_redis() -> None:
    code = "\n".join(line for line in decide_source().splitlines() if not line.lstrip().startswith("--"))
    assert code.count("redis.call('TIME')") == 1
    assert "os.time" not in code and "os.clock" not in code
