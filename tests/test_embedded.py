"""The embedded Redis that the demo and the suite start on machines without one (or with
REDIS_URL=embedded), stopped with its directory removed however the demo is stopped."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from devtools.embedded import EMBEDDED, answers, free_port, resolve_redis_url, start_redis
from tests.support.gunicorn_server import ROOT, http_get


def test_start_redis_serves_and_stops() -> None:
    server = start_redis()
    try:
        assert redis.Redis.from_url(server.url).ping()
    finally:
        server.stop()
    assert server.process.poll() is not None
    assert not answers("127.0.0.1", server.port)


def test_resolve_prefers_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://10.9.8.7:6390/3")
    assert resolve_redis_url() == "redis://10.9.8.7:6390/3"


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_the_demo_stops_its_redis_and_removes_its_directory_on_a_signal(tmp_path: Path, signum: int) -> None:
    """`manage.py rundemo` (what ./scripts/demo runs) with a Redis of its own, stopped by a process manager
    or `timeout` (SIGTERM), a closed terminal (SIGHUP) or Ctrl-C (SIGINT): the same clean exit."""
    port = free_port()
    output = tmp_path / "demo.out"
    env = {**os.environ, "REDIS_URL": EMBEDDED, "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
           "DJANGO_SETTINGS_MODULE": "project.settings", "PYTHONUNBUFFERED": "1"}
    with output.open("wb") as out:
        demo = subprocess.Popen([sys.executable, "manage.py", "rundemo", f"127.0.0.1:{port}"], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, preexec_fn=default_signal_actions)
    try:
        wait_for(lambda: http_get(port, "/health") == 200, timeout=120, what="the demo to serve")
        redis_url = re.search(r"^Redis: (\S+) \(a private redis-server", output.read_text(), re.MULTILINE)
        assert redis_url is not None, output.read_text()
        client = redis.Redis.from_url(redis_url.group(1))
        redis_pid, directory = int(client.info("server")["process_id"]), str(client.config_get("dir")["dir"])
        client.close()
        assert Path(directory).is_dir() and Path(directory).name.startswith("ratelimit-redis-")
        demo.send_signal(signum)
        demo.wait(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    outlived, left = pid_exists(redis_pid), Path(directory).exists()
    if outlived:  # (what the demo should have done, so that a failure leaves nothing behind either)
        os.kill(redis_pid, signal.SIGTERM)
    shutil.rmtree(directory, ignore_errors=True)
    assert not outlived, "the demo's redis-server outlived it"
    assert not left, "the demo's Redis directory was left behind"


def default_signal_actions() -> None:
    """In the demo's process, before it starts: the signals under test take their default action, as in a
    terminal. A suite started in the background (`cmd &` ignores SIGINT, `nohup` SIGHUP) would otherwise
    hand its ignored signals down, and the demo, rightly, would not stop on them."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)


def pid_exists(pid: int) -> bool:
    """True while a process `pid` exists (a zombie counts: it has not been waited for)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
