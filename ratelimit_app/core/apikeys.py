"""API keys, `<prefix>.<secret>`: generation, hashing (SHA-512 of the whole key) and shape validation, with no
I/O (lookups live in `plans.lookups`; docs/security.md says why a fast hash is right for random keys)."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string

PREFIX_LENGTH = 8
_SECRET_BYTES = 32
#: Longest string `parse_key` looks at: anything longer is refused before any other work.
MAX_KEY_LENGTH = 128

_PREFIX_ALPHABET = string.ascii_letters + string.digits
# The secret is checked loosely (URL-safe base64, 32-86 characters) so a later change of its length
# does not invalidate issued keys; the prefix is exact because it is the database lookup key.
_KEY_SHAPE = re.compile(rf"([A-Za-z0-9]{{{PREFIX_LENGTH}}})\.[A-Za-z0-9_-]{{32,86}}")


def generate_key() -> tuple[str, str]:
    """Return a new random `(prefix, full_key)`; the full key is `prefix + "." + secret`."""
    prefix = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(PREFIX_LENGTH))
    return prefix, f"{prefix}.{secrets.token_urlsafe(_SECRET_BYTES)}"


def hash_key(key: str) -> str:
    """The stored form of a full key: hex SHA-512 (128 characters)."""
    return hashlib.sha512(key.encode("ascii")).hexdigest()


def parse_key(raw: str | None) -> str | None:
    """The prefix of `raw` if it has the shape of an API key, else None.

    Cheap and safe on hostile input: the length is checked before anything else, so a 1 MiB header
    costs one `len()`; the pattern is anchored and has no backtracking.
    """
    if raw is None or len(raw) > MAX_KEY_LENGTH:
        return None
    match = _KEY_SHAPE.fullmatch(raw)
    return match.group(1) if match else None


def key_matches(key: str, hashed_key: str) -> bool:
    """True when `key` hashes to `hashed_key`, compared in constant time."""
    return hmac.compare_digest(hash_key(key), hashed_key)
