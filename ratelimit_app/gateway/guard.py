"""Who may call the gateway endpoint: gateways only.

The endpoint decides requests it is told about, and takes and gives back slots for them: a caller that
is not a gateway could describe a critical path to hold fleet slots, or a victim's address and a large
cost to drain the victim's allowance. So every view of the endpoint (`authorize`, `auth-request`,
`confirm`, `release`) first checks the guards set in RATELIMIT, each of which must pass:

- `GATEWAY_SECRET`: the call carries it in `X-RateLimit-Gateway-Secret` (compared in constant time, as
  SHA-256 digests: the comparison does not even reveal its length);
- `GATEWAY_NETWORKS`: the direct peer (`REMOTE_ADDR`, never a forwarded header) is in one of them.

A call that fails one is refused with a 403 JSON body, before anything is planned, charged or held
(nginx's contract carries it like any refusal). With neither set, or with an invalid GATEWAY_SECRET,
every call is refused: `manage.py check` reports it (ratelimit.E006, ratelimit.E001). The secret's
value is never shown or logged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from dataclasses import dataclass

from django.http import HttpRequest, JsonResponse

from ..apply.identity import IPNetwork, address_in, parse_networks
from ..conf.settings import InvalidSetting
from ..conf.snapshot import Snapshot, request_settings
from ..core.logs import log_once

SECRET_HEADER = "X-RateLimit-Gateway-Secret"  # noqa: S105  (a header name)
_SECRET_META = "HTTP_X_RATELIMIT_GATEWAY_SECRET"  # noqa: S105


@dataclass(frozen=True, slots=True)
class GatewayAccess:
    """The gateway guards, parsed once per settings change: the digest of GATEWAY_SECRET (None: unset),
    the GATEWAY_NETWORKS, and why no call can pass ("" when calls can)."""

    secret_digest: bytes | None
    networks: tuple[IPNetwork, ...]
    problem: str = ""


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def _parse_access(snapshot: Snapshot) -> GatewayAccess:
    networks = parse_networks(snapshot.get("GATEWAY_NETWORKS"))  # always readable: its valid CIDRs
    try:
        secret = snapshot.get("GATEWAY_SECRET")
    except InvalidSetting as exc:
        return GatewayAccess(None, networks, f"{exc}: the gateway endpoint answers no one until it is fixed")
    if secret is None and not networks:
        return GatewayAccess(None, networks, "neither RATELIMIT['GATEWAY_SECRET'] nor RATELIMIT['GATEWAY_NETWORKS'] "
                                             "is set: the gateway endpoint answers no one")
    return GatewayAccess(_digest(secret) if secret is not None else None, networks)


def gateway_access() -> GatewayAccess:
    """The parsed guards (parsed once per settings snapshot)."""
    return request_settings().derived(_parse_access)


def refused(request: HttpRequest) -> JsonResponse | None:
    """None when `request` passes every guard set; else the 403 to answer it with (nothing else done)."""
    access = gateway_access()
    if access.problem:
        return _forbidden(access.problem, "unconfigured")
    peer = str(request.META.get("REMOTE_ADDR") or "")
    if access.networks and not address_in(peer, access.networks):
        return _forbidden("the gateway endpoint answers gateways only: this caller's address is not in "
                          "RATELIMIT['GATEWAY_NETWORKS']", "network", peer)
    if access.secret_digest is not None:
        presented = request.META.get(_SECRET_META)
        if not isinstance(presented, str) or not hmac.compare_digest(_digest(presented), access.secret_digest):
            return _forbidden(f"the gateway endpoint answers gateways only: {SECRET_HEADER} is missing or "
                              "is not RATELIMIT['GATEWAY_SECRET']", "secret", peer)
    return None


def _forbidden(detail: str, reason: str, peer: str = "") -> JsonResponse:
    # once per process and cause: a caller probing the endpoint must not flood the logs
    log_once("ratelimit.gateway_refused", logging.WARNING, reason=reason, **({"peer": peer} if peer else {}))
    response = JsonResponse({"error": "forbidden", "detail": detail}, status=403)
    response["Cache-Control"] = "no-store"
    return response
