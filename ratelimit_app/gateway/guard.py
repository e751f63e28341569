"""Who may call the gateway endpoint: gateways only (RATELIMIT['GATEWAY_SECRET'], RATELIMIT['GATEWAY_NETWORKS']).

A caller that is not a gateway could otherwise describe a critical path to hold fleet slots, or a victim's
address and a large cost to drain the victim's allowance (docs/gateway.md, "Answer gateways only"). With
neither guard set, or an invalid secret, every call is refused. The secret is never shown or logged.
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


def refused(request: HttpRequest) -> JsonResponse | None:
    """None when `request` passes every guard set; else the 403 to answer it with (nothing else done)."""
    access = request_settings().derived(_parse_access)  # parsed once per settings snapshot
    if access.problem:
        return _forbidden(access.problem, "unconfigured")
    peer = str(request.META.get("REMOTE_ADDR") or "")
    if access.networks and not address_in(peer, access.networks):
        return _forbidden("the gateway endpoint answers gateways only: this caller's address is not in "
                          "RATELIMIT['GATEWAY_NETWORKS']", "network", peer)
    if access.secret_digest is not None:
        # compared as SHA-256 digests, in constant time: not even the secret's length is revealed
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
