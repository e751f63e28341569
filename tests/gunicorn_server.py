"""The demo site under gunicorn in a child process, for tests that need a real second app server."""

from __future__ import annotations

import http.client
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while True:
        try:
            if http_get(port, "/health") == 200:
                return server
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            _, stderr = server.communicate(timeout=30)
            raise AssertionError(f"gunicorn did not start: {stderr.decode()[-2000:]}")
        time.sleep(0.1)
