"""The limits of the harness's tiers, the timing of a row and the ledger's key, shared by the app and the
harness (no Django here)."""

from __future__ import annotations

#: Each row's keys get LIMIT requests per fixed WINDOW seconds, and SLOTS at once with a LEASE-second lease.
WINDOW = 2
LIMIT = 10
SLOTS = 4
LEASE = 5
#: The hash in the ledger Redis where the protected view counts what it served.
LEDGER_KEY = "ledger"
#: Seconds of steady load before each fault, and the most a row waits after the heal for an exact window.
BASELINE = 2.0
MAX_RECOVERY = 25.0
