"""The HTTP load: wrk when it is installed, else a bounded Python client; both send GET requests over
keep-alive connections for a fixed time, each with the next of a list of API keys, and report an
`HttpResult` (requests per second, p50 / p99 latency, answers that were not 200)."""

from __future__ import annotations

import http.client
import itertools
import math
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HttpResult:
    """One variant's run: requests per second, latency percentiles (seconds) and non-200 answers."""

    variant: str
    requests: int
    per_second: float
    p50: float
    p99: float
    errors: int
    generator: str
    server_cpu: float = math.nan  # Redis CPU seconds (user + sys) per request, from INFO cpu
    app_cpu: float = math.nan  # CPU seconds of the serving processes per request (from /proc)


_WRK_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _wrk_seconds(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not match:
        raise ValueError(f"unexpected wrk latency {text!r}")
    return float(match.group(1)) * _WRK_UNITS[match.group(2)]


_WRK_KEYS = """
local keys = {%s}
local next_key = 0
request = function()
  next_key = next_key %% #keys + 1
  return wrk.format("GET", nil, {["X-API-Key"] = keys[next_key]})
end
"""


def wrk_load(url: str, keys: Sequence[str], connections: int, duration: float) -> HttpResult:
    """Run wrk (1 thread, `connections` keep-alive connections, `duration` seconds, --latency), each request
    with the next of `keys` in X-API-Key (none when `keys` is empty)."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--latency", "--timeout", "5s"]
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="ratelimit-wrk-") as script:
        if keys:
            script.write(_WRK_KEYS % ", ".join(f'"{key}"' for key in keys))
            script.flush()
            command += ["-s", script.name]
        done = subprocess.run([*command, url], capture_output=True, text=True, timeout=duration + 60, check=True)
    out = done.stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    per_second = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _wrk_seconds(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _wrk_seconds(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = int(non_2xx.group(1)) if non_2xx else 0
    if socket_errors:
        errors += sum(int(n) for n in socket_errors.groups())
    return HttpResult("", requests, per_second, p50, p99, errors, "wrk")


def python_load(url: str, keys: Sequence[str], connections: int, duration: float) -> HttpResult:
    """A bounded Python client: `connections` threads, each one keep-alive connection, for `duration` s;
    each request with the next of `keys` in X-API-Key (none when `keys` is empty)."""
    match = re.match(r"http://([^:/]+):(\d+)(/.*)", url)
    if not match:
        raise ValueError(f"unexpected url {url!r}")
    host, port, path = match.group(1), int(match.group(2)), match.group(3)
    end = time.monotonic() + duration
    latencies: list[list[float]] = [[] for _ in range(connections)]
    errors = [0] * connections

    turn = itertools.cycle([{"X-API-Key": key} for key in keys] or [{}])
    turn_lock = threading.Lock()

    def client(slot: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=5)
        while True:
            before = time.monotonic()
            if before >= end:
                break
            with turn_lock:
                headers = next(turn)
            try:
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    errors[slot] += 1
            except (OSError, http.client.HTTPException):
                errors[slot] += 1
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=5)
                continue
            latencies[slot].append(time.monotonic() - before)
        conn.close()

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(slot,)) for slot in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    ordered = sorted(value for values in latencies for value in values)
    count = len(ordered)
    p50 = ordered[count // 2] if ordered else float("nan")
    p99 = ordered[min(count - 1, int(0.99 * count))] if ordered else float("nan")
    return HttpResult("", count, count / elapsed, p50, p99, sum(errors), "python")


def load_generator() -> tuple[str, Callable[[str, Sequence[str], int, float], HttpResult]]:
    """wrk when installed (it costs the server's CPU far less than Python), else the Python client;
    BENCH_LOAD_GENERATOR=python forces the Python client."""
    if shutil.which("wrk") and os.environ.get("BENCH_LOAD_GENERATOR") != "python":
        return "wrk", wrk_load
    return "python", python_load
