"""The demo site as the harness runs it: gunicorn (2 workers) and uvicorn side by side, against one store.

`prepare_database` makes the harness's SQLite database once: one tier per row of a session (`row<N>`,
the limits of bench.faults.tiers) and KEYS_PER_ROW API keys in each. `AppServers` starts both servers
with bench.faults.settings, their output in a log file of the run, and stops them with SIGTERM (their
metrics flushed on the way out).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.embedded import free_port
from tests.support.gunicorn_server import ROOT, http_get, prepare_database

from .tiers import LEASE, LIMIT, SLOTS, WINDOW

BIN = Path(sys.executable).parent
#: Each row's keys: the first LOADED carry the steady load; the last one only the requests that hold slots.
KEYS_PER_ROW = 4
LOADED = 3
#: gunicorn's two workers and uvicorn's one process: what the local fail mode divides each limit by.
APP_PROCESSES = 3

SETUP = f"""
import json
from ratelimit_app.models import ApiKey, Tier, TierLimit
keys = {{}}
for row in range({{rows}}):
    tier = Tier.objects.create(slug=f"row{{row}}", name=f"Fault row {{row}}")
    TierLimit.objects.create(tier=tier, name="window", algorithm="fixed_window", limit={LIMIT}, period={WINDOW})
    TierLimit.objects.create(tier=tier, name="slots", algorithm="concurrency", limit={SLOTS}, period={LEASE})
    keys[row] = [ApiKey.objects.create_key(name=f"row{{row}}-{{n}}", tier=tier)[1] for n in range({KEYS_PER_ROW})]
print(json.dumps(keys))
"""


def environment(work: Path, store_url: str, ledger_url: str, prefix: str, mode: str) -> dict[str, str]:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.faults.settings", "REDIS_URL": store_url,
            "FAULTS_DB": str(work / "faults.sqlite3"), "FAULTS_LEDGER_URL": ledger_url, "FAULTS_PREFIX": prefix,
            "FAULTS_FAIL_MODE": mode, "FAULTS_APP_SERVERS": str(APP_PROCESSES), "RATELIMIT_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1"}


def make_keys(work: Path, ledger_url: str, rows: int) -> dict[int, list[str]]:
    """Migrate the harness's database and make each row's tier and keys; the keys by row."""
    env = environment(work, ledger_url, ledger_url, "faults-setup", "open")
    made = prepare_database(env, SETUP.replace("{rows}", str(rows)))
    return {int(row): keys for row, keys in made.items()}


@dataclass
class AppServers:
    """gunicorn and uvicorn serving the harness's demo; `urls` in the order the load alternates them."""

    env: dict[str, str]
    log: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    def start(self) -> None:
        self.ports = {"gunicorn": free_port(), "uvicorn": free_port()}
        commands = {
            "gunicorn": [str(BIN / "gunicorn"), "project.wsgi:application", "--workers", "2", "--worker-class",
                         "gthread", "--threads", "8", "--bind", f"127.0.0.1:{self.ports['gunicorn']}",
                         "--timeout", "60", "--graceful-timeout", "20"],
            "uvicorn": [str(BIN / "uvicorn"), "project.asgi:application", "--port", str(self.ports["uvicorn"]),
                        "--log-level", "warning", "--timeout-graceful-shutdown", "20"],
        }
        with self.log.open("ab") as out:
            for kind, command in commands.items():
                self.processes[kind] = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=out, stderr=out)
        for kind, port in self.ports.items():
            self._wait(kind, port)

    def _wait(self, kind: str, port: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if http_get(port, "/health") == 200:
                    return
            except OSError:
                pass
            if self.processes[kind].poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{kind} did not start (see {self.log})")
            time.sleep(0.1)

    @property
    def urls(self) -> list[tuple[str, int]]:
        return [(kind, port) for kind, port in self.ports.items()]

    def gunicorn_workers(self) -> list[int]:
        found = subprocess.run(["pgrep", "-P", str(self.processes["gunicorn"].pid)], capture_output=True, text=True)
        return [int(pid) for pid in found.stdout.split()]

    def kill_gunicorn_workers(self) -> list[int]:
        """SIGKILL every gunicorn worker (its master starts new ones); the pids killed."""
        pids = self.gunicorn_workers()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return pids

    def stop(self) -> None:
        """SIGTERM both servers and wait: their workers flush their metrics on the way out."""
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
