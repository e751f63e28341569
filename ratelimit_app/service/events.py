"""The one interface through which the limiter feeds observability: request handling and the services report
here, to the recorder the app installs (`ratelimit_app.observability.recorder`); with none installed every
report is dropped."""

from __future__ import annotations

from typing import Protocol


class Recorder(Protocol):
    """What a recorder of the limiter's events offers (a module with these functions will do)."""

    def record_decision(self, *, allowed: bool, tier: str, policy: str | None, degraded: bool, identity: str,
                        unauthorized: bool = False, listed: str = "") -> None: ...

    def record_shadow_blocked(self, *, tier: str, policies: tuple[str, ...], identity: str) -> None: ...

    def record_usage(self, *, tier: str, used: tuple[tuple[str, str, int], ...]) -> None: ...

    def observe_latency(self, seconds: float) -> None: ...

    def record_breaker_change(self, *, previous: str, state: str) -> None: ...


_recorder: Recorder | None = None


def install(recorder: Recorder | None) -> None:
    """Send every later report to `recorder` (None: drop them)."""
    global _recorder
    _recorder = recorder


def record_decision(*, allowed: bool, tier: str, policy: str | None, degraded: bool, identity: str,
                    unauthorized: bool = False, listed: str = "") -> None:
    """Report one limited request: allowed or refused, by which tier and policy, for which identity label."""
    if _recorder is not None:
        _recorder.record_decision(allowed=allowed, tier=tier, policy=policy, degraded=degraded, identity=identity,
                                  unauthorized=unauthorized, listed=listed)


def record_shadow_blocked(*, tier: str, policies: tuple[str, ...], identity: str) -> None:
    """Report one allowed request that the shadow (dry-run) `policies` would have refused."""
    if _recorder is not None:
        _recorder.record_shadow_blocked(tier=tier, policies=policies, identity=identity)


def record_usage(*, tier: str, used: tuple[tuple[str, str, int], ...]) -> None:
    """Report the units one request used under the usage limits of `tier`, once, when it was settled:
    (policy, unit, count) per limit."""
    if _recorder is not None:
        _recorder.record_usage(tier=tier, used=used)


def observe_latency(seconds: float) -> None:
    """Report the duration of one limiter call to Redis, in seconds."""
    if _recorder is not None:
        _recorder.observe_latency(seconds)


def record_breaker_change(*, previous: str, state: str) -> None:
    """Report one change of the circuit breaker in front of Redis."""
    if _recorder is not None:
        _recorder.record_breaker_change(previous=previous, state=state)
