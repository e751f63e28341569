"""WebSocket messages per second through the Channels middleware, against the same consumer without it.

    python3 bench/ws_bench.py [--duration 5] [--rounds 5] [--connections 8] [--json results.json] [--write]

One uvicorn (one worker) serves the demo's echo consumer (project.demo.consumers.EchoConsumer) at two
paths, against a private redis-server and a SQLite database of its own:

- "without the limiter": `AuthMiddlewareStack(EchoConsumer)`, as a Channels project serves it;
- "one bare EVALSHA per message (the floor)": the same, plus a middleware that makes one bare EVALSHA (an
  INCR script) per received message over a redis.asyncio client: the floor of any Redis-backed limiter;
- "through the limiter": `RateLimitMiddlewareStack(EchoConsumer)`: each message charged to its tier's
  message limit (one EVALSHA per message), the connection holding a concurrency slot.

The key's tier is made for the run: a token bucket of 10^9 messages per 10 s, so no message is refused.
Each round opens `--connections` WebSocket connections per variant (one asyncio client each, in this
process) that send a message and wait for its echo, again and again, for `--duration` seconds; the two
variants alternate within each round and each row is its median round. Also measured: EVALSHA calls per
message (Redis INFO commandstats). Results go to stdout as a Markdown table (with --json, to a file);
--write puts them into docs/benchmarks.md as a marked section, which `bench/run.py` keeps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from devtools.embedded import free_port, start_redis  # noqa: E402

#: The tier of the run's key: messages never refused, connections never refused.
SETUP = """
import json
from ratelimit_app.models import ApiKey, Tier, TierLimit
tier = Tier.objects.create(slug="wsbench", name="WebSocket bench")
TierLimit.objects.create(tier=tier, scope="websocket", name="connections", algorithm="concurrency",
                         limit=10000, period=60)
TierLimit.objects.create(tier=tier, scope="websocket_message", name="messages", algorithm="token_bucket",
                         limit=1000000000, period=10, burst=1000000000)
print(json.dumps(ApiKey.objects.create_key(name="ws bench", tier=tier)[1]))
"""
VARIANTS = (("without the limiter", "plain"), ("one bare EVALSHA per message (the floor)", "floor"),
            ("through the limiter", "limited"))


class _Floor:
    """ASGI middleware: one bare EVALSHA per received WebSocket message, then the message goes on."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.floor: tuple[Any, str] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.floor is None:  # a redis.asyncio client belongs to the loop it is first used on: uvicorn's
            from bench.limiters import INCR_SCRIPT
            from ratelimit_app.service.connection import get_async_redis

            client: Any = get_async_redis()
            self.floor = (client, str(await client.script_load(INCR_SCRIPT)))
        client, sha = self.floor

        async def charged() -> Any:
            event = await receive()
            if event.get("type") == "websocket.receive":
                await client.evalsha(sha, 1, "floor:ws")
            return event

        await self.inner(scope, charged, send)


def application() -> Any:
    """The ASGI application uvicorn serves (`--factory bench.ws_bench:application`): the echo at
    /plain/ and at /limited/."""
    from django.core.asgi import get_asgi_application

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.asgi_server_settings")
    django_application = get_asgi_application()
    from channels.auth import AuthMiddlewareStack
    from channels.routing import ProtocolTypeRouter, URLRouter
    from django.urls import path

    from project.demo.consumers import EchoConsumer
    from ratelimit_app.channels.middleware import RateLimitMiddlewareStack

    limited: Any = RateLimitMiddlewareStack(EchoConsumer.as_asgi())  # an ASGI app, which path() routes too
    return ProtocolTypeRouter({"http": django_application, "websocket": URLRouter([
        path("plain/", AuthMiddlewareStack(EchoConsumer.as_asgi())),
        path("floor/", AuthMiddlewareStack(_Floor(EchoConsumer.as_asgi()))),
        path("limited/", limited),
    ])})


async def _client(url: str, until: float) -> int:
    from websockets.asyncio.client import connect

    sent = 0
    async with connect(url) as socket:
        while time.monotonic() < until:
            await socket.send("x" * 32)
            answer = await socket.recv()
            if not isinstance(answer, str) or answer.startswith("{"):
                raise AssertionError(f"not an echo: {answer!r:.200}")
            sent += 1
    return sent


async def _round(url: str, connections: int, duration: float) -> tuple[int, float]:
    """The messages echoed by `connections` clients sending for `duration` seconds, and the seconds it took
    (connecting included)."""
    until = time.monotonic() + duration
    started = time.monotonic()
    counts = await asyncio.gather(*(_client(url, until) for _ in range(connections)))
    return sum(counts), time.monotonic() - started


def _evalsha_calls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import redis

    from tests.support.gunicorn_server import prepare_database, start_server, stop_server

    redis_server = start_redis()
    tmp = Path(tempfile.mkdtemp(prefix="ws-bench-"))
    env = {**os.environ, "REDIS_URL": redis_server.url, "RATELIMIT_TEST_PREFIX": "wsbench",
           "DJANGO_SETTINGS_MODULE": "tests.support.asgi_server_settings",
           "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}", "RATELIMIT_LOG_LEVEL": "WARNING"}
    key = prepare_database(env, SETUP)
    port = free_port()
    command = [str(Path(sys.executable).parent / "uvicorn"), "--factory", "bench.ws_bench:application",
               "--port", str(port), "--log-level", "warning", "--no-access-log"]
    server = start_server(command, port, env, wait=60)
    stats = redis.Redis.from_url(redis_server.url)
    rates: dict[str, list[float]] = {label: [] for label, _ in VARIANTS}
    evalsha: dict[str, list[float]] = {label: [] for label, _ in VARIANTS}
    try:
        for number in range(args.rounds):
            order = VARIANTS[number % 3:] + VARIANTS[:number % 3]  # each variant first in turn
            for label, route in order:
                before = _evalsha_calls(stats)
                messages, seconds = asyncio.run(_round(f"ws://127.0.0.1:{port}/{route}/?key={key}",
                                                       args.connections, args.duration))
                rates[label].append(messages / seconds)
                evalsha[label].append((_evalsha_calls(stats) - before) / max(messages, 1))
    finally:
        stop_server(server)
        stats.close()
        redis_server.stop()
    return {"rates": rates, "evalsha_per_message": evalsha, "connections": args.connections,
            "duration": args.duration, "rounds": args.rounds}


def table(results: dict[str, Any]) -> list[str]:
    rates = results["rates"]
    plain = statistics.median(rates[VARIANTS[0][0]])
    floor = statistics.median(rates[VARIANTS[1][0]])
    lines = [f"uvicorn 1 worker; {results['connections']} connections, each sending a 32-byte text message and "
             f"waiting for its echo; {results['rounds']} rounds of {results['duration']:g} s (median round); "
             f"{os.cpu_count()} cores", "",
             "| consumer | messages/s (median) | vs without | vs the floor | rounds (messages/s) | EVALSHA/message |",
             "|---|---|---|---|---|---|"]
    for label, _ in VARIANTS:
        median = statistics.median(rates[label])
        per_message = statistics.median(results["evalsha_per_message"][label])
        lines.append(f"| {label} | {median:,.0f} | {median / plain:.2f}x | {median / floor:.2f}x | "
                     f"{', '.join(f'{rate:,.0f}' for rate in rates[label])} | {per_message:.3f} |")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per variant and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--write", action="store_true", help="put the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    load_at_start = os.getloadavg()[0]
    results = measure(args)
    lines = table(results)
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.write:
        from bench.report_text import write_script_section

        write_script_section("websockets", "## 10. WebSocket messages through the Channels middleware",
                             "bench/ws_bench.py", [
                                 "One uvicorn (1 worker) serves the demo's echo consumer three ways: behind Channels'",
                                 "AuthMiddlewareStack, and behind RateLimitMiddlewareStack (each message charged to",
                                 "its tier's message limit, a token bucket no run exhausts: one EVALSHA per message);",
                                 "the floor adds a middleware making one bare EVALSHA (an INCR script) per message.",
                                 "The clients run in the benchmark's process, on the same 2 cores.",
                             ], lines, load_at_start, os.getloadavg()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
