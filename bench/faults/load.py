"""Steady load of known keys, spread over the app servers, recorded request by request.

Each of `len(keys) x len(servers)` threads sends GET /api/faults/hit for one key to one server at a
fixed pace (a thread that falls behind does not catch up in a burst), on a keep-alive connection, and
records when it sent, when the answer came, its status, and whether a 503 was the limiter's own (its
JSON body) or something else. A request without an answer (a killed worker) is status 0.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from typing import NamedTuple

#: Requests per second each thread sends (one key, one server).
PACE = 7.5
TIMEOUT = 10.0


class Sent(NamedTuple):
    key: int
    server: str
    sent: float
    done: float
    status: int
    ours: bool  # a 429 or 503 in the limiter's JSON shape (the fail mode's or a limit's refusal)


@dataclass
class Load:
    keys: list[str]
    servers: list[tuple[str, int]]
    path: str = "/api/faults/hit"
    records: list[Sent] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for index, key in enumerate(self.keys):
            for server in self.servers:
                thread = threading.Thread(target=self._run, args=(index, key, server), daemon=True)
                self._threads.append(thread)
                thread.start()

    def stop(self) -> list[Sent]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=TIMEOUT + 5)
        with self._lock:
            return sorted(self.records, key=lambda record: record.sent)

    def _run(self, index: int, key: str, server: tuple[str, int]) -> None:
        kind, port = server
        connection: http.client.HTTPConnection | None = None
        interval = 1 / PACE
        upcoming = time.monotonic() + (index * len(self.servers) + self.servers.index(server)) * interval / 6
        while not self._stop.is_set():
            pause = upcoming - time.monotonic()
            if pause > 0 and self._stop.wait(pause):
                break
            upcoming = max(upcoming + interval, time.monotonic())
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
            sent = time.time()
            status, ours = self._get(connection, key)
            if status == 0:
                connection.close()
                connection = None
            with self._lock:
                self.records.append(Sent(index, kind, sent, time.time(), status, ours))
        if connection is not None:
            connection.close()

    def _get(self, connection: http.client.HTTPConnection, key: str) -> tuple[int, bool]:
        try:
            connection.request("GET", self.path, headers={"X-API-Key": key})
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            return 0, False
        ours = False
        if response.status in (429, 503):
            try:
                ours = "retry_after" in json.loads(body)
            except ValueError:
                ours = False
        return response.status, ours


def hold_slots(port: int, key: str, count: int, ms: int) -> list[threading.Thread]:
    """`count` requests of `key` that each hold a concurrency slot `ms` milliseconds (answers ignored)."""

    def one() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=ms / 1000 + TIMEOUT)
        try:
            connection.request("GET", f"/api/faults/hit?ms={ms}", headers={"X-API-Key": key})
            connection.getresponse().read()
        except (OSError, http.client.HTTPException):
            pass
        finally:
            connection.close()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads
