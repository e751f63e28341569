"""The examples in the docs are what the code does: the rate limit headers of
docs/usage.md and the problem details of docs/plans.md, checked against real responses of the seeded
free tier (values that depend on the time of day are checked to be those of one moment); every settings
block a newcomer copies from README, usage.md, testing.md and operations.md passes the settings check."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import Client
from django.urls import path

from ratelimit_app.core.logs import JsonFormatter, log_event, logger
from tests.support.limits_support import make_key, parse_ietf, seed_tiers

pytestmark = pytest.mark.django_db

DOCS = Path(__file__).resolve().parent.parent / "docs"


def code_block(document: str, containing: str) -> str:
    """The fenced code block of docs/<document> that contains `containing`."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", (DOCS / document).read_text(encoding="utf-8"), re.DOTALL)
    found = [block for block in blocks if containing in block]
    assert len(found) == 1, f"{document}: {len(found)} code blocks contain {containing!r}"
    return found[0]


def header_lines(block: str) -> dict[str, str]:
    """'Name: value' lines of an example (a comment after the value, set off by 2+ spaces, is dropped)."""
    headers = {}
    for line in block.splitlines():
        name, colon, value = line.partition(": ")
        if colon and re.fullmatch(r"[A-Za-z-]+", name):
            headers[name] = re.split(r"\s{2,}", value.strip())[0]
    return headers


def test_the_rate_limit_headers_of_usage_md_are_what_a_first_request_gets(client: Any) -> None:
    example = header_lines(code_block("usage.md", "RateLimit-Policy:"))
    seed_tiers()
    response = client.get("/api/users", HTTP_X_API_KEY=make_key("free"))  # a new key's first request
    assert response.status_code == 200
    for name in ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Tier",
                 "RateLimit-Policy"):
        assert example[name] == response[name], name
    shown, sent = parse_ietf(example["RateLimit"]), parse_ietf(response["RateLimit"])
    assert list(shown) == list(sent)
    assert {name: fields["r"] for name, fields in shown.items()} == {name: fields["r"] for name, fields in sent.items()}
    clocked = {"ip", "day"}  # windows aligned to the clock: their t depends on the time of the request
    assert {name: shown[name]["t"] for name in shown if name not in clocked} == \
        {name: sent[name]["t"] for name in sent if name not in clocked}
    # the example's day (a fixed window ending at 00:00 UTC) and per-IP limit (a sliding window counter
    # of 60 s, full again at the end of the next window) show one moment: the same shift of the clock
    # from this request's moment moves both
    shift = shown["day"]["t"] - sent["day"]["t"]
    assert 0 < shown["day"]["t"] <= 86400
    assert 60 < shown["ip"]["t"] <= 120 and (shown["ip"]["t"] - sent["ip"]["t"] - shift) % 60 == 0


def test_the_problem_details_of_plans_md_are_what_a_refusal_gets(client: Any, settings: Any) -> None:
    example = code_block("plans.md", "application/problem+json")
    head, _, body = example.partition("\n\n")
    shown_body = json.loads(body)
    settings.RATELIMIT = {**settings.RATELIMIT, "ERROR_FORMAT": "problem"}
    seed_tiers()
    key = make_key("free")
    responses = [client.get("/api/users", HTTP_X_API_KEY=key) for _ in range(11)]  # a burst of 10
    refused = responses[-1]
    assert [r.status_code for r in responses] == [200] * 10 + [429]
    assert head.splitlines()[0] == "HTTP/1.1 429 Too Many Requests"
    headers = header_lines(head)
    assert headers["Content-Type"] == refused["Content-Type"]
    sent_body = json.loads(refused.content)
    assert set(shown_body) == set(sent_body)
    assert {k: v for k, v in shown_body.items() if k != "retry_after"} == \
        {k: v for k, v in sent_body.items() if k != "retry_after"}
    # the burst refills one unit every 3 s: the wait shown is one a refusal can get, rounded up as sent
    assert 0 < shown_body["retry_after"] <= 3 and 0 < sent_body["retry_after"] <= 3
    assert int(headers["Retry-After"]) == math.ceil(shown_body["retry_after"])
    assert int(refused["Retry-After"]) == math.ceil(sent_body["retry_after"])


def test_the_logging_example_of_observability_md_shows_what_its_settings_let_through() -> None:
    config: dict[str, Any] = {}
    exec(code_block("observability.md", "JsonFormatter"), config)  # noqa: S102 (our own docs)
    level = logging.getLevelName(config["LOGGING"]["loggers"]["ratelimit_app"]["level"])
    shown = json.loads(code_block("observability.md", '"event": "ratelimit.redis_unavailable"'))
    assert logging.getLevelName(shown["level"]) >= level  # the settings above let the sample line through
    # the line is what JsonFormatter writes for that event (all but the time)
    handler = logging.Handler()
    lines: list[str] = []
    handler.emit = lambda record: lines.append(JsonFormatter().format(record))  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        fields = {name: shown[name] for name in ("redis", "error", "fail_mode", "requests")}
        log_event(shown["event"], logging.getLevelName(shown["level"]), **fields)
    finally:
        logger.removeHandler(handler)
    [line] = lines
    assert {**json.loads(line), "time": shown["time"]} == shown
    denied = json.loads(code_block("observability.md", '"event": "ratelimit.denied"'))
    assert denied["level"] == "DEBUG"  # shown only once the level is DEBUG, as the docs say there


def test_the_cost_example_of_usage_md_charges_a_post_with_an_api_key_5(settings: Any) -> None:
    block = code_block("usage.md", '@limit_cost(5, methods=["POST"])')
    example = block[:block.index("def upload(request): ...")] + "def upload(request): return HttpResponse('ok')\n"
    namespace: dict[str, Any] = {"HttpResponse": HttpResponse, "__name__": "usage_md_example"}
    exec(example, namespace)  # noqa: S102 (our own docs)
    urls = ModuleType("usage_md_upload_urls")
    urls.urlpatterns = [path("api/upload", namespace["upload"])]  # type: ignore[attr-defined]
    settings.ROOT_URLCONF = urls
    seed_tiers()
    client = Client(enforce_csrf_checks=True)  # as Django's CsrfViewMiddleware treats a client without a cookie
    response = client.post("/api/upload", {"file": "x"}, HTTP_X_API_KEY=make_key("free"))
    assert response.status_code == 200, response.content[:200]
    assert response["X-RateLimit-Remaining"] == "5"  # the free burst of 10, less 5


def test_the_docs_say_when_edits_apply_as_the_code_does() -> None:
    from ratelimit_app.conf.settings import DEFAULTS
    from ratelimit_app.plans.edits import EDITS_CHECK_INTERVAL

    assert EDITS_CHECK_INTERVAL == 1.0 and DEFAULTS["CACHE_TTL"] == 5
    readme = re.sub(r"\s+", " ", (DOCS.parent / "README.md").read_text(encoding="utf-8"))
    gateway = re.sub(r"\s+", " ", (DOCS / "gateway.md").read_text(encoding="utf-8"))
    assert "about a second after they are saved" in readme and "`CACHE_TTL`, 5 s" in readme
    assert "about a second after it is saved" in gateway and "`RATELIMIT['CACHE_TTL']`, 5 s by default" in gateway
    assert "within `RATELIMIT['CACHE_TTL']` seconds" not in gateway


@pytest.mark.parametrize("document", ["README.md", "docs/usage.md", "docs/testing.md", "docs/gateway.md",
                                      "docs/operations.md", "docs/observability.md", "docs/settings.md",
                                      "docs/websockets.md"])
def test_every_file_and_link_a_doc_names_exists(document: str) -> None:
    root = DOCS.parent
    text = (root / document).read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:ratelimit_app|tests|bench|project|devtools|scripts|docs)/[\w./-]+)`", text))
    linked = {str((root / document).parent.relative_to(root) / target) for target in
              re.findall(r"\]\((?!https?:|#|mailto:)([^)#\s]+)", text)}
    missing = sorted(path for path in named | linked if not (root / path).exists())
    assert missing == []
    anchored = {(str((root / document).parent.relative_to(root) / target) if target else document, anchor)
                for target, anchor in re.findall(r"\]\((?!https?:)([^)#\s]*)#([^)\s]+)\)", text)}
    assert sorted((path, anchor) for path, anchor in anchored if anchor not in heading_anchors(root / path)) == []


def heading_anchors(document: Path) -> set[str]:
    """The anchors GitHub gives the headings of `document` (lower case, punctuation dropped, spaces as '-')."""
    text = re.sub(r"```.*?```", "", document.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+\s+(.*)$", text, re.MULTILINE)}


#: The settings blocks of the docs a newcomer copies: (document, a line of the block). Each is run as
#: Python (the `...` a block elides is the project's own: dropped from a dict, Ellipsis in a list).
SETTINGS_BLOCKS = [
    ("../README.md", 'INSTALLED_APPS += ["ratelimit_app"]'),
    ("../README.md", 'INSTALLED_APPS = [..., "ratelimit_app"]'),
    ("usage.md", '"TRUSTED_PROXIES": 0,'),
    ("usage.md", '"EXEMPT_PATHS": ["/health", "/api/docs", "/api/openapi.json"]'),
    ("usage.md", "?max_connections=20"),
    ("testing.md", '"BACKEND": "memory"'),
    ("operations.md", "redis+cluster://"),
    ("operations.md", "redis+sentinel://"),
]


def run_settings_block(document: str, containing: str) -> dict[str, Any]:
    """The names a settings block of the docs sets, run over an empty project's lists."""
    block = code_block(document, containing).replace("    ...,\n", "")
    namespace: dict[str, Any] = {"INSTALLED_APPS": [], "MIDDLEWARE": [], "RATELIMIT": {}}
    exec(block, namespace)  # noqa: S102 (our own docs)
    return namespace


@pytest.mark.parametrize(("document", "containing"), SETTINGS_BLOCKS)
def test_every_settings_block_of_the_docs_passes_check(document: str, containing: str, settings: Any) -> None:
    from ratelimit_app.conf.settings import read_settings

    settings.RATELIMIT = run_settings_block(document, containing)["RATELIMIT"]
    _, errors = read_settings()
    assert errors == []


def test_the_settings_usage_md_marks_as_defaults_are_the_defaults() -> None:
    from ratelimit_app.conf.settings import DEFAULTS

    block = code_block("usage.md", '"TRUSTED_PROXIES": 0,')
    written = run_settings_block("usage.md", '"TRUSTED_PROXIES": 0,')["RATELIMIT"]
    marked = re.findall(r'^\s+"(\w+)":.*\(default\)$', block, re.MULTILINE)
    assert marked == ["PATH_PREFIXES", "EXEMPT_PATHS", "IP_RATE"]
    assert {name: written[name] for name in marked} == {name: DEFAULTS[name] for name in marked}
    assert written["TRUSTED_PROXIES"] == DEFAULTS["TRUSTED_PROXIES"]


def test_the_drf_settings_of_usage_md_name_our_throttles_and_valid_rates() -> None:
    from django.utils.module_loading import import_string

    from ratelimit_app.throttling_checks import _rate_errors

    framework = run_settings_block("usage.md", '"DEFAULT_THROTTLE_RATES"')["REST_FRAMEWORK"]
    assert [import_string(name).__module__ for name in framework["DEFAULT_THROTTLE_CLASSES"]] == \
        ["ratelimit_app.throttling"] * 2
    assert _rate_errors(framework["DEFAULT_THROTTLE_RATES"]) == []
