"""Demo settings for the Django app behind the live gateways (tests/gateway/test_live.py): the test's key
prefix (Redis keys and the shared lookup cache), the gateway as the one trusted proxy (it adds the
client's address to X-Forwarded-For), a per-IP limit the tests never reach, and generous Redis
timeouts for a loaded CI box. The endpoint's guards: the secret the documented configurations send (their
placeholder) and the demo's GATEWAY_NETWORKS (this machine); a fleet capacity no test reaches, so every
request also holds a fleet slot, which an abort must not strand either."""

from __future__ import annotations

import os

from project import settings as demo
from tests.support.gateways import DOC_SECRET, FIRST_LEASE

globals().update({name: value for name, value in vars(demo).items() if name.isupper()})

PREFIX = os.environ["RATELIMIT_TEST_PREFIX"]
CACHES = {"default": {**demo.CACHES["default"], "KEY_PREFIX": PREFIX}}
RATELIMIT: dict[str, object] = {
    **demo.RATELIMIT,
    "KEY_PREFIX": PREFIX,
    "TRUSTED_PROXIES": 1,
    "IP_RATE": "100000/m",  # every test's client is 127.0.0.1: the per-IP limit stays out of the way
    "BUDGET_MS": 5000,
    "SOCKET_CONNECT_TIMEOUT": 2.0,
    "SOCKET_TIMEOUT": 5.0,
    "GATEWAY_SECRET": DOC_SECRET,
    "SHED_CAPACITY": 100000,
    "GATEWAY_FIRST_LEASE": FIRST_LEASE,
}
