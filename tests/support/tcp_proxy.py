"""A loopback TCP proxy for failure injection a real Redis cannot produce on demand.

Modes: "forward" (normal), "drop_replies" (requests reach Redis, replies are thrown away: a reply lost
after the command was sent) and "black_hole" (accepts connections and bytes, forwards nothing).
`connections` counts accepted client connections, `peak` the most that were open at once, and
`from_clients` keeps every byte clients sent, in every mode, so a test can tell whether (and how often)
a client tried to talk to Redis.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class TcpProxy:
    #: Keep every byte clients send in `from_clients` (a long-running user turns it off).
    keep_sent = True

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode = "forward"
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = int(self._listener.getsockname()[1])
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.connections = 0
        self.open = 0  # client connections open now
        self.peak = 0  # the most client connections open at once
        self.from_clients = bytearray()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._track(client)
            with self._lock:
                self.connections += 1
                self.open += 1
                self.peak = max(self.peak, self.open)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            while not self._closed.is_set():
                if upstream is None and self.mode != "black_hole":
                    upstream = socket.create_connection(self.upstream, timeout=5)
                    self._track(upstream)
                sockets = [client] if upstream is None else [client, upstream]
                readable, _, _ = select.select(sockets, [], [], 0.05)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client and self.keep_sent:
                        with self._lock:
                            self.from_clients += data
                    if sock is client and upstream is not None and self.mode != "black_hole":
                        upstream.sendall(data)
                    elif sock is upstream and not self._reply(client, upstream, data):
                        return
        except OSError:
            return
        finally:
            with self._lock:
                self.open -= 1
            client.close()
            if upstream is not None:
                upstream.close()

    def _reply(self, client: socket.socket, upstream: socket.socket, data: bytes) -> bool:
        """Pass a reply of Redis on to the client as the mode says; False to end the connection
        (bench/faults/proxy.py adds modes here)."""
        if self.mode == "forward":
            client.sendall(data)
        return True

    def commands_seen(self, name: str) -> int:
        """How many times clients sent the command `name` (counted in the RESP bytes, any mode)."""
        encoded = name.upper().encode()
        with self._lock:
            return bytes(self.from_clients).count(b"$%d\r\n%s\r\n" % (len(encoded), encoded))

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass


@contextmanager
def tcp_proxy(host: str, port: int) -> Iterator[TcpProxy]:
    proxy = TcpProxy(host, port)
    try:
        yield proxy
    finally:
        proxy.close()
