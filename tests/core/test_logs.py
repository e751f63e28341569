"""ratelimit_app.core.logs: `log_event`'s record (message, level, fields on the record), the redaction
of keys and identities, the helpers' levels and `JsonFormatter`'s one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from ratelimit_app.core.logs import (
    JsonFormatter,
    log_breaker_change,
    log_denial,
    log_event,
    log_once,
    mask_key,
    safe_identity,
)

SECRET = "S3cretPartOfTheKeyThatMustNeverBeLogged0123"


def records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "ratelimit_app"]


@pytest.mark.parametrize(("key", "shown"), [
    ("", "…"), (None, "…"), (12345678, "…"), ("abc", "abc…"), (f"AbCd1234.{SECRET}", "AbCd1234.…"),
    ("x" * 40 + ".secret", "x" * 32 + ".…"), (".secret", ".…"),
])
def test_mask_key_never_shows_what_follows_the_prefix(key: object, shown: str) -> None:
    assert mask_key(key) == shown  # type: ignore[arg-type]


@pytest.mark.parametrize(("identity", "shown"), [
    (None, "?"), (42, "?"), ("key:AbCd1234", "key:AbCd1234"), (f"key:AbCd1234.{SECRET}", "key:AbCd1234"),
    ("key:" + "p" * 80, "key:" + "p" * 64), ("user:5", "user:5"), ("ip:" + "1" * 200, ("ip:" + "1" * 200)[:128]),
    ("hash:0123abcd.notasecret", "hash:0123abcd.notasecret"),
])
def test_safe_identity_cuts_a_key_label_at_its_prefix_and_any_label_at_128(identity: object, shown: str) -> None:
    assert safe_identity(identity) == shown  # type: ignore[arg-type]


def test_log_event_reads_as_event_and_fields_and_carries_them_on_the_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ratelimit_app")
    log_event("ratelimit.sample", logging.WARNING, identity=f"key:AbCd1234.{SECRET}", key=f"AbCd1234.{SECRET}",
              note="two words", count=3, path="/api/v1:x")
    [record] = records(caplog)
    assert record.levelno == logging.WARNING
    assert record.getMessage() == ('ratelimit.sample identity=key:AbCd1234 key="AbCd1234.\\u2026" '
                                   'note="two words" count=3 path=/api/v1:x')
    assert record.ratelimit_event == "ratelimit.sample"  # type: ignore[attr-defined]
    assert record.ratelimit == {"identity": "key:AbCd1234", "key": "AbCd1234.…",  # type: ignore[attr-defined]
                                "note": "two words", "count": 3, "path": "/api/v1:x"}
    assert SECRET not in caplog.text


def test_a_value_cannot_forge_another_field_or_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ratelimit_app")
    log_event("ratelimit.sample", where="x state=closed\nratelimit.breaker state=open")
    [record] = records(caplog)
    assert "\n" not in record.getMessage()
    assert record.getMessage() == 'ratelimit.sample where="x state=closed\\nratelimit.breaker state=open"'


def test_nothing_is_formatted_below_the_loggers_level(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ratelimit_app")

    class Loud:
        def __str__(self) -> str:
            raise AssertionError("formatted although the record is not logged")

    log_event("ratelimit.quiet", logging.DEBUG, value=Loud())
    log_denial(tier="free", policy="burst", identity="ip:192.0.2.1")
    assert records(caplog) == []


def test_the_helpers_log_at_their_documented_levels(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="ratelimit_app")
    log_denial(tier="free", policy=None, identity=f"key:AbCd1234.{SECRET}", degraded=True)
    log_breaker_change(previous="closed", state="open")
    log_breaker_change(previous="open", state="half_open")
    log_breaker_change(previous="half_open", state="closed")
    seen = [(r.ratelimit_event, r.levelname, r.ratelimit) for r in records(caplog)]  # type: ignore[attr-defined]
    assert seen == [
        ("ratelimit.denied", "DEBUG", {"tier": "free", "policy": "", "identity": "key:AbCd1234", "degraded": True}),
        ("ratelimit.breaker", "WARNING", {"previous": "closed", "state": "open"}),
        ("ratelimit.breaker", "INFO", {"previous": "open", "state": "half_open"}),
        ("ratelimit.breaker", "INFO", {"previous": "half_open", "state": "closed"}),
    ]


def test_json_formatter_writes_one_object_per_line_whose_fields_never_replace_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ratelimit_app")
    log_event("ratelimit.sample", time="spoofed", logger="spoofed", identity="ip:192.0.2.1", took=object())
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("ratelimit_app").error("failed", exc_info=sys.exc_info())
    event, failure = (JsonFormatter().format(r) for r in records(caplog))
    assert "\n" not in event
    line = json.loads(event)
    assert (line["level"], line["logger"], line["event"]) == ("INFO", "ratelimit_app", "ratelimit.sample")
    assert line["message"].startswith("ratelimit.sample time=spoofed logger=spoofed")
    assert line["identity"] == "ip:192.0.2.1" and line["took"].startswith("<object object")
    other = json.loads(failure)
    assert other["event"] is None and other["message"] == "failed"
    assert "RuntimeError: boom" in other["exception"]


def test_log_once_logs_the_same_event_and_fields_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ratelimit_app")
    assert log_once("ratelimit.sample", logging.ERROR, tier="free", limit="day") is True
    assert log_once("ratelimit.sample", logging.ERROR, limit="day", tier="free") is False  # the same, any order
    assert log_once("ratelimit.sample", logging.ERROR, tier="free", limit="month") is True
    assert [(r.levelname, r.ratelimit) for r in records(caplog)] == [  # type: ignore[attr-defined]
        ("ERROR", {"tier": "free", "limit": "day"}), ("ERROR", {"tier": "free", "limit": "month"})]
