"""The demo site in a child process (gunicorn, uvicorn), for tests that need a real server."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def http_get(port: int, path: str) -> int:
    """GET http://127.0.0.1:<port><path>; the status code."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def start_gunicorn(port: int, env: dict[str, str], *options: str) -> subprocess.Popen[bytes]:
    """Start `gunicorn project.wsgi:application` on 127.0.0.1:<port> with `env` (its settings module) and
    `options`; return once GET /health answers 200. Stop it with terminate() and communicate()."""
    command = [str(Path(sys.executable).parent / "gunicorn"), "project.wsgi:application",
               "--bind", f"127.0.0.1:{port}", *options]
    return start_server(command, port, env)


def start_server(command: list[str], port: int, env: dict[str, str], *, wait: float = 30) -> subprocess.Popen[bytes]:
    """Start `command`, a server of the demo site on 127.0.0.1:<port>, with `env`; return once GET
    /health answers 200 (AssertionError with its stderr when it has not within `wait` seconds)."""
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + wait
    while True:
        try:
            if http_get(port, "/health") == 200:
                return server
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            _, stderr = server.communicate(timeout=30)
            raise AssertionError(f"{Path(command[0]).name} did not start: {stderr.decode()[-2000:]}")
        time.sleep(0.1)


def stop_server(server: subprocess.Popen[bytes]) -> None:
    """Stop a server started by `start_server` (SIGTERM, then SIGKILL after 30 seconds)."""
    server.terminate()
    try:
        server.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.communicate()


def prepare_database(env: dict[str, str], setup: str) -> Any:
    """Migrate the database of `env` and run `setup` in `manage.py shell`; the JSON its last line prints."""
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    made = subprocess.run([*manage, "shell", "-c", setup], cwd=ROOT, env=env, check=True, capture_output=True)
    return json.loads(made.stdout.decode().strip().splitlines()[-1])
