"""The faults, one at a time: what each does to the store (or to an app server) and which stores have it.

`inject(ctx)` blocks while the fault lasts and returns once it has healed (with a note for the report,
or None) (the store answers again, the
failover or the resharding is done, gunicorn's workers are back); the harness keeps the load running
throughout. The numbers (how long, how much) are the ones the report names.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .load import hold_slots

BUDGET = 0.05  # RATELIMIT['BUDGET_MS'], the default the harness keeps


@dataclass(frozen=True)
class Context:
    store: Any
    apps: Any
    prefix: str
    keys: list[str]


@dataclass(frozen=True)
class Fault:
    name: str
    what: str  # the report's words
    stores: tuple[str, ...]
    inject: Callable[[Context], object]  # what it returns, when not None, the report shows beside the fault
    #: seconds the load keeps running after the heal at least (a breaker's cooldown, a lease)
    settle: float = 2.0
    #: whose memory the fault loses, so metric counts kept there are lost with it: "store" (counts
    #: flushed before), "workers" (counts not flushed yet by the SIGKILLed processes), or ""
    loses: str = ""


STANDALONE = ("redis", "valkey")


def _worker_killed(ctx: Context) -> None:
    gunicorn = dict(ctx.apps.urls)["gunicorn"]
    hold_slots(gunicorn, ctx.keys[-1], 2, ms=8000)
    time.sleep(1.0)  # both are in the view, holding their slots
    old = set(ctx.apps.kill_gunicorn_workers())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = set(ctx.apps.gunicorn_workers())
        if len(pids) == 2 and not pids & old:
            break
        time.sleep(0.1)


def _flusher_paused(ctx: Context) -> None:
    for _ in range(4):
        ctx.store.pause(0.6)
        time.sleep(0.6)


FAULTS: list[Fault] = [
    Fault("kill-restart", "store SIGKILLed, restarted empty 1 s later", STANDALONE,
          lambda ctx: ctx.store.kill_and_restart(1.0), loses="store"),
    Fault("stop-1s", "store paused (SIGSTOP) 1 s", STANDALONE, lambda ctx: ctx.store.pause(1.0)),
    Fault("stop-15s", "store paused (SIGSTOP) 15 s", STANDALONE, lambda ctx: ctx.store.pause(15.0), settle=4.0),
    Fault("latency", f"every reply 200 ms late ({0.2 / BUDGET:.0f}x the budget) for 3 s", STANDALONE,
          lambda ctx: ctx.store.network(3.0, "delay", delay=0.2)),
    Fault("loss", "packet loss: 10% of replies held 200 ms (a retransmission) for 3 s", STANDALONE,
          lambda ctx: ctx.store.network(3.0, "loss", loss=0.1)),
    Fault("resets", "connection reset mid-reply: 20% of replies cut in half, then RST, for 3 s", STANDALONE,
          lambda ctx: ctx.store.network(3.0, "reset", resets=0.2)),
    Fault("worker-killed", "both gunicorn workers SIGKILLed while 2 requests hold slots", STANDALONE,
          _worker_killed, loses="workers"),
    Fault("flusher-paused", "store paused 0.6 s four times, 0.6 s apart (metrics flushes in flight)", STANDALONE,
          _flusher_paused),
    Fault("failover", "Sentinel failover: the master SIGKILLed, the replica promoted", ("sentinel",),
          lambda ctx: ctx.store.failover(), settle=4.0),
    Fault("master-killed", "Cluster: a master holding the keys SIGKILLed, restarted empty 1 s later", ("cluster",),
          lambda ctx: ctx.store.kill_master(ctx.prefix, 1.0), settle=4.0, loses="store"),
    Fault("reshard", "Cluster resharding: every slot holding the run's keys migrated to another master",
          ("cluster",), lambda ctx: f"{ctx.store.reshard(ctx.prefix)} slots moved"),
]

#: What CI's short run injects (Redis; the closed and local fail modes): about two minutes.
SHORT = ("kill-restart", "stop-1s", "worker-killed", "flusher-paused")


def faults_for(store: str, short: bool) -> list[Fault]:
    return [fault for fault in FAULTS if store in fault.stores and (not short or fault.name in SHORT)]
