"""Counting instructions with callgrind, for the scripts that need a measure machine load cannot skew
(bench/script_instructions.py, bench/script_floor.py: Redis' side; bench/request_instructions.py: the app's)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

from devtools.embedded import free_port


def require(*tools: str) -> None:
    """Exit with a message naming the first of `tools` (valgrind, callgrind_annotate...) not on PATH."""
    for tool in tools:
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not on PATH")


def annotate(out: Path, *, inclusive: bool = False) -> str:
    """callgrind_annotate's summary of the output file `out`."""
    return subprocess.run(["callgrind_annotate", *(["--inclusive=yes"] if inclusive else []), str(out)],
                          capture_output=True, text=True, check=True).stdout


def program_total(summary: str) -> int:
    """The instructions of the whole program in a callgrind_annotate summary."""
    total = re.search(r"([\d,]+)\s+(?:\(100\.0%\)\s+)?PROGRAM TOTALS", summary)
    if not total:
        raise SystemExit("callgrind_annotate printed no total")
    return int(total.group(1).replace(",", ""))


def inside(summary: str, function: str) -> int:
    """The instructions inside `function`, its callees included (an --inclusive=yes summary)."""
    found = re.search(rf"^\s*([\d,]+)\s+\([\d.]+%\)\s+\S*:{function}\b", summary, re.MULTILINE)
    if not found:
        raise SystemExit(f"callgrind_annotate printed no {function}")
    return int(found.group(1).replace(",", ""))


def redis_under_callgrind(work: Path, run: Callable[[redis.Redis], None]) -> str:
    """Start redis-server under `valgrind --tool=callgrind` on a free port, call `run` with a client of it,
    shut it down and return the inclusive summary of its whole run."""
    port = free_port()
    out = work / f"callgrind.{port}.out"
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "redis-server", "--port", str(port),
         "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         # the slow log copies a command that ran over 10 ms: under valgrind, on a busy machine, that
         # depends on the load, and its work would be counted inside the script's calls
         "--slowlog-log-slower-than", "-1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, socket_timeout=600)
        deadline = time.monotonic() + 300  # valgrind starts slowly on a busy machine
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        run(client)
        client.shutdown(nosave=True)
    except redis.ConnectionError:
        pass  # SHUTDOWN closes the connection
    finally:
        server.wait(timeout=300)
    return annotate(out, inclusive=True)
