"""Structured log records of the logger "ratelimit_app", with API keys redacted (`log_event`), and
`JsonFormatter` (docs/observability.md lists the events and their levels)."""

from __future__ import annotations

import json
import logging
import re
import threading
from typing import Any

logger = logging.getLogger("ratelimit_app")

_MAX_IDENTITY = 128
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.:/@+\-\[\]]*$")


def mask_key(key: str) -> str:
    """An API key as it may be shown: its public prefix, never the secret ("abcd1234.…").

    Keys are `<prefix>.<secret>`; a string without a dot shows its first 4 characters only.
    """
    if not isinstance(key, str) or not key:
        return "…"
    prefix, dot, _ = key.partition(".")
    if dot:
        return f"{prefix[:32]}.…"
    return f"{key[:4]}…"


def safe_identity(identity: str) -> str:
    """An identity label safe to store and show: "key:<prefix>.<secret>" becomes "key:<prefix>".

    Labels of other schemes ("ip:...", "user:...") are kept; anything is cut to 128 characters.
    """
    if not isinstance(identity, str):
        return "?"
    scheme, colon, rest = identity.partition(":")
    if colon and scheme == "key":
        # Only the public prefix identifies a key; whatever follows a dot would be its secret.
        return f"key:{rest.partition('.')[0][:64]}"
    return identity[:_MAX_IDENTITY]


def _format_value(value: Any) -> str:
    text = str(value)
    return text if _SAFE_VALUE.match(text) else json.dumps(text)


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log `event` with `fields` on the "ratelimit_app" logger: the message reads `event key=value ...`, and
    the record carries `ratelimit_event` and `ratelimit` (the fields) for structured handlers."""
    if not logger.isEnabledFor(level):
        return
    if "identity" in fields:
        fields["identity"] = safe_identity(fields["identity"])
    if "key" in fields:
        fields["key"] = mask_key(fields["key"])
    message = " ".join([event, *(f"{name}={_format_value(value)}" for name, value in fields.items())])
    logger.log(level, message, extra={"ratelimit_event": event, "ratelimit": fields})


#: What `log_once` has logged in this process (bounded: past _MAX_LOGGED_ONCE records it logs no more).
_logged_once: set[tuple[str, ...]] = set()
_logged_once_lock = threading.Lock()
_MAX_LOGGED_ONCE = 1000


def log_once(event: str, level: int, **fields: Any) -> bool:
    """`log_event`, once per process for the same event and fields (a row or a setting that stays wrong
    is reported once, not at every reload). True when it logged."""
    record = (event, *(f"{name}={value!r}" for name, value in sorted(fields.items())))
    with _logged_once_lock:
        if record in _logged_once or len(_logged_once) >= _MAX_LOGGED_ONCE:
            return False
        _logged_once.add(record)
    log_event(event, level, **fields)
    return True


def log_denial(*, tier: str, policy: str | None, identity: str, degraded: bool = False) -> None:
    """A request refused by the limiter (DEBUG: one record per denial)."""
    log_event("ratelimit.denied", logging.DEBUG, tier=tier, policy=policy or "", identity=identity,
              degraded=degraded)


def log_breaker_change(*, previous: str, state: str) -> None:
    """The circuit breaker in front of Redis changed state (WARNING when it opens, else INFO)."""
    level = logging.WARNING if state == "open" else logging.INFO
    log_event("ratelimit.breaker", level, previous=previous, state=state)


class JsonFormatter(logging.Formatter):
    """Formats records as one JSON object per line: time, level, logger, event, message and fields.

    Use it in LOGGING: `"formatters": {"json": {"()": "ratelimit_app.core.logs.JsonFormatter"}}`.
    """

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "event": getattr(record, "ratelimit_event", None),
            "message": record.getMessage(),
        }
        fields = getattr(record, "ratelimit", None)
        if isinstance(fields, dict):
            payload.update({name: value for name, value in fields.items() if name not in payload})
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)
