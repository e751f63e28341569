"""HTTP: a trivial view under a real server, in variants, loaded from loopback by a bounded client.

Each variant (bench/httpapp/variants.py) gets its own server on a free loopback port: gunicorn
serving bench.httpapp.wsgi (the WSGI variants), or uvicorn, one process without access log,
serving bench.httpapp.asgi (the ASGI variants, whose view is an `async def`). The load generator
(wrk when it is on PATH, else the bounded Python client below) warms it up, then sends GET /api/ping
for a fixed time over a fixed number of keep-alive connections, and reports requests per second, the
p99 latency and how many answers were not 200 (must be 0: no run reaches a limit). Rounds are
interleaved across variants and each variant's row is its median round.

What users get: before the variants run, the SQLite database of the bench settings is migrated, which
seeds the free, pro and enterprise tiers, and KEY_COUNT API keys of the seeded SEEDED_TIER are made.
Every request sends one of them, in turn (X-API-Key), so each key stays within its seeded limits for a
whole round (Redis is flushed between rounds); the limits are the seeded ones, as migrate makes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.loadgen import HttpResult, load_generator
from bench.redis_time import redis_cpu
from devtools.embedded import free_port

ROOT = Path(__file__).resolve().parent.parent
PATH = "/api/ping"

#: The seeded tier whose keys the requests send (its burst of 200 refills at 2,000 per minute: with
#: KEY_COUNT keys in turn, a round of a few thousand requests per second stays within every key's limits).
SEEDED_TIER = "enterprise"
KEY_COUNT = 64


def server_env(redis_url: str, db_path: Path, variant: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "BENCH_REDIS_URL": redis_url,
        "BENCH_DB_PATH": str(db_path),
        "BENCH_HTTP_VARIANT": variant,
        "DJANGO_SETTINGS_MODULE": "bench.httpapp.settings",
        "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    })
    return env


_PREPARE = """
import json, sys
import django
django.setup()
from django.core.management import call_command
from ratelimit_app.models import ApiKey, Tier
call_command("migrate", interactive=False, verbosity=0)
tier = Tier.objects.get(slug=%r)
keys = [ApiKey.objects.create_key(name=f"benchmark {n}", tier=tier)[1] for n in range(%d)]
sys.stdout.write(json.dumps(keys) + "\\n")
"""


def seeded_limits(slug: str) -> list[tuple[str, str, int, int, int | None]]:
    """The limits `migrate` seeds for tier `slug`: (name, algorithm, limit, period seconds, burst)."""
    seed = importlib.import_module("ratelimit_app.migrations.0001_initial")
    index = list(seed.SEED_TIERS).index(slug)
    return [(name, algorithm, limits[index], period, bursts[index] if bursts else None)
            for scope, name, algorithm, period, _, limits, bursts in seed.SEED_LIMITS if not scope]


def prepare_database(redis_url: str, db_path: Path) -> list[str]:
    """Migrate the bench database (which seeds the tiers) and return KEY_COUNT new API keys of the
    seeded SEEDED_TIER. One process, to start Django once."""
    done = subprocess.run([sys.executable, "-c", _PREPARE % (SEEDED_TIER, KEY_COUNT)],
                          env=server_env(redis_url, db_path, "ours"), cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"preparing the HTTP database failed:\n{done.stdout}\n{done.stderr}")
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


_PREPARE_WITH_SLOT = """
import json, sys
import django
django.setup()
from django.core.management import call_command
from ratelimit_app.models import ApiKey, Tier, TierLimit
call_command("migrate", interactive=False, verbosity=0)
seeded = Tier.objects.get(slug=%r)
slot_tier, _ = Tier.objects.update_or_create(slug=seeded.slug + "-slot", defaults={"name": seeded.name + " + slot"})
for row in seeded.limits.all():
    TierLimit.objects.update_or_create(tier=slot_tier, scope=row.scope, name=row.name, defaults={
        "algorithm": row.algorithm, "limit": row.limit, "period": row.period, "burst": row.burst, "enabled": True})
TierLimit.objects.update_or_create(tier=slot_tier, scope="", name="concurrency", defaults={
    "algorithm": "concurrency", "limit": 1_000_000, "period": 60, "burst": None, "enabled": True})
keys = {tier.slug: [ApiKey.objects.create_key(name=f"bench {n}", tier=tier)[1] for n in range(%d)]
        for tier in (seeded, slot_tier)}
sys.stdout.write(json.dumps(keys) + "\\n")
"""


def prepare_with_slot(redis_url: str, db_path: Path, variant: str) -> dict[str, list[str]]:
    """Migrate the bench database and return KEY_COUNT keys of the seeded SEEDED_TIER and of
    "<SEEDED_TIER>-slot": a copy of it plus a concurrency limit no run reaches (as staff add one), by slug."""
    done = subprocess.run([sys.executable, "-c", _PREPARE_WITH_SLOT % (SEEDED_TIER, KEY_COUNT)],
                          env=server_env(redis_url, db_path, variant), cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"preparing the database failed:\n{done.stdout}\n{done.stderr}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


#: The servers a variant can run under: gunicorn (WSGI) or uvicorn (ASGI).
SERVERS = ("gunicorn", "uvicorn")


def connections_per_worker(connections: int, workers: int) -> int:
    """The most of `connections` one gunicorn worker holds at once (see `server_command`)."""
    return -(-connections // workers)


def server_command(server: str, port: int, workers: int, threads: int, connections: int | None = None) -> list[str]:
    """The command line of `server` serving the bench app on 127.0.0.1:`port`, without access log.

    gunicorn: `workers` sync workers (gunicorn's default class: one request at a time, the connection
    closed after each answer) when `threads` is 0, else gthread workers of `threads` threads, which keep
    connections alive as a deployment behind a proxy would. With gthread and `connections` (those the
    load generator keeps open, straight to gunicorn), each worker holds at most its share of them:
    without that bound, the worker that wakes first accepts every connection opened at once, and a round
    then measures one worker out of two. uvicorn: one process (`workers` and `threads` do not apply), its
    default event loop and HTTP parser (uvloop and httptools when installed).
    """
    if server == "gunicorn":
        kind = ["--worker-class", "sync"] if threads <= 0 else ["--worker-class", "gthread", "--threads", str(threads)]
        share = [] if connections is None or threads <= 0 else \
            ["--worker-connections", str(connections_per_worker(connections, workers))]
        return [sys.executable, "-m", "gunicorn", "bench.httpapp.wsgi:application", "--bind", f"127.0.0.1:{port}",
                "--workers", str(workers), *kind, *share, "--log-level", "warning"]
    if server == "uvicorn":
        return [sys.executable, "-m", "uvicorn", "bench.httpapp.asgi:application", "--host", "127.0.0.1",
                "--port", str(port), "--no-access-log", "--log-level", "warning"]
    raise ValueError(f"unknown server {server!r}; expected one of {', '.join(SERVERS)}")


class Server:
    """gunicorn or uvicorn serving one variant on a free loopback port (a context manager that stops it)."""

    def __init__(self, redis_url: str, db_path: Path, variant: str, workers: int, threads: int,
                 server: str = "gunicorn", connections: int | None = None) -> None:
        self.port = free_port()
        self.server = server
        self.process = subprocess.Popen(server_command(server, self.port, workers, threads, connections),
                                        env=server_env(redis_url, db_path, variant), cwd=ROOT,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = f"http://127.0.0.1:{self.port}{PATH}"

    def wait_ready(self, headers: dict[str, str], timeout: float = 30.0) -> tuple[int, dict[str, str]]:
        """Wait until the server answers; the first answer's status and headers."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                error = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"{self.server} exited with {self.process.returncode}:\n{error}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", PATH, headers=headers)
                response = conn.getresponse()
                response.read()
                conn.close()
                return response.status, dict(response.getheaders())
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def worker_cpu(self) -> float:
        """CPU seconds (user + system) used so far by the processes that serve requests: gunicorn's
        workers (the master's children), or uvicorn's one process."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # a process that ended while we looked
            pid, ppid = int(stat.parent.name), int(fields[1])
            if (pid if self.server == "uvicorn" else ppid) == self.process.pid:
                total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / ticks

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass(frozen=True)
class HttpRun:
    """The HTTP section: per-variant results (the median round by requests/s; requests and errors
    summed over rounds), every round's requests/s, the response headers of our variant, and the set-up."""

    results: tuple[HttpResult, ...]
    rounds: dict[str, tuple[float, ...]]
    ours_headers: dict[str, str]
    generator: str
    workers: int
    threads: int
    connections: int
    duration: float
    server: str = "gunicorn"



def run_http(redis_url: str, admin: redis.Redis, work_dir: Path, variants: list[str], duration: float,
             warmup: float, rounds: int, connections: int, workers: int, threads: int,
             progress: Callable[[str], None], *, server: str = "gunicorn", ours: str = "ours") -> HttpRun:
    """Every variant under `server`, `rounds` interleaved times (see the module docstring); the
    response headers are those of the variant `ours`.

    All variants' servers are started first and stay up (idle ones cost nothing), so a round is
    only load: round r loads every variant once, for `warmup` then `duration` seconds, before round
    r+1 starts. A disturbance of the machine then hits one round of several variants, not every round
    of one, and each variant's row is its median round.
    """
    db_path = work_dir / "bench-http.sqlite3"
    keys = prepare_database(redis_url, db_path)
    headers = {"X-API-Key": keys[0]}
    generator_name, generate = load_generator()
    runs: dict[str, list[HttpResult]] = {variant: [] for variant in variants}
    ours_headers: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        progress(f"http: starting {len(variants)} {server} servers")
        servers = {variant: stack.enter_context(Server(redis_url, db_path, variant, workers, threads, server,
                                                                  connections))
                   for variant in variants}
        for variant, serving in servers.items():
            status, first_headers = serving.wait_ready(headers)
            if status != 200:
                raise RuntimeError(f"HTTP variant {variant}: first answer was {status}, expected 200")
            if variant == ours:
                ours_headers = {k: v for k, v in first_headers.items() if "ratelimit" in k.lower()}
        for round_index in range(rounds):
            progress(f"http ({server}) round {round_index + 1}/{rounds}: {', '.join(variants)}")
            for variant, serving in servers.items():
                admin.flushall()
                if warmup > 0:
                    generate(serving.url, keys, connections, warmup)
                cpu_before, app_before = redis_cpu(admin), serving.worker_cpu()
                result = generate(serving.url, keys, connections, duration)
                cpu, app = redis_cpu(admin) - cpu_before, serving.worker_cpu() - app_before
                requests = max(1, result.requests)
                runs[variant].append(HttpResult(variant, result.requests, result.per_second, result.p50,
                                                result.p99, result.errors, result.generator, cpu / requests,
                                                app / requests))
    admin.flushall()
    medians = []
    for variant in variants:
        done = sorted(runs[variant], key=lambda r: r.per_second)
        middle = done[(len(done) - 1) // 2]
        medians.append(dataclasses.replace(middle, requests=sum(r.requests for r in done),
                                           errors=sum(r.errors for r in done),
                                           server_cpu=statistics.median(r.server_cpu for r in done),
                                           app_cpu=statistics.median(r.app_cpu for r in done)))
    return HttpRun(tuple(medians), {v: tuple(r.per_second for r in runs[v]) for v in variants}, ours_headers,
                   generator_name, workers, threads, connections, duration, server)
