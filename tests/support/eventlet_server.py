"""Serve the demo site with eventlet's own WSGI server, every request in a green thread:
`python -m tests.support.eventlet_server PORT` (tests/test_gevent_live.py). Gunicorn removed its eventlet
worker in version 26, so this is how an eventlet deployment serves Django today.

The limiter here talks to the real Redis server the test names (through the test's counting TCP proxy),
exactly as under gunicorn's gevent worker; `eventlet.monkey_patch()` only makes the standard library's
sockets and threads green, as every eventlet deployment does."""

from __future__ import annotations

import eventlet

# Before Django, redis-py or anything else imports socket or threading. Nothing of Redis is replaced:
# redis-py's own protocol goes over eventlet's green sockets to the real server.
eventlet.monkey_patch()

import sys  # noqa: E402

import eventlet.wsgi  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402


def main() -> None:
    port = int(sys.argv[1])
    application = get_wsgi_application()
    listener = eventlet.listen(("127.0.0.1", port), backlog=1024)
    eventlet.wsgi.server(listener, application, max_size=1000, log_output=False)


if __name__ == "__main__":
    main()
