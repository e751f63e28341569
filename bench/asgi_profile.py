"""Where an ASGI request's time goes: py-spy samples of uvicorn serving each ASGI variant, by part.

Each variant gets a fresh uvicorn (http_bench.Server) under the load of section 6; py-spy records
the stack of whichever thread holds the GIL (`--gil`), so every sample is Python running in the
server (on the event loop or in one of Django's threads). A sample belongs to the part named by its
innermost frame that names one (PARTS); samples over the requests served in the same window give
the Python time of each part per request. py-spy comes with bench/requirements.txt; without it the
profile is not taken and the report says why.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import http_bench

#: Samples per second py-spy takes.
RATE = 200

#: (part, frame markers): a frame that contains one of the markers names the part. Checked from the
#: innermost frame outwards, the parts in this order for each frame.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ours: the Redis call (engine, redis-py)", ("ratelimit_app/core/engine", "ratelimit_app/core/wire")),
    ("ours: who the client is and its plan (key, tier, policies)",
     ("ratelimit_app/apply/planning", "ratelimit_app/apply/identity.py", "ratelimit_app/plans/",
      "ratelimit_app/core/apikeys", "ratelimit_app/core/clientrules")),
    ("ours: the rest (middleware, decision, headers, metrics)", ("ratelimit_app/",)),
    ("the floor's EVALSHA (redis.asyncio client)", ("aping_evalsha (",)),
    ("uvicorn (HTTP protocol)", ("uvicorn/protocols/", "uvicorn/middleware/")),
    ("thread hand-offs (asgiref sync_to_async / async_to_sync, thread start and join)",
     ("asgiref/sync.py", "threading.py", "concurrent/futures/")),
    ("Django (handler, signals, URL resolving, view, response)", ("django/", "bench/httpapp/")),
)
#: The part of a sample no frame names: the event loop and what runs it.
LOOP = "the event loop and the rest"


def part_of(frames: list[str]) -> str:
    """The part a sample's stack (outermost frame first) belongs to."""
    for frame in reversed(frames):
        for part, markers in PARTS:
            if any(marker in frame for marker in markers):
                return part
    return LOOP


@dataclass(frozen=True)
class AsgiProfile:
    """Python time per request (seconds, GIL held) of each ASGI variant by part, from py-spy, with the
    uvicorn process' CPU per request over the same load; `note` says why it was not taken."""

    seconds: float
    rate: int
    per_request: dict[str, dict[str, float]]  # variant -> part -> seconds per request
    cpu: dict[str, float]  # variant -> uvicorn CPU seconds per request
    note: str = ""


def py_spy() -> str | None:
    """The py-spy executable: on PATH, or beside this interpreter (a virtual environment's bin/)."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def _samples(raw: Path) -> Counter[str]:
    parts: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            parts[part_of(stack.split(";"))] += int(count)
    return parts


def _load_into(results: list[http_bench.HttpResult], generate: Callable[..., http_bench.HttpResult],
               *args: object) -> None:
    results.append(generate(*args))


def profile_variants(redis_url: str, work_dir: Path, variants: list[str], seconds: float, connections: int,
                     progress: Callable[[str], None]) -> AsgiProfile:
    """Profile each of `variants` under uvicorn for `seconds` of load from `connections` connections."""
    executable = py_spy()
    if executable is None:
        return AsgiProfile(seconds, RATE, {}, {}, "py-spy is not installed (it comes with bench/requirements.txt)")
    db_path = work_dir / "bench-http.sqlite3"
    keys = http_bench.prepare_database(redis_url, db_path)
    _, generate = http_bench.load_generator()
    per_request: dict[str, dict[str, float]] = {}
    cpu: dict[str, float] = {}
    for variant in variants:
        progress(f"profile (py-spy): {variant}")
        with http_bench.Server(redis_url, db_path, variant, 1, 0, "uvicorn") as server, \
                tempfile.TemporaryDirectory(prefix="ratelimit-profile-") as scratch:
            server.wait_ready({"X-API-Key": keys[0]})
            generate(server.url, keys, connections, 1.0)  # warm up
            # the load runs 0.5 s longer on each side than py-spy, so every sample falls under load
            loaded: list[http_bench.HttpResult] = []
            load = threading.Thread(target=_load_into, args=(loaded, generate, server.url, keys, connections,
                                                             seconds + 1.0))
            load.start()
            time.sleep(0.5)
            raw = Path(scratch) / "stacks.txt"
            cpu_before = server.worker_cpu()
            spied = subprocess.run([executable, "record", "--gil", "--nonblocking", "-r", str(RATE), "-d",
                                    str(max(1, round(seconds))), "-f", "raw", "-o", str(raw), "-p",
                                    str(server.process.pid)], capture_output=True, text=True)
            cpu_spent = server.worker_cpu() - cpu_before
            load.join()
            if spied.returncode != 0 or not raw.exists():
                return AsgiProfile(seconds, RATE, {}, {}, f"py-spy failed: {(spied.stderr or spied.stdout)[-300:]}")
            requests = loaded[0].per_second * max(1, round(seconds))
            per_request[variant] = {part: count / RATE / requests for part, count in _samples(raw).items()}
            cpu[variant] = cpu_spent / requests
    return AsgiProfile(seconds, RATE, per_request, cpu)
