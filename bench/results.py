"""What one benchmark run measured, as the runner hands it to the report (bench/report.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench import accuracy, engine_bench, memory
from bench.asgi_profile import AsgiProfile
from bench.redis_time import RedisTime
from bench.sizes import Sizes
from bench.transports import Transports


@dataclass(frozen=True)
class AsgiSection:
    """The ASGI section: the ASGI variants under uvicorn and the async engine's rows, with what they ran on."""

    http: Any  # http_bench.HttpRun | None
    transports: Transports | None
    note: str  # why http is None
    server: str  # uvicorn's version, event loop and HTTP parser
    load: str  # load average (1 min) at the start / end of the section's measurements
    profile: AsgiProfile | None = None
    redis_time: RedisTime | None = None  # the scripts' time in Redis, which the async engine's rows include
    provenance: str = ""  # command, commit and time, when the section was measured on its own (--asgi-only)


@dataclass(frozen=True)
class Results:
    """Everything one run measured, plus what it ran on."""

    sizes: Sizes
    command: str
    machine: dict[str, str]
    versions: dict[str, str]
    unavailable: dict[str, str]
    engine: list[engine_bench.EngineResult]
    paired: list[engine_bench.Paired]
    transports: Transports | None
    accuracy: list[accuracy.AccuracyResult]
    memory: list[memory.MemoryResult]
    http: Any  # http_bench.HttpRun | None
    http_unavailable: dict[str, str]
    http_note: str
    redis_time: Any = None  # redis_time.RedisTime | None
    asgi: AsgiSection | None = None
    duration: float = 0.0
    finished: str = ""
    notes: list[str] = field(default_factory=list)
