"""The protected service of the live gateway tests: a plain HTTP server (not Django) on a thread of the
test, which counts every request it receives, so a test can tell that a refused request never reached it.

With `release_url` (and the gateways' `secret`), it does what docs/gateway.md ("Concurrency slots") has a
service behind a gateway with no end-of-request hook of its own (Caddy) do with each request that carries
an `X-RateLimit-Lease` (the concurrency slots the gateway endpoint took for it): it confirms the request to
the endpoint's confirm URL (next to the release URL) when it arrives, refuses it (503, Retry-After: 1)
when the endpoint answers that its first lease had already ended, and reports its end to the release URL
before it answers.
`GET /slow?ms=N` answers after N milliseconds. `in_flight[key]` counts the requests of each API key
(X-API-Key, which gateways pass on) the service is working on, `most_in_flight[key]` the most at once: a
request counts from when it is confirmed (or arrives, when there is nothing to confirm) until its work is
done, before its end is reported.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

LEASE_HEADER = "X-RateLimit-Lease"


class CountingService:
    """The service on 127.0.0.1:<port>: `received[path]` counts the requests that reached it, `headers`
    are theirs; `confirmed` counts the leases confirmed (204), `late` those whose first lease had ended
    (409: the request was refused); `released` counts the leases it reported (answered 204),
    `release_failures` holds the status of any other answer of either endpoint."""

    def __init__(self, release_url: str | None = None, secret: str = "") -> None:
        self.received: Counter[str] = Counter()
        self.released = self.confirmed = self.late = 0
        self.release_failures: list[int] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight: Counter[str] = Counter()
        self.most_in_flight: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._release = urlsplit(release_url) if release_url else None
        self._secret = secret  # sent in X-RateLimit-Gateway-Secret: the release endpoint answers gateways only
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                key = self.headers.get("X-API-Key", "")
                service._received(self, key)
                if not service._confirm(self.headers.get(LEASE_HEADER, "")):
                    self._refuse()
                    return
                service._working(key)
                parts = urlsplit(self.path)
                delay = parse_qs(parts.query).get("ms")
                if parts.path == "/slow" and delay:
                    time.sleep(int(delay[0]) / 1000)
                with service._lock:
                    service.in_flight[key] -= 1
                service._report_end(self.headers.get(LEASE_HEADER, ""))
                body = b"served\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _refuse(self) -> None:
                body = b'{"error": "try again"}\n'
                self.send_response(503)
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _received(self, handler: BaseHTTPRequestHandler, key: str) -> None:
        with self._lock:
            self.received[urlsplit(handler.path).path] += 1
            self.headers.append(dict(handler.headers.items()))

    def _working(self, key: str) -> None:
        with self._lock:
            self.in_flight[key] += 1
            self.most_in_flight[key] = max(self.most_in_flight[key], self.in_flight[key])

    def _confirm(self, lease: str) -> bool:
        """False when the request must be refused: its first lease ended before it got here."""
        if self._release is None or not lease:
            return True
        status = self._post(self._release.path.replace("/release", "/confirm"), lease)
        with self._lock:
            if status == 204:
                self.confirmed += 1
            elif status == 409:
                self.late += 1
            else:
                self.release_failures.append(status)
        return status != 409

    def _report_end(self, lease: str) -> None:
        if self._release is None or not lease:
            return
        status = self._post(self._release.path, lease)
        with self._lock:
            if status == 204:
                self.released += 1
            else:
                self.release_failures.append(status)

    def _post(self, path: str, lease: str) -> int:
        assert self._release is not None
        connection = http.client.HTTPConnection(self._release.hostname or "", self._release.port, timeout=10)
        try:
            connection.request("POST", path, headers={LEASE_HEADER: lease, "X-RateLimit-Gateway-Secret": self._secret})
            return connection.getresponse().status
        finally:
            connection.close()

    def total(self) -> int:
        """Every request that reached the service."""
        with self._lock:
            return sum(self.received.values())

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
