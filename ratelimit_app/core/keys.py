"""Where the state of an identity lives in Redis: the names of its keys, and the entries of its state key.

An identity's rate policies share one string key, "<prefix>:{<digest>}" (the braces are the Redis
Cluster hash tag), with one entry per policy under its tag (the letter of its algorithm and its name);
a concurrency policy and a long sliding log keep their state in a key of their own,
"<prefix>:{<digest>}<tag>", in the same hash slot. The format of the entries is decide.lua's (see its
header); this module only names keys and reads entries back. Users never choose Redis key names:
an identity becomes a fixed-length digest, and the prefix and the policy names are validated.
"""

from __future__ import annotations

import hashlib
import re
import struct
from binascii import hexlify
from collections.abc import Sequence
from functools import lru_cache

from .algorithms import BY_NAME, CALENDAR_WINDOW, REGISTRY
from .policies import Policy

#: What a key prefix may be (RATELIMIT['KEY_PREFIX'] is validated against it too).
PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
#: Length of an identity digest in hex characters (blake2b, 12 bytes).
DIGEST_CHARS = 24
#: The letter that stands for the algorithm in a policy's tag (its entry in the identity's key, and the
#: end of the name of its key of its own).
KEY_LETTERS = {algorithm.name: algorithm.letter for algorithm in REGISTRY}


def check_prefix(prefix: str) -> str:
    """`prefix` when it is a valid key prefix (1-64 letters, digits, '_.:-'); ValueError otherwise."""
    if not isinstance(prefix, str) or not PREFIX_PATTERN.match(prefix):
        raise ValueError(f"prefix: {prefix!r} must be 1-64 characters of letters, digits, '_.:-'")
    return prefix


def digest(identity: str) -> bytes:
    """The digest of `identity` as bytes of hex digits (ValueError for an identity that is not a
    non-empty string)."""
    if type(identity) is not str or not identity:
        raise ValueError(f"identity: expected a non-empty string, got {identity!r:.80}")
    return _hashed(identity)


@lru_cache(maxsize=8192)
def _hashed(identity: str) -> bytes:
    """The digest of a valid identity: `digest`'s plain computation, cached (a client's identity comes back
    with its every request, and a hash costs more than the lookup)."""
    return hexlify(hashlib.blake2b(identity.encode("utf-8", "surrogatepass"), digest_size=12).digest())


def identity_digest(identity: str) -> str:
    """A fixed-length, hash-tag-safe digest of an identity: users never choose Redis key names."""
    return digest(identity).decode()


def tag(policy: Policy) -> str:
    """The tag of `policy`: the letter of its algorithm and its name (its entry in its identity's key,
    and the end of the name of its key of its own)."""
    return (CALENDAR_WINDOW.letter if policy.calendar else KEY_LETTERS[policy.algorithm]) + policy.name


def has_own_key(policy: Policy) -> bool:
    """True when `policy` keeps its state in a key of its own, not in an entry of its identity's key: a
    concurrency policy's sorted set of leases, or a long sliding log's units."""
    algorithm = BY_NAME[policy.algorithm]
    return algorithm.concurrency or 0 < algorithm.long_state_from <= policy.limit


def is_sent_its_key(policy: Policy) -> bool:
    """True when a call names `policy`'s key of its own (KEYS[m + k] of decide.lua): every policy of an
    algorithm that may keep its state there, since a sliding log whose limit was lowered below the long
    log's reads its units back from it."""
    algorithm = BY_NAME[policy.algorithm]
    return algorithm.concurrency or algorithm.long_state_from > 0


def state_keys(prefix: str, identity: str, policies: Sequence[Policy]) -> list[str]:
    """The Redis key that holds the state of `identity` under each of these policies, in their order:
    the identity's state key for a rate policy (all of them share it), a concurrency policy's own
    sorted set, a long sliding log's own key (its entry in the identity's key is only a hint of where
    its live units start: see lua/sliding_window.lua)."""
    identity_key = f"{prefix}:{{{identity_digest(identity)}}}"
    return [identity_key + tag(p) if has_own_key(p) else identity_key for p in policies]


def release_keys(prefix: str, held: Sequence[tuple[str, Policy]]) -> list[str]:
    """The keys of the concurrency slots `held` ((identity, concurrency policy) pairs): what a release
    removes the lease token from (one ZREM per key)."""
    return [key for identity, policy in held for key in state_keys(prefix, identity, (policy,))]


def cancel_keys(prefix: str, held: Sequence[tuple[str, Policy]]) -> list[tuple[str, int]]:
    """(key, lease period in ms) of each concurrency slot `held` ((identity, concurrency policy) pairs):
    what cancelling a lease token writes to (lua/cancel.lua, one call per key)."""
    return list(zip(release_keys(prefix, held), (policy.period_ms for _, policy in held), strict=True))


def renew_calls(prefix: str, held: Sequence[tuple[str, Policy]],
                lease_ms: int | None) -> list[tuple[list[str], list[int]]]:
    """What renewing the concurrency slots `held` ((identity, concurrency policy) pairs) sends: one call
    of lua/renew.lua per identity (its keys share its hash tag), its keys and each one's new lease length
    in ms: `lease_ms`, at most the policy's period, or the period itself when `lease_ms` is None."""
    calls: dict[str, tuple[list[str], list[int]]] = {}
    for identity, policy in held:
        keys, lengths = calls.setdefault(identity, ([], []))
        keys += state_keys(prefix, identity, (policy,))
        lengths.append(policy.period_ms if lease_ms is None else min(lease_ms, policy.period_ms))
    return list(calls.values())


_ENTRY_HEAD = struct.Struct(">B")
_ENTRY_TAIL = struct.Struct(">QI")  # expiry (6 bytes after a 2-byte pad), state length


def state_entries(value: bytes) -> dict[str, tuple[int, bytes]]:
    """The entries of an identity's state key (see decide.lua): tag (the algorithm's letter and the
    policy's name) -> (expiry in ms since the epoch, the state in its algorithm's format). For tests
    and for looking at a key while debugging."""
    entries = {}
    position = 0
    while position < len(value):
        [tag_length] = _ENTRY_HEAD.unpack_from(value, position)
        name = value[position + 1:position + 1 + tag_length].decode()
        position += 1 + tag_length
        expiry, length = _ENTRY_TAIL.unpack(b"\0\0" + value[position:position + 10])
        entries[name] = (expiry, value[position + 10:position + 10 + length])
        position += 10 + length
    return entries
