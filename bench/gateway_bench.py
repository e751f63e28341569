"""Gateway mode's cost: requests per second through nginx with and without the gateway endpoint, side by side.

    python3 bench/gateway_bench.py [--duration 5] [--warmup 1] [--rounds 5] [--connections 8]
                                   [--workers 2] [--threads 4] [--json results.json] [--write]

One nginx (one worker) runs four server blocks in front of one protected service (an nginx server block
answering `200 ok`, so the service costs next to nothing), and one gunicorn (gthread) serves the Django
side (bench.httpapp, variant "gateway") against a private redis-server:

- "no auth_request": nginx proxies to the service, nothing else;
- "bare auth_request (the floor)": nginx asks a Django view that makes one bare EVALSHA (the floor of any
  Redis-backed limiter, bench.httpapp.views.ping_evalsha) before it proxies;
- "gateway endpoint": the first nginx block of docs/gateway.md (ports changed), keys of the seeded
  SEEDED_TIER as migrate makes it (its rate limits, no concurrency limit): one decision per request (the
  per-IP limit and three tier limits in one EVALSHA), the rate limit headers copied onto the answer;
- "gateway endpoint + slot": the same block, keys of a copy of that tier plus a concurrency limit no run
  reaches (as staff add one), whose slot is taken in the same EVALSHA; nginx's post_action gives it back
  with a second call to Django (/ratelimit/release: one ZREM).

The four run in interleaved rounds (their order alternates each round); each row is its median round.
Also measured: the gunicorn workers' and Redis' CPU per request, and Redis commands per request (INFO
commandstats). Every limit is far above what a run sends; the table says how many answers were not 200.
Results go to stdout as a Markdown table (and with --json, to a file); --write also puts them into
docs/benchmarks.md as its section 8 (marked, so `bench/run.py` keeps it when it writes the rest).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.http_bench import SEEDED_TIER, Server, prepare_with_slot  # noqa: E402
from bench.httpapp.variants import GATEWAY_VARIANT  # noqa: E402
from bench.loadgen import HttpResult, load_generator  # noqa: E402
from bench.redis_time import redis_cpu  # noqa: E402
from devtools.embedded import free_port, start_redis  # noqa: E402
from tests.support.gateways import doc_block, missing_gateways, start_nginx, with_ports  # noqa: E402

#: A service that costs next to nothing, and the two nginx servers the endpoint is compared with.
_SERVICE = "server {{ listen 127.0.0.1:{service}; location / {{ return 200 \"ok\\n\"; }} }}\n"
_NO_AUTH = "server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://127.0.0.1:{service}; }} }}\n"
_FLOOR = """server {{
    listen 127.0.0.1:{port};
    location / {{ auth_request /_floor; proxy_pass http://127.0.0.1:{service}; }}
    location = /_floor {{
        internal;
        proxy_pass http://127.0.0.1:{django}/api/ping;
        proxy_pass_request_body off;
        proxy_set_header Content-Length "";
        proxy_set_header X-Original-URI $request_uri;
    }}
}}
"""


@dataclass
class Row:
    """One variant: its label, the keys it sends (none: no API key), the nginx port and its rounds."""

    label: str
    tier: str | None
    port: int = 0
    results: list[HttpResult] = field(default_factory=list)
    commands: list[dict[str, float]] = field(default_factory=list)
    cpu: list[tuple[float, float]] = field(default_factory=list)


def prepare(redis_url: str, db_path: Path) -> dict[str, list[str]]:
    return prepare_with_slot(redis_url, db_path, GATEWAY_VARIANT)


def nginx_servers(rows: list[Row], django: int, service: int) -> str:
    """The server blocks of every row and the service's."""
    blocks = [_SERVICE.format(service=service)]
    for row in rows:
        row.port = free_port()
        if row.label == "no auth_request":
            blocks.append(_NO_AUTH.format(port=row.port, service=service))
        elif row.label.startswith("bare auth_request"):
            blocks.append(_FLOOR.format(port=row.port, service=service, django=django))
        else:
            blocks.append(with_ports(doc_block("nginx"), django=django, service=service, listen=row.port,
                                     listen_pattern="listen {};"))
    return "\n".join(blocks)



def _commands(admin: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in admin.info("commandstats").items()}


def measure(rows: list[Row], keys: dict[str, list[str]], server: Server, admin: redis.Redis,
            args: argparse.Namespace) -> str:
    """Every row, `args.rounds` interleaved rounds; the name of the load generator."""
    generator_name, generate = load_generator()
    for round_index in range(args.rounds):
        for row in rows if round_index % 2 == 0 else list(reversed(rows)):
            url, sent = f"http://127.0.0.1:{row.port}/ping", keys[row.tier] if row.tier else []
            admin.flushdb()  # the private server: counters start afresh, the scripts stay loaded
            generate(url, sent, args.connections, args.warmup)
            before, app_before, redis_before = _commands(admin), server.worker_cpu(), redis_cpu(admin)
            result = generate(url, sent, args.connections, args.duration)
            after, app_after, redis_after = _commands(admin), server.worker_cpu(), redis_cpu(admin)
            done = max(1, result.requests)
            row.results.append(result)
            row.cpu.append(((app_after - app_before) / done, (redis_after - redis_before) / done))
            row.commands.append({name: (after[name] - before.get(name, 0)) / done for name in after})
            print(f"round {round_index + 1}/{args.rounds} {row.label}: {result.per_second:.0f} req/s "
                  f"({result.errors} not 200)", file=sys.stderr)
    return generator_name


def table(rows: list[Row], args: argparse.Namespace, generator: str) -> list[str]:
    lines = [f"nginx 1 worker; gunicorn gthread, {args.workers} workers x {args.threads} threads; load: {generator}, "
             f"{args.connections} connections, {args.rounds} rounds of {args.duration:g} s (median round); "
             f"{os.cpu_count()} cores", "",
             "| through nginx | req/s (median) | vs no auth_request | vs the floor | rounds (req/s) | p50 ms | "
             "p99 ms | not 200 | EVALSHA/req | ZREM/req | Django CPU ms/req | Redis CPU us/req |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    medians = {row.label: _median(row).per_second for row in rows}
    for row in rows:
        middle = _median(row)
        rounds = ", ".join(f"{r.per_second:.0f}" for r in row.results)
        evalsha = statistics.median(c.get("evalsha", 0.0) for c in row.commands)
        zrem = statistics.median(c.get("zrem", 0.0) for c in row.commands)
        app_cpu = statistics.median(c[0] for c in row.cpu) * 1000
        redis_cpu = statistics.median(c[1] for c in row.cpu) * 1_000_000
        lines.append(
            f"| {row.label} | {middle.per_second:.0f} | {middle.per_second / medians['no auth_request']:.2f}x | "
            f"{middle.per_second / medians['bare auth_request (the floor)']:.2f}x | {rounds} | "
            f"{middle.p50 * 1000:.2f} | {middle.p99 * 1000:.2f} | {sum(r.errors for r in row.results)} | "
            f"{evalsha:.3f} | {zrem:.3f} | {app_cpu:.3f} | {redis_cpu:.1f} |")
    return lines


def _median(row: Row) -> HttpResult:
    ordered = sorted(row.results, key=lambda r: r.per_second)
    return ordered[(len(ordered) - 1) // 2]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    parser.add_argument("--write", action="store_true", help="put the results into docs/benchmarks.md")
    args = parser.parse_args(argv)
    load_at_start = os.getloadavg()[0]
    missing = missing_gateways()
    if missing is not None:
        raise SystemExit(f"gateway_bench: {missing}")
    rows = [Row("no auth_request", None), Row("bare auth_request (the floor)", SEEDED_TIER),
            Row("gateway endpoint", SEEDED_TIER), Row("gateway endpoint + slot", f"{SEEDED_TIER}-slot")]
    redis_server = start_redis()
    admin = redis.Redis.from_url(redis_server.url)
    work_dir = Path(tempfile.mkdtemp(prefix="ratelimit-gateway-bench-"))
    try:
        keys = prepare(redis_server.url, work_dir / "db.sqlite3")
        with Server(redis_server.url, work_dir / "db.sqlite3", GATEWAY_VARIANT, args.workers, args.threads) as server:
            if server.wait_ready({})[0] != 200:
                raise RuntimeError("the Django app's floor view did not answer 200")
            nginx = start_nginx(nginx_servers(rows, server.port, free_port()), work_dir / "nginx", rows[0].port)
            try:
                generator = measure(rows, keys, server, admin, args)
            finally:
                nginx.stop()
    finally:
        redis_server.stop()
    lines = table(rows, args, generator)
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps([{"label": row.label, "results": [asdict(r) for r in row.results],
                                          "commands": row.commands, "cpu": row.cpu} for row in rows], indent=2))
    if args.write:
        _write_section(lines, load_at_start, os.getloadavg()[0])
    return 0


def _write_section(lines: list[str], load_at_start: float, load_at_end: float) -> None:
    from bench.report_text import write_script_section

    write_script_section("gateway", "## 8. Gateway mode through nginx", "bench/gateway_bench.py", [
        "One nginx (1 worker) in front of a protected service that answers `200 ok`; one gunicorn serves the",
        "Django side against a private redis-server. \"gateway endpoint\" is the first nginx block of",
        "docs/gateway.md (ports changed) with keys of the seeded enterprise tier as `migrate` makes it;",
        "\"+ slot\" uses a copy of that tier plus a concurrency limit, given back by nginx's `post_action` (a",
        "second call to Django, one ZREM). The floor is a bare auth_request to a view making one EVALSHA.",
    ], lines, load_at_start, load_at_end)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
