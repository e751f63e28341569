"""`manage.py ratelimit_loadtest URL --key KEY ...`: load-test a deployment with one API key from C threads,
each on one kept-alive connection; allowed, blocked, errors, status codes and latency (docs/observability.md)."""

from __future__ import annotations

import http.client
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ratelimit_app.conf.settings import ratelimit_settings
from ratelimit_app.core.logs import mask_key

_MAX_REQUESTS = 100_000
_MAX_CONCURRENCY = 256
_MAX_SECONDS = 3600.0
_BAR_WIDTH = 30


@dataclass(frozen=True)
class _LoadTestResult:
    """What a load test saw. `statuses` maps an HTTP status (or an error name) to its count."""

    sent: int
    requested: int
    seconds: float
    allowed: int
    blocked: int
    errors: int
    statuses: tuple[tuple[str, int], ...]
    latencies_ms: tuple[float, ...]
    stopped_by_time: bool

    def percentile(self, fraction: float) -> float:
        """The latency (ms) below which `fraction` of the answered requests fell (nearest rank)."""
        if not self.latencies_ms:
            return math.nan
        ordered = sorted(self.latencies_ms)
        rank = max(math.ceil(fraction * len(ordered)), 1)
        return ordered[rank - 1]


class _Run:
    """Shared state of the worker threads: the requests left to send and what came back."""

    def __init__(self, requests: int, deadline: float) -> None:
        self.lock = threading.Lock()
        self.left = requests
        self.deadline = deadline
        self.done = 0
        self.statuses: Counter[str] = Counter()
        self.latencies: list[float] = []
        self.stopped_by_time = False

    def take(self) -> bool:
        with self.lock:
            if self.left <= 0:
                return False
            if time.monotonic() >= self.deadline:
                self.stopped_by_time = True
                return False
            self.left -= 1
            return True

    def record(self, status: str, latency_ms: float | None) -> None:
        with self.lock:
            self.done += 1
            self.statuses[status] += 1
            if latency_ms is not None:
                self.latencies.append(latency_ms)


def _run_load_test(url: str, *, key: str, header: str, requests: int, concurrency: int, max_seconds: float,
                   timeout: float, method: str = "GET", progress: Any = None) -> _LoadTestResult:
    """Send the requests (see the module docstring); `progress(done, total)` is called about 10 times a
    second from the calling thread."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"URL: {url!r} must be an http:// or https:// URL")
    started = time.monotonic()
    run = _Run(requests, started + max_seconds)
    headers = {header: key, "User-Agent": "ratelimit_loadtest", "Connection": "keep-alive"}
    threads = [threading.Thread(target=_send_while_allowed, args=(run, parts, method, headers, timeout),
                                name=f"loadtest-{n}", daemon=True) for n in range(concurrency)]
    for thread in threads:
        thread.start()
    while True:
        alive = [thread for thread in threads if thread.is_alive()]
        if not alive:
            break
        if progress is not None:
            progress(run.done, requests)
        alive[0].join(0.1)
    if progress is not None:
        progress(run.done, requests)
    elapsed = time.monotonic() - started
    allowed = sum(n for status, n in run.statuses.items() if status.isdigit() and 200 <= int(status) < 300)
    blocked = run.statuses.get("429", 0)
    return _LoadTestResult(
        sent=run.done, requested=requests, seconds=elapsed, allowed=allowed, blocked=blocked,
        errors=run.done - allowed - blocked,
        statuses=tuple(sorted(run.statuses.items(), key=lambda item: (not item[0].isdigit(), item[0]))),
        latencies_ms=tuple(run.latencies), stopped_by_time=run.stopped_by_time,
    )


def _send_while_allowed(run: _Run, parts: SplitResult, method: str, headers: dict[str, str], timeout: float) -> None:
    """One worker: send requests over one keep-alive connection while `run` has requests left."""
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    connection: http.client.HTTPConnection | None = None
    while run.take():
        if connection is None:
            connection = connection_class(parts.hostname or "", parts.port, timeout=timeout)
        sent_at = time.perf_counter()
        try:
            connection.request(method, target, headers=headers)
            response = connection.getresponse()
            response.read()
        except (OSError, http.client.HTTPException) as exc:
            run.record(type(exc).__name__, None)
            connection.close()
            connection = None  # reconnect for the next request
            continue
        run.record(str(response.status), (time.perf_counter() - sent_at) * 1000)
        if response.will_close:
            connection.close()
            connection = None
    if connection is not None:
        connection.close()


class Command(BaseCommand):
    help = "Load-test a rate-limited URL with an API key: allowed / blocked / errors, status codes, latency."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("url", help="The URL to request, for example https://api.example.com/api/users.")
        parser.add_argument("--key", required=True, help="The API key to send.")
        parser.add_argument("--requests", type=int, default=100, help=f"Requests to send (1-{_MAX_REQUESTS:,}).")
        parser.add_argument("--concurrency", type=int, default=10,
                            help=f"Parallel connections (1-{_MAX_CONCURRENCY}).")
        parser.add_argument("--max-seconds", type=float, default=60.0,
                            help=f"Start no request after this many seconds (at most {_MAX_SECONDS:g}).")
        parser.add_argument("--timeout", type=float, default=10.0, help="Seconds to wait for one answer.")
        parser.add_argument("--method", default="GET", choices=["GET", "POST", "HEAD"], help="HTTP method.")
        parser.add_argument("--header", default=None,
                            help="Header that carries the key (default: RATELIMIT['API_KEY_HEADER']).")
        parser.add_argument("--no-progress", action="store_true", help="Do not draw the progress bar.")

    def handle(self, *args: Any, **options: Any) -> None:
        requests, concurrency = options["requests"], options["concurrency"]
        max_seconds, timeout = options["max_seconds"], options["timeout"]
        if not 1 <= requests <= _MAX_REQUESTS:
            raise CommandError(f"--requests: {requests} must be from 1 to {_MAX_REQUESTS:,}")
        if not 1 <= concurrency <= _MAX_CONCURRENCY:
            raise CommandError(f"--concurrency: {concurrency} must be from 1 to {_MAX_CONCURRENCY}")
        if not 0 < max_seconds <= _MAX_SECONDS:
            raise CommandError(f"--max-seconds: {max_seconds:g} must be more than 0 and at most {_MAX_SECONDS:g}")
        if not 0 < timeout <= 300:
            raise CommandError(f"--timeout: {timeout:g} must be more than 0 and at most 300")
        key = options["key"]
        if not key or any(ch in key for ch in "\r\n"):
            raise CommandError("--key: expected an API key on one line")
        header = options["header"] or ratelimit_settings.API_KEY_HEADER
        concurrency = min(concurrency, requests)
        self.stdout.write(f"{options['method']} {options['url']} x {requests:,} with key {mask_key(key)} "
                          f"({header}), {concurrency} connection(s), at most {max_seconds:g} s")
        try:
            result = _run_load_test(
                options["url"], key=key, header=header, requests=requests, concurrency=concurrency,
                max_seconds=max_seconds, timeout=timeout, method=options["method"],
                progress=None if options["no_progress"] else self._draw_progress,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if not options["no_progress"]:
            self.stderr.write("")
        self._report(result)

    def _draw_progress(self, done: int, total: int) -> None:
        filled = int(_BAR_WIDTH * done / total) if total else _BAR_WIDTH
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        self.stderr.write(f"\r[{bar}] {done:,}/{total:,} ({done * 100 // max(total, 1)}%)", ending="")
        self.stderr.flush()

    def _report(self, result: _LoadTestResult) -> None:
        out = self.stdout
        rate = result.sent / result.seconds if result.seconds > 0 else 0.0
        out.write(f"Sent {result.sent:,} of {result.requested:,} requests in {result.seconds:.2f} s "
                  f"({rate:,.1f} requests/s)")
        if result.stopped_by_time:
            out.write(self.style.WARNING("Stopped by --max-seconds before every request was sent."))
        out.write(f"  allowed (2xx):  {result.allowed:,}")
        out.write(f"  blocked (429):  {result.blocked:,}")
        out.write(f"  errors:         {result.errors:,}  (other statuses, timeouts, refused connections)")
        out.write("Status codes: " + (", ".join(f"{status}: {count:,}" for status, count in result.statuses) or "none"))
        if result.latencies_ms:
            out.write("Latency (ms): " + "  ".join(
                f"{name} {result.percentile(fraction):.1f}"
                for name, fraction in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))
            ))
        statuses = dict(result.statuses)
        if "401" in statuses:
            out.write(self.style.WARNING("401: the server refused the key (unknown, revoked or expired?)."))
        if "503" in statuses:
            out.write(self.style.WARNING("503: the limiter was unavailable and its fail mode refused requests."))
