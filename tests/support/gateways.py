"""Real gateways for the live tests and the gateway benchmark: nginx and Caddy processes of their own (never
the system services), on free ports, their configuration files, pid and logs in a temporary directory.

`doc_block(language)` is the first fenced block of that language in docs/gateway.md, and `with_ports`
changes its ports and nothing else, so the tests run the configuration the documentation shows.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_DOC = ROOT / "docs" / "gateway.md"
#: The addresses the documented configurations use: the Django app, the service, the gateway's port.
DOC_DJANGO, DOC_SERVICE, DOC_PORT = "127.0.0.1:8000", "127.0.0.1:9000", 8080
#: The placeholder the documented configurations send as RATELIMIT['GATEWAY_SECRET'] (the reader replaces
#: it; the live tests' Django app is given it, so the blocks run as written).
DOC_SECRET = "replace-with-your-RATELIMIT-GATEWAY_SECRET"
#: RATELIMIT["GATEWAY_FIRST_LEASE"] of the live tests' Django app: seconds a request's slots are held until the
#: service confirms it (short, so that the abort test waits a bounded time)
FIRST_LEASE = 2


def missing_gateways() -> str | None:
    """Why the gateways cannot run here (nginx or caddy not installed), or None."""
    absent = [name for name in ("nginx", "caddy") if shutil.which(name) is None]
    if absent:
        return f"{' and '.join(absent)} not installed (`apt-get install -y nginx caddy`)"
    return None


def doc_block(language: str) -> str:
    """The first ```<language> block of docs/gateway.md."""
    match = re.search(rf"^```{language}\n(.*?)^```$", GATEWAY_DOC.read_text(), re.MULTILINE | re.DOTALL)
    assert match, f"docs/gateway.md has no ```{language} block"
    return match.group(1)


def with_ports(block: str, *, django: int, service: int, listen: int, listen_pattern: str) -> str:
    """`block` with the Django app, the service and the listening port moved to these ports; nothing else
    changes. `listen_pattern` is how the block writes its port (a format string of DOC_PORT)."""
    old_listen = listen_pattern.format(DOC_PORT)
    assert block.count(old_listen) == 1, f"the block does not listen with {old_listen!r}"
    assert DOC_DJANGO in block and DOC_SERVICE in block and DOC_SECRET in block
    return (block.replace(DOC_DJANGO, f"127.0.0.1:{django}").replace(DOC_SERVICE, f"127.0.0.1:{service}")
            .replace(old_listen, listen_pattern.format(listen)))


@dataclass
class Gateway:
    """A running gateway: its kind, URL, process and directory."""

    kind: str
    url: str
    process: subprocess.Popen[bytes]
    directory: Path

    def log(self) -> str:
        path = self.directory / ("error.log" if self.kind == "nginx" else "caddy.log")
        return path.read_text()[-3000:] if path.exists() else ""

    def stop(self) -> None:
        """Stop it (nginx: graceful SIGQUIT; caddy: SIGTERM), SIGKILL after 20 seconds."""
        self.process.send_signal(signal.SIGQUIT if self.kind == "nginx" else signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_nginx(server_block: str, directory: Path, port: int, *, workers: int = 1) -> Gateway:
    """nginx in the foreground (daemon off) with `server_block` as its only server, prefix `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    temp = " ".join(f"{name}_temp_path {directory / name};" for name in ("client_body", "proxy", "fastcgi",
                                                                         "uwsgi", "scgi"))
    (directory / "server.conf").write_text(server_block)
    (directory / "nginx.conf").write_text(
        f"daemon off;\nworker_processes {workers};\npid {directory / 'nginx.pid'};\n"
        f"error_log {directory / 'error.log'} warn;\nevents {{ worker_connections 1024; }}\n"
        f"http {{\n    access_log off;\n    {temp}\n    include {directory / 'server.conf'};\n}}\n")
    command = ["nginx", "-p", str(directory), "-e", str(directory / "error.log"), "-c", str(directory / "nginx.conf")]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return _started(Gateway("nginx", f"http://127.0.0.1:{port}", process, directory), port)


def start_caddy(caddyfile: str, directory: Path, port: int) -> Gateway:
    """`caddy run` with `caddyfile` after global options of the test's own: no admin endpoint (whose fixed
    port other runs may hold), no automatic HTTPS, its data and configuration under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "Caddyfile").write_text("{\n\tadmin off\n\tauto_https off\n}\n\n" + caddyfile)
    env = {**os.environ, "XDG_DATA_HOME": str(directory / "data"), "XDG_CONFIG_HOME": str(directory / "config"),
           "HOME": str(directory)}
    command = ["caddy", "run", "--config", str(directory / "Caddyfile"), "--adapter", "caddyfile"]
    with open(directory / "caddy.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    return _started(Gateway("caddy", f"http://127.0.0.1:{port}", process, directory), port)


def _started(gateway: Gateway, port: int, wait: float = 20) -> Gateway:
    """`gateway` once its port accepts connections (AssertionError with its log when it has not)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return gateway
        except OSError:
            pass
        if gateway.process.poll() is not None or time.monotonic() > deadline:
            gateway.process.kill()
            _, stderr = gateway.process.communicate(timeout=10)
            raise AssertionError(f"{gateway.kind} did not start: {(stderr or b'').decode()[-2000:]}{gateway.log()}")
        time.sleep(0.05)
