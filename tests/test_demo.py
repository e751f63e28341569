"""The demo site's own views follow the advice of the docs: no 500 when Redis is down or a body is
hostile, and no stream that outlives the leases it holds. Through Django's test client, on the demo
URLconf, against a redis-server of the test's own (which it stops)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from devtools.embedded import EMBEDDED, RedisProcess, free_port
from tests.support.limits_support import make_key, make_tier, seed_tiers
from tests.test_embedded import wait_for

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", ["/api/slow?ms=0", "/api/export?ms=0", "/api/checkout?ms=0"])
def test_slow_views_answer_without_their_counts_when_redis_is_down(settings: Any, server: RedisProcess,
                                                                  path: str) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": server.url, "FAIL_MODE": "open",
                          "SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2, "BUDGET_MS": 200}
    seed_tiers()
    key = make_key("free")
    client = Client(raise_request_exception=False)
    assert client.get(path, HTTP_X_API_KEY=key).json()["in_flight"] == 1  # counted in Redis while it answers
    server.stop()
    response = client.get(path, HTTP_X_API_KEY=key)
    assert response.status_code == 200, response.content  # the limiter failed open, and so does the demo
    assert response.json()["in_flight"] is None and response.json()["in_flight_of_kind"] is None


def test_deeply_nested_json_is_a_400(client: Client) -> None:
    seed_tiers()
    key = make_key("free")
    nested = b"[" * 100_000 + b"]" * 100_000
    response = client.post("/api/data", nested, content_type="application/json", HTTP_X_API_KEY=key)
    assert response.status_code == 400 and "nested" in response.json()["error"]


def test_a_stream_ends_within_half_the_shortest_lease_it_holds(client: Client) -> None:
    tier = make_tier("short", [("minute", "fixed_window", 100, 60, None, ""),
                               ("concurrency", "concurrency", 2, 2, None, "")])  # a 2-second slot
    key = make_key(tier)
    started = time.monotonic()
    response = client.get("/api/stream?chunks=1000&ms=400", HTTP_X_API_KEY=key)
    chunks = []
    for chunk in response.streaming_content:  # type: ignore[attr-defined]
        chunks.append(chunk)
        assert len(chunks) <= 3, "the stream outlives half of its 2-second lease"
    assert chunks == [b"chunk 0\n", b"chunk 1\n", b"chunk 2\n"]  # 0, 0.4 and 0.8 s: within 1 s
    assert time.monotonic() - started < 2
    response.close()


def rundemo_output(addrport: str) -> str:
    """What `./scripts/demo <addrport>` prints before it serves (`manage.py rundemo --no-serve`)."""
    out = StringIO()
    call_command("rundemo", addrport, no_serve=True, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize(("addrport", "base", "everywhere"), [
    ("8101", "http://127.0.0.1:8101/", False),
    ("127.0.0.1:8101", "http://127.0.0.1:8101/", False),
    ("0.0.0.0:8101", "http://127.0.0.1:8101/", True),  # every address: the links name one this machine reaches
    ("localhost:8101", "http://localhost:8101/", False),
    ("[::1]:8101", "http://[::1]:8101/", False),
    ("[::]:8101", "http://[::1]:8101/", True),
])
def test_the_demo_prints_links_that_name_where_it_serves(addrport: str, base: str, everywhere: bool) -> None:
    output = rundemo_output(addrport)
    links = re.findall(r"https?://\S+", output)
    assert len(links) >= 7 and all(link.startswith(base) for link in links), links
    assert ("Listening on every address" in output) == everywhere


def test_the_demo_refuses_an_address_runserver_would_refuse() -> None:
    with pytest.raises(CommandError, match="'http://x:1' is not a port number or an address:port pair"):
        rundemo_output("http://x:1")


def test_every_curl_line_the_demo_prints_answers(client: Client) -> None:
    lines = [line.strip() for line in rundemo_output("8101").splitlines() if line.strip().startswith("curl ")]
    assert len(lines) >= 6
    for line in lines:
        words = shlex.split(line)
        method = words[words.index("-X") + 1] if "-X" in words else "GET"
        url = next(word for word in words if word.startswith("http://127.0.0.1:8101/"))
        headers = dict(words[i + 1].split(": ", 1) for i, word in enumerate(words) if word == "-H")
        data = words[words.index("-d") + 1] if "-d" in words else ""
        path = url.removeprefix("http://127.0.0.1:8101")
        response = client.generic(method, path, data, content_type="application/x-www-form-urlencoded",
                                  headers=headers)
        assert response.status_code in (200, 201), (line, response.status_code, response.content[:200])


def readme_demo_endpoints() -> list[tuple[str, str]]:
    """(method, path) of every endpoint README's paragraph on the demo lists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    paragraph = readme[readme.index("The demo (`./scripts/demo"):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    return [(method or "GET", path) for method, path in re.findall(r"`(?:(GET|POST) )?(/[^`\s]*)`", paragraph)]


def test_every_endpoint_readme_lists_for_the_demo_answers(client: Client) -> None:
    endpoints = readme_demo_endpoints()
    assert ("GET", "/ninja/users") in endpoints and ("GET", "/health") in endpoints and len(endpoints) >= 15
    seed_tiers()
    key = make_key("enterprise")  # enough for every call below
    for method, path in endpoints:
        response = client.generic(method, path, "{}", content_type="application/json", HTTP_X_API_KEY=key)
        assert response.status_code in (200, 201), (method, path, response.status_code)
        if response.streaming:
            b"".join(response.streaming_content)  # type: ignore[attr-defined]


@pytest.mark.slow
def test_the_demo_serves_on_an_ipv6_address_at_the_links_it_prints(tmp_path: Path) -> None:
    port = free_port()
    output = tmp_path / "demo.out"
    env = {**os.environ, "REDIS_URL": EMBEDDED, "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
           "DJANGO_SETTINGS_MODULE": "project.settings", "PYTHONUNBUFFERED": "1"}
    with output.open("wb") as out:
        demo = subprocess.Popen([sys.executable, "manage.py", "rundemo", f"[::1]:{port}"], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        def health() -> int:
            link = re.search(r"curl -i (\S+/health)$", output.read_text(), re.MULTILINE)
            if link is None:
                return 0
            assert link.group(1) == f"http://[::1]:{port}/health"
            with urllib.request.urlopen(link.group(1), timeout=5) as response:  # noqa: S310 (a link of ours)
                return int(response.status)

        wait_for(lambda: health() == 200, timeout=120, what="the demo to serve on [::1]")
    finally:
        demo.terminate()
        demo.wait(timeout=30)
